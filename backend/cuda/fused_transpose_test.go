package cuda

import (
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

// TestGPT2StepTransposeCopies: the Transposes left as copies in the gpt2
// training step as train builds it for CUDA, planned in mixed precision.
// Weight-gradient transposes fold into cuBLAS (placeFolded); the q and k
// head splits are read by the norms' bodies and the dq and dk merges written
// by the norm backward's (fuse_elementwise's Transpose steps), so per layer
// only the four that touch nothing but GEMMs and attention stay copies:
// v's split, o's merge, and their gradients dO and dv. Before the Transpose
// steps there were eight per layer (96 in all; 144 with recompute, now 72).
func TestGPT2StepTransposeCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and plans the gpt2 step")
	}
	cfg, err := model.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	for _, recompute := range []bool{false, true} {
		gs, err := train.BuildGraphs(cfg, true, train.Hyper{WeightDecay: 0.1, Recompute: recompute})
		if err != nil {
			t.Fatal(err)
		}
		// Recomputing the forward in the backward copies v's split and
		// o's merge once more per layer.
		want := 4 * cfg.Layers
		if recompute {
			want = 6 * cfg.Layers
		}
		checkTransposeCopies(t, gs, want, recompute)
	}
}

func checkTransposeCopies(t *testing.T, gs *train.Graphs, want int, recompute bool) {
	g := gs.Step.Graph
	plan, err := PlanMemoryWith(g, PlanOptions{Compute: graph.BFloat16, Updates: gs.Step.Updates})
	if err != nil {
		t.Fatal(err)
	}
	uses := g.Uses()
	attention := map[string]bool{"FlashAttention": true, "FlashAttentionGrad": true}
	copies, folded := 0, 0
	for _, n := range g.Nodes {
		if n.Op != "Transpose" {
			continue
		}
		if plan.values[n.Outputs[0]].kind == placeFolded {
			folded++
			continue
		}
		copies++
		// What is left moves data between a GEMM's Reshape and attention:
		// no elementwise body on either side.
		near := []*graph.Node{n.Inputs[0].Producer}
		near = append(near, uses[n.Outputs[0]]...)
		touchesAttention := false
		for _, m := range near {
			if m == nil {
				continue
			}
			if m.Op == "FusedElementwise" {
				t.Errorf("%s is a copy next to the body %s", n.Name, m.Name)
			}
			touchesAttention = touchesAttention || attention[m.Op]
		}
		if !touchesAttention {
			t.Errorf("%s is a copy that neither reads nor feeds attention", n.Name)
		}
	}
	t.Logf("gpt2 bf16 step (recompute %v): %d Transpose copies, %d folded into GEMMs", recompute, copies, folded)
	if copies != want {
		t.Errorf("recompute %v: %d Transpose copies in the gpt2 step, want %d (v, o, dO, dv per layer, and v, o again where recomputed)", recompute, copies, want)
	}
}
