package graph

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func tensorF64(shape Shape, v ...float64) *Tensor {
	t := NewTensor(Float64, shape)
	copy(t.F64, v)
	return t
}

func tensorI64(shape Shape, v ...int64) *Tensor {
	t := NewTensor(Int64, shape)
	copy(t.I64, v)
	return t
}

func TestEveryOpHasEval(t *testing.T) {
	for _, s := range Ops() {
		if s.Eval == nil {
			t.Errorf("op %s has no Eval", s.QualifiedName())
		}
	}
}

func TestEvalExamples(t *testing.T) {
	a := tensorF64(Shape{2, 2}, 1, 2, 3, 4)
	v := tensorF64(Shape{2}, 5, 6)
	for _, c := range []struct {
		op    string
		attrs Attrs
		in    []*Tensor
		want  []float64
		shape Shape
	}{
		{"MatMul", nil, []*Tensor{a, v}, []float64{17, 39}, Shape{2}},
		{"MatMul", nil, []*Tensor{v, a}, []float64{23, 34}, Shape{2}},
		{"MatMul", nil, []*Tensor{v, v}, []float64{61}, Shape{}},
		{"Add", nil, []*Tensor{a, v}, []float64{6, 8, 8, 10}, Shape{2, 2}},
		{"Transpose", nil, []*Tensor{a}, []float64{1, 3, 2, 4}, Shape{2, 2}},
		{"ReduceSum", Attrs{"keepdims": Int(0)}, []*Tensor{a, tensorI64(Shape{1}, 0)}, []float64{4, 6}, Shape{2}},
		{"Trilu", Attrs{"upper": Int(0)}, []*Tensor{a}, []float64{1, 0, 3, 4}, Shape{2, 2}},
		{"Slice", nil, []*Tensor{v, tensorI64(Shape{1}, -1), tensorI64(Shape{1}, -3), nil, tensorI64(Shape{1}, -1)},
			[]float64{6, 5}, Shape{2}},
		{"Gather", nil, []*Tensor{a, tensorI64(Shape{1}, -1)}, []float64{3, 4}, Shape{1, 2}},
		{"Div", nil, []*Tensor{tensorI64(Shape{2}, 7, -7), tensorI64(Shape{}, 2)}, []float64{3, -3}, Shape{2}},
	} {
		out, err := Eval(c.op, c.attrs, c.in...)
		if err != nil {
			t.Errorf("%s: %v", c.op, err)
			continue
		}
		got := make([]float64, out[0].Len())
		for i := range got {
			got[i] = out[0].At(i)
		}
		if !out[0].Shape.Equal(c.shape) || !slices.Equal(got, c.want) {
			t.Errorf("%s = %v%v, want %v%v", c.op, out[0].Shape, got, c.shape, c.want)
		}
	}
}

// Int64 arithmetic is exact beyond 2^53, where float64 would round.
func TestEvalInt64IsExact(t *testing.T) {
	big := int64(1)<<60 + 1
	out, err := Eval("Add", nil, tensorI64(Shape{}, big), tensorI64(Shape{}, 2))
	if err != nil || out[0].I64[0] != big+2 {
		t.Fatalf("Add = %v, %v; want %d", out, err, big+2)
	}
}

func TestEvalErrors(t *testing.T) {
	for _, c := range []struct {
		op   string
		in   []*Tensor
		want string
	}{
		{"Div", []*Tensor{tensorI64(Shape{1}, 1), tensorI64(Shape{1}, 0)}, "integer division by zero"},
		{"Gather", []*Tensor{tensorF64(Shape{2}, 1, 2), tensorI64(Shape{1}, 2)}, "out of range"},
		{"SoftmaxCrossEntropyLoss", []*Tensor{tensorF64(Shape{1, 2}, 1, 2), tensorI64(Shape{1}, 5)}, "out of range"},
		{"NoSuchOp", nil, "unknown op"},
		{"Add", []*Tensor{tensorF64(Shape{1}, 1)}, "takes 2 inputs"},
	} {
		_, err := Eval(c.op, nil, c.in...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.op, err, c.want)
		}
	}
}

// Results are rounded once to the output dtype: 1/3 in float32.
func TestEvalRoundsToOutputDType(t *testing.T) {
	x := NewTensor(Float32, Shape{})
	x.F32[0] = 3
	out, err := Eval("Reciprocal", nil, x)
	if err != nil || out[0].F32[0] != float32(1.0/3) {
		t.Fatalf("Reciprocal(3) = %v, %v", out, err)
	}
	if y, _ := Eval("Exp", nil, tensorF64(Shape{}, 1)); y[0].F64[0] != math.E {
		t.Fatalf("Exp(1) = %v", y[0].F64[0])
	}
}
