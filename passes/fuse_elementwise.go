package passes

import (
	"fmt"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// PassFuseElementwise names the elementwise fusion.
const PassFuseElementwise = "fuse_elementwise"

func init() {
	Register(PassFuseElementwise, func() Pass { return FuseElementwise{} })
}

// FuseElementwise groups chains and trees of elementwise ops that compute
// tensors of one shape into FusedElementwise nodes, so that a backend that
// generates code reads each input and writes each needed result once, with
// the intermediates kept in registers.
//
// It runs on finished graphs (the training step after autodiff): a
// FusedElementwise node has no gradient rule.
//
// Grouping, in node order: an elementwise op (graph.FusibleElementwise) joins
// the open group that produced one of its inputs when its result has the
// group's shape and dtype; otherwise it opens a group of its own. A group
// closes when any other node reads one of its values, so a group can run at
// the position of its last member: everything it reads is computed by then,
// and everything that reads it comes later. Values a group computes that are
// read outside it (or are graph outputs) become the fused node's outputs,
// keeping their names; the rest exist only inside the kernel. Groups of one
// op stay as they are.
type FuseElementwise struct{}

// Name is "fuse_elementwise".
func (FuseElementwise) Name() string { return PassFuseElementwise }

// Limits of one group: generated kernels take every input as a parameter and
// keep every step in registers.
const (
	fuseMaxInputs = 24
	fuseMaxSteps  = 128
)

type ewGroup struct {
	shape   graph.Shape
	dt      graph.DType
	members []*graph.Node
	inputs  map[*graph.Value]bool // external inputs
	closed  bool
}

// fusibleNode reports whether n may be a group member, or why not.
func fusibleNode(n *graph.Node) (bool, string) {
	if !graph.FusibleElementwise[n.Op] {
		return false, ""
	}
	out := n.Outputs[0].Type
	if !out.DType.IsFloat() {
		return false, "result is not floating point"
	}
	if out.Shape.Numel() == 0 {
		return false, "result is empty"
	}
	for _, v := range n.Inputs {
		if v == nil {
			return false, "an input is omitted"
		}
	}
	return true, ""
}

// Run returns g itself when no group has two ops.
func (FuseElementwise) Run(g *graph.Graph, log *Log) (*graph.Graph, error) {
	if g == nil {
		return nil, errNilGraph
	}
	c := g.Clone()
	owner := map[*graph.Value]*ewGroup{} // value -> the group whose member made it
	groupOf := map[*graph.Node]*ewGroup{}
	var groups []*ewGroup
	for _, n := range c.Nodes {
		ok, _ := fusibleNode(n)
		var target *ewGroup
		if ok {
			out := n.Outputs[0].Type
			for _, v := range n.Inputs {
				gr := owner[v]
				if gr == nil || gr.closed || !gr.shape.Equal(out.Shape) || gr.dt != out.DType {
					continue
				}
				if len(gr.members) >= fuseMaxSteps || len(gr.inputs)+len(n.Inputs) > fuseMaxInputs {
					continue
				}
				target = gr
				break
			}
		}
		// Every other group n reads from must run before n: close it.
		for _, v := range n.Inputs {
			if gr := owner[v]; gr != nil && gr != target {
				gr.closed = true
			}
		}
		if !ok {
			continue
		}
		if target == nil {
			target = &ewGroup{shape: n.Outputs[0].Type.Shape, dt: n.Outputs[0].Type.DType, inputs: map[*graph.Value]bool{}}
			groups = append(groups, target)
		}
		target.members = append(target.members, n)
		for _, v := range n.Inputs {
			if owner[v] != target {
				target.inputs[v] = true
			}
		}
		groupOf[n] = target
		owner[n.Outputs[0]] = target
	}

	uses := c.Uses()
	isOut := map[*graph.Value]bool{}
	for _, v := range c.Outputs {
		isOut[v] = true
	}
	fusedAt := map[*graph.Node]*graph.Node{} // last member -> the fused node
	fusedCount := 0
	for _, gr := range groups {
		if len(gr.members) < 2 {
			continue
		}
		fn, err := buildFused(gr, groupOf, uses, isOut)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", PassFuseElementwise, err)
		}
		fusedAt[gr.members[len(gr.members)-1]] = fn
		fusedCount++
		if log != nil {
			ops := make([]string, len(gr.members))
			for i, m := range gr.members {
				ops[i] = m.Op
			}
			log.Add(Event{Pass: PassFuseElementwise, Kind: Fired, Rule: "elementwise_group", Node: gr.members[0].Name,
				Op: gr.members[0].Op, Result: fn.Name,
				Detail: fmt.Sprintf("%d ops (%s) over %v, %d inputs, %d outputs", len(gr.members), strings.Join(ops, " "),
					gr.shape, len(fn.Inputs), len(fn.Outputs))})
		}
	}
	if fusedCount == 0 {
		return g, nil
	}
	nodes := make([]*graph.Node, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		gr := groupOf[n]
		if gr == nil || len(gr.members) < 2 {
			nodes = append(nodes, n)
			continue
		}
		if fn := fusedAt[n]; fn != nil {
			nodes = append(nodes, fn)
		}
	}
	c.Nodes = nodes
	if log != nil {
		log.Infof(PassFuseElementwise, "%d fused elementwise nodes", fusedCount)
	}
	if err := graph.Verify(c); err != nil {
		return nil, fmt.Errorf("%s: internal error: %w", PassFuseElementwise, err)
	}
	return c, nil
}

// buildFused makes the FusedElementwise node of a group.
func buildFused(gr *ewGroup, groupOf map[*graph.Node]*ewGroup, uses map[*graph.Value][]*graph.Node, isOut map[*graph.Value]bool) (*graph.Node, error) {
	step := map[*graph.Value]int{}
	inIndex := map[*graph.Value]int{}
	var inputs []*graph.Value
	steps := make([]graph.FusedStep, len(gr.members))
	for k, m := range gr.members {
		s := graph.FusedStep{Op: m.Op}
		for _, v := range m.Inputs {
			if j, ok := step[v]; ok {
				s.Args = append(s.Args, graph.FusedOperand{Step: true, Index: j})
				continue
			}
			i, ok := inIndex[v]
			if !ok {
				i = len(inputs)
				inIndex[v] = i
				inputs = append(inputs, v)
			}
			s.Args = append(s.Args, graph.FusedOperand{Index: i})
		}
		steps[k] = s
		step[m.Outputs[0]] = k
	}
	fn := &graph.Node{Name: "fused/" + gr.members[0].Name, Op: "FusedElementwise", Inputs: inputs}
	var outIdx []int64
	for k, m := range gr.members {
		v := m.Outputs[0]
		needed := isOut[v]
		for _, u := range uses[v] {
			if groupOf[u] != gr {
				needed = true
			}
		}
		if needed {
			outIdx = append(outIdx, int64(k))
			v.Producer = fn
			fn.Outputs = append(fn.Outputs, v)
		}
	}
	if len(outIdx) == 0 {
		return nil, fmt.Errorf("group at %s computes nothing that is read", gr.members[0].Name)
	}
	fn.Attrs = graph.Attrs{"body": graph.Str(graph.FormatFusedBody(steps)), "outputs": graph.Ints(outIdx...)}
	return fn, nil
}
