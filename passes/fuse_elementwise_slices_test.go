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
