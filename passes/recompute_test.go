package passes

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// stepFeeds are random tokens and targets, a small learning rate and step 1.
func stepFeeds(ts *autodiff.TrainStep, seed uint64) map[string]*graph.Tensor {
	feeds := map[string]*graph.Tensor{}
	r := rand.New(rand.NewPCG(seed, 7))
	for _, in := range ts.Graph.Inputs {
		x := graph.NewTensor(in.Type.DType, in.Type.Shape)
		for i := range x.Len() {
			switch {
			case in.Type.DType == graph.Int64:
				x.Set(i, float64(r.IntN(256)))
			case in.Name == ts.Step:
				x.Set(i, 1)
			default:
				x.Set(i, 1e-3)
			}
		}
		feeds[in.Name] = x
	}
	return feeds
}

// sameOutputs fails unless got and want hold the same outputs bit for bit.
func sameOutputs(t *testing.T, what string, got, want map[string]*graph.Tensor) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d outputs, want %d", what, len(got), len(want))
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Fatalf("%s: no output %s", what, name)
		}
		if g.Len() != w.Len() {
			t.Fatalf("%s: output %s has %d elements, want %d", what, name, g.Len(), w.Len())
		}
		for i := range w.Len() {
			if g.At(i) != w.At(i) {
				t.Fatalf("%s: output %s[%d] = %v, reference %v", what, name, i, g.At(i), w.At(i))
			}
		}
	}
}

// Recomputing every layer's forward in the backward computes the same step:
// the loss, every gradient and every updated parameter and optimizer state
// are bit-identical on the CPU, in float32 and float64, alone and followed by
// the elementwise fusion (with its own rematerialisation on).
func TestRecomputeKeepsTheStepBitExact(t *testing.T) {
	for _, dt := range []graph.DType{graph.Float32, graph.Float64} {
		ts := tinyTrainStep(t, dt)
		log := &Log{}
		rc, err := (Recompute{}).Run(ts.Graph, log)
		if err != nil {
			t.Fatal(err)
		}
		if err := graph.Verify(rc); err != nil {
			t.Fatal(err)
		}
		// Both layers are recomputed, FlashAttention included, and no
		// backward node reads a layer-internal activation any more.
		infos := log.Filter(PassRecompute, Info)
		if len(infos) != 2 {
			t.Fatalf("%v: %d Info lines, want one per layer:\n%s", dt, len(infos), log)
		}
		text := graph.Format(rc)
		if !strings.Contains(text, "recompute/layers.0/attn/FlashAttention_0") || !strings.Contains(text, "recompute/layers.1/attn/FlashAttention_0") {
			t.Errorf("%v: FlashAttention not recomputed", dt)
		}
		for _, n := range rc.Nodes {
			if !strings.HasPrefix(n.Name, "grad/") {
				continue
			}
			for _, in := range n.Inputs {
				if in == nil || in.Producer == nil {
					continue
				}
				if _, ok := recomputeLayer(in.Producer.Name); ok && !strings.HasSuffix(in.Name, "/resid_mlp") {
					t.Errorf("%v: backward node %s still reads the saved %s", dt, n.Name, in.Name)
				}
			}
		}
		back, err := graph.Parse(text)
		if err != nil {
			t.Fatal(err)
		}
		if graph.Format(back) != text {
			t.Fatal("Parse(Format(recomputed)) differs")
		}
		// Idempotent: a second run finds nothing left to recompute.
		if again, err := (Recompute{}).Run(rc, nil); err != nil || again != rc {
			t.Errorf("%v: a second recompute changed the graph (err %v)", dt, err)
		}

		feeds := stepFeeds(ts, uint64(dt))
		want := fzCPU(t, ts.Graph, feeds)
		sameOutputs(t, dt.String()+" recompute", fzCPU(t, rc, feeds), want)

		fused, err := (FuseElementwise{}).Run(rc, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The recomputed chains fuse like the rest. The elementwise pass's
		// own rematerialisation has nothing left to do: it copies values
		// read late in the backward, and after recompute every backward
		// read of a layer's activation is of a clone made just before the
		// layer's backward.
		if n := fused.CountOps()["FusedElementwise"]; n < 20 {
			t.Errorf("%v: only %d FusedElementwise nodes after recompute", dt, n)
		}
		if err := graph.Verify(fused); err != nil {
			t.Fatal(err)
		}
		sameOutputs(t, dt.String()+" recompute+fuse_elementwise", fzCPU(t, fused, feeds), want)
	}
}

// A graph without layer scopes comes back as it is.
func TestRecomputeLeavesOtherGraphsAlone(t *testing.T) {
	b := graph.NewBuilder("plain")
	x := b.Input("x", graph.Float32, 4)
	b.Output(b.Op("Exp", nil, x))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := (Recompute{}).Run(g, nil); err != nil || out != g {
		t.Errorf("a graph without layers changed (err %v)", err)
	}
	if _, err := (Recompute{}).Run(nil, nil); err == nil {
		t.Error("nil graph: no error")
	}
	for name, want := range map[string]int{"layers.12/attn/x": 12, "layers.0/y": 0} {
		if got, ok := recomputeLayer(name); !ok || got != want {
			t.Errorf("recomputeLayer(%q) = %d, %v", name, got, ok)
		}
	}
	for _, name := range []string{"grad/layers.0/x", "layers.x/y", "layers.01/y", "layers.3", "final_norm/Mul_0"} {
		if _, ok := recomputeLayer(name); ok {
			t.Errorf("recomputeLayer(%q) accepted", name)
		}
	}
}

// A training step whose forward has no layer scopes (an imported graph names
// its nodes as its exporter did: "/h.0/attn/MatMul") is recomputed by its
// structure: the layers found are exactly the built-in model's, fused
// (FlashAttention) and unfused (Softmax); the step computes the same bits;
// and the planned peak of activations shrinks.
func TestRecomputeFindsLayersByStructure(t *testing.T) {
	for _, fuse := range []bool{true, false} {
		cfg, err := model.Lookup("tiny")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Layers = 3
		fwd, err := model.Build(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if fwd, err = Default(fuse).Run(fwd, nil); err != nil {
			t.Fatal(err)
		}
		// The layer each node belongs to by its scope, then the scopes gone.
		named := map[string]int{}
		for _, n := range fwd.Nodes {
			if l, ok := recomputeLayer(n.Name); ok {
				n.Name = "/h." + strings.TrimPrefix(n.Name, "layers.")
				named[n.Name] = l
			}
		}
		ts, err := autodiff.TrainingGraph(fwd, autodiff.TrainOptions{Loss: "loss"})
		if err != nil {
			t.Fatal(err)
		}
		got := structuralLayers(ts.Graph, func(n *graph.Node) bool { return strings.HasPrefix(n.Name, "grad/") }, outputsOf(ts.Graph))
		if len(got) != cfg.Layers {
			t.Fatalf("fuse=%v: %d layers found, want %d", fuse, len(got), cfg.Layers)
		}
		count := 0
		for l, ns := range got {
			for _, n := range ns {
				if w, ok := named[n.Name]; !ok || w != l {
					t.Errorf("fuse=%v: node %s put in layer %d, built in %v (%v)", fuse, n.Name, l, w, ok)
				}
			}
			count += len(ns)
		}
		if count != len(named) {
			t.Errorf("fuse=%v: %d nodes in the layers found, %d built in layers", fuse, count, len(named))
		}

		log := &Log{}
		rc, err := (Recompute{}).Run(ts.Graph, log)
		if err != nil {
			t.Fatal(err)
		}
		if err := graph.Verify(rc); err != nil {
			t.Fatal(err)
		}
		infos := log.Filter(PassRecompute, Info)
		if len(infos) != cfg.Layers || !strings.Contains(infos[0].Reason, "found by structure") {
			t.Fatalf("fuse=%v: %d Info lines, want one per layer found by structure:\n%s", fuse, len(infos), log)
		}
		feeds := stepFeeds(ts, 3)
		sameOutputs(t, "recompute by structure", fzCPU(t, rc, feeds), fzCPU(t, ts.Graph, feeds))
		peak := func(g *graph.Graph) int64 {
			exe, err := cpu.New().Compile(g, backend.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			return exe.Stats().PeakActivationBytes
		}
		if before, after := peak(ts.Graph), peak(rc); after >= before {
			t.Errorf("fuse=%v: planned activation peak %d with recompute, %d without: no saving", fuse, after, before)
		} else {
			t.Logf("fuse=%v: planned activation peak %d → %d bytes", fuse, before, after)
		}
	}
}

func outputsOf(g *graph.Graph) map[*graph.Value]bool {
	m := map[*graph.Value]bool{}
	for _, v := range g.Outputs {
		m[v] = true
	}
	return m
}

// RecomputeCheap recomputes the norms and elementwise ops but keeps every
// MatMul and FlashAttention output saved, with the same bits.
func TestRecomputeCheapKeepsGEMMsSaved(t *testing.T) {
	ts := tinyTrainStep(t, graph.Float32)
	rc, err := (Recompute{Mode: RecomputeCheap}).Run(ts.Graph, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := graph.Verify(rc); err != nil {
		t.Fatal(err)
	}
	cloned := 0
	for _, n := range rc.Nodes {
		if !strings.HasPrefix(n.Name, recomputeCloneScope) {
			continue
		}
		cloned++
		if !recomputeCheapOps[n.Op] {
			t.Errorf("cheap mode recomputes %s (%s)", n.Name, n.Op)
		}
	}
	if cloned == 0 {
		t.Fatal("cheap mode recomputes nothing")
	}
	feeds := stepFeeds(ts, 7)
	want := fzCPU(t, ts.Graph, feeds)
	sameOutputs(t, "cheap recompute", fzCPU(t, rc, feeds), want)
	fused, err := (FuseElementwise{}).Run(rc, nil)
	if err != nil {
		t.Fatal(err)
	}
	sameOutputs(t, "cheap recompute+fuse_elementwise", fzCPU(t, fused, feeds), want)
}
