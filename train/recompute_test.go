package train

import (
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// TestTrainRecomputeBitExact: training with each layer's forward recomputed
// in the backward (Hyper.Recompute) gives the same losses and the same
// weights and AdamW moments, bit for bit, as keeping the activations: with
// attention fused (FlashAttention recomputed too, elementwise fusion on) and
// unfused, in float32 and float64, on the CPU.
func TestTrainRecomputeBitExact(t *testing.T) {
	const steps = 5
	for _, dt := range []graph.DType{graph.Float32, graph.Float64} {
		for _, fuse := range []bool{true, false} {
			cfg := testConfig(t, dt)
			corpus := testCorpus(t)
			var losses [2][]float64
			var states [2]*checkpoint.Tensors
			for k, rc := range []bool{false, true} {
				h := testHyper(steps)
				h.Recompute = rc
				// BuildGraphs (elementwise rematerialisation on, as on a GPU)
				// is what NewTrainer compiles apart from that switch; the
				// recomputing step must verify and carry the clones.
				gs, err := BuildGraphs(cfg, fuse, h)
				if err != nil {
					t.Fatal(err)
				}
				if err := graph.Verify(gs.Step.Graph); err != nil {
					t.Fatal(err)
				}
				tr, err := NewTrainer(cpu.New(), cfg, fuse, h, corpus)
				if err != nil {
					t.Fatal(err)
				}
				cloned := 0
				for _, n := range tr.Graphs.Step.Graph.Nodes {
					if strings.HasPrefix(n.Name, "recompute/") {
						cloned++
					}
				}
				if rc != (cloned > 0) {
					t.Fatalf("%v fuse=%v recompute=%v: %d recomputed nodes in the step", dt, fuse, rc, cloned)
				}
				for range steps {
					if _, err := tr.Step(); err != nil {
						t.Fatal(err)
					}
				}
				losses[k] = tr.Losses()
				if states[k], err = tr.State(); err != nil {
					t.Fatal(err)
				}
				tr.Close()
			}
			if !slices.Equal(losses[0], losses[1]) {
				t.Errorf("%v fuse=%v: losses %v, recomputing %v", dt, fuse, losses[0], losses[1])
			}
			if len(states[0].Tensors) != len(states[1].Tensors) || len(states[0].Tensors) == 0 {
				t.Fatalf("%v fuse=%v: %d and %d state tensors", dt, fuse, len(states[0].Tensors), len(states[1].Tensors))
			}
			for n, x := range states[0].Tensors {
				if !sameBits(x, states[1].Tensors[n]) {
					t.Errorf("%v fuse=%v: %s differs after %d steps with recomputation", dt, fuse, n, steps)
				}
			}
		}
	}
}

// stepPlanBytes is the bfloat16 activation arena of cfg's fused training
// step as the CUDA backend would plan it (planning needs no GPU).
func stepPlanBytes(t *testing.T, cfg model.Config, recompute bool) int64 {
	t.Helper()
	h := testHyper(10)
	h.Recompute = recompute
	gs, err := BuildGraphs(cfg, true, h)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cuda.PlanMemoryWith(gs.Step.Graph, cuda.PlanOptions{Compute: graph.BFloat16, Updates: gs.Step.Updates})
	if err != nil {
		t.Fatal(err)
	}
	return p.PeakBytes
}

// TestRecomputeShrinksTheMemoryPlan: recomputing each layer's forward lowers
// the training step's peak activation memory for small and gpt2 (bf16, fused
// attention and elementwise chains, the GPU's settings).
func TestRecomputeShrinksTheMemoryPlan(t *testing.T) {
	names := []string{"small", "gpt2"}
	if testing.Short() {
		names = names[:1]
	}
	for _, name := range names {
		cfg, err := model.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		keep, rc := stepPlanBytes(t, cfg, false), stepPlanBytes(t, cfg, true)
		t.Logf("%s: training step activation arena %.1f MiB, with recompute %.1f MiB (%.0f%%)",
			name, float64(keep)/(1<<20), float64(rc)/(1<<20), 100*float64(rc)/float64(keep))
		if !(rc < keep) {
			t.Errorf("%s: recomputing step plans %d bytes, keeping %d", name, rc, keep)
		}
	}
}
