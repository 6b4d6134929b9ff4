package onnx

import (
	"errors"
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// A Reshape whose shape is a graph input: without a binding the import names
// the input in a BindError; bound, the input becomes a constant and the graph
// specialises to it.
func TestBindInput(t *testing.T) {
	m := modelOf(17, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 3), vi("s", onnxpb.Int64, 2)}, nil, []string{"y"},
		nd("Reshape", []string{"x", "s"}, []string{"y"}))
	_, err := ImportModel(m, Options{})
	var be *BindError
	if !errors.As(err, &be) || be.Input != "s" {
		t.Fatalf("import without binding: %v, want a BindError for s", err)
	}
	shape := &onnxpb.Tensor{Name: "s", DataType: onnxpb.Int64, Dims: []int64{2}, Int64Data: []int64{3, -1}}
	g, err := ImportModel(m, Options{Bind: map[string]*onnxpb.Tensor{"s": shape}})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Inputs) != 1 || g.Inputs[0].Name != "x" {
		t.Fatalf("inputs %v, want x alone", g.Inputs)
	}
	if got := g.Outputs[0].Type.Shape; !got.Equal(graph.Shape{3, 2}) {
		t.Fatalf("output shape %v, want [3 2]", got)
	}
	for name, bad := range map[string]map[string]*onnxpb.Tensor{
		"not an input": {"q": shape},
		"wrong shape":  {"s": {Name: "s", DataType: onnxpb.Int64, Dims: []int64{3}, Int64Data: []int64{3, 2, 1}}},
		"wrong type":   {"s": {Name: "s", DataType: onnxpb.Int32, Dims: []int64{2}, Int32Data: []int32{3, 2}}},
	} {
		if _, err := ImportModel(m, Options{Bind: bad}); err == nil {
			t.Errorf("%s: binding imported", name)
		}
	}
}

// LayerNormalization's Mean and InvStdDev outputs: the statistics over the
// axes from axis on, with those axes kept as 1.
func TestLayerNormStats(t *testing.T) {
	m := modelOf(17, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 3)},
		[]*onnxpb.Tensor{onnxpb.NewFloat32("s", []int64{3}, []float32{1, 2, 3})}, []string{"y", "mean", "inv"},
		nd("LayerNormalization", []string{"x", "s"}, []string{"y", "mean", "inv"}, aFloat("epsilon", 0.5)))
	x := graph.NewTensor(graph.Float32, graph.Shape{2, 3})
	for i, v := range []float64{1, 2, 6, -1, 0, 4} {
		x.Set(i, v)
	}
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
	for r := range 2 {
		a, b, c := x.At(3*r), x.At(3*r+1), x.At(3*r+2)
		mean := (a + b + c) / 3
		v := ((a-mean)*(a-mean) + (b-mean)*(b-mean) + (c-mean)*(c-mean)) / 3
		inv := 1 / math.Sqrt(v+0.5)
		if got := out["mean"]; !got.Shape.Equal(graph.Shape{2, 1}) || math.Abs(got.At(r)-mean) > 1e-6 {
			t.Errorf("mean row %d: got %v %v, want [2 1] %v", r, got.Shape, got.At(r), mean)
		}
		if got := out["inv"]; math.Abs(got.At(r)-inv) > 1e-6*inv {
			t.Errorf("inv std dev row %d: got %v, want %v", r, got.At(r), inv)
		}
		if got := out["y"].At(3*r + 2); math.Abs(got-3*(c-mean)*inv) > 1e-5 {
			t.Errorf("y row %d: got %v, want %v", r, got, 3*(c-mean)*inv)
		}
	}
}
