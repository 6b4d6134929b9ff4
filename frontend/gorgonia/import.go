package gorgonia

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	G "gorgonia.org/gorgonia"
)

// Options tune an import.
type Options struct {
	// Name is the graph's name ("gorgonia" when empty).
	Name string
	// Inputs lists nodes that become graph inputs: variables even though a
	// value is bound to them (bound so that gorgonia can run, say), or op
	// nodes, which cuts the graph there (what only they depend on is not
	// imported: a way around an unsupported op). Variables with no value
	// bound are always inputs.
	Inputs []*G.Node
	// Consts lists bound variables that become consts rather than params.
	Consts []*G.Node
	// Freeze makes every bound variable not in Inputs a const: an inference
	// graph with nothing to train.
	Freeze bool
}

// UnsupportedOpError is the refusal of a gorgonia op that has no
// translation; Import never guesses at an op's meaning.
type UnsupportedOpError struct {
	Op     string // the op as gorgonia prints it (its String)
	Node   string // the gorgonia node's name
	Reason string // why, where more can be said; may be empty
}

func (e *UnsupportedOpError) Error() string {
	s := fmt.Sprintf("gorgonia op %s (node %s) is not supported", e.Op, e.Node)
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Import translates the part of g that the outputs depend on into a verified
// graph whose outputs are, in order, the values of outputs. See the package
// documentation for what becomes of each node.
func Import(g *G.ExprGraph, outputs []*G.Node, opts Options) (*graph.Graph, error) {
	out, _, err := ImportWithNames(g, outputs, opts)
	return out, err
}

// ImportWithNames is Import that also says which graph value each imported
// gorgonia node became (nodes that needed no value of their own, such as a
// Repeat folded into broadcasting, are absent).
func ImportWithNames(g *G.ExprGraph, outputs []*G.Node, opts Options) (*graph.Graph, map[*G.Node]string, error) {
	if g == nil {
		return nil, nil, fmt.Errorf("gorgonia import: nil graph")
	}
	if len(outputs) == 0 {
		return nil, nil, fmt.Errorf("gorgonia import: no outputs")
	}
	name := opts.Name
	if name == "" {
		name = "gorgonia"
	}
	im := &importer{
		g:      g,
		out:    &graph.Graph{Name: name},
		namer:  graph.NewNamer(nil),
		vals:   map[*G.Node]*graph.Value{},
		busy:   map[*G.Node]bool{},
		ints:   map[string]*graph.Value{},
		inputs: map[*G.Node]bool{},
		consts: map[*G.Node]bool{},
		freeze: opts.Freeze,
	}
	for _, n := range opts.Inputs {
		im.inputs[n] = true
	}
	for _, n := range opts.Consts {
		im.consts[n] = true
	}
	for i, o := range outputs {
		if o == nil {
			return nil, nil, fmt.Errorf("gorgonia import: output %d is nil", i)
		}
		if o.Graph() != g {
			return nil, nil, fmt.Errorf("gorgonia import: output %d (node %s) is not in this graph", i, o.Name())
		}
	}
	if err := im.reserveNames(outputs); err != nil {
		return nil, nil, err
	}
	for _, o := range outputs {
		v, err := im.value(o)
		if err != nil {
			return nil, nil, fmt.Errorf("gorgonia import: %w", err)
		}
		im.out.Outputs = append(im.out.Outputs, v)
	}
	if err := graph.Verify(im.out); err != nil {
		return nil, nil, fmt.Errorf("gorgonia import: %w", err)
	}
	names := make(map[*G.Node]string, len(im.vals))
	for n, v := range im.vals {
		names[n] = v.Name
	}
	return im.out, names, nil
}

type importer struct {
	g     *G.ExprGraph
	out   *graph.Graph
	namer *graph.Namer
	// user holds the gorgonia names that are set and unique in the imported
	// sub-graph; they are reserved before any name is generated, so that a
	// generated name never takes one.
	user map[*G.Node]string
	vals map[*G.Node]*graph.Value
	// busy marks nodes being translated: a cycle (impossible in a well-formed
	// ExprGraph) is reported instead of recursing forever.
	busy map[*G.Node]bool
	// ints shares int64 operand consts (shapes, axes) by content.
	ints           map[string]*graph.Value
	inputs, consts map[*G.Node]bool
	freeze         bool
}

// children returns a node's operands in order (gorgonia keeps them
// unexported; the graph's From gives them in order).
func (im *importer) children(n *G.Node) []*G.Node {
	it := im.g.From(n.ID())
	if it == nil {
		return nil
	}
	var out []*G.Node
	for it.Next() {
		if c, ok := it.Node().(*G.Node); ok {
			out = append(out, c)
		}
	}
	return out
}

// userName returns the name given to the node in gorgonia, or "" where none
// was: Name() makes one up from the op and node ids for unnamed nodes, so the
// field itself is read. Constants are named after their value by
// NewConstant; that is not a user name either.
func userName(n *G.Node) string {
	rv := reflect.ValueOf(n)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return ""
	}
	f := rv.Elem().FieldByName("name")
	if !f.IsValid() || f.Kind() != reflect.String {
		return ""
	}
	s := f.String()
	if v := n.Value(); isConstant(n) && v != nil && (s == fmt.Sprintf("%v", v) || s == fmt.Sprintf("%v", v.Data())) {
		return ""
	}
	if s == "" || s == "_" || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '\uFFFD' }) {
		return ""
	}
	return s
}

// reserveNames walks the sub-graph once and reserves the user names used
// exactly once in it.
func (im *importer) reserveNames(outputs []*G.Node) error {
	seen := map[*G.Node]bool{}
	var order []*G.Node
	stack := append([]*G.Node(nil), outputs...)
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[n] {
			continue
		}
		if n.Graph() != im.g {
			return fmt.Errorf("gorgonia import: node %s is not in this graph", n.Name())
		}
		seen[n] = true
		order = append(order, n)
		if im.inputs[n] {
			continue // a cut: its operands are not imported
		}
		kids := im.children(n)
		for i := len(kids) - 1; i >= 0; i-- {
			stack = append(stack, kids[i])
		}
	}
	count := map[string]int{}
	given := make([]string, len(order))
	for i, n := range order {
		if given[i] = userName(n); given[i] != "" {
			count[given[i]]++
		}
	}
	im.user = map[*G.Node]string{}
	for i, n := range order {
		if s := given[i]; s != "" && count[s] == 1 {
			im.user[n] = s
			im.namer.Reserve(s)
		}
	}
	return nil
}

// name returns the node's user name, or a fresh one from prefix.
func (im *importer) name(n *G.Node, prefix string) string {
	if s, ok := im.user[n]; ok {
		return s
	}
	return im.namer.Fresh(prefix)
}

func isConstant(n *G.Node) bool {
	switch opType(n.Op()) {
	case "constantScalar", "constantTensor":
		return true
	}
	return false
}

// opType is the name of an op's Go type in package gorgonia ("elemBinOp",
// "softmaxOp"), or "" for a nil op or one from another package. Gorgonia's
// op types are unexported; their type names are stable identities.
func opType(op G.Op) string {
	if op == nil {
		return ""
	}
	t := reflect.TypeOf(op)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() != "gorgonia.org/gorgonia" {
		return ""
	}
	return t.Name()
}

// value returns the graph value of a gorgonia node, translating it (and,
// first, the operands it needs) on first use: nodes are appended in a depth
// first post-order over operands in order, a deterministic topological order.
func (im *importer) value(n *G.Node) (*graph.Value, error) {
	if v, ok := im.vals[n]; ok {
		return v, nil
	}
	if im.busy[n] {
		return nil, fmt.Errorf("node %s is part of a cycle", n.Name())
	}
	im.busy[n] = true
	defer delete(im.busy, n)

	t, err := typeOf(n)
	if err != nil {
		return nil, err
	}
	var v *graph.Value
	switch {
	case n.Op() == nil:
		v, err = im.variable(n, t)
	case im.inputs[n] && !isConstant(n):
		v = im.leaf(graph.Input, im.name(n, "input"), t, nil)
	case isConstant(n):
		v, err = im.constant(n, t, n.Value())
	default:
		v, err = im.op(n, t)
	}
	if err != nil {
		return nil, err
	}
	if !v.Type.Equal(t) {
		// Every translation must reproduce gorgonia's own static type; a
		// difference means gorgonia's semantics were misread, never rounding.
		return nil, fmt.Errorf("node %s (%v): translated to %v, gorgonia says %v", n.Name(), n.Op(), v.Type, t)
	}
	im.vals[n] = v
	return v, nil
}

// typeOf is the static type gorgonia gives a node.
func typeOf(n *G.Node) (graph.TensorType, error) {
	dt, ok := dtypeOf(n.Dtype())
	if !ok {
		return graph.TensorType{}, fmt.Errorf("node %s: dtype %v is not supported (float64 and float32 are)", n.Name(), n.Dtype())
	}
	s := n.Shape()
	if s == nil && !n.IsScalar() {
		return graph.TensorType{}, fmt.Errorf("node %s has no static shape", n.Name())
	}
	return graph.TensorType{DType: dt, Shape: graph.Shape(s).Clone()}, nil
}

// variable imports a leaf variable as an input, a param or a const.
func (im *importer) variable(n *G.Node, t graph.TensorType) (*graph.Value, error) {
	bound := n.Value()
	switch {
	case im.inputs[n] || bound == nil:
		if im.consts[n] {
			return nil, fmt.Errorf("node %s is listed in both Options.Inputs and Options.Consts, or has no value to make a const of", n.Name())
		}
		return im.leaf(graph.Input, im.name(n, "input"), t, nil), nil
	case im.consts[n] || im.freeze:
		return im.constant(n, t, bound)
	}
	data, err := im.data(n, t, bound)
	if err != nil {
		return nil, err
	}
	init := graph.Literal(data...)
	return im.leaf(graph.Param, im.name(n, "param"), t, &init), nil
}

// constant imports a value as a const.
func (im *importer) constant(n *G.Node, t graph.TensorType, v G.Value) (*graph.Value, error) {
	data, err := im.data(n, t, v)
	if err != nil {
		return nil, err
	}
	init := graph.Literal(data...)
	if isCausalMask(t.Shape, data) {
		init = graph.CausalMask()
	}
	return im.leaf(graph.Const, im.name(n, "const"), t, &init), nil
}

// data reads a node's value and checks it against the node's type.
func (im *importer) data(n *G.Node, t graph.TensorType, v G.Value) ([]float64, error) {
	if v == nil {
		return nil, fmt.Errorf("node %s has no value", n.Name())
	}
	data, dt, err := values(v)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name(), err)
	}
	if dt != t.DType || len(data) != t.Shape.Numel() {
		return nil, fmt.Errorf("node %s: bound value is %v%v, the node is %v", n.Name(), dt, graph.Shape(v.Shape()), t)
	}
	return data, nil
}

// isCausalMask reports whether data is bit for bit what graph.CausalMask
// materialises for shape: +0 on and below the diagonal, −Inf above it.
func isCausalMask(s graph.Shape, data []float64) bool {
	if s.Rank() != 2 || s.Numel() < 2 {
		return false
	}
	rows, cols := s[0], s[1]
	for i := range rows {
		for j := range cols {
			x := data[i*cols+j]
			if j > i && !math.IsInf(x, -1) || j <= i && math.Float64bits(x) != 0 {
				return false
			}
		}
	}
	return true
}

// leaf declares a graph input, param or const.
func (im *importer) leaf(kind graph.ValueKind, name string, t graph.TensorType, init *graph.Init) *graph.Value {
	v := &graph.Value{Name: name, Type: t, Kind: kind, Init: init}
	switch kind {
	case graph.Input:
		im.out.Inputs = append(im.out.Inputs, v)
	case graph.Param:
		im.out.Params = append(im.out.Params, v)
	case graph.Const:
		im.out.Consts = append(im.out.Consts, v)
	}
	return v
}

// emit appends a node named from its op and returns its output.
func (im *importer) emit(op string, attrs graph.Attrs, in ...*graph.Value) (*graph.Value, error) {
	return im.emitNamed(im.namer.Fresh(op), op, attrs, in...)
}

func (im *importer) emitNamed(name, op string, attrs graph.Attrs, in ...*graph.Value) (*graph.Value, error) {
	n, err := graph.NewNode(name, op, attrs, in...)
	if err != nil {
		return nil, err
	}
	im.out.Nodes = append(im.out.Nodes, n)
	return n.Outputs[0], nil
}

// intsConst returns a shared 1-D int64 const (a shape or axes operand).
func (im *importer) intsConst(prefix string, vals []int) *graph.Value {
	parts := make([]string, len(vals))
	data := make([]float64, len(vals))
	for i, x := range vals {
		parts[i] = strconv.Itoa(x)
		data[i] = float64(x)
	}
	key := prefix + "[" + strings.Join(parts, ",") + "]"
	if v, ok := im.ints[key]; ok {
		return v
	}
	init := graph.Literal(data...)
	v := im.leaf(graph.Const, im.namer.Fresh(prefix), graph.TensorType{DType: graph.Int64, Shape: graph.Shape{len(vals)}}, &init)
	im.ints[key] = v
	return v
}

// reshape returns x reshaped to s (x itself when it already has shape s).
func (im *importer) reshape(x *graph.Value, s graph.Shape) (*graph.Value, error) {
	if x.Type.Shape.Equal(s) {
		return x, nil
	}
	return im.emit("Reshape", nil, x, im.intsConst("shape", s))
}

// transpose applies perm (none when it is the identity).
func (im *importer) transpose(x *graph.Value, perm []int) (*graph.Value, error) {
	id := true
	p := make([]int64, len(perm))
	for i, a := range perm {
		p[i] = int64(a)
		id = id && a == i
	}
	if id {
		return x, nil
	}
	return im.emit("Transpose", graph.Attrs{"perm": graph.Ints(p...)}, x)
}

// op translates an op node: the rule for its op type builds the value.
func (im *importer) op(n *G.Node, t graph.TensorType) (*graph.Value, error) {
	typ := opType(n.Op())
	r, ok := rules[typ]
	if !ok {
		return nil, unsupported(n, "")
	}
	res, err := r(im, n, t)
	if err != nil {
		return nil, err
	}
	if res.v != nil {
		// The node is another value under a new name (a one-input Concat):
		// an Identity carries a user name, otherwise the value is shared.
		if s, ok := im.user[n]; ok && !res.own {
			return im.emitNamed(s, "Identity", nil, res.v)
		}
		return res.v, nil
	}
	name := im.name(n, res.op)
	v, err := im.emitNamed(name, res.op, res.attrs, res.in...)
	if err != nil {
		return nil, fmt.Errorf("node %s (%v): %w", n.Name(), n.Op(), err)
	}
	return v, nil
}

func unsupported(n *G.Node, reason string) error {
	return &UnsupportedOpError{Op: fmt.Sprint(n.Op()), Node: n.Name(), Reason: reason}
}
