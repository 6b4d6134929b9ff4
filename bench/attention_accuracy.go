package bench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"

	"github.com/flashgraph/flashgraph/backend/cuda"
)

// AccuracyCase is one problem of `flashgraph bench -accuracy`: Q, dO of [B,
// H, S, D] and K, V of [B, H_kv, S, D] in a 16-bit element type,
// self-attention (Sq = Sk = S), scale 1/√D.
type AccuracyCase struct {
	DType      string // "bfloat16" or "float16"
	B, H, S, D int
	// KVHeads is H_kv (grouped-query attention: query head h reads K/V head
	// h/(H/H_kv)); 0 means H.
	KVHeads int
	Causal  bool
}

func (c AccuracyCase) String() string {
	if c.KV() != c.H {
		return fmt.Sprintf("%s B=%d H=%d H_kv=%d S=%d D=%d causal=%v", c.DType, c.B, c.H, c.KV(), c.S, c.D, c.Causal)
	}
	return fmt.Sprintf("%s B=%d H=%d S=%d D=%d causal=%v", c.DType, c.B, c.H, c.S, c.D, c.Causal)
}

// Elems is the element count of each of Q, dO, O, dQ.
func (c AccuracyCase) Elems() int { return c.B * c.H * c.S * c.D }

// KV is the number of K/V heads: KVHeads, or H when it is 0.
func (c AccuracyCase) KV() int {
	if c.KVHeads == 0 {
		return c.H
	}
	return c.KVHeads
}

// KVElems is the element count of each of K, V, dK, dV.
func (c AccuracyCase) KVElems() int { return c.B * c.KV() * c.S * c.D }

// Scale is the softmax scale the kernels get: 1/√D rounded to float32, the
// value the reference must use too.
func (c AccuracyCase) Scale() float32 { return float32(1 / math.Sqrt(float64(c.D))) }

// Gemm is the element type as the CUDA launchers name it.
func (c AccuracyCase) Gemm() (cuda.GemmType, error) {
	switch c.DType {
	case "bfloat16":
		return cuda.GemmBF16, nil
	case "float16":
		return cuda.GemmF16, nil
	}
	return 0, fmt.Errorf("accuracy bench: element type %q: want bfloat16 or float16", c.DType)
}

// AccuracyData is one case's inputs and our outputs, as the device held
// them: 16-bit tensors as their bit patterns (row-major [B, H, S, D]) and
// LSE as float32 [B, H, S] (natural log).
type AccuracyData struct {
	Case          AccuracyCase
	Q, K, V, DO   []uint16
	O, DQ, DK, DV []uint16
	LSE           []float32
}

// AccuracyInputs draws the case's inputs: four tensors of standard normals
// rounded to the element type, each from its own seed (seed, seed+φ, ...
// as NewAttnBench does), so they depend on seed, the element type and the
// element counts only (K and V have KVElems elements).
func AccuracyInputs(c AccuracyCase, seed uint64) (q, k, v, dout []uint16, err error) {
	var round func(float32) uint16
	switch c.DType {
	case "bfloat16":
		round = cuda.BF16FromFloat32
	case "float16":
		round = cuda.F16FromFloat32
	default:
		_, err := c.Gemm()
		return nil, nil, nil, nil, err
	}
	if c.Elems() < 1 || c.KVElems() < 1 {
		return nil, nil, nil, nil, fmt.Errorf("accuracy bench: %v: every dim must be positive", c)
	}
	var in [4][]uint16
	for i := range in {
		n := c.Elems()
		if i == 1 || i == 2 {
			n = c.KVElems()
		}
		in[i] = randomNormal16(n, seed+uint64(i)*0x9e3779b9, round)
	}
	return in[0], in[1], in[2], in[3], nil
}

// randomNormal16 draws n standard normals rounded by round, in parallel
// chunks with their own seeds (with round = BF16FromFloat32 it is randomBF16).
func randomNormal16(n int, seed uint64, round func(float32) uint16) []uint16 {
	out := make([]uint16, n)
	const chunk = 1 << 20
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for lo := 0; lo < n; lo += chunk {
		wg.Add(1)
		sem <- struct{}{}
		go func(lo int) {
			defer func() { <-sem; wg.Done() }()
			r := rand.New(rand.NewPCG(seed, uint64(lo)))
			for i := lo; i < min(lo+chunk, n); i++ {
				out[i] = round(float32(r.NormFloat64()))
			}
		}(lo)
	}
	wg.Wait()
	return out
}

// RunAccuracy uploads the case's inputs (AccuracyInputs), runs FlashForward
// and FlashBackward once (their grouped forms, FlashForwardGroupedWS and
// FlashBackwardGrouped, with group H/H_kv: group 1 is the same kernels), with whichever kernels the environment selects
// (cuda.FlashSM90Env, cuda.FlashSM90BwdEnv, cuda.FlashGQABwdEnv), and downloads O, LSE, dQ, dK
// and dV. The outputs are poisoned with NaN first, so an element the kernels
// never write shows up as non-finite. Any failure is returned: with no
// timing to report, a case that cannot run has nothing to show.
func RunAccuracy(d *cuda.Device, c AccuracyCase, seed uint64) (*AccuracyData, error) {
	dt, err := c.Gemm()
	if err != nil {
		return nil, err
	}
	q, k, v, dout, err := AccuracyInputs(c, seed)
	if err != nil {
		return nil, err
	}
	n, nkv, bh, group := c.Elems(), c.KVElems(), c.B*c.H, c.H/c.KV()
	var bufs []cuda.DevicePtr
	defer func() {
		for _, p := range bufs {
			d.Free(p)
		}
	}()
	var in [4]cuda.DevicePtr
	for i, h := range [][]uint16{q, k, v, dout} {
		p, err := cuda.Upload(d, h)
		if err != nil {
			return nil, fmt.Errorf("accuracy bench %v inputs: %w", c, err)
		}
		bufs = append(bufs, p)
		in[i] = p
	}
	scale := c.Scale()
	var out [6]cuda.DevicePtr // o, lse, dq, dk, dv, workspace
	for i, sz := range []int{n * 2, bh * c.S * 4, n * 2, nkv * 2, nkv * 2, cuda.FlashBackwardWorkspaceBytes(dt, bh, group, c.S, c.S, c.D, scale)} {
		p, err := d.Alloc(sz)
		if err != nil {
			return nil, fmt.Errorf("accuracy bench %v: %w", c, err)
		}
		bufs = append(bufs, p)
		out[i] = p
		if i < 5 {
			if err := d.Memset(p, 0xff, sz); err != nil {
				return nil, err
			}
		}
	}
	o, lse, dq, dk, dv, ws := out[0], out[1], out[2], out[3], out[4], out[5]
	if err := cuda.FlashForwardGroupedWS(d, dt, in[0], in[1], in[2], o, lse, 0, bh, group, c.S, c.S, c.D, scale, c.Causal); err != nil {
		return nil, fmt.Errorf("accuracy bench %v: FlashForward: %w", c, err)
	}
	if err := cuda.FlashBackwardGrouped(d, dt, in[0], in[1], in[2], o, in[3], lse, dq, dk, dv, ws, bh, group, c.S, c.S, c.D, scale, c.Causal); err != nil {
		return nil, fmt.Errorf("accuracy bench %v: FlashBackward: %w", c, err)
	}
	if err := d.Synchronize(); err != nil {
		return nil, fmt.Errorf("accuracy bench %v: %w", c, err)
	}
	r := &AccuracyData{Case: c, Q: q, K: k, V: v, DO: dout, LSE: make([]float32, bh*c.S)}
	for _, dst := range []struct {
		h *[]uint16
		p cuda.DevicePtr
		n int
	}{{&r.O, o, n}, {&r.DQ, dq, n}, {&r.DK, dk, nkv}, {&r.DV, dv, nkv}} {
		*dst.h = make([]uint16, dst.n)
		if err := cuda.Download(d, dst.p, *dst.h); err != nil {
			return nil, err
		}
	}
	if err := cuda.Download(d, lse, r.LSE); err != nil {
		return nil, err
	}
	return r, nil
}

// errNoCases is returned by CheckAccuracyCases for an empty list.
var errNoCases = errors.New("accuracy bench: no cases")

// CheckAccuracyCases rejects cases the bench cannot run before the device
// is opened: an unknown element type, a non-positive dim or an H_kv that
// does not divide H.
func CheckAccuracyCases(cs []AccuracyCase) error {
	if len(cs) == 0 {
		return errNoCases
	}
	for _, c := range cs {
		if _, err := c.Gemm(); err != nil {
			return err
		}
		if c.B < 1 || c.H < 1 || c.S < 1 || c.D < 1 || c.KVHeads < 0 {
			return fmt.Errorf("accuracy bench: %v: every dim must be positive", c)
		}
		if c.H%c.KV() != 0 {
			return fmt.Errorf("accuracy bench: %v: H_kv %d must divide H %d", c, c.KV(), c.H)
		}
	}
	return nil
}
