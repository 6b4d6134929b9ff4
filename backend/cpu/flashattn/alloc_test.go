package flashattn

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// heapBytes returns the bytes f allocates on the heap (TotalAlloc counts
// every allocation, even ones already freed: it cannot miss a transient
// S×S buffer the way a peak-usage reading between GCs could).
func heapBytes(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// expectedBytes is what the design allocates for one Forward plus one
// Backward in float64: per worker one Br×Bc score tile and Br-long m, l in
// the forward pass, two Br×Bc tiles in each backward pass, plus the
// BH×Sq row vector D. Nothing else may grow with S.
func expectedBytes(bh, sq, sk int) uint64 {
	const f64 = 8
	workers := func(tasks int) uint64 { return uint64(min(runtime.GOMAXPROCS(0), tasks)) }
	qTasks, kTasks := bh*ceilDiv(sq, br), bh*ceilDiv(sk, bc)
	fwd := workers(qTasks) * (br*bc + 2*br) * f64
	bwd := (workers(kTasks) + workers(qTasks)) * 2 * br * bc * f64
	return fwd + bwd + uint64(bh*sq)*f64
}

// TestNoQuadraticAllocation proves the S×S matrix is never allocated: at
// S = 4096, D = 64 an S×S float64 matrix is 128 MiB; Forward+Backward must
// allocate no more than twice the per-worker tiles and O(S) vectors of the
// design (plus 64 KiB for goroutine bookkeeping), must stay under S²·8/8,
// and must grow at most linearly from S = 2048 to 4096. Causal, to halve the
// test's run time: it allocates exactly what the non-causal call does (same
// tasks, same scratch; only the tile loops are shorter).
func TestNoQuadraticAllocation(t *testing.T) {
	const bh, d = 1, 64
	measure := func(s int) uint64 {
		rng := rand.New(rand.NewPCG(uint64(s), 1))
		q, k, v, do := randn(rng, bh*s*d), randn(rng, bh*s*d), randn(rng, bh*s*d), randn(rng, bh*s*d)
		o, lse := make([]float64, bh*s*d), make([]float64, bh*s)
		dq, dk, dv := make([]float64, bh*s*d), make([]float64, bh*s*d), make([]float64, bh*s*d)
		n := heapBytes(func() {
			if err := Forward(q, k, v, o, lse, bh, s, s, d, 0.125, true); err != nil {
				t.Fatal(err)
			}
			if err := Backward(q, k, v, o, do, lse, dq, dk, dv, bh, s, s, d, 0.125, true); err != nil {
				t.Fatal(err)
			}
		})
		square := uint64(s) * uint64(s) * 8
		t.Logf("S=%d: Forward+Backward allocated %d bytes (design %d; S×S float64 = %d)", s, n, expectedBytes(bh, s, s), square)
		if lim := 2*expectedBytes(bh, s, s) + 64<<10; n > lim {
			t.Errorf("S=%d: allocated %d bytes, more than the design's bound %d", s, n, lim)
		}
		if n > square/8 {
			t.Errorf("S=%d: allocated %d bytes, not far below S²·8 = %d", s, n, square)
		}
		return n
	}
	n2k, n4k := measure(2048), measure(4096)
	if float64(n4k) > 2.5*float64(n2k) {
		t.Errorf("allocation grew %.2f× from S=2048 to 4096 (%d → %d bytes): worse than linear", float64(n4k)/float64(n2k), n2k, n4k)
	}
}

// TestAllocationCount: the number of allocations does not depend on S (it is
// a few per worker: scratch tiles and goroutines), so nothing is allocated
// per tile or per row. The worker count is pinned so that it, and with it the
// count, is the same on any machine and at both sizes.
func TestAllocationCount(t *testing.T) {
	const bh, d, workers = 2, 16, 4
	count := func(s int) (fwd, bwd float64) {
		rng := rand.New(rand.NewPCG(uint64(s), 2))
		q, k, v, do := randn(rng, bh*s*d), randn(rng, bh*s*d), randn(rng, bh*s*d), randn(rng, bh*s*d)
		o, lse := make([]float64, bh*s*d), make([]float64, bh*s)
		dq, dk, dv := make([]float64, bh*s*d), make([]float64, bh*s*d), make([]float64, bh*s*d)
		fwd = testing.AllocsPerRun(3, func() {
			if err := forward(q, k, v, o, lse, bh, 1, s, s, d, 0.25, true, workers); err != nil {
				t.Fatal(err)
			}
		})
		bwd = testing.AllocsPerRun(3, func() {
			if err := backward(q, k, v, o, do, lse, dq, dk, dv, bh, 1, s, s, d, 0.25, true, workers); err != nil {
				t.Fatal(err)
			}
		})
		return fwd, bwd
	}
	f1, b1 := count(256)
	f2, b2 := count(1024)
	t.Logf("allocations: Forward %v (S=256) %v (S=1024); Backward %v, %v", f1, f2, b1, b2)
	const w = workers
	if f2 > f1+2 || b2 > b1+2 {
		t.Errorf("allocation count grows with S: Forward %v → %v, Backward %v → %v", f1, f2, b1, b2)
	}
	if f2 > 8+8*w || b2 > 8+16*w {
		t.Errorf("too many allocations for %v workers: Forward %v, Backward %v", w, f2, b2)
	}
}
