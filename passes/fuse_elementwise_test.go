package passes

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// tinyTrainStep is the tiny model's training step with fused attention.
func tinyTrainStep(t *testing.T, dt graph.DType) *TrainStep {
	t.Helper()
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.DType = dt
	fwd, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fwd, err = Default(true).Run(fwd, nil); err != nil {
		t.Fatal(err)
	}
	ts, err := TrainingGraph(fwd, TrainOptions{Loss: "loss"})
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// The fused training step computes exactly what the step as built does: the
// CPU runs each body op by op with the ops' own kernels, and a recomputed
// value is the same ops on the same inputs, so every output and every updated
// parameter is bit-identical.
func TestFuseElementwiseKeepsTheStepBitExact(t *testing.T) {
	for _, dt := range []graph.DType{graph.Float32, graph.Float64} {
		ts := tinyTrainStep(t, dt)
		log := &Log{}
		fused, err := (FuseElementwise{}).Run(ts.Graph, log)
		if err != nil {
			t.Fatal(err)
		}
		if err := graph.Verify(fused); err != nil {
			t.Fatal(err)
		}
		counts := map[string]int{}
		for _, n := range fused.Nodes {
			counts[n.Op]++
		}
		if counts["FusedElementwise"] < 20 {
			t.Fatalf("%v: only %d FusedElementwise nodes in the tiny step", dt, counts["FusedElementwise"])
		}
		if len(fused.Nodes) >= len(ts.Graph.Nodes) {
			t.Errorf("%v: %d nodes after fusion, %d before", dt, len(fused.Nodes), len(ts.Graph.Nodes))
		}
		if !strings.Contains(log.String(), "recomputed") {
			t.Errorf("%v: no value was rematerialised:\n%s", dt, log)
		}
		// NoRemat fuses the same way and copies nothing.
		log2 := &Log{}
		kept, err := (FuseElementwise{NoRemat: true}).Run(ts.Graph, log2)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(log2.String(), "recomputed") || strings.Contains(graph.Format(kept), "remat/") {
			t.Errorf("%v: NoRemat still recomputed values", dt)
		}
		// The text format carries the bodies: the fused graph round-trips.
		text := graph.Format(fused)
		back, err := graph.Parse(text)
		if err != nil {
			t.Fatal(err)
		}
		if graph.Format(back) != text {
			t.Fatal("Parse(Format(fused)) differs from fused")
		}

		feeds := stepFeeds(ts, uint64(dt))
		sameOutputs(t, dt.String()+" fuse_elementwise", fzCPU(t, fused, feeds), fzCPU(t, ts.Graph, feeds))
	}
}

// Groups follow values: ops of one shape that feed each other fuse, a value
// read by a non-elementwise node leaves the group as an output, an op of
// another shape starts its own group, and a lone op stays as it is.
func TestFuseElementwiseGroups(t *testing.T) {
	b := graph.NewBuilder("groups")
	x := b.Input("x", graph.Float32, 4, 8)
	w := b.Input("w", graph.Float32, 8)
	s := b.Sigmoid(x)
	y := b.Mul(b.Mul(x, s), w)                                  // one group: Sigmoid, Mul, Mul
	r := b.ReduceSum(y, true, 1)                                // reads y: y is an output of the group
	z := b.Add(b.Neg(r), b.Scalar(graph.Float32, 1))            // [4,1]: another group
	lone := b.Op("Exp", nil, b.MatMul(y, b.Transpose(y, 1, 0))) // a single Exp stays
	b.Output(z, lone)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	fused, err := (FuseElementwise{}).Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	var bodies []string
	ops := map[string]int{}
	for _, n := range fused.Nodes {
		ops[n.Op]++
		if n.Op == "FusedElementwise" {
			bodies = append(bodies, n.Attrs["body"].S)
		}
	}
	want := []string{"Sigmoid(i0);Mul(i0,t0);Mul(t1,i1)", "Neg(i0);Add(t0,i1)"}
	if strings.Join(bodies, " | ") != strings.Join(want, " | ") {
		t.Errorf("bodies %q, want %q", bodies, want)
	}
	if ops["Exp"] != 1 || ops["Sigmoid"] != 0 || ops["Neg"] != 0 {
		t.Errorf("ops after fusion: %v", ops)
	}
	// Nothing to fuse: the graph comes back as it is (byte-identical).
	b2 := graph.NewBuilder("lone")
	b2.Output(b2.Op("Exp", nil, b2.Input("x", graph.Float32, 3)))
	g2, _ := b2.Build()
	if out, err := (FuseElementwise{}).Run(g2, nil); err != nil || out != g2 {
		t.Errorf("a graph with no group of two changed (err %v)", err)
	}
}
