package attention

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
)

// flashDecodeTimingEnv switches TestFlashDecodeTiming on ("1"): it needs a
// GPU and about half a GiB of device memory, and times rather than checks.
const flashDecodeTimingEnv = "FLASHGRAPH_DECODE_TIMING"

// TestFlashDecodeTiming times the decode forward on the shapes of
// `flashgraph bench -decode 1,16 -seqs 4096,16384 -dims 64,128 -tokens 32768
// -width 2048` (bf16, non-causal; B = 32768/S, H = 2048/D, so every shape
// reads the same 256 MiB of K and V), each way it can run, so that one GPU
// run compares them (CUDA events around each call, back to back as the
// bench does, median):
//
//	v1            the first version (its splits and ring, partials, combine kernel)
//	v1-fused      v1's splits and ring with v2's fused combine (the combine's share)
//	v2            as planned (FlashForward's default)
//	v2-prefetch   v2 with the L2 256-byte prefetch hint on the K/V loads
//	wave rN       v2's one-wave split rule with a ring of N tiles (the deepest
//	              ring for 3, 2 or 1 CTAs per SM)
//	s=M rN        v2 with about M chunks per row and a ring of N tiles (a sweep)
//	off           FlashForward with FlashDecodeEnv=0 (FA2 or the sm90 kernel)
//
// Each line: the launch (version, chunks × tiles of 64 keys, ring depth), the
// median in microseconds and the K/V bytes per second. Every output is
// compared with off's (a loose check: TestFlashDecodeGPU is the correctness
// test).
func TestFlashDecodeTiming(t *testing.T) {
	if os.Getenv(flashDecodeTimingEnv) != "1" {
		t.Skipf("set %s=1 to time the decode forward (GPU)", flashDecodeTimingEnv)
	}
	d := gpu(t)
	const tokens, width = 32768, 2048
	const warmup, iters = 10, 50
	n := tokens * width
	q := flashDecodeRandomBF16(t, d, n/16, 1)
	k := flashDecodeRandomBF16(t, d, n, 2)
	v := flashDecodeRandomBF16(t, d, n, 3)
	t.Logf("%s; CUDA events, median of %d after %d warm-up", d.Name(), iters, warmup)
	t.Logf("%4s %6s %4s %4s  %-12s %-16s %9s %7s", "Sq", "S", "D", "BH", "variant", "launch", "us", "TB/s")
	for _, dim := range []int{64, 128} {
		for _, sk := range []int{4096, 16384} {
			for _, sq := range []int{1, 16} {
				bh := (tokens / sk) * (width / dim)
				flashDecodeTimeShape(t, d, q, k, v, bh, sq, sk, dim, warmup, iters)
			}
		}
	}
}

// flashDecodeTimeShape times and logs every variant of one shape.
func flashDecodeTimeShape(t *testing.T, d *Device, q, k, v DevicePtr, bh, sq, sk, dim, warmup, iters int) {
	t.Helper()
	const dt = GemmBF16
	scale := float32(1 / math.Sqrt(float64(dim)))
	type variant struct {
		name string
		plan *flashDecodePlan // nil: FlashForward with the decode forward off
	}
	var vs []variant
	add := func(name string, p flashDecodePlan) { vs = append(vs, variant{name, &p}) }
	v1, err := planFlashDecodeAs(flashDecodeV1, dt, bh, sq, sk, dim, false)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := planFlashDecodeAs(flashDecodeV2, dt, bh, sq, sk, dim, false)
	if err != nil {
		t.Fatal(err)
	}
	add("v1", v1)
	v1f := v1
	v1f.flags = flashDecodeFlagsV2
	v1f.split(bh, sq, dim, v1.splits)
	add("v1-fused", v1f)
	add("v2", v2)
	pf := v2
	pf.flags |= flashDecodePF256
	add("v2-prefetch", pf)
	seen := map[[3]int]bool{{v2.splits, v2.tilesPerSplit, v2.stages}: true}
	try := func(name string, stages, splits int) {
		p := v2
		p.setStages(dim, stages)
		p.split(bh, sq, dim, min(splits, max(1, p.tiles/flashDecodeMinTiles)))
		if key := [3]int{p.splits, p.tilesPerSplit, p.stages}; !seen[key] {
			seen[key] = true
			add(name, p)
		}
	}
	rings := map[int][]int{64: {4, 6, 14}, 128: {3, 6}}[dim]
	for _, r := range rings {
		try(fmt.Sprintf("wave r%d", r), r, flashDecodeSMs*flashDecodeResident(dim, r)/bh)
	}
	for _, r := range rings {
		for _, s := range []int{1, 2, 3, 4, 6, 8, 12, 16, 24, 32} {
			try(fmt.Sprintf("s=%d r%d", s, r), r, s)
		}
	}
	vs = append(vs, variant{"off", nil})

	nq := bh * sq * dim
	wsBytes := 256
	for _, x := range vs {
		if x.plan != nil {
			wsBytes = max(wsBytes, x.plan.workspaceBytes())
		}
	}
	ws := flashAlloc(t, d, wsBytes, 1)
	lse := flashAlloc(t, d, bh*sq, 4)
	outs := make([][]float64, len(vs))
	times := make([]float64, len(vs))
	for i, x := range vs {
		o := flashAlloc(t, d, nq, 2)
		run := func() error {
			if x.plan == nil {
				return FlashForwardWS(d, dt, q, k, v, o, lse, ws, bh, sq, sk, dim, scale, false)
			}
			return flashForwardDecode(d, *x.plan, q, k, v, o, lse, ws, bh, 1, sq, sk, dim, scale, false)
		}
		if x.plan == nil {
			t.Setenv(FlashDecodeEnv, "0")
		}
		ms, err := flashDecodeMedianMs(d, run, warmup, iters)
		t.Setenv(FlashDecodeEnv, "")
		if err != nil {
			t.Fatalf("sq %d sk %d d%d %s: %v", sq, sk, dim, x.name, err)
		}
		times[i] = ms
		outs[i] = flashDownload(t, d, dt, o, nq)
	}
	ref := outs[len(outs)-1]
	refMax := 0.0
	for _, x := range ref {
		refMax = max(refMax, math.Abs(x))
	}
	kvBytes := 2.0 * float64(bh*sk*dim) * 2
	for i, x := range vs {
		launch := "-"
		if x.plan != nil {
			launch = x.plan.String()
		}
		t.Logf("%4d %6d %4d %4d  %-12s %-16s %9.1f %7.2f", sq, sk, dim, bh, x.name, launch, times[i]*1e3, kvBytes/(times[i]*1e-3)/1e12)
		diff := 0.0
		for j, y := range outs[i] {
			if math.IsNaN(y) {
				diff = math.Inf(1)
				break
			}
			diff = max(diff, math.Abs(y-ref[j]))
		}
		if diff > 0.02*refMax+1e-4 {
			t.Errorf("sq %d sk %d d%d %s (%s): max |O - off's O| = %.3g (max |O| %.3g)", sq, sk, dim, x.name, launch, diff, refMax)
		}
	}
}

// flashDecodeMedianMs runs f warmup times, then iters times with an event
// recorded after each call, and returns the median milliseconds per call.
func flashDecodeMedianMs(d *Device, f func() error, warmup, iters int) (float64, error) {
	for range warmup {
		if err := f(); err != nil {
			return 0, err
		}
	}
	evs := make([]*Event, iters+1)
	defer func() {
		for _, e := range evs {
			e.Destroy()
		}
	}()
	for i := range evs {
		e, err := d.NewEvent()
		if err != nil {
			return 0, err
		}
		evs[i] = e
	}
	if err := d.Record(evs[0]); err != nil {
		return 0, err
	}
	for i := range iters {
		if err := f(); err != nil {
			return 0, err
		}
		if err := d.Record(evs[i+1]); err != nil {
			return 0, err
		}
	}
	ms := make([]float64, iters)
	for i := range iters {
		x, err := d.ElapsedMs(evs[i], evs[i+1])
		if err != nil {
			return 0, err
		}
		ms[i] = float64(x)
	}
	slices.Sort(ms)
	return ms[iters/2], nil
}

// flashDecodeRandomBF16 uploads n bfloat16 values of magnitude in [0.25,
// 0.5) with random signs (a cheap generator: timing needs no distribution).
func flashDecodeRandomBF16(t *testing.T, d *Device, n int, seed uint64) DevicePtr {
	t.Helper()
	h := make([]uint16, n)
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range h {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		h[i] = uint16(x>>48)&0x807f | 0x3e80
	}
	p, err := Upload(d, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	return p
}
