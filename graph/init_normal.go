package graph

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
)

// The "normal" initializer draws a PCG stream and turns each pair of draws
// into two normal values by Box-Muller. Its bits are part of every checkpoint
// and golden file, so they must not depend on how the work is split: the
// stream is drawn in order, one chunk of pairs at a time, by one goroutine
// (cheap, about 2 ns a draw), and the math and the stores of each chunk (the
// expensive part: a log, a square root, a cosine and a sine per pair) run on
// all cores. An element's value depends only on its own pair of draws, so any
// split gives the bits of the sequential loop.

// normalSeq is the PCG stream the initializer draws from, for a given seed.
const normalSeq = 0x9e3779b97f4a7c15

// normalChunkPairs is the number of Box-Muller pairs in one unit of parallel
// work: its draws (1 MiB) stay in cache between the drawing goroutine and the
// one that computes them, and a tensor of fewer pairs is done without
// starting goroutines.
const normalChunkPairs = 1 << 16

// fillNormal fills t (a float tensor) with std-scaled standard normal values
// drawn from seed's stream.
func fillNormal(t *Tensor, seed uint64, std float64) {
	n := t.Len()
	pairs := (n + 1) / 2
	rng := rand.NewPCG(seed, normalSeq)
	chunks := (pairs + normalChunkPairs - 1) / normalChunkPairs
	workers := min(runtime.GOMAXPROCS(0), chunks)
	if workers <= 1 {
		draws := make([]uint64, 2*min(pairs, normalChunkPairs))
		for p := 0; p < pairs; p += normalChunkPairs {
			d := draw(rng, draws[:2*min(normalChunkPairs, pairs-p)])
			normalPairs(t, p, d, std)
		}
		return
	}
	type chunk struct {
		first int      // index of the chunk's first pair
		draws []uint64 // its two draws a pair, in stream order
	}
	// Two buffers a worker let the drawing run ahead of the math without
	// holding more than a few MiB.
	free := make(chan []uint64, 2*workers)
	for range cap(free) {
		free <- make([]uint64, 2*normalChunkPairs)
	}
	work := make(chan chunk, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c := range work {
				normalPairs(t, c.first, c.draws, std)
				free <- c.draws[:cap(c.draws)]
			}
		})
	}
	for p := 0; p < pairs; p += normalChunkPairs {
		buf := <-free
		work <- chunk{p, draw(rng, buf[:2*min(normalChunkPairs, pairs-p)])}
	}
	close(work)
	wg.Wait()
}

// draw fills buf with the next len(buf) values of rng's stream.
func draw(rng *rand.PCG, buf []uint64) []uint64 {
	for i := range buf {
		buf[i] = rng.Uint64()
	}
	return buf
}

// boxMuller turns one pair of draws into two standard normal values scaled
// by std. The expressions (and their order of operations) are the
// initializer's definition: changing any of them changes every checkpoint.
func boxMuller(x, y uint64, std float64) (float64, float64) {
	u1 := (float64(x>>11) + 0.5) / (1 << 53)
	u2 := float64(y>>11) / (1 << 53)
	r := math.Sqrt(-2 * math.Log(u1))
	return std * r * math.Cos(2*math.Pi*u2), std * r * math.Sin(2*math.Pi*u2)
}

// normalPairs stores the values of pairs first, first+1, ... (two draws
// each in draws) at elements 2*first, 2*first+1, ..., rounding as Set does;
// the last pair of a tensor of odd length stores only its first value.
func normalPairs(t *Tensor, first int, draws []uint64, std float64) {
	lo := 2 * first
	hi := min(lo+len(draws), t.Len())
	switch t.DType {
	case Float32:
		normalStore(t.F32[lo:hi], draws, std, func(v float64) float32 { return float32(v) })
	case BFloat16:
		normalStore(t.F32[lo:hi], draws, std, func(v float64) float32 { return RoundBF16(float32(v)) })
	case Float16:
		normalStore(t.F32[lo:hi], draws, std, func(v float64) float32 { return RoundF16(float32(v)) })
	case Float64:
		normalStore(t.F64[lo:hi], draws, std, func(v float64) float64 { return v })
	}
}

// normalStore writes the Box-Muller values of draws into dst, converted by
// conv (the rounding of the tensor's dtype).
func normalStore[E float32 | float64](dst []E, draws []uint64, std float64, conv func(float64) E) {
	for k := 0; 2*k < len(dst); k++ {
		a, b := boxMuller(draws[2*k], draws[2*k+1], std)
		dst[2*k] = conv(a)
		if 2*k+1 < len(dst) {
			dst[2*k+1] = conv(b)
		}
	}
}
