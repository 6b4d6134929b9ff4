package cuda

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

// TestRecomputeStepRenders: the recomputing training steps (cheap and full)
// lower to generated kernels without a device, in float32 and bf16; among
// them the SwiGLU kernel that recomputes the product for the down
// projection's weight gradient and writes the two gradients with it (three
// outputs, passes.TestRecomputedSwiGLUStaysInKernels).
func TestRecomputeStepRenders(t *testing.T) {
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []train.RecomputeMode{train.RecomputeCheap, train.RecomputeFull} {
		gs, err := train.BuildGraphs(cfg, true, train.Hyper{}.WithRecompute(mode))
		if err != nil {
			t.Fatal(err)
		}
		swiglu := 0
		for _, n := range gs.Step.Graph.Nodes {
			if n.Op != "FusedElementwise" {
				continue
			}
			for _, v := range n.Outputs {
				if strings.HasPrefix(v.Name, "recompute/layers.") && strings.HasSuffix(v.Name, "/mlp/Mul_1") {
					swiglu++
					if len(n.Outputs) != 3 {
						t.Errorf("recompute %v: %s writes %d values, want the product and two gradients", mode, n.Name, len(n.Outputs))
					}
				}
			}
		}
		if swiglu != cfg.Layers {
			t.Errorf("recompute %v: %d kernels recompute the SwiGLU product, want one a layer (%d)", mode, swiglu, cfg.Layers)
		}
		for _, compute := range []graph.DType{graph.Float32, graph.BFloat16} {
			for _, l := range renderKernels(t, gs.Step.Graph, PlanOptions{Compute: compute, Updates: gs.Step.Updates}) {
				if strings.Contains(l, "FusedElementwise") && strings.HasSuffix(l, ")") {
					t.Errorf("recompute %v, %v: %s", mode, compute, l)
				}
			}
		}
	}
}
