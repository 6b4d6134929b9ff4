package backendtest

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// The reference is checked on its own: hand-worked examples, and every
// gradient formula against central finite differences of its forward
// reference, so that the suite cannot agree with a backend on a wrong answer.

func randArr(r *rand.Rand, shape ...int) *arr {
	a := newArr(shape...)
	for i := range a.data {
		a.data[i] = r.NormFloat64()
	}
	return a
}

func dot(a, b *arr) float64 {
	var s float64
	for i := range a.data {
		s += a.data[i] * b.data[i]
	}
	return s
}

// fdCheck compares grad with the central difference of f at x.
func fdCheck(t *testing.T, name string, x *arr, f func() float64, grad *arr) {
	t.Helper()
	const h = 1e-6
	for i := range x.data {
		old := x.data[i]
		x.data[i] = old + h
		up := f()
		x.data[i] = old - h
		down := f()
		x.data[i] = old
		fd := (up - down) / (2 * h)
		if math.Abs(fd-grad.data[i]) > 1e-6*(1+math.Abs(fd)) {
			t.Fatalf("%s[%d]: analytic %v, finite difference %v", name, i, grad.data[i], fd)
		}
	}
}

func TestRefAttentionGradFiniteDifference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, causal := range []bool{false, true} {
		q, k, v := randArr(r, 2, 5, 3), randArr(r, 2, 7, 3), randArr(r, 2, 7, 3)
		dy := randArr(r, 2, 5, 3)
		const scale = 0.7
		loss := func() float64 {
			y, _ := refAttention(q, k, v, scale, causal)
			return dot(y, dy)
		}
		dq, dk, dv := refAttentionGrad(q, k, v, dy, scale, causal)
		fdCheck(t, "dQ", q, loss, dq)
		fdCheck(t, "dK", k, loss, dk)
		fdCheck(t, "dV", v, loss, dv)
		y, lse := refAttention(q, k, v, scale, causal)
		dq2, dk2, dv2 := refAttentionGradFrom(q, k, v, y, lse, dy, scale, causal)
		for _, p := range [][2]*arr{{dq, dq2}, {dk, dk2}, {dv, dv2}} {
			for i := range p[0].data {
				if math.Abs(p[0].data[i]-p[1].data[i]) > 1e-13 {
					t.Fatalf("causal=%v: gradient from Y and L differs: %v vs %v", causal, p[0].data[i], p[1].data[i])
				}
			}
		}
	}
}

func TestRefAttentionIsSoftmaxOfMaskedScores(t *testing.T) {
	// One head, Sq = Sk = 2, causal: row 0 sees only key 0, so y0 = v0.
	q := &arr{[]int{1, 2, 1}, []float64{1, 2}}
	k := &arr{[]int{1, 2, 1}, []float64{3, 4}}
	v := &arr{[]int{1, 2, 1}, []float64{5, 6}}
	y, lse := refAttention(q, k, v, 1, true)
	p0 := math.Exp(6) / (math.Exp(6) + math.Exp(8))
	want := []float64{5, p0*5 + (1-p0)*6}
	for i := range want {
		if math.Abs(y.data[i]-want[i]) > 1e-14 {
			t.Fatalf("y = %v, want %v", y.data, want)
		}
	}
	if math.Abs(lse.data[0]-3) > 1e-14 || math.Abs(lse.data[1]-math.Log(math.Exp(6)+math.Exp(8))) > 1e-14 {
		t.Fatalf("lse = %v", lse.data)
	}
}

func TestRefSoftmaxGradFiniteDifference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, axis := range []int{0, 1, -1} {
		x, dy := randArr(r, 3, 4, 2), randArr(r, 3, 4, 2)
		loss := func() float64 { return dot(refSoftmax(x, axis, false), dy) }
		fdCheck(t, "dX", x, loss, refSoftmaxGrad(refSoftmax(x, axis, false), dy, axis))
	}
}

func TestRefSCEGradFiniteDifference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	s := randArr(r, 4, 3)
	labels := &arr{[]int{4}, []float64{0, 2, 2, 1}}
	for _, red := range []string{"mean", "sum"} {
		loss := func() float64 { return 1.7 * refSCE(s, labels, red).data[0] }
		fdCheck(t, "dScores/"+red, s, loss, refSCEGrad(1.7, s, labels, red))
	}
}

func TestRefGatherGradIsAdjoint(t *testing.T) {
	// <Gather(x), dy> = <x, GatherGrad(dy)> for every x, dy.
	r := rand.New(rand.NewPCG(7, 8))
	x := randArr(r, 3, 4, 2)
	idx := &arr{[]int{2, 3}, []float64{0, -1, 3, 3, 1, -4}}
	y := refGather(x, idx, 1)
	if !slices.Equal(y.shape, []int{3, 2, 3, 2}) {
		t.Fatalf("gather shape %v", y.shape)
	}
	dy := randArr(r, y.shape...)
	if a, b := dot(y, dy), dot(x, refGatherGrad(dy, idx, 1, x.shape)); math.Abs(a-b) > 1e-12 {
		t.Fatalf("not adjoint: %v vs %v", a, b)
	}
}

func TestRefSliceExamples(t *testing.T) {
	x := newArr(7)
	for i := range x.data {
		x.data[i] = float64(i)
	}
	for _, c := range []struct {
		starts, ends, steps []int
		want                []float64
	}{
		{[]int{-1}, []int{-1000}, []int{-2}, []float64{6, 4, 2, 0}},
		{[]int{1}, []int{1000}, []int{3}, []float64{1, 4}},
		{[]int{-3}, []int{-1}, nil, []float64{4, 5}},
		{[]int{5}, []int{2}, nil, nil},
		{[]int{100}, []int{0}, []int{-1}, []float64{6, 5, 4, 3, 2, 1}},
	} {
		got := refSlice(x, c.starts, c.ends, []int{0}, c.steps)
		if !slices.Equal(got.data, c.want) && !(len(got.data) == 0 && len(c.want) == 0) {
			t.Errorf("slice %v:%v:%v = %v, want %v", c.starts, c.ends, c.steps, got.data, c.want)
		}
	}
}

func TestRefMatMulExamples(t *testing.T) {
	a := &arr{[]int{2, 2}, []float64{1, 2, 3, 4}}
	v := &arr{[]int{2}, []float64{5, 6}}
	if got := refMatMul(a, v); !slices.Equal(got.shape, []int{2}) || !slices.Equal(got.data, []float64{17, 39}) {
		t.Errorf("A@v = %v", got)
	}
	if got := refMatMul(v, a); !slices.Equal(got.shape, []int{2}) || !slices.Equal(got.data, []float64{23, 34}) {
		t.Errorf("v@A = %v", got)
	}
	if got := refMatMul(v, v); len(got.shape) != 0 || got.data[0] != 61 {
		t.Errorf("v@v = %v", got)
	}
	// Batch broadcasting: [2,1,2,2] @ [3,2,2] -> [2,3,2,2].
	b := newArr(3, 2, 2)
	for i := range b.data {
		b.data[i] = float64(i)
	}
	big := &arr{[]int{2, 1, 2, 2}, []float64{1, 0, 0, 1, 2, 0, 0, 2}}
	got := refMatMul(big, b)
	if !slices.Equal(got.shape, []int{2, 3, 2, 2}) || got.at(1, 2, 1, 0) != 2*b.at(2, 1, 0) {
		t.Errorf("batched matmul: shape %v, [1,2,1,0] = %v", got.shape, got.at(1, 2, 1, 0))
	}
}

// refAttentionGrad differentiates attention by hand, from the full P (the
// textbook softmax backward, not FlashAttentionGrad's recomputation from L):
// dV = Pᵀ·dY, dP = dY·Vᵀ, dS = P∘(dP − rowsum(dP∘P)), dQ = scale·dS·K,
// dK = scale·dSᵀ·Q. q is [H, Sq, D], k and v [H, Sk, D].
func refAttentionGrad(q, k, v, dy *arr, scale float64, causal bool) (dq, dk, dv *arr) {
	heads, sq, d, sk := q.shape[0], q.shape[1], q.shape[2], k.shape[1]
	// P = softmax over keys of the masked scaled scores.
	s := refMatMul(q, refTranspose(k, []int{0, 2, 1}))
	for h := range heads {
		for i := range sq {
			for j := range sk {
				s.data[(h*sq+i)*sk+j] *= scale
				if causal && j > i {
					s.data[(h*sq+i)*sk+j] = math.Inf(-1)
				}
			}
		}
	}
	p := refSoftmax(s, -1, false)
	dq, dk, dv = newArr(q.shape...), newArr(k.shape...), newArr(v.shape...)
	for h := range heads {
		for i := range sq {
			dp := make([]float64, sk)
			var rs float64
			for j := range sk {
				for t := range d {
					dp[j] += dy.data[(h*sq+i)*d+t] * v.data[(h*sk+j)*d+t]
				}
				rs += dp[j] * p.data[(h*sq+i)*sk+j]
			}
			for j := range sk {
				pij := p.data[(h*sq+i)*sk+j]
				ds := pij * (dp[j] - rs)
				for t := range d {
					dv.data[(h*sk+j)*d+t] += pij * dy.data[(h*sq+i)*d+t]
					dq.data[(h*sq+i)*d+t] += scale * ds * k.data[(h*sk+j)*d+t]
					dk.data[(h*sk+j)*d+t] += scale * ds * q.data[(h*sq+i)*d+t]
				}
			}
		}
	}
	return dq, dk, dv
}
