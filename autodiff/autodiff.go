package autodiff

import (
	"fmt"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
)

// Reverse-mode automatic differentiation as a graph-to-graph pass: the
// backward pass is written in the same IR as the forward pass, so every
// backend runs it, every pass sees it, and the training graph has a text form
// and a hash like any other graph.
//
// The driver (Gradients) knows nothing about individual ops. Each op's
// vector-Jacobian product is one entry of gradRules (autodiff_rules.go):
// given a forward node and the cotangents of its outputs, the rule emits the
// nodes that compute the cotangents of its inputs.

// Gradients differentiates the scalar value loss of g with respect to the
// values named in wrt (params, inputs or intermediates of a float dtype). It
// returns a new graph — g itself is never changed — holding g's nodes, then
// the backward nodes; its outputs are g's outputs followed by one gradient per
// wrt entry, in order. The map gives each wrt name the name of its gradient
// value ("grad.<name>" unless that name is taken).
//
// Only nodes on a path from some wrt value to loss are differentiated; a wrt
// value the loss does not depend on gets a zeros constant. A node on such a
// path whose op has no rule is an error naming the op.
func Gradients(g *graph.Graph, loss string, wrt []string) (*graph.Graph, map[string]string, error) {
	if g == nil {
		return nil, nil, fmt.Errorf("autodiff: nil graph")
	}
	out := g.Clone()
	vals := out.Values()
	lv, ok := vals[loss]
	if !ok {
		return nil, nil, fmt.Errorf("autodiff: loss %q is not a value of graph %s", loss, g.Name)
	}
	if !lv.Type.DType.IsFloat() || lv.Type.Shape.Numel() != 1 {
		return nil, nil, fmt.Errorf("autodiff: loss %s must be a float scalar, got %v", loss, lv.Type)
	}
	ws := make([]*graph.Value, len(wrt))
	seen := map[string]bool{}
	for i, name := range wrt {
		v, ok := vals[name]
		if !ok {
			return nil, nil, fmt.Errorf("autodiff: wrt %q is not a value of graph %s", name, g.Name)
		}
		if !v.Type.DType.IsFloat() {
			return nil, nil, fmt.Errorf("autodiff: wrt %s is %v, not differentiable", name, v.Type)
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("autodiff: wrt %s listed twice", name)
		}
		seen[name] = true
		ws[i] = v
	}

	if err := refuseText(out, ws, lv); err != nil {
		return nil, nil, err
	}

	// Activity (forward): a value carries a derivative if it is a float
	// value computed from a wrt value through differentiable inputs.
	active := map[*graph.Value]bool{}
	isWrt := map[*graph.Value]bool{}
	for _, w := range ws {
		active[w] = true
		isWrt[w] = true
	}
	for _, n := range out.Nodes {
		if !anyInput(n, diffInputs(n), func(v *graph.Value) bool { return active[v] }) {
			continue
		}
		for _, o := range n.Outputs {
			if o.Type.DType.IsFloat() {
				active[o] = true
			}
		}
	}
	// Relevance (backward): the loss depends on the value through
	// differentiable inputs of active nodes.
	relevant := map[*graph.Value]bool{lv: true}
	onPath := map[*graph.Node]bool{}
	for i := len(out.Nodes) - 1; i >= 0; i-- {
		n := out.Nodes[i]
		for _, o := range n.Outputs {
			if active[o] && relevant[o] {
				onPath[n] = true
			}
		}
		if !onPath[n] {
			continue
		}
		for _, j := range diffInputs(n) {
			if in := n.Inputs[j]; in != nil {
				relevant[in] = true
			}
		}
	}

	e := newEmitter(out)
	fwdNodes := out.Nodes
	e.scope = "grad"
	seed := e.literal(lv.Type.DType, lv.Type.Shape, ones(lv.Type.Shape.Numel()))
	e.contrib[lv] = []*graph.Value{seed}
	for i := len(fwdNodes) - 1; i >= 0; i-- {
		n := fwdNodes[i]
		if !onPath[n] {
			continue
		}
		rule, ok := gradRules[n.Op]
		if !ok {
			return nil, nil, fmt.Errorf("autodiff: no gradient rule for op %s (node %s is on the path from %v to %s)", n.Op, n.Name, wrt, loss)
		}
		e.scope = "grad/" + n.Name
		dy := make([]*graph.Value, len(n.Outputs))
		has := false
		for j, o := range n.Outputs {
			dy[j] = e.total(o)
			has = has || dy[j] != nil
		}
		if !has {
			continue
		}
		need := make([]bool, len(n.Inputs))
		for _, j := range diffInputs(n) {
			in := n.Inputs[j]
			need[j] = in != nil && active[in] && relevant[in]
		}
		dx := rule.VJP(e, n, dy, need)
		if e.err != nil {
			return nil, nil, fmt.Errorf("autodiff: %s rule for node %s: %w", n.Op, n.Name, e.err)
		}
		for j, in := range n.Inputs {
			if !need[j] {
				continue
			}
			if j >= len(dx) || dx[j] == nil {
				return nil, nil, fmt.Errorf("autodiff: %s rule for node %s gave no gradient for input %d (%s)", n.Op, n.Name, j, in.Name)
			}
			// A rule that returns the wrong type is a bug in the rule;
			// catching it here names the rule instead of a later node.
			if !dx[j].Type.Equal(in.Type) {
				return nil, nil, fmt.Errorf("autodiff: %s rule for node %s: gradient of input %d (%s) is %v, want %v", n.Op, n.Name, j, in.Name, dx[j].Type, in.Type)
			}
			e.contrib[in] = append(e.contrib[in], dx[j])
		}
		// Forward values are dead to the backward pass once their
		// producer is done; dropping the sums keeps the map small.
		for _, o := range n.Outputs {
			if !isWrt[o] {
				delete(e.contrib, o)
			}
		}
	}

	names := map[string]string{}
	claimed := map[*graph.Value]bool{}
	for i, w := range ws {
		want := "grad." + w.Name
		e.scope = "grad/" + w.Name
		d := e.total(w)
		switch {
		case d == nil:
			// The loss does not depend on w: its gradient is exactly zero.
			d = e.zerosNamed(want, w.Type)
		case e.made[d] && !claimed[d] && e.namer.Reserve(want):
			d.Name = want
		default:
			// The cotangent is shared (with another gradient or a forward
			// value): give the output its own name with a copy.
			d = e.op("Identity", nil, d)
			if e.namer.Reserve(want) {
				d.Name = want
			}
		}
		if e.err != nil {
			return nil, nil, fmt.Errorf("autodiff: gradient of %s: %w", wrt[i], e.err)
		}
		claimed[d] = true
		names[w.Name] = d.Name
		out.Outputs = append(out.Outputs, d)
	}
	if err := graph.Verify(out); err != nil {
		return nil, nil, fmt.Errorf("autodiff: gradient graph of %s: %w", g.Name, err)
	}
	return out, names, nil
}

// diffInputs lists the inputs of n that can carry a gradient. An op without
// a rule treats every input as differentiable, so that a missing rule is
// reported rather than silently cutting the path.
func diffInputs(n *graph.Node) []int {
	if r, ok := gradRules[n.Op]; ok && r.Diff != nil {
		return r.Diff
	}
	all := make([]int, len(n.Inputs))
	for i := range all {
		all[i] = i
	}
	return all
}

func anyInput(n *graph.Node, idx []int, f func(*graph.Value) bool) bool {
	for _, i := range idx {
		if i < len(n.Inputs) && n.Inputs[i] != nil && f(n.Inputs[i]) {
			return true
		}
	}
	return false
}

func ones(n int) []float64 {
	d := make([]float64, n)
	for i := range d {
		d[i] = 1
	}
	return d
}

// emitter appends backward nodes and constants to the graph being built.
// Errors stick (as in graph.Builder): after the first one every call returns
// a placeholder, so rules read like the math and the driver checks once.
type emitter struct {
	g       *graph.Graph
	namer   *graph.Namer
	scope   string // node name prefix: "grad/<forward node>"
	lits    map[string]*graph.Value
	made    map[*graph.Value]bool           // values produced by backward nodes
	contrib map[*graph.Value][]*graph.Value // cotangent contributions not yet summed
	err     error
}

func newEmitter(g *graph.Graph) *emitter {
	return &emitter{
		g: g, namer: graph.NewNamer(g), lits: map[string]*graph.Value{},
		made: map[*graph.Value]bool{}, contrib: map[*graph.Value][]*graph.Value{},
	}
}

// fail records the first error and returns a placeholder value.
func (e *emitter) fail(format string, args ...any) *graph.Value {
	if e.err == nil {
		e.err = fmt.Errorf(format, args...)
	}
	return &graph.Value{Name: "<error>", Type: graph.TensorType{DType: graph.InvalidDType}}
}

// opN appends one node of op and returns its outputs.
func (e *emitter) opN(op string, attrs graph.Attrs, in ...*graph.Value) []*graph.Value {
	if e.err != nil {
		return []*graph.Value{e.fail(""), e.fail(""), e.fail("")}
	}
	n, err := graph.NewNode(e.namer.Fresh(e.scope+"/"+op), op, attrs, in...)
	if err != nil {
		e.fail("%w", err)
		return []*graph.Value{e.fail(""), e.fail(""), e.fail("")}
	}
	for _, o := range n.Outputs {
		e.namer.Reserve(o.Name) // "#i" names of multi-output nodes
		e.made[o] = true
	}
	e.g.Nodes = append(e.g.Nodes, n)
	return n.Outputs
}

// op appends one node of op and returns its first output.
func (e *emitter) op(op string, attrs graph.Attrs, in ...*graph.Value) *graph.Value {
	return e.opN(op, attrs, in...)[0]
}

// total sums the cotangent contributions of v (nil if it has none). Sums
// are an Add chain in the order the contributions were made, so the graph is
// deterministic.
func (e *emitter) total(v *graph.Value) *graph.Value {
	cs := e.contrib[v]
	if len(cs) == 0 {
		return nil
	}
	sum := cs[0]
	for _, c := range cs[1:] {
		sum = e.op("Add", nil, sum, c)
	}
	e.contrib[v] = []*graph.Value{sum}
	return sum
}

// literal returns a shared constant holding data (one per content).
func (e *emitter) literal(dt graph.DType, shape graph.Shape, data []float64) *graph.Value {
	if e.err != nil {
		return e.fail("")
	}
	key := fmt.Sprint(dt, shape, data)
	if v, ok := e.lits[key]; ok {
		return v
	}
	v := &graph.Value{Name: e.namer.Fresh("grad/c"), Type: graph.TensorType{DType: dt, Shape: shape.Clone()},
		Kind: graph.Const, Init: &graph.Init{Fn: "literal", Data: slices.Clone(data)}}
	e.g.Consts = append(e.g.Consts, v)
	e.lits[key] = v
	return v
}

// scalar is a rank-0 constant of dtype dt.
func (e *emitter) scalar(dt graph.DType, v float64) *graph.Value {
	return e.literal(dt, graph.Shape{}, []float64{v})
}

// ints is a 1-D int64 constant: shapes, axes and slice bounds.
func (e *emitter) ints(vals ...int) *graph.Value {
	d := make([]float64, len(vals))
	for i, v := range vals {
		d[i] = float64(v)
	}
	return e.literal(graph.Int64, graph.Shape{len(vals)}, d)
}

// zeros is a constant of zeros of type t (a recipe, not data).
func (e *emitter) zeros(t graph.TensorType) *graph.Value {
	return e.zerosNamed("", t)
}

func (e *emitter) zerosNamed(name string, t graph.TensorType) *graph.Value {
	if e.err != nil {
		return e.fail("")
	}
	if name == "" || !e.namer.Reserve(name) {
		name = e.namer.Fresh("grad/zeros")
	}
	init := graph.Zeros()
	v := &graph.Value{Name: name, Type: graph.TensorType{DType: t.DType, Shape: t.Shape.Clone()}, Kind: graph.Const, Init: &init}
	e.g.Consts = append(e.g.Consts, v)
	return v
}

// reshape reshapes x to shape, or returns x when it already has it.
func (e *emitter) reshape(x *graph.Value, shape graph.Shape) *graph.Value {
	if e.err != nil {
		return e.fail("")
	}
	if x.Type.Shape.Equal(shape) {
		return x
	}
	return e.op("Reshape", nil, x, e.ints(shape...))
}

// sumTo undoes broadcasting: it sums dy (the cotangent of a broadcast result)
// over the axes that broadcasting added or stretched from 1, so that the
// result has shape to.
func (e *emitter) sumTo(dy *graph.Value, to graph.Shape) *graph.Value {
	if e.err != nil {
		return e.fail("")
	}
	from := dy.Type.Shape
	if from.Equal(to) {
		return dy
	}
	lead := from.Rank() - to.Rank()
	if lead < 0 {
		return e.fail("cannot sum %v down to %v", from, to)
	}
	var axes []int
	for i, d := range from {
		if i < lead || (to[i-lead] == 1 && d != 1) {
			axes = append(axes, i)
		}
	}
	r := dy
	if len(axes) > 0 {
		r = e.op("ReduceSum", graph.Attrs{"keepdims": graph.Int(1)}, dy, e.ints(axes...))
	}
	return e.reshape(r, to)
}

// swapLast2 transposes the last two axes.
func (e *emitter) swapLast2(x *graph.Value) *graph.Value {
	if e.err != nil {
		return e.fail("")
	}
	r := x.Type.Shape.Rank()
	perm := make([]int64, r)
	for i := range perm {
		perm[i] = int64(i)
	}
	perm[r-1], perm[r-2] = perm[r-2], perm[r-1]
	return e.op("Transpose", graph.Attrs{"perm": graph.Ints(perm...)}, x)
}

// maxIntOperand bounds the int64 constant operands constInts computes.
const maxIntOperand = 1 << 16

// constInts reads an int64 constant operand (axes, shapes, slice bounds).
func (e *emitter) constInts(v *graph.Value, what string) []int {
	if e.err != nil {
		return nil
	}
	if v == nil || v.Kind != graph.Const || v.Init == nil || v.Type.DType != graph.Int64 {
		e.fail("%s must be an int64 constant", what)
		return nil
	}
	// Axes, shapes and bounds have one entry per axis: a larger operand is
	// a malformed graph, refused before its recipe is computed.
	if n := v.Type.Shape.Numel(); n > maxIntOperand {
		e.fail("%s %s has %d elements, more than an operand of axes or bounds can (%d)", what, v.Name, n, maxIntOperand)
		return nil
	}
	t, err := v.Init.Materialize(v.Type)
	if err != nil {
		e.fail("%s: %w", what, err)
		return nil
	}
	out := make([]int, len(t.I64))
	for i, x := range t.I64 {
		out[i] = int(x)
	}
	return out
}

// refuseText refuses a loss that depends on a wrt value through a string
// value (a Cast to text and back): activity would stop at the text and give
// a zero gradient for what may be the identity, so the graph is refused,
// naming the value, rather than differentiated wrongly.
func refuseText(g *graph.Graph, ws []*graph.Value, loss *graph.Value) error {
	dep := map[*graph.Value]bool{}
	for _, w := range ws {
		dep[w] = true
	}
	for _, n := range g.Nodes {
		if slices.ContainsFunc(n.Inputs, func(v *graph.Value) bool { return v != nil && dep[v] }) {
			for _, o := range n.Outputs {
				dep[o] = true
			}
		}
	}
	needed := map[*graph.Value]bool{loss: true}
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		n := g.Nodes[i]
		if !slices.ContainsFunc(n.Outputs, func(v *graph.Value) bool { return needed[v] }) {
			continue
		}
		for _, in := range n.Inputs {
			if in == nil {
				continue
			}
			needed[in] = true
			if in.Type.DType == graph.String && dep[in] {
				return fmt.Errorf("autodiff: the loss %s depends on a wrt value through the string value %s (input of node %s): text has no derivative", loss.Name, in.Name, n.Name)
			}
		}
	}
	return nil
}
