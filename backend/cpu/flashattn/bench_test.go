package flashattn

import (
	"math/rand/v2"
	"testing"
)

// benchShapes: a short and a long sequence at d=64, one at d=128; causal and
// not. Reported GFLOP/s use the usual convention: forward 4·BH·Sq·Sk·D
// (halved if causal), backward 2.5× that (5 GEMMs to the forward's 2; this
// implementation does 7 because of the separate dQ pass, so its real
// arithmetic rate is 1.4× the figure shown).
func benchShapes() []shape {
	var ss []shape
	for _, causal := range []bool{false, true} {
		for _, s := range []shape{
			{bh: 8, sq: 256, sk: 256, d: 64},
			{bh: 2, sq: 2048, sk: 2048, d: 64},
			{bh: 2, sq: 1024, sk: 1024, d: 128},
		} {
			s.causal = causal
			ss = append(ss, s)
		}
	}
	return ss
}

func fwdFlops(s shape) float64 {
	f := 4 * float64(s.bh) * float64(s.sq) * float64(s.sk) * float64(s.d)
	if s.causal {
		f /= 2
	}
	return f
}

func BenchmarkForward(b *testing.B) {
	for _, s := range benchShapes() {
		b.Run("f32/"+s.String(), func(b *testing.B) { benchForward[float32](b, s) })
		b.Run("f64/"+s.String(), func(b *testing.B) { benchForward[float64](b, s) })
	}
}

func BenchmarkBackward(b *testing.B) {
	for _, s := range benchShapes() {
		b.Run("f32/"+s.String(), func(b *testing.B) { benchBackward[float32](b, s) })
		b.Run("f64/"+s.String(), func(b *testing.B) { benchBackward[float64](b, s) })
	}
}

func benchForward[T Float](b *testing.B, s shape) {
	rng := rand.New(rand.NewPCG(1, 1))
	q, k, v := convert[T](randn(rng, s.nq())), convert[T](randn(rng, s.nk())), convert[T](randn(rng, s.nk()))
	o, lse := make([]T, s.nq()), make([]T, s.bh*s.sq)
	b.ReportAllocs()
	for b.Loop() {
		if err := Forward(q, k, v, o, lse, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(fwdFlops(s)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func benchBackward[T Float](b *testing.B, s shape) {
	rng := rand.New(rand.NewPCG(1, 1))
	q, k, v, do := convert[T](randn(rng, s.nq())), convert[T](randn(rng, s.nk())), convert[T](randn(rng, s.nk())), convert[T](randn(rng, s.nq()))
	o, lse := make([]T, s.nq()), make([]T, s.bh*s.sq)
	if err := Forward(q, k, v, o, lse, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
		b.Fatal(err)
	}
	dq, dk, dv := make([]T, s.nq()), make([]T, s.nk()), make([]T, s.nk())
	b.ReportAllocs()
	for b.Loop() {
		if err := Backward(q, k, v, o, do, lse, dq, dk, dv, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(2.5*fwdFlops(s)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
