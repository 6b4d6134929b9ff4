// Package parallel splits a loop over goroutines for the CPU backend and its
// matrix kernels.
package parallel

import (
	"runtime"
	"sync"
)

// For calls fn on disjoint ranges covering [0, n), on up to GOMAXPROCS
// goroutines when each gets at least minChunk items. Each index is handled
// by exactly one call, so results do not depend on the split. A panic on a
// worker goroutine could not be recovered by the caller, so it is carried
// back and raised again on the calling goroutine.
func For(n, minChunk int, fn func(lo, hi int)) {
	chunks := min(runtime.GOMAXPROCS(0), n/max(minChunk, 1))
	if chunks <= 1 {
		if n > 0 {
			fn(0, n)
		}
		return
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var panicked any
	for c := range chunks {
		lo, hi := n*c/chunks, n*(c+1)/chunks
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if r := recover(); r != nil {
					mu.Lock()
					panicked = r
					mu.Unlock()
				}
			}()
			fn(lo, hi)
		}()
	}
	wg.Wait()
	if panicked != nil {
		panic(panicked)
	}
}
