package cuda

import (
	"os"

	"github.com/flashgraph/flashgraph/graph"
)

// In-place updates: a training step's AdamW nodes write the new parameter
// and moments as graph outputs that Run copies over the initializers after
// the step (backend.Options.Updates). Given buffers of their own, those
// outputs cost arena memory the size of every parameter three times over
// (1.4 GB for gpt2) and a copy of as many bytes after every step. Where
// nothing can tell the difference, the plan instead places such an output
// on the initializer it replaces, so AdamW updates it in place and the copy
// disappears.
//
// Nothing can tell the difference when:
//   - the output is one of AdamW's (new param, m, v) and the update target is
//     the AdamW input it replaces, an initializer, with no other update source;
//   - no later node reads the initializer (directly or through a view that
//     shares its buffer), and neither it nor such a view is a graph output:
//     Run returns outputs as they were before the update;
//   - every node after the AdamW node is an AdamW node or launches nothing,
//     so that no kernel can report an error after the weights changed: the
//     AdamW kernels write nothing when an earlier kernel set the error flag
//     (or the step is invalid), which keeps a failed run from touching the
//     weights, as with the copy.
//
// PlanOptions.CopyUpdates (FLASHGRAPH_CUDA_INPLACE_UPDATES=0) keeps the copy.

// adamwStateInput is, for AdamW's outputs (new param, m, v), the input each
// replaces: AdamW reads (param, grad, m, v, lr, step).
var adamwStateInput = []int{0, 2, 3}

// inPlaceUpdates returns, for each update source that can be written in
// place, the initializer whose buffer it uses.
func inPlaceUpdates(g *graph.Graph, updates map[string]string) map[*graph.Value]*graph.Value {
	if len(updates) == 0 {
		return nil
	}
	sources := map[string]int{} // update target -> number of sources
	for _, to := range updates {
		sources[to]++
	}
	// base follows views (aliasOps) back to the value whose buffer they share.
	base := map[*graph.Value]*graph.Value{}
	baseOf := func(v *graph.Value) *graph.Value {
		if b, ok := base[v]; ok {
			return b
		}
		return v
	}
	lastRead := map[*graph.Value]int{}
	for i, n := range g.Nodes {
		for _, in := range n.Inputs {
			if in != nil {
				lastRead[baseOf(in)] = i
			}
		}
		// Transposes count as views too: one read only by MatMuls is folded
		// into them and reads the initializer's buffer where they run.
		if (aliasOps[n.Op] || n.Op == "Transpose") && len(n.Inputs) > 0 && n.Inputs[0] != nil {
			for _, out := range n.Outputs {
				base[out] = baseOf(n.Inputs[0])
			}
		}
	}
	for _, v := range g.Outputs {
		lastRead[baseOf(v)] = len(g.Nodes)
	}
	// quietAfter[i]: no node after i can set the error flag once weights
	// changed (AdamW nodes check it first; views launch nothing).
	quietAfter := make([]bool, len(g.Nodes))
	quiet := true
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		quietAfter[i] = quiet
		quiet = quiet && (g.Nodes[i].Op == "AdamW" || aliasOps[g.Nodes[i].Op])
	}
	res := map[*graph.Value]*graph.Value{}
	for i, n := range g.Nodes {
		if n.Op != "AdamW" || !quietAfter[i] {
			continue
		}
		for k, out := range n.Outputs {
			if k >= len(adamwStateInput) || adamwStateInput[k] >= len(n.Inputs) {
				break
			}
			target := n.Inputs[adamwStateInput[k]]
			if target == nil || (target.Kind != graph.Param && target.Kind != graph.Const) ||
				updates[out.Name] != target.Name || sources[target.Name] != 1 ||
				!out.Type.Equal(target.Type) || lastRead[target] > i {
				continue
			}
			res[out] = target
		}
	}
	return res
}

// inPlaceUpdatesEnabled reports whether the user left in-place updates on.
func inPlaceUpdatesEnabled() bool {
	v := os.Getenv("FLASHGRAPH_CUDA_INPLACE_UPDATES")
	return v != "0" && v != "off" && v != "false"
}
