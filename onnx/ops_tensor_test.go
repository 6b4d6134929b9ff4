package onnx

import (
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Pow with a runtime exponent of another type: a float base raised to
// int64 exponents (odd ones keep a negative base's sign), and an int64 base
// raised to float exponents, truncated back to int64 as the ONNX reference
// computes it (3^0.5 = 1.73 → 1, 10^−1 = 0.1 → 0).
func TestPowMixedTypes(t *testing.T) {
	m := modelOf(15, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 4), vi("n", onnxpb.Int64, 4), vi("k", onnxpb.Int64, 4), vi("e", onnxpb.Float, 4)},
		nil, []string{"p", "q"},
		nd("Pow", []string{"x", "n"}, []string{"p"}),
		nd("Pow", []string{"k", "e"}, []string{"q"}))
	x, n := graph.NewTensor(graph.Float32, graph.Shape{4}), graph.NewTensor(graph.Int64, graph.Shape{4})
	copy(x.F32, []float32{-2, 1.5, -1, 0.5})
	copy(n.I64, []int64{3, 2, 1_000_001, -2})
	k, e := graph.NewTensor(graph.Int64, graph.Shape{4}), graph.NewTensor(graph.Float32, graph.Shape{4})
	copy(k.I64, []int64{3, 2, 10, -8})
	copy(e.F32, []float32{0.5, 3, -1, 2})
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x, "n": n, "k": k, "e": e})
	for i, want := range []float64{-8, 2.25, -1, 4} {
		if got := out["p"].At(i); got != want {
			t.Errorf("p[%d] = %v, want %v", i, got, want)
		}
	}
	if out["q"].DType != graph.Int64 {
		t.Fatalf("q is %v, want int64 (the base's type)", out["q"].DType)
	}
	for i, want := range []int64{1, 8, 0, 64} {
		if got := out["q"].I64[i]; got != want {
			t.Errorf("q[%d] = %v, want %v", i, got, want)
		}
	}
}

// Before opset 7, PRelu's slope is one value per channel: a [C] slope
// scales channel c of X [N, C, W] (numpy broadcasting would line it up
// with W instead).
func TestPReluLegacySlope(t *testing.T) {
	m := modelOf(6, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 1, 2, 3), vi("s", onnxpb.Float, 2)}, nil, []string{"y"},
		nd("PRelu", []string{"x", "s"}, []string{"y"}))
	x, s := graph.NewTensor(graph.Float32, graph.Shape{1, 2, 3}), graph.NewTensor(graph.Float32, graph.Shape{2})
	copy(x.F32, []float32{-1, -2, 3, -1, -2, 3})
	copy(s.F32, []float32{0.5, 0.25})
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x, "s": s})
	for i, want := range []float64{-0.5, -1, 3, -0.25, -0.5, 3} {
		if got := out["y"].At(i); got != want {
			t.Errorf("y[%d] = %v, want %v", i, got, want)
		}
	}
}

// BitShift on UINT8: a left shift drops the bits past the width (200 << 1
// = 144), a right shift never leaves the range; on a signed type it is
// refused (ONNX defines it on unsigned ones).
func TestBitShiftNarrow(t *testing.T) {
	for _, c := range []struct {
		dir  string
		want []int64
	}{{"LEFT", []int64{144, 8, 0}}, {"RIGHT", []int64{100, 0, 0}}} {
		m := modelOf(11, []*onnxpb.ValueInfo{vi("x", onnxpb.Uint8, 3), vi("n", onnxpb.Uint8, 3)}, nil, []string{"y"},
			nd("BitShift", []string{"x", "n"}, []string{"y"}, aStr("direction", c.dir)))
		x, n := graph.NewTensor(graph.Int64, graph.Shape{3}), graph.NewTensor(graph.Int64, graph.Shape{3})
		copy(x.I64, []int64{200, 1, 255})
		copy(n.I64, []int64{1, 3, 8})
		_, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x, "n": n})
		for i, w := range c.want {
			if got := out["y"].I64[i]; got != w {
				t.Errorf("%s[%d] = %d, want %d", c.dir, i, got, w)
			}
		}
	}
	m := modelOf(11, []*onnxpb.ValueInfo{vi("x", onnxpb.Int32, 3), vi("n", onnxpb.Int32, 3)}, nil, []string{"y"},
		nd("BitShift", []string{"x", "n"}, []string{"y"}, aStr("direction", "LEFT")))
	if _, err := ImportModel(m, Options{}); err == nil {
		t.Error("BitShift on INT32 imported")
	}
}
