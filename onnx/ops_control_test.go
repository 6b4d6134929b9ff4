package onnx

import (
	"errors"
	"slices"
	"strings"
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

// graphAttr is a GRAPH attribute holding nodes with the given input and
// output names.
func graphAttr(name string, inputs, outputs []string, nodes ...*onnxpb.Node) *onnxpb.Attribute {
	g := &onnxpb.Graph{Node: nodes}
	for _, in := range inputs {
		g.Input = append(g.Input, &onnxpb.ValueInfo{Name: in})
	}
	for _, o := range outputs {
		g.Output = append(g.Output, &onnxpb.ValueInfo{Name: o})
	}
	return &onnxpb.Attribute{Name: name, Type: onnxpb.AttrGraph, G: g}
}

// A Loop of trip count 10 whose condition (iteration < 3, folded each
// iteration) ends it after four iterations: y doubles four times and the
// scan output stacks 2y, 4y, 8y, 16y. A condition computed from a runtime
// value is refused.
func TestLoopUnrolls(t *testing.T) {
	body := graphAttr("body", []string{"i", "c_in", "y_in"}, []string{"c_out", "y_out", "s"},
		nd("Add", []string{"y_in", "y_in"}, []string{"y_out"}),
		nd("Less", []string{"i", "three"}, []string{"c_out"}),
		nd("Identity", []string{"y_out"}, []string{"s"}))
	inits := []*onnxpb.Tensor{onnxpb.NewInt64("M", nil, []int64{10}), onnxpb.NewBool("cond", nil, []bool{true}), onnxpb.NewInt64("three", nil, []int64{3})}
	m := modelOf(13, []*onnxpb.ValueInfo{vi("y", onnxpb.Float, 2)}, inits, []string{"y_final", "stacked"},
		nd("Loop", []string{"M", "cond", "y"}, []string{"y_final", "stacked"}, body))
	y := graph.NewTensor(graph.Float32, graph.Shape{2})
	copy(y.F32, []float32{1, -3})
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"y": y})
	for i, v := range y.F32 {
		if got := out["y_final"].F32[i]; got != 16*v {
			t.Errorf("y_final[%d] = %v, want %v", i, got, 16*v)
		}
	}
	if s := out["stacked"]; !s.Shape.Equal(graph.Shape{4, 2}) || s.F32[0] != 2 || s.F32[7] != -48 {
		t.Errorf("stacked = %v %v, want [4 2] from 2y to 16y", s.Shape, s.F32)
	}
	body.G.Node[1] = nd("ReduceSum", []string{"y_in"}, []string{"sum"}, aInt("keepdims", 0))
	body.G.Node = append(body.G.Node, nd("Greater", []string{"sum", "zero"}, []string{"c_out"}))
	m.Graph.Initializer = append(m.Graph.Initializer, onnxpb.NewFloat32("zero", nil, []float32{0}))
	if _, err := ImportModel(m, Options{}); err == nil || !strings.Contains(err.Error(), "computed at run time") {
		t.Errorf("a loop with a runtime condition: %v, want a refusal naming it", err)
	}
}

// Scan (opset 11) over a [3, 2] input read in reverse, the running sum
// stacked on output axis 1: z[:, k] = s + x[2] + ... + x[2−k].
func TestScanUnrolls(t *testing.T) {
	body := graphAttr("body", []string{"s_in", "x_t"}, []string{"s_out", "z_t"},
		nd("Add", []string{"s_in", "x_t"}, []string{"s_out"}),
		nd("Identity", []string{"s_out"}, []string{"z_t"}))
	m := modelOf(11, []*onnxpb.ValueInfo{vi("s", onnxpb.Float, 2), vi("x", onnxpb.Float, 3, 2)}, nil, []string{"final", "z"},
		nd("Scan", []string{"s", "x"}, []string{"final", "z"}, body, aInt("num_scan_inputs", 1),
			aInts("scan_input_directions", 1), aInts("scan_output_axes", 1)))
	s, x := graph.NewTensor(graph.Float32, graph.Shape{2}), graph.NewTensor(graph.Float32, graph.Shape{3, 2})
	copy(s.F32, []float32{10, 20})
	copy(x.F32, []float32{1, 2, 3, 4, 5, 6})
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"s": s, "x": x})
	if got := out["final"].F32; got[0] != 19 || got[1] != 32 {
		t.Errorf("final = %v, want [19 32]", got)
	}
	// Reversed: x[2] = (5, 6) first, then (3, 4), then (1, 2).
	want := []float32{15, 18, 19, 26, 30, 32}
	if z := out["z"]; !z.Shape.Equal(graph.Shape{2, 3}) || !slices.Equal(z.F32, want) {
		t.Errorf("z = %v %v, want [2 3] %v", z.Shape, z.F32, want)
	}
}

// Sequences are import-time lists: built, edited at known positions and
// turned back into tensors; one used where a tensor is wanted is refused.
func TestSequenceLists(t *testing.T) {
	inits := []*onnxpb.Tensor{onnxpb.NewInt64("one", nil, []int64{1}), onnxpb.NewInt64("neg", nil, []int64{-1})}
	m := modelOf(13, []*onnxpb.ValueInfo{vi("a", onnxpb.Float, 2), vi("b", onnxpb.Float, 2), vi("x", onnxpb.Float, 5, 2)}, inits,
		[]string{"cat", "n", "last"},
		nd("SequenceConstruct", []string{"a", "b"}, []string{"s1"}),
		nd("SequenceInsert", []string{"s1", "b", "one"}, []string{"s2"}), // a, b, b
		nd("SequenceErase", []string{"s2", "neg"}, []string{"s3"}),       // a, b
		nd("SequenceInsert", []string{"s3", "a"}, []string{"s4"}),        // a, b, a
		nd("ConcatFromSequence", []string{"s4"}, []string{"cat"}, aInt("axis", 0), aInt("new_axis", 1)),
		nd("SplitToSequence", []string{"x", "two"}, []string{"parts"}, aInt("axis", 0)),
		nd("SequenceLength", []string{"parts"}, []string{"n"}),
		nd("SequenceAt", []string{"parts", "neg"}, []string{"last"}))
	m.Graph.Initializer = append(m.Graph.Initializer, onnxpb.NewInt64("two", nil, []int64{2}))
	a, b, x := graph.NewTensor(graph.Float32, graph.Shape{2}), graph.NewTensor(graph.Float32, graph.Shape{2}), graph.NewTensor(graph.Float32, graph.Shape{5, 2})
	copy(a.F32, []float32{1, 2})
	copy(b.F32, []float32{3, 4})
	for i := range x.F32 {
		x.F32[i] = float32(i)
	}
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"a": a, "b": b, "x": x})
	if c := out["cat"]; !c.Shape.Equal(graph.Shape{3, 2}) || !slices.Equal(c.F32, []float32{1, 2, 3, 4, 1, 2}) {
		t.Errorf("cat = %v %v, want [3 2] a, b, a", c.Shape, c.F32)
	}
	// Chunks of 2 rows of 5: 3 parts, the last of one row.
	if n := out["n"]; n.I64[0] != 3 {
		t.Errorf("n = %v, want 3", n.I64)
	}
	if l := out["last"]; !l.Shape.Equal(graph.Shape{1, 2}) || !slices.Equal(l.F32, []float32{8, 9}) {
		t.Errorf("last = %v %v, want [1 2] [8 9]", l.Shape, l.F32)
	}
	m.Graph.Node = append(m.Graph.Node, nd("Relu", []string{"s4"}, []string{"bad"}))
	m.Graph.Output = append(m.Graph.Output, &onnxpb.ValueInfo{Name: "bad"})
	if _, err := ImportModel(m, Options{}); err == nil || !strings.Contains(err.Error(), "is a sequence") {
		t.Errorf("Relu of a sequence: %v, want a refusal naming the sequence", err)
	}
}

// A Loop body may hold an If reading the body's values: each unrolled
// iteration imports its own copy of the branch (fresh names, so nothing is
// defined twice). Iterations 0 and 1 negate x, iteration 2 doubles it.
func TestLoopBodyWithIf(t *testing.T) {
	then := graphAttr("then_branch", nil, []string{"twice"}, nd("Add", []string{"x_in", "x_in"}, []string{"twice"}))
	els := graphAttr("else_branch", nil, []string{"neg"}, nd("Neg", []string{"x_in"}, []string{"neg"}))
	body := graphAttr("body", []string{"i", "c", "x_in"}, []string{"c_out", "x_out"},
		nd("Identity", []string{"c"}, []string{"c_out"}),
		nd("Greater", []string{"i", "one"}, []string{"late"}),
		nd("If", []string{"late"}, []string{"x_out"}, then, els))
	m := modelOf(13, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 3)},
		[]*onnxpb.Tensor{onnxpb.NewInt64("n", nil, []int64{3}), onnxpb.NewInt64("one", nil, []int64{1})}, []string{"y"},
		nd("Loop", []string{"n", "", "x"}, []string{"y"}, body))
	x := graph.NewTensor(graph.Float32, graph.Shape{3})
	copy(x.F32, []float32{1, -2, 0.5})
	g, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
	if ops := g.CountOps(); ops["Neg"] != 2 || ops["Add"] != 1 {
		t.Errorf("ops %v, want two Negs and one Add", ops)
	}
	for i, v := range x.F32 {
		if got := out["y"].F32[i]; got != 2*v {
			t.Errorf("y[%d] = %v, want %v", i, got, 2*v)
		}
	}
}
