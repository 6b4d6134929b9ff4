package flashattn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// shape is one attention problem.
type shape struct {
	bh, sq, sk, d int
	causal        bool
	scale         float64 // 0 means 1/√d
}

func (s shape) String() string {
	return fmt.Sprintf("bh%d_sq%d_sk%d_d%d_causal=%v_scale=%g", s.bh, s.sq, s.sk, s.d, s.causal, s.getScale())
}

func (s shape) getScale() float64 {
	if s.scale != 0 {
		return s.scale
	}
	return 1 / math.Sqrt(float64(s.d))
}

func (s shape) nq() int { return s.bh * s.sq * s.d }
func (s shape) nk() int { return s.bh * s.sk * s.d }

// randn returns n standard normal values rounded to float32, so one float64
// reference serves float32 and float64 runs on bit-identical inputs.
func randn(rng *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = float64(float32(rng.NormFloat64()))
	}
	return x
}

func convert[T, U Float](x []U) []T {
	y := make([]T, len(x))
	for i, v := range x {
		y[i] = T(v)
	}
	return y
}

// nans returns a slice poisoned with NaN, so any element a kernel forgets to
// write shows up as a failure.
func nans[T Float](n int) []T {
	x := make([]T, n)
	for i := range x {
		x[i] = T(math.NaN())
	}
	return x
}

// checkClose fails t unless |got−want| ≤ atol + rtol·|want| element-wise
// (NaN never passes; equal infinities do).
func checkClose[T Float](t *testing.T, name string, got []T, want []float64, atol, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: length %d, want %d", name, len(got), len(want))
	}
	worst, worstI, bad := 0.0, -1, 0
	for i, w := range want {
		g := float64(got[i])
		if g == w {
			continue
		}
		err := math.Abs(g - w)
		lim := atol + rtol*math.Abs(w)
		if !(err <= lim) {
			bad++
		}
		if r := err / lim; !(r <= worst) {
			worst, worstI = r, i
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d/%d elements out of tolerance (atol %g, rtol %g); worst [%d] got %v want %v (%.3g× the limit)",
			name, bad, len(want), atol, rtol, worstI, float64(got[worstI]), want[worstI], worst)
	}
}

// maxRelErr is max|got−want| / max|want|: a normwise error that is not
// dominated by elements that happen to be near 0.
func maxRelErr[T Float](got []T, want []float64) float64 {
	var e, m float64
	for i, w := range want {
		e = max(e, math.Abs(float64(got[i])-w))
		m = max(m, math.Abs(w))
	}
	if m == 0 {
		return e
	}
	return e / m
}

func maxAbs(x []float64) float64 {
	var m float64
	for _, v := range x {
		m = max(m, math.Abs(v))
	}
	return m
}
