package passes

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// TestFuseElementwiseQKVSlicesInPlace: in the tiny step with fuse_qkv (as
// train builds it: fuse_qkv on the forward, disjoint_sums on the step),
// every Slice of the merged q/k/v product is read in place by its bodies
// (slice_read; v's head Transpose becomes a body), and the Concat of dq,
// dk and dv is written by one body (concat_write). Left: per layer the
// three Slices of the merged weight gradient (AdamW reads each whole) and
// the Concat of the three weights (a GEMM operand). The CPU runs the
// rewritten bodies step by step: every output is bit-identical to the
// step before fusion's.
func TestFuseElementwiseQKVSlicesInPlace(t *testing.T) {
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pl := Default(true)
	pl.Passes = append(pl.Passes, FuseQKV())
	if fwd, err = pl.Run(fwd, nil); err != nil {
		t.Fatal(err)
	}
	ts, err := autodiff.TrainingGraph(fwd, autodiff.TrainOptions{Loss: "loss"})
	if err != nil {
		t.Fatal(err)
	}
	if ts.Graph, err = DisjointSums().Run(ts.Graph, nil); err != nil {
		t.Fatal(err)
	}
	log := &Log{}
	fused, err := (FuseElementwise{}).Run(ts.Graph, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := graph.Verify(fused); err != nil {
		t.Fatal(err)
	}
	before, after := ts.Graph.CountOps(), fused.CountOps()
	t.Logf("before fusion %d Slice, %d Concat; after %d Slice, %d Concat", before["Slice"], before["Concat"], after["Slice"], after["Concat"])
	if want := 3 * cfg.Layers; after["Slice"] != want {
		t.Errorf("%d Slices left, want %d (the weight gradients')", after["Slice"], want)
	}
	if want := cfg.Layers; after["Concat"] != want {
		t.Errorf("%d Concats left, want %d (the weights')", after["Concat"], want)
	}
	for _, n := range fused.Nodes {
		switch n.Op {
		case "Slice":
			if !strings.HasPrefix(n.Outputs[0].Name, "grad.") {
				t.Errorf("Slice %s of %s left", n.Name, n.Inputs[0].Name)
			}
		case "Concat":
			if n.Inputs[0].Kind != graph.Param {
				t.Errorf("Concat %s of %s left", n.Name, n.Inputs[0].Name)
			}
		}
	}
	s := log.String()
	if got := strings.Count(s, "fired slice_read"); got != 3*cfg.Layers {
		t.Errorf("slice_read fired %d times, want %d:\n%s", got, 3*cfg.Layers, s)
	}
	if got := strings.Count(s, "fired concat_write"); got != cfg.Layers {
		t.Errorf("concat_write fired %d times, want %d:\n%s", got, cfg.Layers, s)
	}
	// What stays says why.
	if !strings.Contains(s, "refused slice_read: read by opt/") || !strings.Contains(s, "refused concat_write: no input is made by a body") {
		t.Errorf("no refusal for the weight gradient's Slices or the weights' Concat:\n%s", s)
	}
	text := graph.Format(fused)
	back, err := graph.Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	if graph.Format(back) != text {
		t.Fatal("Parse(Format(fused)) differs from fused")
	}
	feeds := stepFeeds(ts, 7)
	sameOutputs(t, "fuse_qkv step, fuse_elementwise", fzCPU(t, fused, feeds), fzCPU(t, ts.Graph, feeds))
}

// slice_read and concat_write on a small graph: a Slice read by a body
// (two merged siblings, one reading it twice) and a lone Transpose goes;
// one also read by a Transpose that moves the last axis (for a MatMul), or
// that is a graph output, stays and says why. A Concat of a body's result,
// a Transpose only it reads and a value others read too becomes one body;
// a Concat of graph inputs stays. Every output is the same as before fusion.
func TestFuseElementwiseSliceReadAndConcatWrite(t *testing.T) {
	b := graph.NewBuilder("slices")
	x := b.Input("x", graph.Float32, 2, 5, 6, 8)
	w := b.Input("w", graph.Float32, 8)
	// Heads 1..3 of x: read by two bodies and a head Transpose.
	s := b.Slice(x, 2, 1, 3)
	a := b.Mul(b.Add(s, w), s)
	c := b.Op("Exp", nil, b.Mul(s, w))
	v := b.Op("Softmax", graph.Attrs{"axis": graph.Int(-1)}, b.Transpose(s, 0, 2, 1, 3))
	// Heads 3..5: also read by a MatMul.
	m := b.Slice(x, 2, 3, 5)
	mm := b.MatMul(m, b.Transpose(m, 0, 1, 3, 2))
	e := b.Neg(b.Mul(m, w))
	// Heads 0..1: a graph output.
	o := b.Slice(x, 2, 0, 1)
	f := b.Sigmoid(b.Mul(o, w))
	// A Concat of a body's result, a Transpose only it reads and an input.
	y := b.Input("y", graph.Float32, 2, 2, 5, 8)
	cat := b.Concat(2, b.Op("Tanh", nil, b.Mul(b.Transpose(y, 0, 2, 1, 3), w)), b.Transpose(y, 0, 2, 1, 3), a)
	// A Concat of graph inputs.
	cat2 := b.Concat(1, x, x)
	b.Output(c, v, mm, e, o, f, cat, cat2)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	log := &Log{}
	fused, err := (FuseElementwise{}).Run(g, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := graph.Verify(fused); err != nil {
		t.Fatal(err)
	}
	counts := fused.CountOps()
	if counts["Slice"] != 2 || counts["Concat"] != 1 {
		t.Errorf("%d Slices (want 2: read by a MatMul, a graph output), %d Concats (want 1: of inputs) left:\n%s", counts["Slice"], counts["Concat"], graph.Format(fused))
	}
	text := log.String()
	for _, want := range []string{
		"fired slice_read", "which needs it contiguous", "the slice is a graph output",
		"fired concat_write -> fused/Concat_0",
		"fired concat_write", "refused concat_write: no input is made by a body",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("log lacks %q:\n%s", want, text)
		}
	}
	feeds := map[string]*graph.Tensor{
		"x": graph.NewTensor(graph.Float32, graph.Shape{2, 5, 6, 8}),
		"w": graph.NewTensor(graph.Float32, graph.Shape{8}),
		"y": graph.NewTensor(graph.Float32, graph.Shape{2, 2, 5, 8}),
	}
	for name, f := range feeds {
		for i := range f.Len() {
			f.Set(i, float64((i*7+len(name))%13)/6-1)
		}
	}
	sameOutputs(t, "slices", fzCPU(t, fused, feeds), fzCPU(t, g, feeds))
}
