package graph

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
)

// The "normal" initializer draws a PCG stream and turns each pair of draws
// into two normal values by Box-Muller. Its bits are part of every checkpoint
// and golden file, so they must not depend on how the work is split. The
// tensor is cut into chunks of pairs; each worker (GOMAXPROCS of them) starts
// a generator at its chunk's place in the stream, found by jumping the PCG's
// linear congruential state ahead (pcgAdvance, a few hundred multiplications)
// rather than by drawing every value before it. An element's value depends
// only on its own pair of draws, so any split gives the bits of the one
// sequential loop, and the work (a log, a square root, a cosine and a sine
// a pair: about 20 ns an element on one core) scales with the cores.

// normalSeq is the second seed of the PCG the initializer draws from: the
// stream of Normal(std, seed) starts at the state seed:normalSeq.
const normalSeq = 0x9e3779b97f4a7c15

// normalChunkPairs is the number of Box-Muller pairs in one unit of parallel
// work: its draws (256 KiB) stay in cache between drawing and computing, a
// jump costs nothing beside it, and a tensor of fewer pairs is done without
// starting goroutines.
const normalChunkPairs = 1 << 14

// fillNormal fills t (a float tensor) with std-scaled standard normal values
// drawn from the stream of seed.
func fillNormal(t *Tensor, seed uint64, std float64) {
	pairs := (t.Len() + 1) / 2
	chunks := (pairs + normalChunkPairs - 1) / normalChunkPairs
	workers := min(runtime.GOMAXPROCS(0), chunks)
	if workers <= 1 || !pcgJumps() {
		// One generator drawn in order: the definition itself.
		rng := rand.NewPCG(seed, normalSeq)
		buf := make([]uint64, 2*min(pairs, normalChunkPairs))
		for p := 0; p < pairs; p += normalChunkPairs {
			normalPairs(t, p, draw(rng, buf[:2*min(normalChunkPairs, pairs-p)]), std)
		}
		return
	}
	start := u128{seed, normalSeq}
	var next atomic.Int64 // the next chunk to take
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			buf := make([]uint64, 2*normalChunkPairs)
			for c := int(next.Add(1) - 1); c < chunks; c = int(next.Add(1) - 1) {
				p := c * normalChunkPairs
				s := pcgAdvance(start, 2*uint64(p)) // two draws a pair
				rng := rand.NewPCG(s.hi, s.lo)
				normalPairs(t, p, draw(rng, buf[:2*min(normalChunkPairs, pairs-p)]), std)
			}
		})
	}
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

// u128 is an unsigned 128-bit integer, arithmetic modulo 2^128.
type u128 struct{ hi, lo uint64 }

func (a u128) mul(b u128) u128 {
	hi, lo := bits.Mul64(a.lo, b.lo)
	return u128{hi + a.hi*b.lo + a.lo*b.hi, lo}
}

func (a u128) add(b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	hi, _ := bits.Add64(a.hi, b.hi, c)
	return u128{hi, lo}
}

// The linear congruential step of math/rand/v2's PCG (state = state*mul +
// inc, the multiplier and increment of the PCG reference implementation),
// whose state NewPCG(hi, lo) sets to hi:lo. pcgJumps checks, once, that the
// generator still behaves so before any jump is trusted.
var (
	pcgMul = u128{2549297995355413924, 4865540595714422341}
	pcgInc = u128{6364136223846793005, 1442695040888963407}
)

// pcgAdvance returns the PCG state k steps (draws) after s, in O(log k)
// steps: the affine map x -> mul*x + inc is squared k's bits times (Brown,
// "Random number generation with arbitrary strides", 1994).
func pcgAdvance(s u128, k uint64) u128 {
	accMul, accInc := u128{0, 1}, u128{0, 0}
	m, c := pcgMul, pcgInc
	for ; k > 0; k >>= 1 {
		if k&1 == 1 {
			accMul = accMul.mul(m)
			accInc = accInc.mul(m).add(c)
		}
		c = m.add(u128{0, 1}).mul(c)
		m = m.mul(m)
	}
	return accMul.mul(s).add(accInc)
}

// pcgJumps reports whether a generator started at a pcgAdvance'd state
// continues the stream where drawing in order would be (true unless the Go
// release changed its PCG); without it the initializer draws in order, on
// one goroutine, and still gives its bits.
var pcgJumps = sync.OnceValue(func() bool {
	for _, k := range []uint64{0, 1, 2, 3, 1000, 4097} {
		s := u128{0x0123456789abcdef, normalSeq}
		inOrder := rand.NewPCG(s.hi, s.lo)
		for range k {
			inOrder.Uint64()
		}
		j := pcgAdvance(s, k)
		jumped := rand.NewPCG(j.hi, j.lo)
		for range 4 {
			if inOrder.Uint64() != jumped.Uint64() {
				return false
			}
		}
	}
	return true
})
