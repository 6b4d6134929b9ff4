package graph

// GradientReach returns the values of g (params, inputs, intermediates)
// that a gradient of one of the given values can reach (nil: every float
// graph output). A gradient only flows
// through float values: from a node's float outputs back to its float
// inputs. A param that reaches the targets only through a boolean or integer
// value (a causal-mask buffer cast to bool for a Where condition, a position
// table cast to int64 for a Gather's indices) gets no gradient: it is a
// constant of the model, for training and inference alike.
func GradientReach(g *Graph, targets []*Value) map[*Value]bool {
	if targets == nil {
		targets = g.Outputs
	}
	relevant := map[*Value]bool{}
	for _, v := range targets {
		if v != nil && v.Type.DType.IsFloat() {
			relevant[v] = true
		}
	}
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		n := g.Nodes[i]
		hit := false
		for _, o := range n.Outputs {
			if relevant[o] {
				hit = true
				break
			}
		}
		if !hit {
			continue
		}
		for _, in := range n.Inputs {
			if in != nil && in.Type.DType.IsFloat() {
				relevant[in] = true
			}
		}
	}
	return relevant
}
