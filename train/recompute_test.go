package train

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// recomputeModes are the modes every recompute test covers, none first.
var recomputeModes = []RecomputeMode{RecomputeNone, RecomputeCheap, RecomputeFull}

// TestTrainRecomputeBitExact: training with each layer's forward (full) or
// its norms and elementwise ops (cheap) recomputed in the backward gives the
// same losses and the same weights and AdamW moments, bit for bit, as
// keeping the activations: with attention fused (FlashAttention recomputed
// too in full, elementwise fusion on) and unfused, in float32 and float64,
// on the CPU.
func TestTrainRecomputeBitExact(t *testing.T) {
	const steps = 5
	for _, dt := range []graph.DType{graph.Float32, graph.Float64} {
		for _, fuse := range []bool{true, false} {
			cfg := testConfig(t, dt)
			corpus := testCorpus(t)
			losses := make([][]float64, len(recomputeModes))
			states := make([]*checkpoint.Tensors, len(recomputeModes))
			clonedOps := make([]map[string]int, len(recomputeModes))
			for k, rc := range recomputeModes {
				h := testHyper(steps).WithRecompute(rc)
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
				clonedOps[k] = map[string]int{}
				for _, n := range tr.Graphs.Step.Graph.Nodes {
					if strings.HasPrefix(n.Name, "recompute/") {
						clonedOps[k][n.Op]++
					}
				}
				if rc.On() != (len(clonedOps[k]) > 0) {
					t.Fatalf("%v fuse=%v recompute=%s: recomputed nodes in the step: %v", dt, fuse, rc, clonedOps[k])
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
			// Cheap recomputes no product; full recomputes the attention and
			// the GEMMs as well.
			cheap, full := clonedOps[1], clonedOps[2]
			for _, op := range []string{"MatMul", "FlashAttention", "Softmax"} {
				if cheap[op] > 0 {
					t.Errorf("%v fuse=%v: cheap recomputation clones %d %s nodes", dt, fuse, cheap[op], op)
				}
			}
			if full["MatMul"] == 0 {
				t.Errorf("%v fuse=%v: full recomputation clones no MatMul: %v", dt, fuse, full)
			}
			for k := 1; k < len(recomputeModes); k++ {
				mode := recomputeModes[k]
				if !slices.Equal(losses[0], losses[k]) {
					t.Errorf("%v fuse=%v: losses %v, recomputing %s %v", dt, fuse, losses[0], mode, losses[k])
				}
				if len(states[0].Tensors) != len(states[k].Tensors) || len(states[0].Tensors) == 0 {
					t.Fatalf("%v fuse=%v: %d and %d state tensors", dt, fuse, len(states[0].Tensors), len(states[k].Tensors))
				}
				for n, x := range states[0].Tensors {
					if !sameBits(x, states[k].Tensors[n]) {
						t.Errorf("%v fuse=%v: %s differs after %d steps recomputing %s", dt, fuse, n, steps, mode)
					}
				}
			}
		}
	}
}

// A checkpoint written before the cheap mode holds "recompute": true for
// the whole forward. It reads back as full; a run may resume it in another
// mode (recomputation changes no result), is told so, and continues bit for
// bit as the run that never stopped.
func TestRecomputeCheckpointCompat(t *testing.T) {
	const N = 3
	cfg := testConfig(t, graph.Float32)
	corpus := testCorpus(t)
	run := func(h Hyper, steps int) *Trainer {
		t.Helper()
		tr, err := NewTrainer(cpu.New(), cfg, true, h, corpus)
		if err != nil {
			t.Fatal(err)
		}
		for range steps {
			if _, err := tr.Step(); err != nil {
				t.Fatal(err)
			}
		}
		return tr
	}
	whole := run(testHyper(2*N), 2*N)
	defer whole.Close()

	first := run(testHyper(2*N).WithRecompute(RecomputeFull), N)
	state, err := first.State()
	first.Close()
	if err != nil {
		t.Fatal(err)
	}
	opts := state.Metadata[checkpoint.MetaOptions]
	if !strings.Contains(opts, `"recompute":true`) || strings.Contains(opts, "recompute_cheap") {
		t.Fatalf("full recomputation is no longer recorded as an older binary wrote it: %s", opts)
	}
	// What such a checkpoint reads as, without the running trainer.
	var old struct{ Hyper }
	if err := json.Unmarshal([]byte(opts), &old); err != nil {
		t.Fatal(err)
	}
	if got := old.RecomputeMode(); got != RecomputeFull {
		t.Fatalf("a checkpoint with \"recompute\":true reads as %s, want full", got)
	}

	second, err := NewTrainer(cpu.New(), cfg, true, testHyper(2*N).WithRecompute(RecomputeCheap), corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	notes, err := second.Restore(state, N)
	if err != nil {
		t.Fatalf("resuming a full-recompute checkpoint with cheap: %v", err)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "-recompute full, this run uses cheap (the same math") {
		t.Errorf("notes: %q, want one saying the recompute mode changed and nothing else", notes)
	}
	for range N {
		if _, err := second.Step(); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(second.Losses(), whole.Losses()) {
		t.Errorf("resumed across modes: losses %v, uninterrupted %v", second.Losses(), whole.Losses())
	}
	a, err := second.State()
	if err != nil {
		t.Fatal(err)
	}
	b, err := whole.State()
	if err != nil {
		t.Fatal(err)
	}
	for n, x := range b.Tensors {
		if !sameBits(x, a.Tensors[n]) {
			t.Errorf("%s differs after resuming across recompute modes", n)
		}
	}
	if s := a.Metadata[checkpoint.MetaOptions]; !strings.Contains(s, `"recompute":true`) || !strings.Contains(s, `"recompute_cheap":true`) {
		t.Errorf("the resumed run's checkpoint does not record cheap recomputation: %s", s)
	}
}

func TestParseRecomputeMode(t *testing.T) {
	for in, want := range map[string]RecomputeMode{"none": RecomputeNone, "false": RecomputeNone, "cheap": RecomputeCheap, "full": RecomputeFull, "true": RecomputeFull} {
		got, err := ParseRecomputeMode(in)
		if err != nil || got != want {
			t.Errorf("ParseRecomputeMode(%q) = %s, %v; want %s", in, got, err, want)
		}
		if h := (Hyper{}).WithRecompute(want); h.RecomputeMode() != want {
			t.Errorf("WithRecompute(%s).RecomputeMode() = %s", want, h.RecomputeMode())
		}
	}
	if _, err := ParseRecomputeMode("some"); err == nil || !strings.Contains(err.Error(), "want none, cheap or full") {
		t.Errorf("ParseRecomputeMode(some): %v", err)
	}
}

// stepPlanBytes is the bfloat16 activation arena of cfg's fused training
// step as the CUDA backend would plan it (planning needs no GPU).
func stepPlanBytes(t *testing.T, cfg model.Config, recompute RecomputeMode) int64 {
	t.Helper()
	h := testHyper(10).WithRecompute(recompute)
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

// TestRecomputeShrinksTheMemoryPlan: recomputing lowers the training step's
// peak activation memory for small and gpt2 (bf16, fused attention and
// elementwise chains, the GPU's settings), the cheap mode less than the
// full one.
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
		keep, cheap, full := stepPlanBytes(t, cfg, RecomputeNone), stepPlanBytes(t, cfg, RecomputeCheap), stepPlanBytes(t, cfg, RecomputeFull)
		t.Logf("%s: training step activation arena %.1f MiB, recompute cheap %.1f MiB (%.0f%%), full %.1f MiB (%.0f%%)",
			name, float64(keep)/(1<<20), float64(cheap)/(1<<20), 100*float64(cheap)/float64(keep), float64(full)/(1<<20), 100*float64(full)/float64(keep))
		if !(full < cheap && cheap < keep) {
			t.Errorf("%s: planned bytes: keeping %d, recomputing cheap %d, full %d; want full < cheap < keeping", name, keep, cheap, full)
		}
	}
}
