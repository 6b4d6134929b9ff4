package flashattn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// grads runs Forward then Backward with lse of type L and returns O and the
// gradients, all outputs poisoned with NaN before the calls.
func grads[T, L Float](t *testing.T, s shape, q, k, v, do []T) (o, dq, dk, dv []T) {
	t.Helper()
	o, lse := nans[T](s.nq()), nans[L](s.bh*s.sq)
	if err := Forward(q, k, v, o, lse, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
		t.Fatal(err)
	}
	dq, dk, dv = nans[T](s.nq()), nans[T](s.nk()), nans[T](s.nk())
	if err := Backward(q, k, v, o, do, lse, dq, dk, dv, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
		t.Fatal(err)
	}
	return o, dq, dk, dv
}

// TestBackwardFiniteDifference checks dQ, dK, dV of the loss sum(O∘W) against
// central differences of Forward itself, at sizes inside one tile, across
// tile boundaries (70, 130: ragged last tiles) and with Sq ≠ Sk.
//
// Tolerance: with h = 1e-5 the truncation error is ~h²·|∂³f| ≈ 1e-10; the
// rounding error, ε·(sum of |terms| of the loss)/h, dominates at a few 1e-9
// (measured ≤ 5e-9). 1e-7·(1+|g|) is 20× above that and far below what a
// wrong tile or mask gives (≥ 1e-3).
func TestBackwardFiniteDifference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, causal := range []bool{false, true} {
		for _, s := range []shape{
			{bh: 1, sq: 1, sk: 1, d: 4},
			{bh: 2, sq: 3, sk: 5, d: 4},
			{bh: 1, sq: 70, sk: 130, d: 8},
			{bh: 1, sq: 130, sk: 70, d: 8},
			{bh: 1, sq: 65, sk: 65, d: 16, scale: 1},
		} {
			s.causal = causal
			t.Run(s.String(), func(t *testing.T) {
				q, k, v, w := randn(rng, s.nq()), randn(rng, s.nk()), randn(rng, s.nk()), randn(rng, s.nq())
				_, dq, dk, dv := grads[float64, float64](t, s, q, k, v, w)

				o := make([]float64, s.nq())
				loss := func() float64 {
					if err := Forward(q, k, v, o, []float64(nil), s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
						t.Fatal(err)
					}
					var l float64
					for i := range o {
						l += o[i] * w[i]
					}
					return l
				}
				const h = 1e-5
				for _, tc := range []struct {
					name   string
					x, grd []float64
				}{{"dQ", q, dq}, {"dK", k, dk}, {"dV", v, dv}} {
					// All entries of small tensors, 40 random ones of large.
					idx := rng.Perm(len(tc.x))
					if len(idx) > 40 {
						idx = idx[:40]
					}
					for _, i := range idx {
						x0 := tc.x[i]
						tc.x[i] = x0 + h
						lp := loss()
						tc.x[i] = x0 - h
						lm := loss()
						tc.x[i] = x0
						fd := (lp - lm) / (2 * h)
						if err := math.Abs(fd - tc.grd[i]); !(err <= 1e-7*(1+math.Abs(fd))) {
							t.Errorf("%s[%d] = %.12g, finite difference %.12g (err %.2g)", tc.name, i, tc.grd[i], fd, err)
						}
					}
				}
			})
		}
	}
}

// TestBackwardMatchesReference compares with the composed softmax backward
// on the full S×S P. float64 with a float64 LSE must agree to 1e-10 (the
// fused-vs-unfused bar); float32 gets a float32-sized tolerance.
func TestBackwardMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, causal := range []bool{false, true} {
		for _, s := range []shape{
			{bh: 1, sq: 1, sk: 1, d: 16},
			{bh: 2, sq: 65, sk: 65, d: 16},
			{bh: 1, sq: 130, sk: 77, d: 64},
			{bh: 1, sq: 77, sk: 130, d: 128},
			{bh: 2, sq: 200, sk: 150, d: 32, scale: 1},
			{bh: 1, sq: 1037, sk: 1037, d: 64},
		} {
			s.causal = causal
			t.Run(s.String(), func(t *testing.T) {
				q, k, v, do := randn(rng, s.nq()), randn(rng, s.nk()), randn(rng, s.nk()), randn(rng, s.nq())
				wq, wk, wv, err := ReferenceBackward(q, k, v, do, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal)
				if err != nil {
					t.Fatal(err)
				}
				_, dq, dk, dv := grads[float64, float64](t, s, q, k, v, do)
				// Absolute tolerance relative to the gradients' common scale:
				// entries can be ~0 by cancellation (at Sk = 1, dQ and dK are
				// exactly 0 while their terms are O(1)), where an elementwise
				// rtol means nothing.
				gscale := max(maxAbs(wq), maxAbs(wk), maxAbs(wv))
				for _, c := range []struct {
					name      string
					got, want []float64
				}{{"dQ", dq, wq}, {"dK", dk, wk}, {"dV", dv, wv}} {
					checkClose(t, "f64 "+c.name, c.got, c.want, 1e-10*gscale, 1e-10)
				}

				q32, k32, v32, do32 := convert[float32](q), convert[float32](k), convert[float32](v), convert[float32](do)
				_, dq32, dk32, dv32 := grads[float32, float32](t, s, q32, k32, v32, do32)
				// float32: the score error is ∝ σ = scale·√d (see f32Atol) and
				// reaches dQ, dK, dV through P and dS. Measured normwise error
				// ≤ 0.65e-6·(1+σ); 3e-6·(1+σ) of the scale leaves ≥ 4× margin.
				sigma := s.getScale() * math.Sqrt(float64(s.d))
				for _, c := range []struct {
					name string
					got  []float32
					want []float64
				}{{"dQ", dq32, wq}, {"dK", dk32, wk}, {"dV", dv32, wv}} {
					checkClose(t, "f32 "+c.name, c.got, c.want, 3e-6*(1+sigma)*gscale, f32Rtol)
				}
				t.Logf("normwise error f64: dQ %.2g dK %.2g dV %.2g; f32: dQ %.2g dK %.2g dV %.2g",
					maxRelErr(dq, wq), maxRelErr(dk, wk), maxRelErr(dv, wv),
					maxRelErr(dq32, wq), maxRelErr(dk32, wk), maxRelErr(dv32, wv))
			})
		}
	}
}

// TestLSEDtype is the reason lse has its own type parameter: a float64
// backward fed a float32 logsumexp is off by ~|L|·2⁻²⁴ relative, four orders
// beyond the 1e-10 fused-vs-unfused bar; a float64 one is not.
func TestLSEDtype(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	s := shape{bh: 1, sq: 100, sk: 100, d: 16}
	q, k, v, do := randn(rng, s.nq()), randn(rng, s.nk()), randn(rng, s.nk()), randn(rng, s.nq())
	_, _, wv, err := ReferenceBackward(q, k, v, do, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal)
	if err != nil {
		t.Fatal(err)
	}
	_, _, _, dv64 := grads[float64, float64](t, s, q, k, v, do)
	_, _, _, dv32 := grads[float64, float32](t, s, q, k, v, do)
	e64, e32 := maxRelErr(dv64, wv), maxRelErr(dv32, wv)
	t.Logf("dV normwise error: float64 LSE %.2g, float32 LSE %.2g", e64, e32)
	if e64 > 1e-13 {
		t.Errorf("float64 LSE: dV error %.2g, want ≤ 1e-13", e64)
	}
	if e32 < 1e-9 {
		t.Errorf("float32 LSE: dV error %.2g; expected ~1e-7 — has the LSE precision trade-off changed?", e32)
	}
}

// Results must not depend on the number of workers: every output row is
// owned by one task and accumulated in a fixed order.
func TestDeterministicAcrossWorkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	s := shape{bh: 3, sq: 150, sk: 130, d: 16, causal: true}
	q, k, v, do := randn(rng, s.nq()), randn(rng, s.nk()), randn(rng, s.nk()), randn(rng, s.nq())
	type result struct{ o, lse, dq, dk, dv []float64 }
	runWith := func(workers int) result {
		r := result{nans[float64](s.nq()), nans[float64](s.bh * s.sq), nans[float64](s.nq()), nans[float64](s.nk()), nans[float64](s.nk())}
		if err := forward(q, k, v, r.o, r.lse, s.bh, 1, s.sq, s.sk, s.d, s.getScale(), s.causal, workers); err != nil {
			t.Fatal(err)
		}
		if err := backward(q, k, v, r.o, do, r.lse, r.dq, r.dk, r.dv, s.bh, 1, s.sq, s.sk, s.d, s.getScale(), s.causal, workers); err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := runWith(1), runWith(5)
	for _, c := range []struct {
		name string
		x, y []float64
	}{{"O", a.o, b.o}, {"LSE", a.lse, b.lse}, {"dQ", a.dq, b.dq}, {"dK", a.dk, b.dk}, {"dV", a.dv, b.dv}} {
		for i := range c.x {
			if math.Float64bits(c.x[i]) != math.Float64bits(c.y[i]) {
				t.Fatalf("%s[%d]: %v with 1 worker, %v with 5", c.name, i, c.x[i], c.y[i])
			}
		}
	}
}
