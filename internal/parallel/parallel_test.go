package parallel

import (
	"runtime"
	"sync/atomic"
	"testing"
)

// Every index is visited exactly once, whatever the split.
func TestForCoversOnce(t *testing.T) {
	for _, procs := range []int{1, 2, 7} {
		old := runtime.GOMAXPROCS(procs)
		for _, n := range []int{0, 1, 5, 100, 1001} {
			seen := make([]atomic.Int32, n)
			For(n, 3, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					seen[i].Add(1)
				}
			})
			for i := range seen {
				if c := seen[i].Load(); c != 1 {
					t.Fatalf("GOMAXPROCS %d, n %d: index %d visited %d times", procs, n, i, c)
				}
			}
		}
		runtime.GOMAXPROCS(old)
	}
}

// A worker's panic reaches the caller.
func TestForCarriesPanic(t *testing.T) {
	old := runtime.GOMAXPROCS(4)
	defer runtime.GOMAXPROCS(old)
	defer func() {
		if r := recover(); r != "boom" {
			t.Fatalf("recovered %v, want boom", r)
		}
	}()
	For(1000, 1, func(lo, hi int) {
		if lo > 0 {
			panic("boom")
		}
	})
	t.Fatal("For returned without panicking")
}
