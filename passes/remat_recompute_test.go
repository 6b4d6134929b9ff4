package passes

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// A recomputing step (cheap and full) keeps none of the SwiGLU's recomputed
// intermediates: the sigmoid and the SiLU that the recompute pass clones
// for the backward are computed again inside the kernel that reads them,
// which also writes the recomputed product (read by the down projection's
// weight gradient) and the two gradients, as the plain step's backward
// computes them inside its one kernel. Before, the clones were one kernel of
// three outputs (sigmoid, SiLU, product) whose first two the backward's
// kernels read back. The step's bits stay the same.
func TestRecomputedSwiGLUStaysInKernels(t *testing.T) {
	ts := tinyTrainStep(t, graph.Float32)
	feeds := stepFeeds(ts, 3)
	want := fzCPU(t, ts.Graph, feeds)
	for _, mode := range []RecomputeMode{RecomputeCheap, RecomputeFull} {
		rc, err := (Recompute{Mode: mode}).Run(ts.Graph, nil)
		if err != nil {
			t.Fatal(err)
		}
		fused, err := (FuseElementwise{}).Run(rc, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := graph.Verify(fused); err != nil {
			t.Fatal(err)
		}
		made := map[string]*graph.Node{}
		for _, n := range fused.Nodes {
			for _, v := range n.Outputs {
				made[v.Name] = n
			}
		}
		for l := range 2 { // tiny's layers
			mlp := fmt.Sprintf("%slayers.%d/mlp/", recomputeCloneScope, l)
			for _, v := range []string{mlp + "Sigmoid_0", mlp + "Mul_0"} {
				if n := made[v]; n != nil {
					t.Errorf("mode %v: %s is kept, written by %s", mode, v, n.Name)
				}
			}
			product := made[mlp+"Mul_1"]
			if product == nil {
				t.Fatalf("mode %v: no node writes %sMul_1 (the product the down projection's weight gradient reads)", mode, mlp)
			}
			if !slices.ContainsFunc(product.Outputs, func(v *graph.Value) bool {
				return strings.HasPrefix(v.Name, fmt.Sprintf("grad/layers.%d/mlp/", l))
			}) {
				t.Errorf("mode %v: %s writes the recomputed product but no gradient of the SwiGLU: %v", mode, product.Name, names(product.Outputs))
			}
		}
		sameOutputs(t, fmt.Sprintf("recompute %v + fuse_elementwise", mode), fzCPU(t, fused, feeds), want)
	}
}

func names(vs []*graph.Value) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Name)
	}
	return out
}

// dropUnread removes the elementwise nodes it is given once nothing reads
// them, and then their producers that this leaves unread, but not a node
// that is read, a graph output, or a node that is not elementwise.
func TestDropUnread(t *testing.T) {
	b := graph.NewBuilder("drop")
	x := b.Input("x", graph.Float32, 4)
	w := b.Input("w", graph.Float32, 4, 4)
	s := b.Sigmoid(x)      // read only by silu: dropped after it
	silu := b.Mul(x, s)    // unread: dropped
	kept := b.Neg(x)       // a graph output
	prod := b.MatMul(w, w) // unread, but not elementwise: stays
	read := b.Sqrt(x)      // read by kept2
	kept2 := b.Add(read, x)
	b.Output(kept)
	b.Output(kept2)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	_ = prod
	nodes := slices.Clone(g.Nodes)
	// g.Build may have pruned unread nodes; put those made above back.
	byOut := map[*graph.Value]bool{}
	for _, n := range nodes {
		for _, v := range n.Outputs {
			byOut[v] = true
		}
	}
	for _, v := range []*graph.Value{s, silu, prod} {
		if !byOut[v] {
			t.Skipf("the builder dropped %s: nothing to test", v.Name)
		}
	}
	got := dropUnread(nodes, g.Outputs, []*graph.Node{silu.Producer, read.Producer, kept.Producer, prod.Producer})
	left := map[*graph.Node]bool{}
	for _, n := range got {
		left[n] = true
	}
	for _, c := range []struct {
		v    *graph.Value
		kept bool
	}{{s, false}, {silu, false}, {kept, true}, {prod, true}, {read, true}, {kept2, true}} {
		if left[c.v.Producer] != c.kept {
			t.Errorf("%s (%s): kept %v, want %v", c.v.Name, c.v.Producer.Op, left[c.v.Producer], c.kept)
		}
	}
}
