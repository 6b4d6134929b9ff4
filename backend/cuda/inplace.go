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
// on the initializer it replaces, so the node updates it in place and the
// copy disappears.
//
// No op is named here: the op table says which output is the new value of
// which input (graph.OpSpec.InPlace, AdamW's param, m and v) and which ops
// are views (OpSpec.View) or permutations (OpSpec.Permutation); the
// lowering says whose kernels write nothing after an earlier failure
// (loweringPlan.guarded). Nothing can tell the difference when:
//   - the output is the new value of an input (InPlace), that input is an
//     initializer and the update target, with no other update source;
//   - no later node reads the initializer (directly or through a view or
//     permutation that may share its buffer), and neither it nor such a
//     view is a graph output: Run returns outputs as they were before the
//     update;
//   - the node and every node after it is guarded or a view (launches
//     nothing), so that no kernel can report an error after the weights
//     changed: guarded kernels write nothing when an earlier kernel set the
//     error flag (or the step is invalid), which keeps a failed run from
//     touching the weights, as with the copy.
//
// PlanOptions.CopyUpdates (FLASHGRAPH_CUDA_INPLACE_UPDATES=0) keeps the copy.

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
	specs := make([]*graph.OpSpec, len(g.Nodes))
	for i, n := range g.Nodes {
		if specs[i], _ = graph.LookupOp(n.Op); specs[i] == nil {
			specs[i] = &graph.OpSpec{Name: n.Op}
		}
	}
	// base follows views and permutations back to the value whose buffer
	// they may share: a permutation read only by GEMMs is folded into them
	// and reads its input's buffer where they run.
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
		if s := specs[i]; (s.View || s.Permutation != nil) && len(n.Inputs) > 0 && n.Inputs[0] != nil {
			for _, out := range n.Outputs {
				base[out] = baseOf(n.Inputs[0])
			}
		}
	}
	for _, v := range g.Outputs {
		lastRead[baseOf(v)] = len(g.Nodes)
	}
	// quiet[i]: node i and every node after it either is guarded or
	// launches nothing, so none can set the error flag once weights changed.
	quiet := make([]bool, len(g.Nodes))
	for i, after := len(g.Nodes)-1, true; i >= 0; i-- {
		after = after && (loweringPlans[g.Nodes[i].Op].guarded || specs[i].View)
		quiet[i] = after
	}
	res := map[*graph.Value]*graph.Value{}
	for i, n := range g.Nodes {
		if !quiet[i] || !loweringPlans[n.Op].guarded {
			continue
		}
		for k, out := range n.Outputs {
			j := specs[i].InPlaceInput(k)
			if j < 0 || j >= len(n.Inputs) {
				continue
			}
			target := n.Inputs[j]
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
