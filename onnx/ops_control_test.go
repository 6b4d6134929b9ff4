package onnx

import (
	"errors"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// An If whose condition folds from a static shape (x has 2 rows) imports
// the then branch in place: its nodes read x from the outer graph and its
// output is the If's. A condition computed from a runtime value asks for
// that input to be bound.
func TestIfInlinesKnownBranch(t *testing.T) {
	branch := func(op string) *onnxpb.Attribute {
		return &onnxpb.Attribute{Type: onnxpb.AttrGraph, G: &onnxpb.Graph{
			Node:   []*onnxpb.Node{nd(op, []string{"x", "x"}, []string{op + "_out"})},
			Output: []*onnxpb.ValueInfo{{Name: op + "_out"}},
		}}
	}
	then, els := branch("Mul"), branch("Add")
	then.Name, els.Name = "then_branch", "else_branch"
	m := modelOf(13, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 3)},
		[]*onnxpb.Tensor{onnxpb.NewInt64("two", nil, []int64{2}), onnxpb.NewInt64("zero", nil, []int64{0})}, []string{"y"},
		nd("Shape", []string{"x"}, []string{"s"}),
		nd("Gather", []string{"s", "zero"}, []string{"rows"}),
		nd("Equal", []string{"rows", "two"}, []string{"cond"}),
		nd("If", []string{"cond"}, []string{"y"}, then, els))
	x := graph.NewTensor(graph.Float32, graph.Shape{2, 3})
	copy(x.F32, []float32{1, 2, 3, -1, 0.5, 4})
	g, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
	if ops := g.CountOps(); ops["Mul"] != 1 || ops["Add"] != 0 {
		t.Errorf("ops %v, want the then branch's Mul alone", ops)
	}
	for i, v := range x.F32 {
		if got := out["y"].F32[i]; got != v*v {
			t.Errorf("y[%d] = %v, want %v", i, got, v*v)
		}
	}

	// A condition only known at run time.
	m.Graph.Node[2] = nd("Greater", []string{"x", "x"}, []string{"cond"})
	m.Graph.Node = m.Graph.Node[2:]
	_, err := ImportModel(m, Options{})
	var be *BindError
	if !errors.As(err, &be) || be.Input != "x" {
		t.Errorf("runtime condition: %v, want a BindError for x", err)
	}
}
