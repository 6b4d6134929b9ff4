package passes

import (
	"fmt"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// DCE removes nodes whose outputs nothing reads (transitively) and
// initializers no remaining node reads. Graph outputs are the roots of
// liveness; graph inputs stay even when unused, since they are the graph's
// calling convention (feeds are checked against them). No op has side
// effects: training updates are graph outputs, so they are live.
type DCE struct{}

// Name is "dce".
func (DCE) Name() string { return PassDCE }

// Run returns g itself when nothing is dead.
func (DCE) Run(g *graph.Graph, log *Log) (*graph.Graph, error) {
	if g == nil {
		return nil, errNilGraph
	}
	live := make(map[*graph.Value]bool, len(g.Nodes))
	for _, o := range g.Outputs {
		live[o] = true
	}
	// One backward walk: nodes are in topological order, so every reader of
	// a node's outputs has been decided when the walk reaches the node.
	liveNode := make([]bool, len(g.Nodes))
	deadNodes := 0
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		n := g.Nodes[i]
		for _, o := range n.Outputs {
			if live[o] {
				liveNode[i] = true
				break
			}
		}
		if !liveNode[i] {
			deadNodes++
			continue
		}
		for _, in := range n.Inputs {
			if in != nil {
				live[in] = true
			}
		}
	}
	deadInits := 0
	for _, v := range g.Initializers() {
		if !live[v] {
			deadInits++
		}
	}
	if deadNodes == 0 && deadInits == 0 {
		return g, nil
	}
	// Clone keeps node and initializer order, so the indexes carry over.
	c := g.Clone()
	var removed []string
	nodes := c.Nodes[:0]
	for i, n := range c.Nodes {
		if liveNode[i] {
			nodes = append(nodes, n)
		} else {
			removed = append(removed, n.Name)
		}
	}
	c.Nodes = nodes
	keep := func(orig, cl []*graph.Value) []*graph.Value {
		out := cl[:0]
		for i, v := range cl {
			if live[orig[i]] {
				out = append(out, v)
			} else {
				removed = append(removed, v.Name)
			}
		}
		return out
	}
	c.Params = keep(g.Params, c.Params)
	c.Consts = keep(g.Consts, c.Consts)
	log.Infof(PassDCE, "removed %d nodes and %d initializers: %s", deadNodes, deadInits, clip(strings.Join(removed, " "), 400))
	return c, nil
}

// clip shortens a log line's list.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("... (%d more bytes)", len(s)-n)
}
