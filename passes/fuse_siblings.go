package passes

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// Sibling fusion. Grouping follows producer-consumer edges, so two
// elementwise kernels that only share inputs stay apart: in a SwiGLU
// backward, one kernel reads gate and dact to write d(up) and another reads
// gate, up and dact to write d(gate), and gate and dact (a [B,S,hidden]
// activation each) are read twice. mergeSiblings merges two such nodes into
// one with both bodies and both outputs, so the shared inputs are read once.
//
// Two FusedElementwise nodes a (earlier) and b merge when:
//   - both bodies are purely elementwise (no reduction, no index steps) and
//     every output of both has one shape and dtype, so one kernel walks one
//     index space;
//   - they share an input of that full shape (what there is to save);
//   - every input of b exists before a, so the merged node can run where a
//     ran: no path leads from a to b, and everything that reads a's outputs
//     still comes after them. b's outputs are made earlier than before,
//     which can only lengthen their lives; siblingMaxGap bounds that.
//   - the merged node stays within the group limits.
const siblingMaxGap = 16 // b at most this many nodes after a

// pureElementwise reports the output shape and dtype of a FusedElementwise
// node whose body has no reduction and no index step and whose outputs all
// have one type.
func pureElementwise(n *graph.Node) (graph.TensorType, []graph.FusedStep, bool) {
	if _, reduces := n.Attrs["axes"]; n.Op != "FusedElementwise" || len(n.Outputs) == 0 || reduces {
		return graph.TensorType{}, nil, false
	}
	steps, err := graph.ParseFusedBody(n.Attrs.String("body", ""), len(n.Inputs))
	if err != nil {
		return graph.TensorType{}, nil, false
	}
	for _, s := range steps {
		if !graph.FusibleElementwise[s.Op] {
			return graph.TensorType{}, nil, false
		}
	}
	t := n.Outputs[0].Type
	for _, o := range n.Outputs[1:] {
		if !o.Type.Equal(t) {
			return graph.TensorType{}, nil, false
		}
	}
	return t, steps, true
}

// mergeSiblings merges sibling FusedElementwise nodes of c in place and
// returns how many merges it made.
func mergeSiblings(c *graph.Graph, log *Log) (int, error) {
	pos := map[*graph.Node]int{}
	for i, n := range c.Nodes {
		pos[n] = i
	}
	// definedBefore reports whether v exists before node index i.
	definedBefore := func(v *graph.Value, i int) bool {
		if v == nil || v.Producer == nil {
			return true
		}
		p, ok := pos[v.Producer]
		return ok && p < i
	}
	uses := c.Uses()
	removed := map[*graph.Node]bool{}
	merges := 0
	for i := 0; i < len(c.Nodes); i++ {
		a := c.Nodes[i]
		if removed[a] {
			continue
		}
		ta, stepsA, ok := pureElementwise(a)
		if !ok {
			continue
		}
		// Merge partners into a until none is left.
		refused := map[*graph.Node]bool{}
		for {
			b, v := siblingOf(a, ta, len(stepsA), i, pos, uses, func(n *graph.Node) bool { return removed[n] || refused[n] }, definedBefore)
			if b == nil {
				break
			}
			_, stepsB, _ := pureElementwise(b)
			merged, err := mergeBodies(a, b, stepsA, stepsB)
			if err != nil {
				return merges, err
			}
			if merged == nil { // too many inputs: leave b alone
				refused[b] = true
				continue
			}
			if log != nil {
				log.Add(Event{Pass: PassFuseElementwise, Kind: Fired, Rule: "sibling_merge", Node: b.Name, Op: b.Op,
					Result: merged.Name, Detail: fmt.Sprintf("reads %s like %s; %d steps, %d inputs, %d outputs",
						v.Name, a.Name, len(stepsA)+len(stepsB), len(merged.Inputs), len(merged.Outputs))})
			}
			removed[b] = true
			c.Nodes[i] = merged
			pos[merged] = i
			for _, in := range merged.Inputs {
				uses[in] = append(uses[in], merged)
			}
			a = merged
			_, stepsA, _ = pureElementwise(merged)
			merges++
		}
	}
	if merges == 0 {
		return 0, nil
	}
	nodes := c.Nodes[:0]
	for _, n := range c.Nodes {
		if !removed[n] {
			nodes = append(nodes, n)
		}
	}
	c.Nodes = nodes
	return merges, nil
}

// siblingOf finds a node that may merge into a (at node index i) and the
// full-shape input they share; nil when there is none.
func siblingOf(a *graph.Node, ta graph.TensorType, nsteps, i int, pos map[*graph.Node]int, uses map[*graph.Value][]*graph.Node,
	skip func(*graph.Node) bool, definedBefore func(*graph.Value, int) bool) (*graph.Node, *graph.Value) {
	for _, v := range a.Inputs {
		if !v.Type.Shape.Equal(ta.Shape) {
			continue
		}
		for _, b := range uses[v] {
			if b == a || skip(b) || pos[b] <= i || pos[b]-i > siblingMaxGap {
				continue
			}
			tb, stepsB, ok := pureElementwise(b)
			if !ok || !tb.Equal(ta) || nsteps+len(stepsB) > fuseMaxSteps {
				continue
			}
			ready := true
			for _, in := range b.Inputs {
				ready = ready && definedBefore(in, i)
			}
			if ready {
				return b, v
			}
		}
	}
	return nil, nil
}

// mergeBodies returns the node that computes a's and b's outputs: a's
// inputs then b's new ones, a's steps then b's, a's outputs then b's. Nil
// when the inputs would exceed the group limit.
func mergeBodies(a, b *graph.Node, stepsA, stepsB []graph.FusedStep) (*graph.Node, error) {
	inputs := append([]*graph.Value(nil), a.Inputs...)
	index := map[*graph.Value]int{}
	for k, v := range inputs {
		if _, ok := index[v]; !ok {
			index[v] = k
		}
	}
	remap := make([]int, len(b.Inputs))
	for k, v := range b.Inputs {
		j, ok := index[v]
		if !ok {
			j = len(inputs)
			index[v] = j
			inputs = append(inputs, v)
		}
		remap[k] = j
	}
	if len(inputs) > fuseMaxInputs {
		return nil, nil
	}
	steps := append(append([]graph.FusedStep(nil), stepsA...), shiftSteps(stepsB, remap, len(stepsA))...)
	outA, outB := a.Attrs.IntList("outputs"), b.Attrs.IntList("outputs")
	if len(outA) != len(a.Outputs) || len(outB) != len(b.Outputs) {
		return nil, fmt.Errorf("%s: internal error: %s or %s lists outputs that do not match its values", PassFuseElementwise, a.Name, b.Name)
	}
	outs := append([]int64(nil), outA...)
	for _, k := range outB {
		outs = append(outs, k+int64(len(stepsA)))
	}
	m := &graph.Node{Name: a.Name, Op: "FusedElementwise", Inputs: inputs,
		Attrs: graph.Attrs{"body": graph.Str(graph.FormatFusedBody(steps)), "outputs": graph.Ints(outs...)}}
	for _, v := range append(append([]*graph.Value(nil), a.Outputs...), b.Outputs...) {
		v.Producer = m
		m.Outputs = append(m.Outputs, v)
	}
	return m, nil
}

// shiftSteps renumbers steps for a body they are appended to: step operands
// move by shift, input operands through remap (nil: unchanged).
func shiftSteps(steps []graph.FusedStep, remap []int, shift int) []graph.FusedStep {
	out := make([]graph.FusedStep, len(steps))
	for k, s := range steps {
		args := make([]graph.FusedOperand, len(s.Args))
		for j, a := range s.Args {
			switch {
			case a.Step:
				a.Index += shift
			case remap != nil:
				a.Index = remap[a.Index]
			}
			args[j] = a
		}
		out[k] = graph.FusedStep{Op: s.Op, Params: s.Params, Attrs: s.Attrs, Args: args}
	}
	return out
}
