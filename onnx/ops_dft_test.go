package onnx

import (
	"fmt"
	"math"
	"math/cmplx"
	"math/rand/v2"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// TestDFTForms checks DFT against the sum Σ x[n]·e^(∓2πikn/L) (÷L when
// inverse) over a signal axis of [2, 5, 3, c]: complex and real input, the
// signal zero-padded (L > N) and cut (L < N), onesided, inverse, on either
// signal axis.
func TestDFTForms(t *testing.T) {
	for _, c := range []struct {
		axis, length       int
		complex, inv, half bool
	}{
		{1, 5, true, false, false},
		{1, 8, true, true, false},
		{2, 2, false, false, false},
		{1, 6, false, false, true},
		{2, 3, true, true, false},
	} {
		name := fmt.Sprintf("axis%d_L%d_complex%v_inverse%v_onesided%v", c.axis, c.length, c.complex, c.inv, c.half)
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, uint64(c.length)))
			shape := []int{2, 5, 3}
			ch := 1
			if c.complex {
				ch = 2
			}
			x := graph.NewTensor(graph.Float64, graph.Shape{2, 5, 3, ch})
			for i := range x.Len() {
				x.F64[i] = rng.NormFloat64()
			}
			attrs := []*onnxpb.Attribute{aInt("axis", int64(c.axis))}
			if c.inv {
				attrs = append(attrs, aInt("inverse", 1))
			}
			if c.half {
				attrs = append(attrs, aInt("onesided", 1))
			}
			m := modelOf(17, []*onnxpb.ValueInfo{vi("x", onnxpb.Double, 2, 5, 3, int64(ch))},
				[]*onnxpb.Tensor{onnxpb.NewInt64("L", nil, []int64{int64(c.length)})}, []string{"y"},
				nd("DFT", []string{"x", "L"}, []string{"y"}, attrs...))
			_, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
			y := out["y"]
			k := c.length
			if c.half {
				k = c.length/2 + 1
			}
			want := graph.Shape{2, 5, 3, 2}
			want[c.axis] = k
			if !y.Shape.Equal(want) {
				t.Fatalf("shape %v, want %v", y.Shape, want)
			}
			at := func(i []int) complex128 {
				p := ((i[0]*5+i[1])*3 + i[2]) * ch
				if c.complex {
					return complex(x.F64[p], x.F64[p+1])
				}
				return complex(x.F64[p], 0)
			}
			sign := -1.0
			if c.inv {
				sign = 1
			}
			idx := make([]int, 3)
			for p := range y.Len() / 2 {
				rest := p
				for d := 2; d >= 0; d-- {
					idx[d] = rest % want[d]
					rest /= want[d]
				}
				f := idx[c.axis]
				var s complex128
				for n := range min(shape[c.axis], c.length) {
					src := append([]int(nil), idx...)
					src[c.axis] = n
					s += at(src) * cmplx.Exp(complex(0, sign*2*math.Pi*float64(f*n)/float64(c.length)))
				}
				if c.inv {
					s /= complex(float64(c.length), 0)
				}
				if math.Abs(y.F64[2*p]-real(s)) > 1e-12 || math.Abs(y.F64[2*p+1]-imag(s)) > 1e-12 {
					t.Fatalf("y at %v = %v%+vi, want %v", idx, y.F64[2*p], y.F64[2*p+1], s)
				}
			}
		})
	}
}
