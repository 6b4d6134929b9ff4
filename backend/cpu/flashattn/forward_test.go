package flashattn

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// forwardShapes cover: a single element, Sq≠Sk both ways, sizes one below,
// at and above the 64 tile, several tiles with a ragged last one, 1037
// (16 full tiles + 13), D ∈ {16, 64, 128}, and scale 1 at D=64 (score std 8)
// so the running max really moves between K/V blocks and the rescaling by
// exp(m_old − m_new) is exercised with factors far from 1.
func forwardShapes() []shape {
	var ss []shape
	for _, causal := range []bool{false, true} {
		for _, s := range []shape{
			{bh: 1, sq: 1, sk: 1, d: 16},
			{bh: 2, sq: 1, sk: 5, d: 16},
			{bh: 2, sq: 5, sk: 1, d: 16},
			{bh: 3, sq: 63, sk: 63, d: 16},
			{bh: 1, sq: 64, sk: 64, d: 64},
			{bh: 2, sq: 65, sk: 65, d: 64},
			{bh: 1, sq: 130, sk: 77, d: 128},
			{bh: 1, sq: 77, sk: 130, d: 128},
			{bh: 2, sq: 200, sk: 150, d: 64, scale: 1},
			{bh: 1, sq: 1037, sk: 1037, d: 16},
			{bh: 1, sq: 1037, sk: 1037, d: 64},
			{bh: 1, sq: 1037, sk: 1037, d: 128},
		} {
			s.causal = causal
			ss = append(ss, s)
		}
	}
	return ss
}

// f32Atol is the absolute tolerance for float32 outputs of s. The float32
// error of a score is ~√d·2⁻²⁴·|q||k|·scale, i.e. proportional to the score's
// typical magnitude σ = scale·√d (unit-normal inputs), and exp turns it into
// that relative error of P, hence of O (|O| ≲ max|v| ≈ 4). Measured worst
// |ΔO|: 3.8e-7 at σ = 1, 3.3e-6 at σ = 8; atol = 1e-6·(1+σ) leaves 3–5×
// margin, while a wrong block or rescale is off by > 1e-2.
func f32Atol(s shape) float64 { return 1e-6 * (1 + s.getScale()*math.Sqrt(float64(s.d))) }

// f32Rtol: LSE ≈ ln Sk + max score is ≤ ~40 here; its float32 rounding alone
// is 6e-8 relative, and measured errors stay below 1e-7.
const f32Rtol = 1e-5

func TestForwardMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range forwardShapes() {
		t.Run(s.String(), func(t *testing.T) {
			q, k, v := randn(rng, s.nq()), randn(rng, s.nk()), randn(rng, s.nk())
			wantO, wantL, err := Reference(q, k, v, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal)
			if err != nil {
				t.Fatal(err)
			}

			o, lse := nans[float64](s.nq()), nans[float64](s.bh*s.sq)
			if err := Forward(q, k, v, o, lse, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
				t.Fatal(err)
			}
			checkClose(t, "f64 O", o, wantO, 1e-12, 1e-12)
			checkClose(t, "f64 LSE", lse, wantL, 1e-12, 1e-12)

			q32, k32, v32 := convert[float32](q), convert[float32](k), convert[float32](v)
			o32, lse32 := nans[float32](s.nq()), nans[float32](s.bh*s.sq)
			if err := Forward(q32, k32, v32, o32, lse32, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
				t.Fatal(err)
			}
			checkClose(t, "f32 O", o32, wantO, f32Atol(s), f32Rtol)
			checkClose(t, "f32 LSE", lse32, wantL, f32Atol(s), f32Rtol)
			t.Logf("normwise error: f64 O %.2g LSE %.2g; f32 O %.2g LSE %.2g",
				maxRelErr(o, wantO), maxRelErr(lse, wantL), maxRelErr(o32, wantO), maxRelErr(lse32, wantL))
		})
	}
}

// With lse nil only O is written (inference); O must be the same as with it.
func TestForwardWithoutLSE(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := shape{bh: 2, sq: 70, sk: 90, d: 16, causal: true}
	q, k, v := randn(rng, s.nq()), randn(rng, s.nk()), randn(rng, s.nk())
	o1, o2 := nans[float64](s.nq()), nans[float64](s.nq())
	if err := Forward(q, k, v, o1, make([]float32, s.bh*s.sq), s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
		t.Fatal(err)
	}
	if err := Forward(q, k, v, o2, []float32(nil), s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
		t.Fatal(err)
	}
	for i := range o1 {
		if o1[i] != o2[i] {
			t.Fatalf("O[%d] = %v with lse, %v without", i, o1[i], o2[i])
		}
	}
}

// No visible key (Sk = 0): O = 0 and LSE = +Inf, not NaN; the backward pass
// then gives dQ = 0.
func TestNoVisibleKeys(t *testing.T) {
	for _, causal := range []bool{false, true} {
		bh, sq, d := 2, 70, 8
		q := randn(rand.New(rand.NewPCG(5, 6)), bh*sq*d)
		o, lse := nans[float64](bh*sq*d), nans[float64](bh*sq)
		if err := Forward(q, nil, nil, o, lse, bh, sq, 0, d, 1, causal); err != nil {
			t.Fatal(err)
		}
		for i, x := range o {
			if x != 0 {
				t.Fatalf("causal=%v: O[%d] = %v, want 0", causal, i, x)
			}
		}
		for i, x := range lse {
			if !math.IsInf(x, 1) {
				t.Fatalf("causal=%v: LSE[%d] = %v, want +Inf", causal, i, x)
			}
		}
		dq := nans[float64](bh * sq * d)
		if err := Backward(q, nil, nil, o, q, lse, dq, nil, nil, bh, sq, 0, d, 1, causal); err != nil {
			t.Fatal(err)
		}
		for i, x := range dq {
			if x != 0 {
				t.Fatalf("causal=%v: dQ[%d] = %v, want 0", causal, i, x)
			}
		}
	}
}

// Scores of −Inf (from infinite inputs) in a whole K/V block must not poison
// the row with exp(−Inf − (−Inf)) = NaN: later finite blocks still count.
func TestInfiniteScoresBlock(t *testing.T) {
	sq, sk, d := 1, 130, 1
	q := []float64{1}
	k := make([]float64, sk)
	v := make([]float64, sk)
	for j := range k {
		k[j] = math.Inf(-1) // first two blocks: score −Inf
		v[j] = 100
	}
	k[129], v[129] = 0, 7 // the only finite score, in the last block
	o, lse := nans[float64](1), nans[float64](1)
	if err := Forward(q, k, v, o, lse, 1, sq, sk, d, 1, false); err != nil {
		t.Fatal(err)
	}
	if o[0] != 7 || lse[0] != 0 {
		t.Fatalf("O = %v, LSE = %v; want 7, 0", o[0], lse[0])
	}
}

// The float32 path accepts named types (~float32); it reinterprets slices
// for gonum's Sgemm, which must not change results.
func TestNamedElementTypes(t *testing.T) {
	type f32 float32
	type f64 float64
	rng := rand.New(rand.NewPCG(7, 8))
	s := shape{bh: 1, sq: 100, sk: 80, d: 16, causal: true}
	q, k, v := randn(rng, s.nq()), randn(rng, s.nk()), randn(rng, s.nk())
	want, wantL, _ := Reference(q, k, v, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal)

	o := nans[f32](s.nq())
	lse := nans[f64](s.bh * s.sq)
	if err := Forward(convert[f32](q), convert[f32](k), convert[f32](v), o, lse, s.bh, s.sq, s.sk, s.d, s.getScale(), s.causal); err != nil {
		t.Fatal(err)
	}
	checkClose(t, "O", o, want, f32Atol(s), f32Rtol)
	checkClose(t, "LSE", lse, wantL, f32Atol(s), f32Rtol)
}

func TestInvalidInputs(t *testing.T) {
	const bh, sq, sk, d = 2, 3, 4, 5
	q, k, v, o := make([]float64, bh*sq*d), make([]float64, bh*sk*d), make([]float64, bh*sk*d), make([]float64, bh*sq*d)
	lse := make([]float32, bh*sq)
	type call struct {
		name string
		err  error
	}
	var calls []call
	fwd := func(name string, q, k, v, o []float64, lse []float32, bh, sq, sk, d int, scale float64) {
		calls = append(calls, call{"Forward " + name, Forward(q, k, v, o, lse, bh, sq, sk, d, scale, true)})
	}
	fwd("short q", q[1:], k, v, o, lse, bh, sq, sk, d, 1)
	fwd("long k", q, append(k, 0), v, o, lse, bh, sq, sk, d, 1)
	fwd("short v", q, k, v[:3], o, lse, bh, sq, sk, d, 1)
	fwd("nil o", q, k, v, nil, lse, bh, sq, sk, d, 1)
	fwd("short lse", q, k, v, o, lse[1:], bh, sq, sk, d, 1)
	fwd("d=0", q, k, v, o, lse, bh, sq, sk, 0, 1)
	fwd("negative sq", q, k, v, o, lse, bh, -sq, sk, d, 1)
	fwd("negative bh", q, k, v, o, lse, -1, sq, sk, d, 1)
	fwd("overflow", q, k, v, o, lse, math.MaxInt/2, sq, sk, d, 1)
	fwd("NaN scale", q, k, v, o, lse, bh, sq, sk, d, math.NaN())
	fwd("Inf scale", q, k, v, o, lse, bh, sq, sk, d, math.Inf(1))

	dq, dk, dv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	bwd := func(name string, do, dq, dk, dv []float64, lse []float32, d int) {
		calls = append(calls, call{"Backward " + name, Backward(q, k, v, o, do, lse, dq, dk, dv, bh, sq, sk, d, 1, false)})
	}
	bwd("short do", o[2:], dq, dk, dv, lse, d)
	bwd("nil lse", o, dq, dk, dv, nil, d)
	bwd("short dq", o, dq[1:], dk, dv, lse, d)
	bwd("short dk", o, dq, dk[1:], dv, lse, d)
	bwd("long dv", o, dq, dk, append(dv, 1), lse, d)
	bwd("d=-1", o, dq, dk, dv, lse, -1)

	_, _, err := Reference(q[1:], k, v, bh, sq, sk, d, 1, false)
	calls = append(calls, call{"Reference short q", err})
	_, _, _, err = ReferenceBackward(q, k, v, nil, bh, sq, sk, d, 1, false)
	calls = append(calls, call{"ReferenceBackward nil do", err})

	for _, c := range calls {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
		} else if !errors.Is(c.err, ErrShape) && c.name != "Forward NaN scale" && c.name != "Forward Inf scale" {
			t.Errorf("%s: error %q does not wrap ErrShape", c.name, c.err)
		}
	}
}
