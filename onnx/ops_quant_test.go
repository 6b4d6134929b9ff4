package onnx

import (
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// QuantizeLinear rounds halves to even and saturates to the zero point's
// type; DequantizeLinear undoes the affine map; MatMulInteger subtracts a
// per-row zero point before the exact integer product.
func TestQuantizeForms(t *testing.T) {
	u8 := func(name string, v ...int32) *onnxpb.Tensor {
		return &onnxpb.Tensor{Name: name, DataType: onnxpb.Uint8, Dims: []int64{int64(len(v))}, Int32Data: v}
	}
	i8 := func(name string, v ...int32) *onnxpb.Tensor {
		return &onnxpb.Tensor{Name: name, DataType: onnxpb.Int8, Int32Data: v}
	}
	m := modelOf(13, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 6), vi("a", onnxpb.Uint8, 2, 3), vi("b", onnxpb.Uint8, 3, 2)},
		[]*onnxpb.Tensor{onnxpb.NewFloat32("one", nil, []float32{1}), onnxpb.NewFloat32("half", nil, []float32{0.5}),
			i8("zm3", -3), u8("azp", 1, 2)},
		[]string{"q", "qi", "d", "p"},
		nd("QuantizeLinear", []string{"x", "one"}, []string{"q"}),
		nd("QuantizeLinear", []string{"x", "half", "zm3"}, []string{"qi"}),
		nd("DequantizeLinear", []string{"qi", "half", "zm3"}, []string{"d"}),
		nd("MatMulInteger", []string{"a", "b", "azp"}, []string{"p"}))
	x := graph.NewTensor(graph.Float32, graph.Shape{6})
	copy(x.F32, []float32{-1, 0.5, 1.5, 2.5, 300, -70})
	a := &graph.Tensor{DType: graph.Int64, Shape: graph.Shape{2, 3}, I64: []int64{1, 2, 3, 255, 0, 2}}
	b := &graph.Tensor{DType: graph.Int64, Shape: graph.Shape{3, 2}, I64: []int64{1, 0, 0, 1, 200, 7}}
	g, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x, "a": a, "b": b})
	// uint8: −1 saturates to 0, 0.5 and 2.5 round to even, 300 saturates.
	if want := []int64{0, 0, 2, 2, 255, 0}; !slices.Equal(out["q"].I64, want) {
		t.Errorf("q = %v, want %v", out["q"].I64, want)
	}
	// int8 with scale 0.5 and zero point −3: x/0.5 − 3, in [−128, 127].
	if want := []int64{-5, -2, 0, 2, 127, -128}; !slices.Equal(out["qi"].I64, want) {
		t.Errorf("qi = %v, want %v", out["qi"].I64, want)
	}
	if want := []float32{-1, 0.5, 1.5, 2.5, 65, -62.5}; !slices.Equal(out["d"].F32, want) {
		t.Errorf("d = %v, want %v", out["d"].F32, want)
	}
	// Rows minus their zero points (1, 2): [0 1 2] and [253 −2 0].
	if want := []int64{400, 15, 253, -2}; !slices.Equal(out["p"].I64, want) {
		t.Errorf("p = %v, want %v", out["p"].I64, want)
	}
	if g.ElemTypes["q"] != "uint8" || g.ElemTypes["qi"] != "int8" || g.ElemTypes["p"] != "int32" {
		t.Errorf("declared types %v, want q uint8, qi int8, p int32", g.ElemTypes)
	}
}
