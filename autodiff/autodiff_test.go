package autodiff

import (
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

func tinyConfig(t *testing.T, dt graph.DType) model.Config {
	t.Helper()
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.DType = dt
	return cfg
}

func buildModel(t *testing.T, cfg model.Config) *graph.Graph {
	t.Helper()
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func paramNames(g *graph.Graph) []string {
	var out []string
	for _, p := range g.Params {
		out = append(out, p.Name)
	}
	return out
}

// checkStatic asserts the graph is an ordinary static graph: it verifies,
// round-trips through the text format and keeps its hash.
func checkStatic(t *testing.T, g *graph.Graph) {
	t.Helper()
	if err := graph.Verify(g); err != nil {
		t.Fatal(err)
	}
	text := graph.Format(g)
	back, err := graph.Parse(text)
	if err != nil {
		t.Fatalf("parse of formatted graph: %v", err)
	}
	if graph.Format(back) != text {
		t.Fatal("Format(Parse(Format(g))) differs from Format(g)")
	}
	if back.Hash() != g.Hash() {
		t.Fatal("hash changed through the text format")
	}
}

func TestAutodiffTinyModelStructure(t *testing.T) {
	g := buildModel(t, tinyConfig(t, graph.Float32))
	before := graph.Format(g)
	gg, grads, err := Gradients(g, "loss", paramNames(g))
	if err != nil {
		t.Fatal(err)
	}
	if graph.Format(g) != before {
		t.Fatal("Gradients changed its input graph")
	}
	checkStatic(t, gg)
	vals := gg.Values()
	for _, p := range g.Params {
		name, ok := grads[p.Name]
		if !ok {
			t.Fatalf("no gradient for %s", p.Name)
		}
		if name != "grad."+p.Name {
			t.Errorf("gradient of %s is called %s", p.Name, name)
		}
		v := vals[name]
		if v == nil || !v.Type.Equal(p.Type) {
			t.Fatalf("gradient %s: %v, want type %v", name, v, p.Type)
		}
		if !gg.IsOutput(v) {
			t.Errorf("gradient %s is not an output", name)
		}
	}
	if len(gg.Outputs) != len(g.Outputs)+len(g.Params) {
		t.Errorf("%d outputs, want %d", len(gg.Outputs), len(g.Outputs)+len(g.Params))
	}
	ops := gg.CountOps()
	if ops["SoftmaxGrad"] != 2 || ops["SoftmaxCrossEntropyLossGrad"] != 1 || ops["GatherGrad"] != 1 {
		t.Errorf("backward ops: %v", ops)
	}
	// Deterministic: two runs give the same graph.
	gg2, _, err := Gradients(g, "loss", paramNames(g))
	if err != nil {
		t.Fatal(err)
	}
	if gg2.Hash() != gg.Hash() {
		t.Error("Gradients is not deterministic")
	}
}

func TestAutodiffErrors(t *testing.T) {
	b := graph.NewBuilder("e")
	x := b.Param("x", graph.Float64, graph.Shape{3}, graph.Ones())
	y := b.Op("ReduceMax", graph.Attrs{"keepdims": graph.Int(0)}, x)
	b.Output(b.Rename(y, "loss"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = Gradients(g, "loss", []string{"x"})
	if err == nil || !strings.Contains(err.Error(), "no gradient rule for op ReduceMax") {
		t.Fatalf("missing rule: got %v", err)
	}
	for _, tc := range []struct {
		loss string
		wrt  []string
		want string
	}{
		{"nope", []string{"x"}, "loss \"nope\""},
		{"loss", []string{"nope"}, "wrt \"nope\""},
		{"loss", []string{"x", "x"}, "twice"},
	} {
		if _, _, err := Gradients(g, tc.loss, tc.wrt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Gradients(%s, %v): got %v, want %q", tc.loss, tc.wrt, err, tc.want)
		}
	}
}

func TestTrainingGraphStructure(t *testing.T) {
	g := buildModel(t, tinyConfig(t, graph.Float32))
	ts, err := TrainingGraph(g, TrainOptions{WeightDecay: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	checkStatic(t, ts.Graph)
	tg := ts.Graph
	if tg.Outputs[0].Name != "loss" {
		t.Errorf("first output is %s, want loss", tg.Outputs[0].Name)
	}
	if n := tg.CountOps()["AdamW"]; n != len(g.Params) {
		t.Errorf("%d AdamW nodes, want %d", n, len(g.Params))
	}
	vals := tg.Values()
	for _, name := range []string{"lr", "step"} {
		v := vals[name]
		if v == nil || v.Kind != graph.Input || !v.Type.Equal(graph.TensorType{DType: graph.Float32, Shape: graph.Shape{}}) {
			t.Errorf("input %s: %v", name, v)
		}
	}
	if len(ts.Updates) != 3*len(g.Params) || len(tg.Outputs) != 1+3*len(g.Params) {
		t.Errorf("%d updates, %d outputs", len(ts.Updates), len(tg.Outputs))
	}
	for out, init := range ts.Updates {
		o, i := vals[out], vals[init]
		if o == nil || i == nil || !i.IsInitializer() || !o.Type.Equal(i.Type) || !tg.IsOutput(o) {
			t.Errorf("update %s -> %s: %v -> %v", out, init, o, i)
		}
	}
	for _, n := range tg.Nodes {
		if n.Op != "AdamW" {
			continue
		}
		p := n.Inputs[0]
		wd := n.Attrs.Float("weight_decay", -1)
		if want := map[bool]float64{true: 0, false: 0.1}[p.Type.Shape.Rank() == 1]; wd != want {
			t.Errorf("%s (rank %d): weight_decay %v, want %v", p.Name, p.Type.Shape.Rank(), wd, want)
		}
		if m := n.Inputs[2]; m.Name != "opt.m."+p.Name || m.Kind != graph.Const || m.Init.Fn != "zeros" {
			t.Errorf("%s: first moment %s %v", p.Name, m.Name, m.Kind)
		}
		if v := n.Inputs[3]; v.Name != "opt.v."+p.Name || v.Kind != graph.Const || v.Init.Fn != "zeros" {
			t.Errorf("%s: second moment %s %v", p.Name, v.Name, v.Kind)
		}
	}
	g64 := buildModel(t, tinyConfig(t, graph.Float64))
	ts64, err := TrainingGraph(g64, TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lr := ts64.Graph.Value("lr"); lr.Type.DType != graph.Float64 {
		t.Errorf("float64 graph: lr is %v", lr.Type)
	}
}

// TestAutodiffEdgeCases: a wrt value the loss ignores gets exact zeros; two
// wrt values whose gradients are the same cotangent (here the seed itself)
// get outputs of their own; an intermediate value can be a wrt; a value
// used twice accumulates.
func TestAutodiffEdgeCases(t *testing.T) {
	b := graph.NewBuilder("edge")
	x := b.Input("x", graph.Float64)
	y := b.Input("y", graph.Float64)
	b.Input("unused", graph.Float64, 2)
	s := b.Rename(b.Mul(x, x), "sq")
	b.Output(b.Rename(b.Add(b.Add(s, y), x), "loss"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	gg, grads, err := Gradients(g, "loss", []string{"x", "y", "unused", "sq", "loss"})
	if err != nil {
		t.Fatal(err)
	}
	checkStatic(t, gg)
	seen := map[string]bool{}
	for _, name := range grads {
		if seen[name] {
			t.Errorf("gradient value %s shared by two wrt entries", name)
		}
		seen[name] = true
	}
	scalar := func(v float64) *graph.Tensor {
		t := graph.NewTensor(graph.Float64, graph.Shape{})
		t.F64[0] = v
		return t
	}
	out := run(t, compile(t, gg, backend.Options{}), map[string]*graph.Tensor{
		"x": scalar(3), "y": scalar(-2), "unused": graph.NewTensor(graph.Float64, graph.Shape{2}),
	})
	for name, want := range map[string][]float64{"x": {7}, "y": {1}, "unused": {0, 0}, "sq": {1}, "loss": {1}} {
		got := out[grads[name]]
		if got == nil || !slices.Equal(got.F64, want) {
			t.Errorf("d loss/d %s = %v, want %v", name, got, want)
		}
	}
}

// An op whose gradient exists only in some forms says which: GatherND's
// rule is a ScatterND, which has no batch axes; LRN has no rule at all.
func TestGradientRefusalsNameTheForm(t *testing.T) {
	for _, c := range []struct {
		op, want string
		build    func(b *graph.Builder, x *graph.Value) *graph.Value
	}{
		{"GatherND", "batch_dims 1 has no gradient rule", func(b *graph.Builder, x *graph.Value) *graph.Value {
			idx := b.Const("idx", graph.Int64, graph.Shape{2, 1}, graph.Literal(1, 0))
			return b.Op("GatherND", graph.Attrs{"batch_dims": graph.Int(1)}, x, idx)
		}},
		{"LRN", "no gradient rule for op LRN", func(b *graph.Builder, x *graph.Value) *graph.Value {
			return b.Op("LRN", graph.Attrs{"size": graph.Int(3)}, x)
		}},
	} {
		b := graph.NewBuilder("e")
		x := b.Param("x", graph.Float64, graph.Shape{2, 3}, graph.Ones())
		y := c.build(b, x)
		b.Output(b.Rename(b.Op("ReduceSum", graph.Attrs{"keepdims": graph.Int(0)}, y), "loss"))
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := Gradients(g, "loss", []string{"x"}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.op, err, c.want)
		}
	}
}
