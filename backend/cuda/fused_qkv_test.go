package cuda

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

// qkvCopies counts, in a training step with fuse_qkv, the index nodes that
// are copies on CUDA: Slices and Concats left as nodes, and Transposes the
// plan does not fold into a GEMM.
type qkvCopies struct{ slices, concats, transposes int }

func countQKVCopies(t *testing.T, gs *train.Graphs) qkvCopies {
	t.Helper()
	g := gs.Step.Graph
	plan, err := PlanMemoryWith(g, PlanOptions{Compute: graph.BFloat16, Updates: gs.Step.Updates})
	if err != nil {
		t.Fatal(err)
	}
	var c qkvCopies
	for _, n := range g.Nodes {
		switch n.Op {
		case "Slice":
			c.slices++
			// What stays a Slice is a weight's gradient, cut from the
			// merged weight gradient for its AdamW.
			if !strings.HasPrefix(n.Outputs[0].Name, "grad.") {
				t.Errorf("%s: Slice %s of %s left a copy", n.Name, n.Outputs[0].Name, n.Inputs[0].Name)
			}
		case "Concat":
			c.concats++
			for _, v := range n.Inputs {
				if v.Kind != graph.Param {
					t.Errorf("%s: Concat of %s (not a weight) left a copy", n.Name, v.Name)
				}
			}
		case "Transpose":
			if plan.values[n.Outputs[0]].kind != placeFolded {
				c.transposes++
			}
		}
	}
	return c
}

// TestGPT2FuseQKVStepCopies: with fuse_qkv, the gpt2 bf16 training step as
// train builds it for CUDA. The three Slices of the merged q/k/v product
// are read in place: q's and k's by their norms' forward and backward
// bodies, v's by its head Transpose, which becomes one strided copy from
// the merged product (fuse_elementwise slice_read). The gradients dq, dk
// and dv are written into the one [B,S,3H,D] tensor the merged backward
// GEMMs read by a single body that computes the norm backwards and dv's
// transpose at the positions the Concat selects (concat_write). Per layer
// what stays: the Concat of the three weights (the forward GEMM's operand)
// and the three Slices of the merged weight gradient (one per AdamW), both
// D×3D, small next to the B·S×3D activations; and the Transposes of o and
// dO next to attention, as without fuse_qkv.
//
// Before: per layer 6 Slices (3 of the product, 3 of the weight gradient),
// 2 Concats (weights; dq|dk|dv) and 4 Transpose copies (v, o, dO, dv).
func TestGPT2FuseQKVStepCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and plans the gpt2 step")
	}
	cfg, err := model.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	L := cfg.Layers
	for _, tc := range []struct {
		recompute train.RecomputeMode
		want      qkvCopies
	}{
		{train.RecomputeNone, qkvCopies{slices: 3 * L, concats: L, transposes: 2 * L}},
		// Recomputing the forward concatenates the weights and merges o's
		// heads once more per layer.
		{train.RecomputeFull, qkvCopies{slices: 3 * L, concats: 2 * L, transposes: 3 * L}},
	} {
		h := train.Hyper{WeightDecay: 0.1, FuseQKV: true}.WithRecompute(tc.recompute)
		gs, err := train.BuildGraphs(cfg, true, h)
		if err != nil {
			t.Fatal(err)
		}
		got := countQKVCopies(t, gs)
		t.Logf("gpt2 bf16 step with fuse_qkv, recompute %q: %+v", tc.recompute, got)
		if got != tc.want {
			t.Errorf("gpt2 step with fuse_qkv, recompute %q: %+v copies, want %+v", tc.recompute, got, tc.want)
		}
	}
}

// TestFuseQKVStepRenders: the bodies that read the merged product's slices
// in place and write the Concat of their gradients lower to generated
// kernels without a device (the tiny step, bf16 and float32): none fails.
func TestFuseQKVStepRenders(t *testing.T) {
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	gs, err := train.BuildGraphs(cfg, true, train.Hyper{FuseQKV: true})
	if err != nil {
		t.Fatal(err)
	}
	bodies := 0
	for _, n := range gs.Step.Graph.Nodes {
		if n.Op == "FusedElementwise" && strings.Contains(n.Attrs.String("body", ""), "Slice<2,") {
			bodies++
		}
	}
	// Per layer: v's transpose, q's and k's forward norm bodies (the row
	// sum and, in a second walk over the row, the scaling), their backward
	// row sums, and the body writing dq|dk|dv.
	if want := 6 * cfg.Layers; bodies != want {
		t.Errorf("%d bodies read a slice of the merged product, want %d", bodies, want)
	}
	for _, compute := range []graph.DType{graph.Float32, graph.BFloat16} {
		lines := renderKernels(t, gs.Step.Graph, PlanOptions{Compute: compute, Updates: gs.Step.Updates})
		for _, l := range lines {
			if strings.Contains(l, "FusedElementwise") && strings.HasSuffix(l, ")") {
				t.Errorf("%v: %s", compute, l)
			}
		}
	}
}
