package bench

import (
	"fmt"
	"math"
	"os"

	"github.com/flashgraph/flashgraph/backend/cuda"
)

// DecodeShape is one generation-step attention problem: Sq query rows per
// (batch, head) against Sk keys and values, [B, H, ·, D], non-causal (with
// the top-left causal mask of FlashForward and SDPA a row of Sq <= 16 would
// see at most 16 keys).
type DecodeShape struct {
	B, H, Sq, Sk, D int
}

func (s DecodeShape) String() string {
	return fmt.Sprintf("B=%d H=%d Sq=%d Sk=%d D=%d", s.B, s.H, s.Sq, s.Sk, s.D)
}

// KVBytes is what a forward must read at least: K and V in bfloat16.
func (s DecodeShape) KVBytes() int64 { return 2 * int64(s.B*s.H*s.Sk*s.D) * 2 }

// DecodeResult is the forward of one decode shape timed twice: FlashForward
// as it runs (the split-K/V decode forward where it applies) and with
// cuda.FlashDecodeEnv=0 (one CTA per (batch·head, query tile): FA2 or, on
// sm_90, the Hopper kernel).
type DecodeResult struct {
	Shape            DecodeShape
	SplitMs, WholeMs float64 // medians
	// MaxAbsDiff is max |split − whole| over O (+Inf if either has a NaN);
	// MaxAbsRef the largest |whole|.
	MaxAbsDiff, MaxAbsRef float64
}

// Decode times the forward of sh on the bench's inputs (Q from the first
// B·H·Sq·D elements of q, K and V from k and v).
func (ab *AttnBench) Decode(sh DecodeShape) (*DecodeResult, error) {
	if sh.B < 1 || sh.H < 1 || sh.Sq < 1 || sh.Sk < 1 || sh.D < 1 {
		return nil, fmt.Errorf("decode bench: %v: every dim must be positive", sh)
	}
	bh := sh.B * sh.H
	if bh*max(sh.Sq, sh.Sk)*sh.D > ab.n {
		return nil, fmt.Errorf("decode bench: %v needs %d elements per input, the bench has %d", sh, bh*max(sh.Sq, sh.Sk)*sh.D, ab.n)
	}
	d := ab.d
	nq := bh * sh.Sq * sh.D
	scale := float32(1 / math.Sqrt(float64(sh.D)))
	wsBytes := max(256, cuda.FlashForwardWorkspaceBytes(cuda.GemmBF16, bh, sh.Sq, sh.Sk, sh.D, scale, false))
	var bufs []cuda.DevicePtr
	defer func() {
		for _, p := range bufs {
			d.Free(p)
		}
	}()
	for _, n := range []int{nq * 2, nq * 2, bh * sh.Sq * 4, wsBytes} {
		p, err := d.Alloc(n)
		if err != nil {
			return nil, err
		}
		bufs = append(bufs, p)
	}
	oSplit, oWhole, lse, ws := bufs[0], bufs[1], bufs[2], bufs[3]
	for _, p := range []cuda.DevicePtr{oSplit, oWhole} {
		if err := d.Memset(p, 0xff, nq*2); err != nil {
			return nil, err
		}
	}
	old, had := os.LookupEnv(cuda.FlashDecodeEnv)
	defer func() {
		if had {
			os.Setenv(cuda.FlashDecodeEnv, old)
		} else {
			os.Unsetenv(cuda.FlashDecodeEnv)
		}
	}()
	r := &DecodeResult{Shape: sh}
	for _, run := range []struct {
		env string
		o   cuda.DevicePtr
		ms  *float64
	}{{"1", oSplit, &r.SplitMs}, {"0", oWhole, &r.WholeMs}} {
		os.Setenv(cuda.FlashDecodeEnv, run.env)
		fwd := func() error {
			return cuda.FlashForwardWS(d, cuda.GemmBF16, ab.in[0], ab.in[1], ab.in[2], run.o, lse, ws, bh, sh.Sq, sh.Sk, sh.D, scale, false)
		}
		med, err := ab.timeLoop([]func() error{fwd}, []bool{true})
		if err == nil {
			err = d.Synchronize()
		}
		if err != nil {
			return nil, fmt.Errorf("decode bench %v, %s=%s: %w", sh, cuda.FlashDecodeEnv, run.env, err)
		}
		*run.ms = med[0]
	}
	a, err := ab.download(oSplit, nq)
	if err != nil {
		return nil, err
	}
	b, err := ab.download(oWhole, nq)
	if err != nil {
		return nil, err
	}
	r.MaxAbsDiff, r.MaxAbsRef = maxAbsDiff(a, b)
	return r, nil
}
