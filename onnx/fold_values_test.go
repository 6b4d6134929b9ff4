package onnx

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// A window whose size is computed from a graph input (a Cast, then a
// Sub): the import names that input, not the node's own operand, and bound
// it folds the whole chain. The symmetric Hann window of 5 is
// 0.5 − 0.5·cos(2πk/4).
func TestBindThroughComputedOperand(t *testing.T) {
	m := modelOf(17, []*onnxpb.ValueInfo{vi("n", onnxpb.Int64)},
		[]*onnxpb.Tensor{{Name: "one", DataType: onnxpb.Int64, Int64Data: []int64{1}}}, []string{"w"},
		nd("Add", []string{"n", "one"}, []string{"n1"}),
		nd("HannWindow", []string{"n1"}, []string{"w"}, aInt("periodic", 0)))
	_, err := ImportModel(m, Options{})
	var be *BindError
	if !errors.As(err, &be) || be.Input != "n" {
		t.Fatalf("import without binding: %v, want a BindError for n", err)
	}
	g, out := importAndRunBound(t, m, map[string]*onnxpb.Tensor{"n": {Name: "n", DataType: onnxpb.Int64, Int64Data: []int64{4}}})
	if len(g.Inputs) != 0 {
		t.Errorf("inputs %v, want none", g.Inputs)
	}
	w := out["w"]
	for k := range 5 {
		if want := 0.5 - 0.5*math.Cos(2*math.Pi*float64(k)/4); math.Abs(w.At(k)-want) > 1e-7 {
			t.Errorf("w[%d] = %v, want %v", k, w.At(k), want)
		}
	}
}

// Unique along an axis in order of first occurrence (sorted=0), with its
// indices, inverse indices and counts, and NonZero's coordinates, each
// folded once the input is bound.
func TestFoldUniqueNonZero(t *testing.T) {
	x := onnxpb.NewFloat32("x", []int64{2, 4}, []float32{1, 0, 1, 0, 2, 3, 2, 3})
	m := modelOf(17, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 4)}, nil, []string{"y", "i", "inv", "cnt", "nz"},
		nd("Unique", []string{"x"}, []string{"y", "i", "inv", "cnt"}, aInt("axis", -1), aInt("sorted", 0)),
		nd("NonZero", []string{"x"}, []string{"nz"}))
	_, out := importAndRunBound(t, m, map[string]*onnxpb.Tensor{"x": x})
	// Columns (1,2), (0,3), (1,2), (0,3): two distinct, (1,2) first.
	for name, want := range map[string][]float64{
		"y": {1, 0, 2, 3}, "i": {0, 1}, "inv": {0, 1, 0, 1}, "cnt": {2, 2},
		"nz": {0, 0, 1, 1, 1, 1, 0, 2, 0, 1, 2, 3},
	} {
		got := out[name]
		var vals []float64
		for k := range got.Len() {
			vals = append(vals, got.At(k))
		}
		if !slices.Equal(vals, want) {
			t.Errorf("%s = %v, want %v", name, vals, want)
		}
	}
	if !out["y"].Shape.Equal(graph.Shape{2, 2}) || !out["nz"].Shape.Equal(graph.Shape{2, 6}) {
		t.Errorf("shapes y %v, nz %v; want [2 2] and [2 6]", out["y"].Shape, out["nz"].Shape)
	}
}

// importAndRunBound imports m with bind and runs it with no feeds.
func importAndRunBound(t *testing.T, m *onnxpb.Model, bind map[string]*onnxpb.Tensor) (*graph.Graph, map[string]*graph.Tensor) {
	t.Helper()
	g, err := ImportModel(m, Options{Bind: bind})
	if err != nil {
		t.Fatal(err)
	}
	return g, runGraph(t, g, nil)
}
