package passes

import (
	"fmt"
	"slices"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// PassFuseElementwise names the elementwise fusion.
const PassFuseElementwise = "fuse_elementwise"

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
// op stay as they are. An op that reads values of two open groups that could
// both take it merges them (neither has been read outside yet).
//
// A row reduction (ReduceSum or ReduceMean over the last axis) joins the
// group that made its operand, as that group's one reduction: from then on
// the group has the reduced shape, so the elementwise ops on the reduced
// values (an RMSNorm's eps, square root and reciprocal; the backward's
// scaling of a row sum) join it too, and the whole chain becomes one kernel
// that never writes the reduced operand. An elementwise op of the reduced
// operand's shape after the reduction joins too (walksRowAgain: the
// normalisation x·rstd·w, a norm backward's combination of a row sum with
// the row's elements): it may read the group's row values, broadcast along
// the row, and its element values from before the reduction, which a
// generated kernel recomputes in a second walk over the row. Unless those
// ops feed only elementwise ops of other groups (a layer norm backward's x·c
// terms, which the body summing dx's terms computes itself): then the
// reduction takes none (row_walk refused, and the nodes are grouped again).
// A group with a reduction merges with no other.
//
// A ReduceSum over leading axes of a group's value (a norm backward's
// weight gradient, the column sum of dy·x̂) and a Reshape of its result do
// not close the group: they run right after its fused node
// (deferredReader), so the body that makes dy·w and dy·x̂ goes on to take
// in the row sum and dx, and a norm backward is one body. Any other reader
// of their values closes the group. A group the column sum is the first
// to read joins an open sibling first (one that shares a full-shape input:
// the final norm's dy·x̂ and dy·w, both of the loss GEMM's dy). Not when
// the group then has a
// reduction and reads an index chain or is read by a Transpose (a q/k head
// norm's, after RoPE's gradient): those join groups without a reduction
// only (defer_reader refused, and the nodes are grouped again).
//
// After grouping, a Slice read only by bodies is read in place by each, and
// a Concat of values only it reads is written by one body
// (fuse_elementwise_slices.go: fuse_qkv's head splits and their gradients).
//
// Before grouping, cheap elementwise values that are kept only for late
// elementwise readers are recomputed next to those readers (rematerialize),
// and an Expand read only by elementwise ops that broadcast anyway is
// bypassed (foldExpands).
type FuseElementwise struct {
	// NoRemat turns rematerialisation off (see rematerialize): for a
	// backend whose elementwise work is bound by arithmetic, not memory
	// traffic, computing a transcendental twice costs more than keeping it.
	NoRemat bool
}

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
	// reduce is the group's reduction member (nil: none); from it on the
	// group's shape is the reduced one.
	reduce *graph.Node
	axes   []int64
	// reads are the Transposes whose values the group reads through a
	// Transpose step of their input (by the value they make); writes are
	// the Transposes that alone read a value of the group, which the group
	// writes transposed instead (by the value they read). Both nodes go.
	reads, writes map[*graph.Value]*graph.Node
	// into is the group this one was merged into (nil: none).
	into *ewGroup
	// after are the nodes that read the group's values but run after it
	// (deferredReader): a norm backward's column ReduceSum of dy·x̂ and
	// its Reshape, in node order.
	after []*graph.Node
}

// final is the group gr's members ended up in.
func (gr *ewGroup) final() *ewGroup {
	for gr.into != nil {
		gr = gr.into
	}
	return gr
}

// fused reports whether the group becomes a FusedElementwise node: two ops
// or more, or one op and a Transpose it takes in.
func (gr *ewGroup) fused() bool {
	return len(gr.members) >= 2 || len(gr.members) == 1 && len(gr.reads)+len(gr.writes) > 0
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

// bodyOperands are the inputs of group member n that become operands of its
// body step: a reduction's axes and a Slice's bounds are constants that
// become the node's attributes or the step's parameters instead.
func bodyOperands(n *graph.Node) []*graph.Value {
	if n.Op == "Slice" || graph.FusibleReduce[n.Op] {
		return n.Inputs[:1]
	}
	return n.Inputs
}

// fusibleReduce reports whether n is a reduction a group may end with: a
// ReduceSum or ReduceMean of a float tensor over its last axis only (the
// generated kernels reduce rows), with constant axes. It returns the axes.
func fusibleReduce(n *graph.Node) ([]int64, bool) {
	if !graph.FusibleReduce[n.Op] || len(n.Inputs) != 2 || n.Inputs[0] == nil || n.Inputs[1] == nil {
		return nil, false
	}
	x, a := n.Inputs[0], n.Inputs[1]
	if !x.Type.DType.IsFloat() || x.Type.Shape.Numel() == 0 || x.Type.Shape.Rank() == 0 ||
		n.Attrs.Int("noop_with_empty_axes", 0) != 0 {
		return nil, false
	}
	if a.Kind != graph.Const || a.Init == nil || a.Type.DType != graph.Int64 || a.Type.Shape.Numel() != 1 {
		return nil, false
	}
	t, err := a.Init.Materialize(a.Type)
	if err != nil || len(t.I64) != 1 {
		return nil, false
	}
	r := int64(x.Type.Shape.Rank())
	if ax := t.I64[0]; ax != -1 && ax != r-1 {
		return nil, false
	}
	if x.Type.Shape[r-1] < 2 {
		return nil, false // reducing an axis of one element is a copy
	}
	return []int64{-1}, true
}

// Run returns g itself when no group has two ops.
func (f FuseElementwise) Run(g *graph.Graph, log *Log) (*graph.Graph, error) {
	if g == nil {
		return nil, errNilGraph
	}
	c := g.Clone()
	rewritten := 0
	if !f.NoRemat {
		rewritten = rematerialize(c, log)
	}
	rewritten += foldExpands(c, log)
	uses := c.Uses()
	isOut := map[*graph.Value]bool{}
	for _, v := range c.Outputs {
		isOut[v] = true
	}
	// A reduction whose element steps after it only feed elementwise ops
	// of other groups keeps them out: those readers compute them in
	// registers anyway, and the body would write full tensors they read
	// back (a norm backward's x·c terms, summed with the other gradient
	// terms by the next body).
	//
	// A reader deferred past a group with a reduction (deferredReader) is
	// not deferred when that group reads an index chain's result or is
	// read by a Transpose (a q/k head norm's backward after RoPE's): the
	// chain and the transposed write join groups without a reduction
	// only, so the group would cost more nodes than the deferral saves.
	noWalk := map[*graph.Node]bool{}
	noDefer := map[*graph.Node]bool{}
	made := map[*graph.Value]*graph.Node{}
	for _, n := range c.Nodes {
		for _, o := range n.Outputs {
			made[o] = n
		}
	}
	var groups []*ewGroup
	var owner map[*graph.Value]*ewGroup
	var groupOf map[*graph.Node]*ewGroup
	for {
		groups, owner, groupOf = groupElementwise(c.Nodes, noWalk, noDefer)
		again := false
		for _, gr := range groups {
			if gr.reduce == nil || len(gr.members) == 0 {
				continue
			}
			if len(gr.after) > 0 && readsIndexOrTransposed(gr, made, uses) {
				for _, n := range gr.after {
					if !noDefer[n] {
						noDefer[n], again = true, true
						if log != nil && n.Op == "ReduceSum" {
							log.Add(Event{Pass: PassFuseElementwise, Kind: Refused, Rule: "defer_reader", Node: n.Name, Op: n.Op,
								Reason: "the group it would follow has a row reduction and reads an index chain or is read by a Transpose, which join groups without one only"})
						}
					}
				}
			}
			if !noWalk[gr.reduce] && lateFeedsOnlyElementwise(gr, groupOf, uses, isOut) {
				noWalk[gr.reduce], again = true, true
				if log != nil {
					log.Add(Event{Pass: PassFuseElementwise, Kind: Refused, Rule: "row_walk", Node: gr.reduce.Name, Op: gr.reduce.Op,
						Reason: "the element ops after the reduction feed only elementwise ops of other groups, which compute them themselves"})
				}
			}
		}
		if !again {
			break
		}
	}

	absorbIndexChains(groups, groupOf, owner, uses, isOut, log)
	absorbed := absorbTransposes(c.Nodes, groupOf, uses, isOut, log)
	pos := make(map[*graph.Node]int, len(c.Nodes))
	for i, n := range c.Nodes {
		pos[n] = i
	}
	fusedAt := map[*graph.Node]*graph.Node{} // last member -> the fused node
	fusedCount := 0
	for _, gr := range groups {
		if len(gr.members) == 1 && !gr.fused() && log != nil {
			n := gr.members[0]
			log.Add(Event{Pass: PassFuseElementwise, Kind: Refused, Rule: "elementwise_group", Node: n.Name, Op: n.Op,
				Reason: loneReason(n, uses)})
		}
		if !gr.fused() {
			continue
		}
		// Merged groups interleave: the body follows the graph's order.
		slices.SortFunc(gr.members, func(a, b *graph.Node) int { return pos[a] - pos[b] })
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
			detail := fmt.Sprintf("%d ops (%s) over %s, %d inputs, %d outputs", len(gr.members), strings.Join(ops, " "),
				groupShape(gr), len(fn.Inputs), len(fn.Outputs))
			if n := len(gr.reads) + len(gr.writes); n > 0 {
				detail += fmt.Sprintf(", %d Transposes as index steps", n)
			}
			log.Add(Event{Pass: PassFuseElementwise, Kind: Fired, Rule: "elementwise_group", Node: gr.members[0].Name,
				Op: gr.members[0].Op, Result: fn.Name, Detail: detail})
		}
	}
	if fusedCount == 0 && rewritten == 0 {
		return g, nil
	}
	// A fused group's deferred readers run right after its node.
	deferred := map[*graph.Node]bool{}
	for _, gr := range groups {
		if gr.fused() {
			for _, n := range gr.after {
				deferred[n] = true
			}
		}
	}
	nodes := make([]*graph.Node, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		if absorbed[n] || deferred[n] {
			continue
		}
		gr := groupOf[n]
		if gr == nil || !gr.fused() {
			nodes = append(nodes, n)
			continue
		}
		if fn := fusedAt[n]; fn != nil {
			nodes = append(nodes, fn)
			nodes = append(nodes, gr.after...)
		}
	}
	c.Nodes = nodes
	siblings, err := mergeSiblings(c, log)
	if err != nil {
		return nil, err
	}
	if _, err := readSlicesInPlace(c, log); err != nil {
		return nil, fmt.Errorf("%s: %w", PassFuseElementwise, err)
	}
	if _, err := writeConcatsInPlace(c, log); err != nil {
		return nil, fmt.Errorf("%s: %w", PassFuseElementwise, err)
	}
	if log != nil {
		log.Infof(PassFuseElementwise, "%d fused elementwise nodes, %d merged with a sibling", fusedCount-siblings, siblings)
	}
	if err := graph.Verify(c); err != nil {
		return nil, fmt.Errorf("%s: internal error: %w", PassFuseElementwise, err)
	}
	return c, nil
}

// groupElementwise groups nodes (see FuseElementwise), in node order: no
// element op joins a group after a reduction in noWalk.
func groupElementwise(nodes []*graph.Node, noWalk, noDefer map[*graph.Node]bool) ([]*ewGroup, map[*graph.Value]*ewGroup, map[*graph.Node]*ewGroup) {
	owner := map[*graph.Value]*ewGroup{} // value -> the group whose member made it
	groupOf := map[*graph.Node]*ewGroup{}
	// follows: a value a deferred reader makes -> the group it runs after.
	follows := map[*graph.Value]*ewGroup{}
	var groups []*ewGroup
	for _, n := range nodes {
		if gr := deferredReader(n, owner, follows); gr != nil && !noDefer[n] {
			// A group nothing else has read yet may join an open sibling
			// (a shared input, see openSiblingOf) first.
			if gr.reduce == nil && len(gr.after) == 0 {
				if sib := openSiblingOf(gr, groups); sib != nil {
					for _, m := range gr.members {
						groupOf[m] = sib
						owner[m.Outputs[0]] = sib
					}
					sib.members = append(sib.members, gr.members...)
					for in := range gr.inputs {
						if owner[in] != sib {
							sib.inputs[in] = true
						}
					}
					gr.members, gr.closed, gr.into = nil, true, sib
					gr = sib
				}
			}
			gr.after = append(gr.after, n)
			for _, o := range n.Outputs {
				follows[o] = gr
			}
			continue
		}
		// Any other reader of a deferred reader's value runs after the
		// group, which takes in nothing from here on.
		for _, v := range n.Inputs {
			if gr := follows[v]; gr != nil {
				gr.final().closed = true
			}
		}
		ok, _ := fusibleNode(n)
		axes, isReduce := fusibleReduce(n)
		var target *ewGroup
		if isReduce {
			// A reduction joins the open group that made its operand (one
			// without a reduction yet), or starts a group of its own.
			ok = true
			x := n.Inputs[0]
			if gr := owner[x]; gr != nil && !gr.closed && gr.reduce == nil && gr.shape.Equal(x.Type.Shape) &&
				gr.dt == x.Type.DType && len(gr.members) < fuseMaxSteps {
				target = gr
			}
		} else if ok {
			out := n.Outputs[0].Type
			for _, v := range n.Inputs {
				gr := owner[v]
				if gr == nil || gr.closed || gr.dt != out.DType {
					continue
				}
				// An op of the group's shape joins; so does, in a group with
				// a reduction, an op of the reduced operand's shape (a second
				// walk over the row).
				walk := walksRowAgain(gr, out.Shape) && !noWalk[gr.reduce]
				if !gr.shape.Equal(out.Shape) && !walk {
					continue
				}
				if gr.reduce != nil && !walk && !readsOnlyReduced(n, gr, owner) {
					continue
				}
				if len(gr.members) >= fuseMaxSteps || len(gr.inputs)+len(n.Inputs) > fuseMaxInputs {
					continue
				}
				target = gr
				break
			}
		}
		// Other open groups n reads from that could take n too are merged
		// into the target (none of them has been read outside yet, so the
		// merged group can still run at its last member); every other group
		// n reads from must run before n: close it.
		for _, v := range n.Inputs {
			gr := owner[v]
			if gr == nil || gr == target {
				continue
			}
			// A group with a reduction takes in an open group of its
			// reduced shape (those ops run after the row is reduced);
			// two reductions never meet in one group.
			if target != nil && !gr.closed && gr.reduce == nil && !isReduce && gr.shape.Equal(target.shape) && gr.dt == target.dt &&
				len(gr.members)+len(target.members) < fuseMaxSteps && len(gr.inputs)+len(target.inputs)+len(n.Inputs) <= fuseMaxInputs {
				for _, m := range gr.members {
					groupOf[m] = target
					owner[m.Outputs[0]] = target
				}
				target.members = append(target.members, gr.members...)
				target.after = append(target.after, gr.after...)
				gr.after, gr.into = nil, target
				for in := range gr.inputs {
					if owner[in] != target {
						target.inputs[in] = true
					}
				}
				for in := range target.inputs {
					if owner[in] == target {
						delete(target.inputs, in)
					}
				}
				gr.members, gr.closed = nil, true
				continue
			}
			gr.closed = true
		}
		if !ok {
			continue
		}
		if target == nil {
			target = &ewGroup{shape: n.Outputs[0].Type.Shape, dt: n.Outputs[0].Type.DType, inputs: map[*graph.Value]bool{}}
			groups = append(groups, target)
		}
		target.members = append(target.members, n)
		if isReduce {
			target.reduce, target.axes = n, axes
			target.shape = n.Outputs[0].Type.Shape
		}
		for _, v := range bodyOperands(n) {
			if owner[v] != target {
				target.inputs[v] = true
			}
		}
		groupOf[n] = target
		owner[n.Outputs[0]] = target
	}
	return groups, owner, groupOf
}

// deferredReader returns the open group whose fused node n is to run after,
// or nil when n runs where it is: n is a ReduceSum over leading axes (not a
// row reduction a group takes in) of a value an open group made, or a
// Reshape of such a ReduceSum's result. The group stays open past n: a norm
// backward's dy·w keeps taking in the row sum and dx after dy·x̂ is read by
// the weight gradient's column ReduceSum, which then reads dy·x̂ once the
// group's kernel has written it. Any other node that reads a value n makes
// closes the group (so n still runs before it), and nothing n makes feeds
// the group.
func deferredReader(n *graph.Node, owner, follows map[*graph.Value]*ewGroup) *ewGroup {
	if len(n.Inputs) != 2 || n.Inputs[0] == nil || n.Inputs[1] == nil || n.Inputs[1].Kind != graph.Const {
		return nil
	}
	var gr *ewGroup
	switch n.Op {
	case "ReduceSum":
		if _, row := fusibleReduce(n); row {
			return nil
		}
		gr = owner[n.Inputs[0]]
	case "Reshape":
		gr = follows[n.Inputs[0]]
	}
	if gr == nil {
		return nil
	}
	if gr = gr.final(); gr.closed {
		return nil
	}
	return gr
}

// openSiblingOf returns an open group without a reduction, other than gr (one
// without a reduction too), of gr's shape and dtype, that reads a full-shape
// input gr reads and can take in gr's members within the limits; nil if
// none. The final norm's backward computes dy·w before dy·x̂, both from the
// loss GEMM's dy: when the weight gradient's column sum is deferred past
// dy·x̂, dy·x̂ joins the body that makes dy·w and dx instead of being a
// kernel of its own that reads dy again.
func openSiblingOf(gr *ewGroup, groups []*ewGroup) *ewGroup {
	for _, o := range groups {
		if o == gr || o.closed || o.reduce != nil || len(o.members) == 0 || !o.shape.Equal(gr.shape) || o.dt != gr.dt ||
			len(o.members)+len(gr.members) > fuseMaxSteps || len(o.inputs)+len(gr.inputs) > fuseMaxInputs {
			continue
		}
		for v := range gr.inputs {
			if o.inputs[v] && v.Type.Shape.Equal(gr.shape) {
				return o
			}
		}
	}
	return nil
}

// readsIndexOrTransposed reports whether gr reads a value a Slice or Concat
// made, or a Transpose reads one of gr's values.
func readsIndexOrTransposed(gr *ewGroup, made map[*graph.Value]*graph.Node, uses map[*graph.Value][]*graph.Node) bool {
	for _, m := range gr.members {
		for _, v := range bodyOperands(m) {
			if p := made[v]; p != nil && (p.Op == "Slice" || p.Op == "Concat") {
				return true
			}
		}
		for _, u := range uses[m.Outputs[0]] {
			if u.Op == "Transpose" {
				return true
			}
		}
	}
	return false
}

// lateFeedsOnlyElementwise reports whether gr, a group with a reduction,
// has element members after it (of the reduced operand's shape) and
// everything outside gr that reads them is a fusible elementwise op (no
// graph output, no other op).
func lateFeedsOnlyElementwise(gr *ewGroup, groupOf map[*graph.Node]*ewGroup, uses map[*graph.Value][]*graph.Node, isOut map[*graph.Value]bool) bool {
	full := gr.reduce.Inputs[0].Type.Shape
	after, late := false, false
	for _, m := range gr.members {
		if m == gr.reduce {
			after = true
			continue
		}
		if !after || !m.Outputs[0].Type.Shape.Equal(full) {
			continue
		}
		late = true
		if isOut[m.Outputs[0]] {
			return false
		}
		for _, u := range uses[m.Outputs[0]] {
			if groupOf[u] == gr {
				continue
			}
			if ok, _ := fusibleNode(u); !ok {
				return false
			}
		}
	}
	return late
}

// buildFused makes the FusedElementwise node of a group. A Transpose the
// group reads becomes a Transpose step of its input before the first step
// that reads it; one it writes, a Transpose step right after the step it
// transposes, whose value the node outputs under the Transpose's name.
func buildFused(gr *ewGroup, groupOf map[*graph.Node]*ewGroup, uses map[*graph.Value][]*graph.Node, isOut map[*graph.Value]bool) (*graph.Node, error) {
	step := map[*graph.Value]int{}
	inIndex := map[*graph.Value]int{}
	var inputs []*graph.Value
	var steps []graph.FusedStep
	var made []*graph.Value // per step: the graph's value it computes, nil for a read Transpose
	input := func(v *graph.Value) graph.FusedOperand {
		i, ok := inIndex[v]
		if !ok {
			i = len(inputs)
			inIndex[v] = i
			inputs = append(inputs, v)
		}
		return graph.FusedOperand{Index: i}
	}
	// add appends step s computing v; made says whether v is the node's
	// to output (a value a group member or written Transpose made) or only
	// the body's (a read Transpose's).
	add := func(s graph.FusedStep, v *graph.Value, output bool) graph.FusedOperand {
		steps = append(steps, s)
		if output {
			made = append(made, v)
		} else {
			made = append(made, nil)
		}
		step[v] = len(steps) - 1
		return graph.FusedOperand{Step: true, Index: len(steps) - 1}
	}
	operand := func(v *graph.Value) graph.FusedOperand {
		if j, ok := step[v]; ok {
			return graph.FusedOperand{Step: true, Index: j}
		}
		if t := gr.reads[v]; t != nil {
			return add(graph.FusedStep{Op: "Transpose", Params: transposePerm(t), Args: []graph.FusedOperand{input(t.Inputs[0])}}, v, false)
		}
		return input(v)
	}
	for _, m := range gr.members {
		// An op whose expression reads attributes carries the node's values.
		s := graph.FusedStep{Op: m.Op, Attrs: graph.ExprStepAttrs(m.Op, m.Attrs)}
		switch m.Op {
		case "Slice":
			axis, start, end, _ := sliceParams(m)
			s.Params = []int64{axis, start, end}
		case "Concat":
			axis, _ := concatAxis(m)
			s.Params = []int64{axis}
		}
		for _, v := range bodyOperands(m) {
			s.Args = append(s.Args, operand(v))
		}
		t := add(s, m.Outputs[0], true)
		if w := gr.writes[m.Outputs[0]]; w != nil {
			add(graph.FusedStep{Op: "Transpose", Params: transposePerm(w), Args: []graph.FusedOperand{t}}, w.Outputs[0], true)
		}
	}
	fn := &graph.Node{Name: "fused/" + gr.members[0].Name, Op: "FusedElementwise", Inputs: inputs}
	var outIdx []int64
	for k, v := range made {
		if v == nil {
			continue // a transposed input, read only inside
		}
		w := gr.writes[v]
		needed := isOut[v]
		for _, u := range uses[v] {
			if groupOf[u] != gr && u != w {
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
	if gr.reduce != nil {
		fn.Attrs["axes"] = graph.Ints(gr.axes...)
		fn.Attrs["keepdims"] = graph.Int(gr.reduce.Attrs.Int("keepdims", 1))
	}
	return fn, nil
}

// Rematerialisation. A training step keeps forward values alive until the
// backward reads them; an elementwise value (a SiLU, a sigmoid, a normalised
// activation) is as cheap to compute again from the values it came from as to
// read back, and keeping it costs a whole activation per layer. When every
// late reader of such a value is itself an elementwise op of the same shape
// (so that the copy fuses into the reader's kernel), and what the value is
// computed from is alive at each reader anyway, each reader gets its own copy
// of the producing ops, placed just before it, and the original dies with the
// forward. This is what torch.compile's min-cut partitioner decides for
// pointwise ops; here it is a local rule.
//
// A value the recompute pass cloned for the backward (a node scoped
// recomputeCloneScope) is rematerialised in all its readers, near ones too,
// when they are all elementwise: it was computed again only to be read there,
// so computing it inside their kernels instead of storing it is the same
// arithmetic and saves its write and reads. Without this, -recompute=cheap's
// SwiGLU clone wrote the sigmoid, the SiLU and the product (three activations)
// for the backward's kernels to read back, where the plain step's backward
// computes the first two inside its one kernel.
const (
	rematGap   = 32 // a reader at least this many nodes later is "late"
	rematDepth = 3  // producers copied along one chain at most
)

// rematerialize rewrites c in place and returns how many values it stopped
// keeping.
func rematerialize(c *graph.Graph, log *Log) int {
	pos := make(map[*graph.Node]int, len(c.Nodes))
	for i, n := range c.Nodes {
		pos[n] = i
	}
	uses := c.Uses()
	lastUse := map[*graph.Value]int{}
	for v, us := range uses {
		for _, u := range us {
			lastUse[v] = max(lastUse[v], pos[u])
		}
	}
	for _, v := range c.Outputs {
		lastUse[v] = len(c.Nodes)
	}
	fusibleProducer := func(v *graph.Value) *graph.Node {
		if v.Producer == nil {
			return nil
		}
		if ok, _ := fusibleNode(v.Producer); !ok {
			return nil
		}
		return v.Producer
	}
	// anchorNear: u is not elementwise-made and is read at or shortly before
	// position at (reading it at `at` stretches its life by less than the
	// gap, where keeping the rematerialised value would stretch another's
	// across the whole backward).
	anchorNear := func(u *graph.Value, at int) bool {
		return u.Producer == nil || fusibleProducer(u) == nil && lastUse[u] >= at-rematGap
	}
	// canRemat: v can be computed again at position at from values alive there.
	var canRemat func(v *graph.Value, at, depth int) bool
	canRemat = func(v *graph.Value, at, depth int) bool {
		p := fusibleProducer(v)
		if p == nil || depth > rematDepth {
			return false
		}
		for _, u := range p.Inputs {
			if anchorNear(u, at) {
				continue // an input, initializer, or an anchor alive near `at`
			}
			if !canRemat(u, at, depth+1) {
				return false
			}
		}
		return true
	}
	type job struct {
		v      *graph.Value
		reader *graph.Node
	}
	var jobs []job
	count := 0
	var saved int64
	for _, n := range c.Nodes {
		if ok, _ := fusibleNode(n); !ok {
			continue
		}
		v := n.Outputs[0]
		if lastUse[v] == len(c.Nodes) {
			continue // a graph output is kept anyway
		}
		var late []*graph.Node
		all := true
		clone := strings.HasPrefix(n.Name, recomputeCloneScope)
		for _, u := range uses[v] {
			if pos[u]-pos[n] < rematGap && !clone {
				continue
			}
			ok, _ := fusibleNode(u)
			if !ok || !u.Outputs[0].Type.Shape.Equal(v.Type.Shape) || u.Outputs[0].Type.DType != v.Type.DType || !canRemat(v, pos[u], 1) {
				all = false
				break
			}
			late = append(late, u)
		}
		if !all || len(late) == 0 {
			continue
		}
		for _, u := range late {
			jobs = append(jobs, job{v, u})
		}
		count++
		saved += int64(v.Type.Shape.Numel()) * int64(v.Type.DType.Size())
	}
	if len(jobs) == 0 {
		return 0
	}
	// Copies go in just before their reader; a reader with several
	// rematerialised inputs shares copies of common producers.
	before := map[*graph.Node][]*graph.Node{}
	copies := map[*graph.Node]map[*graph.Value]*graph.Value{}
	var clone func(v *graph.Value, reader *graph.Node) *graph.Value
	clone = func(v *graph.Value, reader *graph.Node) *graph.Value {
		if copies[reader] == nil {
			copies[reader] = map[*graph.Value]*graph.Value{}
		}
		if cv, ok := copies[reader][v]; ok {
			return cv
		}
		p := v.Producer
		cn := &graph.Node{Name: "remat/" + reader.Name + "/" + p.Name, Op: p.Op, Attrs: p.Attrs.Clone()}
		for _, u := range p.Inputs {
			if !anchorNear(u, pos[reader]) {
				u = clone(u, reader)
			}
			cn.Inputs = append(cn.Inputs, u)
		}
		cv := &graph.Value{Name: "remat/" + reader.Name + "/" + v.Name, Type: v.Type, Kind: graph.Intermediate, Producer: cn}
		cn.Outputs = []*graph.Value{cv}
		before[reader] = append(before[reader], cn)
		copies[reader][v] = cv
		return cv
	}
	for _, j := range jobs {
		cv := clone(j.v, j.reader)
		for i, in := range j.reader.Inputs {
			if in == j.v {
				j.reader.Inputs[i] = cv
			}
		}
	}
	nodes := make([]*graph.Node, 0, len(c.Nodes)+len(jobs))
	for _, n := range c.Nodes {
		nodes = append(nodes, before[n]...)
		nodes = append(nodes, n)
	}
	var producers []*graph.Node
	for _, j := range jobs {
		producers = append(producers, j.v.Producer)
	}
	c.Nodes = dropUnread(nodes, c.Outputs, producers)
	if log != nil {
		log.Infof(PassFuseElementwise, "recomputed %d elementwise values in their late readers instead of keeping them (%d bytes)", count, saved)
	}
	return count
}

// dropUnread removes from nodes the elementwise nodes among from that
// nothing reads any more (no node, no graph output), and then those among
// their producers that this leaves unread, in turn: a recompute clone whose
// readers now compute it themselves, with the copies made for it.
func dropUnread(nodes []*graph.Node, outputs []*graph.Value, from []*graph.Node) []*graph.Node {
	reads := map[*graph.Value]int{}
	for _, n := range nodes {
		for _, v := range n.Inputs {
			reads[v]++
		}
	}
	for _, v := range outputs {
		reads[v]++
	}
	dead := map[*graph.Node]bool{}
	work := slices.Clone(from)
	for len(work) > 0 {
		n := work[len(work)-1]
		work = work[:len(work)-1]
		if n == nil || dead[n] {
			continue
		}
		if ok, _ := fusibleNode(n); !ok {
			continue
		}
		unread := true
		for _, v := range n.Outputs {
			unread = unread && reads[v] == 0
		}
		if !unread {
			continue
		}
		dead[n] = true
		for _, v := range n.Inputs {
			reads[v]--
			if v.Producer != nil {
				work = append(work, v.Producer)
			}
		}
	}
	if len(dead) == 0 {
		return nodes
	}
	return slices.DeleteFunc(nodes, func(n *graph.Node) bool { return dead[n] })
}

// loneReason says why an elementwise node stayed alone: what feeds it and
// what reads it are not elementwise ops of its shape (or the group it could
// join was already read by something else).
func loneReason(n *graph.Node, uses map[*graph.Value][]*graph.Node) string {
	var readers []string
	seen := map[string]bool{}
	for _, u := range uses[n.Outputs[0]] {
		if !seen[u.Op] {
			seen[u.Op] = true
			readers = append(readers, u.Op)
		}
	}
	slices.Sort(readers)
	if len(readers) == 0 {
		readers = []string{"no node (a graph output)"}
	}
	return fmt.Sprintf("no elementwise op of shape %v feeds it in an open group or reads it first; read by %s",
		n.Outputs[0].Type.Shape, strings.Join(readers, ", "))
}

// walksRowAgain reports whether an elementwise op of shape out may join gr
// as an element step after its reduction: gr has a row reduction that keeps
// the reduced axis (so a row value broadcasts along its row) and out is the
// reduced operand's shape. A generated kernel computes such steps in a second
// walk over the row, once the row's values are known, recomputing the
// element steps before the reduction that they read; the CPU runs them on
// the [rows, last] tensors of its row chunks, broadcasting the row values.
func walksRowAgain(gr *ewGroup, out graph.Shape) bool {
	return gr.reduce != nil && gr.reduce.Attrs.Int("keepdims", 1) == 1 && out.Equal(gr.reduce.Inputs[0].Type.Shape)
}

// readsOnlyReduced reports whether elementwise n may join gr, a group with a
// reduction: it reads none of the values gr computed before its reduction
// (those have the unreduced shape; a generated kernel has them only while
// it walks a row).
func readsOnlyReduced(n *graph.Node, gr *ewGroup, owner map[*graph.Value]*ewGroup) bool {
	after := false
	before := map[*graph.Value]bool{}
	for _, m := range gr.members {
		if m == gr.reduce {
			after = true
			continue
		}
		if !after {
			before[m.Outputs[0]] = true
		}
	}
	for _, v := range n.Inputs {
		if owner[v] == gr && before[v] {
			return false
		}
	}
	return true
}

// foldExpands bypasses Expand nodes whose every reader is a fusible
// elementwise op that gives the Expand's shape with the unexpanded operand
// too (broadcasting does the Expand's work): the readers read the Expand's
// input, and the Expand, unread, goes. It returns how many went. An Expand
// that is a graph output stays.
func foldExpands(c *graph.Graph, log *Log) int {
	uses := c.Uses()
	isOut := map[*graph.Value]bool{}
	for _, v := range c.Outputs {
		isOut[v] = true
	}
	dropped := map[*graph.Node]bool{}
	for _, n := range c.Nodes {
		if n.Op != "Expand" || len(n.Inputs) == 0 || n.Inputs[0] == nil || isOut[n.Outputs[0]] {
			continue
		}
		y, x := n.Outputs[0], n.Inputs[0]
		readers := uses[y]
		if len(readers) == 0 {
			continue
		}
		ok := true
		for _, u := range readers {
			if fine, _ := fusibleNode(u); !fine || !u.Outputs[0].Type.Shape.Equal(y.Type.Shape) ||
				!broadcastsTo(u, y, x, y.Type.Shape) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		for _, u := range readers {
			for i, in := range u.Inputs {
				if in == y {
					u.Inputs[i] = x
				}
			}
		}
		dropped[n] = true
		if log != nil {
			log.Add(Event{Pass: PassFuseElementwise, Kind: Fired, Rule: "expand_to_broadcast", Node: n.Name, Op: n.Op,
				Detail: fmt.Sprintf("%d elementwise readers broadcast %v to %v themselves", len(readers), x.Type.Shape, y.Type.Shape)})
		}
	}
	if len(dropped) == 0 {
		return 0
	}
	c.Nodes = slices.DeleteFunc(c.Nodes, func(n *graph.Node) bool { return dropped[n] })
	return len(dropped)
}

// broadcastsTo reports whether u's operands, with x read in place of y,
// still broadcast to shape.
func broadcastsTo(u *graph.Node, y, x *graph.Value, shape graph.Shape) bool {
	var shapes []graph.Shape
	for _, in := range u.Inputs {
		if in == y {
			in = x
		}
		shapes = append(shapes, in.Type.Shape)
	}
	got, err := graph.Broadcast(shapes...)
	return err == nil && got.Equal(shape)
}

// Index chains. A rotate-half (RoPE: Concat(Neg(Slice(x)), Slice(x))) and
// its gradient (Slices of a product, Concats with zeros) move values
// between positions; as separate nodes each writes a tensor that the next
// reads once. absorbIndexChains takes such a chain into the elementwise
// group that reads it: the group's kernel computes a Slice as a read at an
// offset and a Concat as a choice by position, recomputing the chain's
// elementwise ops at the positions the Concat and Slices select. A chain
// member is absorbed only when everything that reads it is in the group
// (nothing else needs its tensor), and an elementwise group only when it
// feeds index ops alone (so that absorbing it copies no real work).

// sliceParams returns a Slice node's axis, start and end (normalised, step
// 1, one axis, constant bounds), or ok false.
func sliceParams(n *graph.Node) (axis, start, end int64, ok bool) {
	if n.Op != "Slice" || len(n.Inputs) < 3 || n.Inputs[0] == nil {
		return 0, 0, 0, false
	}
	x := n.Inputs[0].Type
	one := func(i int) (int64, bool) {
		if i >= len(n.Inputs) || n.Inputs[i] == nil {
			return 0, false
		}
		v := n.Inputs[i]
		if v.Kind != graph.Const || v.Init == nil || v.Type.DType != graph.Int64 || v.Type.Shape.Numel() != 1 {
			return 0, false
		}
		t, err := v.Init.Materialize(v.Type)
		if err != nil || len(t.I64) != 1 {
			return 0, false
		}
		return t.I64[0], true
	}
	s, ok1 := one(1)
	e, ok2 := one(2)
	a, ok3 := int64(0), true
	if len(n.Inputs) > 3 && n.Inputs[3] != nil {
		a, ok3 = one(3)
	}
	if len(n.Inputs) > 4 && n.Inputs[4] != nil {
		if st, ok := one(4); !ok || st != 1 {
			return 0, 0, 0, false
		}
	}
	if !ok1 || !ok2 || !ok3 || !x.DType.IsFloat() {
		return 0, 0, 0, false
	}
	ax, err := graph.NormAxis(int(a), x.Shape.Rank())
	if err != nil {
		return 0, 0, 0, false
	}
	_, out, err := graph.ResolveSlice(x.Shape, []int{int(s)}, []int{int(e)}, []int{ax}, nil)
	if err != nil || out.Numel() == 0 {
		return 0, 0, 0, false
	}
	d := int64(x.Shape[ax])
	if s < 0 {
		s += d
	}
	s = max(0, min(s, d))
	return int64(ax), s, s + int64(out[ax]), true
}

// concatAxis returns a Concat node's normalised axis, or ok false.
func concatAxis(n *graph.Node) (int64, bool) {
	if n.Op != "Concat" || len(n.Inputs) == 0 {
		return 0, false
	}
	for _, v := range n.Inputs {
		if v == nil || !v.Type.DType.IsFloat() {
			return 0, false
		}
	}
	ax, err := graph.NormAxis(int(n.Attrs.Int("axis", 0)), n.Outputs[0].Type.Shape.Rank())
	if err != nil {
		return 0, false
	}
	return int64(ax), true
}

func isIndexNode(n *graph.Node) bool {
	if _, _, _, ok := sliceParams(n); ok {
		return true
	}
	_, ok := concatAxis(n)
	return ok
}

// absorbIndexChains moves index chains into the groups that read them (see
// above), rewriting groupOf and owner; absorbed groups are left empty.
func absorbIndexChains(groups []*ewGroup, groupOf map[*graph.Node]*ewGroup, owner map[*graph.Value]*ewGroup,
	uses map[*graph.Value][]*graph.Node, isOut map[*graph.Value]bool, log *Log) {
	// A unit is an elementwise group or a lone index node.
	type unit struct {
		members []*graph.Node
		gr      *ewGroup // nil for an index node
	}
	unitOf := func(n *graph.Node) *unit {
		if gr := groupOf[n]; gr != nil {
			if len(gr.members) == 0 || gr.reduce != nil {
				return nil
			}
			return &unit{members: gr.members, gr: gr}
		}
		if isIndexNode(n) && groupOf[n] == nil {
			return &unit{members: []*graph.Node{n}}
		}
		return nil
	}
	key := func(u *unit) *graph.Node { return u.members[0] }
	for _, f := range groups {
		// A group that itself only feeds index nodes is taken, with its
		// own index inputs, by the group that reads those.
		if len(f.members) == 0 || f.reduce != nil || feedsOnlyIndex(f.members, uses, isOut) {
			continue
		}
		inF := map[*graph.Node]bool{}
		for _, m := range f.members {
			inF[m] = true
		}
		// Every unit reachable backwards from f through index nodes and
		// the groups that feed them.
		cand := map[*graph.Node]*unit{}
		var frontier []*graph.Value
		for v := range f.inputs {
			frontier = append(frontier, v)
		}
		for len(frontier) > 0 {
			v := frontier[len(frontier)-1]
			frontier = frontier[:len(frontier)-1]
			if v == nil || v.Producer == nil || inF[v.Producer] {
				continue
			}
			u := unitOf(v.Producer)
			if u == nil || cand[key(u)] != nil || u.gr == f {
				continue
			}
			if u.gr != nil && !feedsOnlyIndex(u.members, uses, isOut) {
				continue
			}
			cand[key(u)] = u
			for _, m := range u.members {
				frontier = append(frontier, m.Inputs...)
			}
		}
		if len(cand) == 0 {
			continue
		}
		// Keep only units whose every reader is in f or another kept unit.
		for changed := true; changed; {
			changed = false
			in := map[*graph.Node]bool{}
			for _, u := range cand {
				for _, m := range u.members {
					in[m] = true
				}
			}
			for k, u := range cand {
				keep := true
				for _, m := range u.members {
					if isOut[m.Outputs[0]] {
						keep = false
					}
					for _, r := range uses[m.Outputs[0]] {
						if !inF[r] && !in[r] {
							keep = false
						}
					}
				}
				if !keep {
					delete(cand, k)
					changed = true
				}
			}
		}
		index := 0
		steps := len(f.members)
		for _, u := range cand {
			if u.gr == nil {
				index++
			}
			steps += len(u.members)
		}
		if index == 0 || steps > fuseMaxSteps {
			continue
		}
		// The group's inputs after absorbing: what the members read that no
		// member makes, minus the constant operands of Slices (they become
		// parameters).
		member := map[*graph.Node]bool{}
		all := slices.Clone(f.members)
		for _, u := range cand {
			all = append(all, u.members...)
		}
		for _, m := range all {
			member[m] = true
		}
		inputs := map[*graph.Value]bool{}
		for _, m := range all {
			for _, v := range bodyOperands(m) {
				if v.Producer == nil || !member[v.Producer] {
					inputs[v] = true
				}
			}
		}
		if len(inputs) > fuseMaxInputs {
			continue
		}
		var absorbed []string
		for _, u := range cand {
			for _, m := range u.members {
				groupOf[m] = f
				owner[m.Outputs[0]] = f
				absorbed = append(absorbed, m.Name)
			}
			if u.gr != nil {
				u.gr.members, u.gr.closed = nil, true
			}
		}
		f.members, f.inputs = all, inputs
		if log != nil {
			slices.Sort(absorbed)
			log.Add(Event{Pass: PassFuseElementwise, Kind: Fired, Rule: "index_chain", Node: f.members[0].Name, Op: f.members[0].Op,
				Detail: fmt.Sprintf("%d nodes read through index arithmetic: %s", len(absorbed), strings.Join(absorbed, ", "))})
		}
	}
}

// feedsOnlyIndex reports whether the values of an elementwise group that
// leave it are read, and read by index nodes only (none is a graph output).
func feedsOnlyIndex(members []*graph.Node, uses map[*graph.Value][]*graph.Node, isOut map[*graph.Value]bool) bool {
	in := map[*graph.Node]bool{}
	for _, m := range members {
		in[m] = true
	}
	read := false
	for _, m := range members {
		if isOut[m.Outputs[0]] {
			return false
		}
		for _, r := range uses[m.Outputs[0]] {
			if in[r] {
				continue
			}
			if !isIndexNode(r) {
				return false
			}
			read = true
		}
	}
	return read
}

// groupShape says what a group computes over: its shape, or for a group
// with a reduction the reduced operand's shape and the result's.
func groupShape(gr *ewGroup) string {
	if gr.reduce == nil {
		return gr.shape.String()
	}
	return fmt.Sprintf("%v reduced to %v", gr.reduce.Inputs[0].Type.Shape, gr.reduce.Outputs[0].Type.Shape)
}
