package graph

import (
	"strings"
	"testing"
)

// negChain builds x -> Neg -> Neg -> output, the smallest graph with a use
// between two nodes.
func negChain(t *testing.T) *Graph {
	t.Helper()
	b := NewBuilder("g")
	x := b.Input("x", Float32, 2)
	b.Output(b.Neg(b.Neg(x)))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Hand-made broken graphs: Verify names the problem and never panics.
func TestVerifyRefusesBrokenGraphs(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(g *Graph)
		want   string
	}{
		{"nil node", func(g *Graph) { g.Nodes = append(g.Nodes, nil) }, "node 2 is nil"},
		{"cycle by node order", func(g *Graph) { g.Nodes[0], g.Nodes[1] = g.Nodes[1], g.Nodes[0] }, "input 0 Neg_0 is not defined before use"},
		{"output owned by another node", func(g *Graph) { g.Nodes[1].Outputs[0].Producer = g.Nodes[0] }, "node Neg_1 (Neg): output 0 is not owned by the node"},
		{"nil node output", func(g *Graph) { g.Nodes[1].Outputs[0] = nil }, "output 0 is not owned by the node"},
		{"nil required input", func(g *Graph) { g.Nodes[1].Inputs[0] = nil }, "Neg input 0 (X) is required"},
		{"nil graph output", func(g *Graph) { g.Outputs = []*Value{nil} }, "graph output <nil> is not defined"},
		{"no outputs", func(g *Graph) { g.Outputs = nil }, "graph has no outputs"},
		{"unknown value kind", func(g *Graph) { g.Inputs[0].Kind = 9 }, "kind(9) x is listed as a input"},
		{"unknown dtype", func(g *Graph) { g.Inputs[0].Type.DType = 77 }, "input x has invalid dtype"},
		{"negative dim", func(g *Graph) { g.Inputs[0].Type.Shape = Shape{-1} }, "shape [-1] has a negative dim"},
		{"unknown op", func(g *Graph) { g.Nodes[0].Op = "Frobnicate" }, `unknown op "Frobnicate"`},
		{"same value name twice", func(g *Graph) { g.Nodes[1].Outputs[0].Name = "x" }, `name "x" used twice`},
		{"stale output type", func(g *Graph) { g.Nodes[0].Outputs[0].Type.Shape = Shape{3} }, "declared float32[3], inferred float32[2]"},
	}
	for _, c := range cases {
		g := negChain(t)
		c.mutate(g)
		err := Verify(g)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if err := Verify(nil); err == nil {
		t.Error("Verify(nil) passed")
	}
}

// Shape inference multiplies dims it is given; a product past MaxElements
// must be an error, not a wrapped-around (possibly "valid") shape.
func TestInferredShapesAreChecked(t *testing.T) {
	b := NewBuilder("g")
	empty := b.Input("empty", Float32, 0)
	b.Output(b.Reshape(empty, 1<<32, 1<<32)) // 2^64 elements wrap to 0 == 0
	if _, err := b.Build(); err == nil || !strings.Contains(err.Error(), "Reshape output 0: shape [4294967296,4294967296] has more than 2^48 elements") {
		t.Errorf("Reshape to 2^64 elements: %v", err)
	}
	b = NewBuilder("g")
	one := b.Input("one", Float32, 1)
	b.Output(b.Op("Expand", nil, one, b.Ints(1<<40, 1<<40)))
	if _, err := b.Build(); err == nil || !strings.Contains(err.Error(), "Expand output 0: shape [1099511627776,1099511627776] has more than 2^48 elements") {
		t.Errorf("Expand to 2^80 elements: %v", err)
	}
}

func TestBuilderMisuseIsAnError(t *testing.T) {
	b := NewBuilder("g")
	b.Pop()
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "Pop without a matching Push") {
		t.Errorf("Pop without Push: %v", err)
	}
	b = NewBuilder("g")
	b.Rename(nil, "y")
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "rename nil value") {
		t.Errorf("Rename(nil): %v", err)
	}
	b = NewBuilder("g")
	b.Neg(nil)
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "Neg input 0 (X) is required") {
		t.Errorf("Neg(nil): %v", err)
	}
	other := NewBuilder("other").Input("x", Float32, 2)
	b = NewBuilder("g")
	b.Output(b.Neg(other))
	if _, err := b.Build(); err == nil || !strings.Contains(err.Error(), "input 0 x is not defined before use") {
		t.Errorf("value of another builder: %v", err)
	}
}

// ONNX writes INT64_MAX for "slice to the end"; as a float64 it is 2^63,
// which Go's int64 conversion turns into MinInt64 on amd64 (an empty slice).
func TestInt64LiteralsSaturate(t *testing.T) {
	text := "flashgraph 1\ngraph g\ninput x: float32[2,3]\n" +
		"const s: int64[1] = literal(0)\nconst e: int64[1] = literal(9223372036854775807)\n" +
		"node n = Slice(x, s, e, s) -> n: float32[2,3]\noutput n\n"
	if _, err := Parse(text); err != nil {
		t.Fatalf("Slice to INT64_MAX: %v", err)
	}
	for _, c := range []struct {
		v    float64
		want int64
	}{{1 << 63, 1<<63 - 1}, {-1 << 63, -1 << 63}, {1e300, 1<<63 - 1}, {-7.9, -7}, {7.9, 7}} {
		tt := NewTensor(Int64, Shape{1})
		tt.Set(0, c.v)
		if tt.I64[0] != c.want {
			t.Errorf("Set(%g) = %d, want %d", c.v, tt.I64[0], c.want)
		}
	}
	for _, lit := range []string{"nan", "1.5"} {
		text := "flashgraph 1\ngraph g\ninput x: float32[2]\nconst c: int64[1] = literal(" + lit + ")\nnode n = Neg(x) -> n: float32[2]\noutput n\n"
		if _, err := Parse(text); err == nil || !strings.Contains(err.Error(), "line 4: const c: int64 literal value 0 ("+lit+") is not an integer") {
			t.Errorf("int64 literal %s: %v", lit, err)
		}
	}
}
