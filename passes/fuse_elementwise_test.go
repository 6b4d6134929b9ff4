package passes

import (
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// tinyTrainStep is the tiny model's training step with fused attention.
func tinyTrainStep(t *testing.T, dt graph.DType) *autodiff.TrainStep {
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
	ts, err := autodiff.TrainingGraph(fwd, autodiff.TrainOptions{Loss: "loss"})
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
		// RoPE's rotate-half and its gradient are read through index
		// arithmetic, the norms' row reductions run in their groups, and
		// no Expand is left for a broadcast.
		if counts["Slice"]+counts["Concat"]+counts["Neg"]+counts["ReduceMean"]+counts["Expand"] != 0 ||
			!strings.Contains(log.String(), "index_chain") {
			t.Errorf("%v: left unfused: %d Slice, %d Concat, %d Neg, %d ReduceMean, %d Expand", dt,
				counts["Slice"], counts["Concat"], counts["Neg"], counts["ReduceMean"], counts["Expand"])
		}
		// The q/k head splits are read by the norms' bodies, their
		// gradients written transposed by the norm backward's.
		if !strings.Contains(log.String(), "fired transpose_read") || !strings.Contains(log.String(), "fired transpose_write") {
			t.Errorf("%v: no head Transpose became an index step:\n%s", dt, log)
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
// read by a non-elementwise node leaves the group as an output, a row
// reduction ends the group's chain and the ops on its result join it, and a
// lone op stays as it is.
func TestFuseElementwiseGroups(t *testing.T) {
	b := graph.NewBuilder("groups")
	x := b.Input("x", graph.Float32, 4, 8)
	w := b.Input("w", graph.Float32, 8)
	s := b.Sigmoid(x)
	y := b.Mul(b.Mul(x, s), w)                                  // one group: Sigmoid, Mul, Mul
	r := b.ReduceSum(y, true, 1)                                // a row reduction of y joins the group
	z := b.Add(b.Neg(r), b.Scalar(graph.Float32, 1))            // [4,1]: after the reduction, joins too
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
	want := []string{"Sigmoid(i0);Mul(i0,t0);Mul(t1,i1);ReduceSum(t2);Neg(t3);Add(t4,i2)"}
	if strings.Join(bodies, " | ") != strings.Join(want, " | ") {
		t.Errorf("bodies %q, want %q", bodies, want)
	}
	if ops["Exp"] != 1 || ops["Sigmoid"] != 0 || ops["Neg"] != 0 || ops["ReduceSum"] != 0 {
		t.Errorf("ops after fusion: %v", ops)
	}
	for _, n := range fused.Nodes {
		if n.Op != "FusedElementwise" {
			continue
		}
		// y (read by the MatMul) and z (the output) leave the kernel; the
		// reduction's axes and keepdims move onto the node.
		if o, a := n.Attrs["outputs"].Ints, n.Attrs["axes"].Ints; !slices.Equal(o, []int64{2, 5}) || !slices.Equal(a, []int64{-1}) ||
			n.Attrs.Int("keepdims", -1) != 1 {
			t.Errorf("outputs %v axes %v keepdims %d, want [2 5] [-1] 1", o, a, n.Attrs.Int("keepdims", -1))
		}
	}
	feeds := map[string]*graph.Tensor{"x": graph.NewTensor(graph.Float32, graph.Shape{4, 8}), "w": graph.NewTensor(graph.Float32, graph.Shape{8})}
	for i := range 32 {
		feeds["x"].Set(i, float64(i%7)/3-1)
	}
	for i := range 8 {
		feeds["w"].Set(i, float64(i)/4-0.5)
	}
	sameOutputs(t, "groups", fzCPU(t, fused, feeds), fzCPU(t, g, feeds))
	// Nothing to fuse: the graph comes back as it is (byte-identical).
	b2 := graph.NewBuilder("lone")
	b2.Output(b2.Op("Exp", nil, b2.Input("x", graph.Float32, 3)))
	g2, _ := b2.Build()
	if out, err := (FuseElementwise{}).Run(g2, nil); err != nil || out != g2 {
		t.Errorf("a graph with no group of two changed (err %v)", err)
	}
}

// What a reduction does not take: a reduction over another axis than the
// last stays a node of its own (run after the group it reads, which here
// joins the open group that reads x too: the row kernel writes Exp(x) in
// its first walk for the column sum), an op that
// reads a value from before a group's reduction does not join that group,
// and an Expand read by elementwise ops that broadcast anyway is bypassed.
func TestFuseElementwiseReductionLimits(t *testing.T) {
	b := graph.NewBuilder("limits")
	x := b.Input("x", graph.Float32, 4, 8)
	e := b.Input("e", graph.Float32, 4, 8)
	sq := b.Mul(x, x)
	col := b.ReduceSum(b.Op("Exp", nil, x), true, 0) // over the first axis: stays
	m := b.ReduceMean(sq, true, 1)                   // joins sq's group
	inv := b.Reciprocal(b.Sqrt(m))                   // joins after the reduction
	big := b.Op("Expand", nil, inv, b.Ints(4, 8))    // bypassed: Mul broadcasts itself
	y := b.Mul(b.Add(sq, e), big)                    // of sq's shape after the reduction: a second walk over the row
	b.Output(col, y)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	log := &Log{}
	fused, err := (FuseElementwise{}).Run(g, log)
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
	want := []string{"Mul(i0,i0);Exp(i0);ReduceMean(t0);Sqrt(t2);Reciprocal(t3);Add(t0,i1);Mul(t5,t4)"}
	if strings.Join(bodies, " | ") != strings.Join(want, " | ") {
		t.Errorf("bodies %q, want %q", bodies, want)
	}
	if ops["ReduceSum"] != 1 || ops["Expand"] != 0 || ops["Exp"] != 0 {
		t.Errorf("ops after fusion: %v", ops)
	}
	if !strings.Contains(log.String(), "expand_to_broadcast") {
		t.Errorf("the log does not say the Expand was bypassed:\n%s", log)
	}
	feeds := map[string]*graph.Tensor{"x": graph.NewTensor(graph.Float32, graph.Shape{4, 8}), "e": graph.NewTensor(graph.Float32, graph.Shape{4, 8})}
	for i := range 32 {
		feeds["x"].Set(i, float64(i%5)/2+0.25)
		feeds["e"].Set(i, float64(i%3)-1)
	}
	sameOutputs(t, "limits", fzCPU(t, fused, feeds), fzCPU(t, g, feeds))
}

// Index chains: a Slice/Concat chain read only by an elementwise group is
// absorbed into it, along any axis and with negative bounds; a chain whose
// values something else reads (here a MatMul, or a graph output) stays.
func TestFuseElementwiseIndexChains(t *testing.T) {
	b := graph.NewBuilder("chains")
	x := b.Input("x", graph.Float32, 4, 6, 8)
	w := b.Input("w", graph.Float32, 4, 6, 8)
	// Rows 3..5 then 0..2 of axis 1 (a roll), negated first half: absorbed.
	lo := b.Slice(x, 1, 0, 3)
	hi := b.Slice(x, 1, -3, 6)
	roll := b.Concat(1, b.Neg(hi), lo)
	y := b.Mul(b.Add(roll, w), w)
	// A Slice also read by a MatMul: not absorbed.
	s := b.Slice(x, 2, 0, 4)
	z := b.MatMul(s, b.Transpose(s, 0, 2, 1))
	kept := b.Op("Exp", nil, b.Concat(2, s, b.Neg(s)))
	b.Output(y, z, kept)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	log := &Log{}
	fused, err := (FuseElementwise{}).Run(g, log)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	var bodies []string
	for _, n := range fused.Nodes {
		counts[n.Op]++
		if n.Op == "FusedElementwise" {
			bodies = append(bodies, n.Attrs["body"].S)
		}
	}
	if counts["Slice"] != 1 || counts["Concat"] != 0 {
		t.Errorf("after fusion %d Slice (want 1: the one a MatMul reads) and %d Concat (want 0); bodies %q", counts["Slice"], counts["Concat"], bodies)
	}
	if !slices.ContainsFunc(bodies, func(s string) bool { return strings.Contains(s, "Slice<1,3,6>") && strings.Contains(s, "Concat<1>") }) {
		t.Errorf("the roll along axis 1 is not in a body (negative start resolved to 3): %q", bodies)
	}
	feeds := map[string]*graph.Tensor{"x": graph.NewTensor(graph.Float32, graph.Shape{4, 6, 8}), "w": graph.NewTensor(graph.Float32, graph.Shape{4, 6, 8})}
	for i := range 4 * 6 * 8 {
		feeds["x"].Set(i, float64(i%11)/5-1)
		feeds["w"].Set(i, float64(i%7)/3-0.5)
	}
	sameOutputs(t, "chains", fzCPU(t, fused, feeds), fzCPU(t, g, feeds))
}
