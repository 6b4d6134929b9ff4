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
// Before grouping, cheap elementwise values that are kept only for late
// elementwise readers are recomputed next to those readers (rematerialize).
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
func (f FuseElementwise) Run(g *graph.Graph, log *Log) (*graph.Graph, error) {
	if g == nil {
		return nil, errNilGraph
	}
	c := g.Clone()
	remat := 0
	if !f.NoRemat {
		remat = rematerialize(c, log)
	}
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
		// Other open groups n reads from that could take n too are merged
		// into the target (none of them has been read outside yet, so the
		// merged group can still run at its last member); every other group
		// n reads from must run before n: close it.
		for _, v := range n.Inputs {
			gr := owner[v]
			if gr == nil || gr == target {
				continue
			}
			if target != nil && !gr.closed && gr.shape.Equal(target.shape) && gr.dt == target.dt &&
				len(gr.members)+len(target.members) < fuseMaxSteps && len(gr.inputs)+len(target.inputs)+len(n.Inputs) <= fuseMaxInputs {
				for _, m := range gr.members {
					groupOf[m] = target
					owner[m.Outputs[0]] = target
				}
				target.members = append(target.members, gr.members...)
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
	pos := make(map[*graph.Node]int, len(c.Nodes))
	for i, n := range c.Nodes {
		pos[n] = i
	}
	fusedAt := map[*graph.Node]*graph.Node{} // last member -> the fused node
	fusedCount := 0
	for _, gr := range groups {
		if len(gr.members) == 1 && log != nil {
			n := gr.members[0]
			log.Add(Event{Pass: PassFuseElementwise, Kind: Refused, Rule: "elementwise_group", Node: n.Name, Op: n.Op,
				Reason: loneReason(n, uses)})
		}
		if len(gr.members) < 2 {
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
			log.Add(Event{Pass: PassFuseElementwise, Kind: Fired, Rule: "elementwise_group", Node: gr.members[0].Name,
				Op: gr.members[0].Op, Result: fn.Name,
				Detail: fmt.Sprintf("%d ops (%s) over %v, %d inputs, %d outputs", len(gr.members), strings.Join(ops, " "),
					gr.shape, len(fn.Inputs), len(fn.Outputs))})
		}
	}
	if fusedCount == 0 && remat == 0 {
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
		for _, u := range uses[v] {
			if pos[u]-pos[n] < rematGap {
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
	c.Nodes = nodes
	if log != nil {
		log.Infof(PassFuseElementwise, "recomputed %d elementwise values in their late readers instead of keeping them (%d bytes)", count, saved)
	}
	return count
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
