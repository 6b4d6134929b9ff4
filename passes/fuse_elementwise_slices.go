package passes

import (
	"fmt"
	"slices"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// Slices read in place. fuse_qkv cuts the merged q/k/v product into three
// Slices of heads; each is read by several kernels (q and k by their norm's
// forward and backward bodies, v by its head Transpose), so the index-chain
// absorption above, which takes a chain into its one reader, leaves each
// Slice a copy of its third of the product. A Slice of a tensor that is
// already in memory costs its readers nothing, though: a generated kernel
// reads it at an offset with the tensor's strides, as it reads a Transpose
// at permuted strides. readSlicesInPlace therefore gives every reader its own
// Slice step of the sliced tensor, after the groups are built:
//
//	slice_read   every reader is a fused body, or a lone Transpose that
//	             keeps the last axis (it becomes a body of a Slice and a
//	             Transpose step: one strided copy from the sliced tensor
//	             instead of a Slice copy and a Transpose copy). The Slice
//	             node goes.
//
// A Slice read by anything else (a MatMul, FlashAttention, a Reshape, a
// graph output) needs its values contiguous and stays a copy. A Transpose
// read by a MatMul or Gemm stays too: the GEMM reads it transposed, with no
// copy, which a body would take away.

// readSlicesInPlace rewrites c in place and returns how many Slices went.
func readSlicesInPlace(c *graph.Graph, log *Log) (int, error) {
	uses := c.Uses()
	isOut := map[*graph.Value]bool{}
	for _, v := range c.Outputs {
		isOut[v] = true
	}
	dropped := map[*graph.Node]bool{}
	replaced := map[*graph.Node]*graph.Node{} // lone Transpose -> its body
	for _, n := range c.Nodes {
		axis, start, end, ok := sliceParams(n)
		if !ok || dropped[n] {
			continue
		}
		y, x := n.Outputs[0], n.Inputs[0]
		why := sliceReadRefusal(y, uses, isOut)
		if why != "" {
			if log != nil {
				log.Add(Event{Pass: PassFuseElementwise, Kind: Refused, Rule: "slice_read", Node: n.Name, Op: n.Op, Reason: why})
			}
			continue
		}
		step := graph.FusedStep{Op: "Slice", Params: []int64{axis, start, end}}
		var readers []*graph.Node // each once (a body may read y twice)
		for _, u := range uses[y] {
			if !slices.Contains(readers, u) {
				readers = append(readers, u)
			}
		}
		for _, u := range readers {
			if u.Op == "Transpose" {
				fn, err := transposeBody(u, x, step)
				if err != nil {
					return 0, err
				}
				replaced[u] = fn
				continue
			}
			if err := sliceInBody(u, y, x, step); err != nil {
				return 0, fmt.Errorf("%s: %w", u.Name, err)
			}
		}
		dropped[n] = true
		if log != nil {
			names := make([]string, len(readers))
			for i, u := range readers {
				names[i] = u.Name
			}
			slices.Sort(names)
			log.Add(Event{Pass: PassFuseElementwise, Kind: Fired, Rule: "slice_read", Node: n.Name, Op: n.Op,
				Detail: fmt.Sprintf("%v of %s read in place by %d bodies: %s", y.Type.Shape, x.Name, len(readers), strings.Join(names, ", "))})
		}
	}
	if len(dropped) == 0 {
		return 0, nil
	}
	nodes := c.Nodes[:0]
	for _, n := range c.Nodes {
		if dropped[n] {
			continue
		}
		if fn := replaced[n]; fn != nil {
			n = fn
		}
		nodes = append(nodes, n)
	}
	c.Nodes = nodes
	return len(dropped), nil
}

// sliceReadRefusal says why the Slice making y cannot be read in place by
// its readers ("" when it can).
func sliceReadRefusal(y *graph.Value, uses map[*graph.Value][]*graph.Node, isOut map[*graph.Value]bool) string {
	if isOut[y] {
		return "the slice is a graph output"
	}
	readers := uses[y]
	if len(readers) == 0 {
		return "the slice is not read"
	}
	for _, u := range readers {
		switch {
		case u.Op == "FusedElementwise":
			if steps := strings.Count(u.Attrs.String("body", ""), ";") + 1; steps >= fuseMaxSteps {
				return fmt.Sprintf("read by %s, a body of %d steps already (at most %d)", u.Name, steps, fuseMaxSteps)
			}
		case indexTranspose(u):
			if slices.Contains(u.Inputs, nil) {
				return fmt.Sprintf("read by %s, a Transpose with an omitted input", u.Name)
			}
			for _, r := range uses[u.Outputs[0]] {
				if r.Op == "MatMul" || r.Op == "Gemm" {
					return fmt.Sprintf("read by %s, a Transpose that %s (%s) reads transposed without a copy", u.Name, r.Name, r.Op)
				}
			}
			if isOut[u.Outputs[0]] {
				return fmt.Sprintf("read by %s, a Transpose that is a graph output", u.Name)
			}
		default:
			return fmt.Sprintf("read by %s (%s), which needs it contiguous", u.Name, u.Op)
		}
	}
	return ""
}

// transposeBody is the fused body that does lone Transpose t's work reading
// x through Slice step s: one strided copy. Its output is t's value.
func transposeBody(t *graph.Node, x *graph.Value, s graph.FusedStep) (*graph.Node, error) {
	perm := transposePerm(t)
	s.Args = []graph.FusedOperand{{Index: 0}}
	steps := []graph.FusedStep{s, {Op: "Transpose", Params: perm, Args: []graph.FusedOperand{{Step: true, Index: 0}}}}
	fn := &graph.Node{Name: "fused/" + t.Name, Op: "FusedElementwise", Inputs: []*graph.Value{x},
		Outputs: slices.Clone(t.Outputs),
		Attrs:   graph.Attrs{"body": graph.Str(graph.FormatFusedBody(steps)), "outputs": graph.Ints(1)}}
	for _, v := range fn.Outputs {
		v.Producer = fn
	}
	return fn, nil
}

// sliceInBody rewrites fused node u, which reads y (the Slice of x that s
// describes) as an input, to read x through a Slice step of its own instead:
// the step goes first, every read of y reads it, and y leaves the inputs.
func sliceInBody(u *graph.Node, y, x *graph.Value, s graph.FusedStep) error {
	steps, err := graph.ParseFusedBody(u.Attrs.String("body", ""), len(u.Inputs))
	if err != nil {
		return err
	}
	// The new inputs: u's without y, with x where it was not one already.
	var inputs []*graph.Value
	index := map[*graph.Value]int{}
	for _, v := range u.Inputs {
		if v == y {
			v = x
		}
		if _, ok := index[v]; !ok {
			index[v] = len(inputs)
			inputs = append(inputs, v)
		}
	}
	s.Args = []graph.FusedOperand{{Index: index[x]}}
	out := []graph.FusedStep{s}
	for _, st := range steps {
		st.Args = slices.Clone(st.Args)
		for j, a := range st.Args {
			switch {
			case a.Step:
				st.Args[j].Index++
			case u.Inputs[a.Index] == y:
				st.Args[j] = graph.FusedOperand{Step: true, Index: 0}
			default:
				st.Args[j].Index = index[u.Inputs[a.Index]]
			}
		}
		out = append(out, st)
	}
	outs := slices.Clone(u.Attrs["outputs"].Ints)
	for i := range outs {
		outs[i]++
	}
	attrs := u.Attrs.Clone()
	attrs["body"] = graph.Str(graph.FormatFusedBody(out))
	attrs["outputs"] = graph.Ints(outs...)
	u.Attrs, u.Inputs = attrs, inputs
	return nil
}

// Concats written in place. The gradient of fuse_qkv's Slices is a Concat
// of dq, dk and dv, each the result of a body (the norm backward, writing
// its heads transposed) or of a lone head Transpose (dv), read by nothing
// else: as nodes, each piece is written once and then copied into the
// Concat's tensor. concatWrite makes the Concat the last step of one body
// that computes every such piece at the positions it selects, so that each
// element is written once, where the GEMMs read it:
//
//	concat_write  a Concat of float tensors at least one of whose inputs is made by a body without a
//	              reduction that has that one output, or by a lone
//	              Transpose that keeps the last axis (not a graph
//	              output, not read by a GEMM), and read by this Concat
//	              only: those bodies' steps, and the Transposes as steps,
//	              join the Concat's body; other inputs are read as they
//	              are (a copy, as before).
//
// Without such an input the Concat stays a copy of its inputs.

// writeConcatsInPlace rewrites c in place and returns how many Concats
// became bodies.
func writeConcatsInPlace(c *graph.Graph, log *Log) (int, error) {
	uses := c.Uses()
	isOut := map[*graph.Value]bool{}
	for _, v := range c.Outputs {
		isOut[v] = true
	}
	taken := map[*graph.Node]bool{}
	replaced := map[*graph.Node]*graph.Node{}
	for _, n := range c.Nodes {
		axis, ok := concatAxis(n)
		if !ok || n.Outputs[0].Type.Shape.Numel() == 0 {
			continue
		}
		b := &bodyBuilder{index: map[*graph.Value]int{}}
		var args []graph.FusedOperand
		var pieces []*graph.Node
		for _, v := range n.Inputs {
			p := v.Producer
			if p == nil || taken[p] || slices.Contains(pieces, p) || !concatPiece(p, v, n, uses, isOut) {
				args = append(args, graph.FusedOperand{Index: b.input(v)})
				continue
			}
			a, err := b.take(p)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", p.Name, err)
			}
			args = append(args, a)
			pieces = append(pieces, p)
		}
		why := ""
		switch {
		case len(pieces) == 0:
			why = "no input is made by a body or a Transpose that only this Concat reads"
		case len(b.inputs) > fuseMaxInputs || len(b.steps)+1 > fuseMaxSteps:
			why = fmt.Sprintf("the body would take %d inputs and %d steps, over %d or %d", len(b.inputs), len(b.steps)+1, fuseMaxInputs, fuseMaxSteps)
		}
		if why != "" {
			if log != nil {
				log.Add(Event{Pass: PassFuseElementwise, Kind: Refused, Rule: "concat_write", Node: n.Name, Op: n.Op, Reason: why})
			}
			continue
		}
		absorbed := make([]string, len(pieces))
		for i, p := range pieces {
			taken[p] = true
			absorbed[i] = p.Name
		}
		b.steps = append(b.steps, graph.FusedStep{Op: "Concat", Params: []int64{axis}, Args: args})
		fn := &graph.Node{Name: "fused/" + n.Name, Op: "FusedElementwise", Inputs: b.inputs, Outputs: slices.Clone(n.Outputs),
			Attrs: graph.Attrs{"body": graph.Str(graph.FormatFusedBody(b.steps)), "outputs": graph.Ints(int64(len(b.steps) - 1))}}
		for _, v := range fn.Outputs {
			v.Producer = fn
		}
		replaced[n] = fn
		if log != nil {
			slices.Sort(absorbed)
			log.Add(Event{Pass: PassFuseElementwise, Kind: Fired, Rule: "concat_write", Node: n.Name, Op: n.Op, Result: fn.Name,
				Detail: fmt.Sprintf("%v written in place by one body of %d steps: %s", n.Outputs[0].Type.Shape, len(b.steps), strings.Join(absorbed, ", "))})
		}
	}
	if len(replaced) == 0 {
		return 0, nil
	}
	nodes := c.Nodes[:0]
	for _, n := range c.Nodes {
		if taken[n] {
			continue
		}
		if fn := replaced[n]; fn != nil {
			n = fn
		}
		nodes = append(nodes, n)
	}
	c.Nodes = nodes
	return len(replaced), nil
}

// concatPiece reports whether p, the producer of v, an input of Concat n,
// can be computed inside n's body: a body without a reduction whose one
// output is v, or a lone Transpose that keeps the last axis whose result
// no GEMM reads; and v is read by n alone (once) and is no graph output.
func concatPiece(p *graph.Node, v *graph.Value, n *graph.Node, uses map[*graph.Value][]*graph.Node, isOut map[*graph.Value]bool) bool {
	if isOut[v] || len(uses[v]) != 1 || uses[v][0] != n || len(p.Outputs) != 1 {
		return false
	}
	reads := 0
	for _, in := range n.Inputs {
		if in == v {
			reads++
		}
	}
	if reads != 1 {
		return false
	}
	switch {
	case p.Op == "FusedElementwise":
		_, reduces := p.Attrs["axes"]
		return !reduces
	case indexTranspose(p):
		return !slices.Contains(p.Inputs, nil)
	}
	return false
}

// bodyBuilder gathers steps of several bodies into one, with one input list.
type bodyBuilder struct {
	steps  []graph.FusedStep
	inputs []*graph.Value
	index  map[*graph.Value]int
}

func (b *bodyBuilder) input(v *graph.Value) int {
	i, ok := b.index[v]
	if !ok {
		i = len(b.inputs)
		b.index[v] = i
		b.inputs = append(b.inputs, v)
	}
	return i
}

// take appends the work of p (a body with one output, or a Transpose) and
// returns the operand of its result.
func (b *bodyBuilder) take(p *graph.Node) (graph.FusedOperand, error) {
	if p.Op == "Transpose" {
		b.steps = append(b.steps, graph.FusedStep{Op: "Transpose", Params: transposePerm(p),
			Args: []graph.FusedOperand{{Index: b.input(p.Inputs[0])}}})
		return graph.FusedOperand{Step: true, Index: len(b.steps) - 1}, nil
	}
	steps, err := graph.ParseFusedBody(p.Attrs.String("body", ""), len(p.Inputs))
	if err != nil {
		return graph.FusedOperand{}, err
	}
	outs := p.Attrs["outputs"].Ints
	if len(outs) != 1 {
		return graph.FusedOperand{}, fmt.Errorf("a body with %d outputs taken as one", len(outs))
	}
	shift := len(b.steps)
	for _, st := range steps {
		st.Args = slices.Clone(st.Args)
		for j, a := range st.Args {
			if a.Step {
				st.Args[j].Index += shift
			} else {
				st.Args[j].Index = b.input(p.Inputs[a.Index])
			}
		}
		b.steps = append(b.steps, st)
	}
	return graph.FusedOperand{Step: true, Index: shift + int(outs[0])}, nil
}
