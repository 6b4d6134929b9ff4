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

// The tensor ops of the table export as the ONNX ops of their names and
// import back as built (attributes of every kind, int64 BitShift, MaxPool's
// Indices output).
func TestRoundTripTensorOps(t *testing.T) {
	b := graph.NewBuilder("tensor_ops")
	x := b.Input("x", graph.Float32, 2, 3, 4, 4)
	ids := b.Input("ids", graph.Int64, 2, 5)
	cs := b.Op("CumSum", graph.Attrs{"exclusive": graph.Int(1), "reverse": graph.Int(1)}, x, b.Ints(-1))
	gnd := b.Op("GatherND", graph.Attrs{"batch_dims": graph.Int(1)}, cs, b.Const("gi", graph.Int64, graph.Shape{2, 1}, graph.Literal(2, 0)))
	snd := b.Op("ScatterND", graph.Attrs{"reduction": graph.Str("mul")}, x, b.Const("si", graph.Int64, graph.Shape{1, 2}, graph.Literal(1, 2)), b.Input("u", graph.Float32, 1, 4, 4))
	rs := b.Op("ReverseSequence", graph.Attrs{"batch_axis": graph.Int(0), "time_axis": graph.Int(1)}, snd, b.Const("lens", graph.Int64, graph.Shape{2}, graph.Literal(3, 1)))
	// Pads and dilations spelled out: the window ops import them explicit.
	pool := b.OpN("MaxPool", graph.Attrs{"kernel_shape": graph.Ints(2, 2), "strides": graph.Ints(2, 2), "storage_order": graph.Int(1),
		"pads": graph.Ints(0, 0, 0, 0), "dilations": graph.Ints(1, 1)}, rs)
	un := b.Op("MaxUnpool", graph.Attrs{"kernel_shape": graph.Ints(2, 2), "strides": graph.Ints(2, 2)}, pool[0], pool[1])
	lrn := b.Op("LRN", graph.Attrs{"size": graph.Int(3), "alpha": graph.Float(0.25)}, un)
	det := b.Op("Det", nil, lrn)
	gs := b.Op("GridSample", graph.Attrs{"mode": graph.Str("bicubic"), "padding_mode": graph.Str("reflection")}, x, b.Input("grid", graph.Float32, 2, 3, 3, 2))
	ra := b.Op("RoiAlign", graph.Attrs{"mode": graph.Str("max"), "output_height": graph.Int(2)}, x, b.Input("rois", graph.Float32, 3, 4), b.Const("bi", graph.Int64, graph.Shape{3}, graph.Literal(0, 1, 1)))
	tf := b.Op("TfIdfVectorizer", graph.Attrs{"mode": graph.Str("TFIDF"), "min_gram_length": graph.Int(1), "max_gram_length": graph.Int(2), "max_skip_count": graph.Int(1),
		"ngram_counts": graph.Ints(0, 2), "ngram_indexes": graph.Ints(1, 0, 2), "pool_int64s": graph.Ints(4, 7, 4, 7), "weights": graph.Floats(0.5, 1.25, 3)}, ids)
	sh := b.Op("BitShift", graph.Attrs{"direction": graph.Str("RIGHT")}, ids, b.Const("n", graph.Int64, graph.Shape{}, graph.Literal(2)))
	b.Output(gnd, det, gs, ra, tf, sh)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, g)
}

// Reshape with allowzero=1 and a literal 0: the output has no elements, a
// constant of the target shape; an input with elements cannot take it.
func TestReshapeAllowZero(t *testing.T) {
	model := func(in ...int64) *onnxpb.Model {
		return modelOf(14, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, in...)},
			[]*onnxpb.Tensor{onnxpb.NewInt64("s", []int64{3}, []int64{4, 0, 3})}, []string{"y"},
			nd("Reshape", []string{"x", "s"}, []string{"y"}, aInt("allowzero", 1)))
	}
	g, err := ImportModel(model(0, 4, 3), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if y := g.Outputs[0]; !y.Type.Shape.Equal(graph.Shape{4, 0, 3}) || y.Kind != graph.Const {
		t.Errorf("y is %v %v, want a constant of shape [4 0 3]", y.Kind, y.Type)
	}
	if _, err := ImportModel(model(2, 6), Options{}); err == nil {
		t.Error("12 elements reshaped to [4 0 3]: imported")
	}
}
