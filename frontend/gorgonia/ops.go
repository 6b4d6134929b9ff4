package gorgonia

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	G "gorgonia.org/gorgonia"
)

// result is what a rule makes of a gorgonia node: the application of one op
// (the node that carries the gorgonia node's name; helper nodes a rule
// needs are emitted before it), or a value that already exists (own: a
// value made for this node and named for it already, such as a const).
type result struct {
	op    string
	attrs graph.Attrs
	in    []*graph.Value
	v     *graph.Value
	own   bool
}

func apply(op string, attrs graph.Attrs, in ...*graph.Value) (result, error) {
	return result{op: op, attrs: attrs, in: in}, nil
}

// rule translates one gorgonia node of type t.
type rule func(im *importer, n *G.Node, t graph.TensorType) (result, error)

// rules maps gorgonia's op type names to their translations: the one list
// of what is supported. Anything else is refused by name.
var rules map[string]rule

func init() {
	// Filled in init: the rules call back into the importer, which reads
	// this table.
	rules = map[string]rule{
		"elemBinOp":   ruleElemBinary,
		"elemUnaryOp": ruleElemUnary,
		"linAlgBinOp": ruleLinAlg,
		"transposeOp": ruleTranspose,
		"reshapeOp":   ruleReshape,
		"softmaxOp":   ruleSoftmax,
		"sumOp":       ruleReduce("ReduceSum", "Σ"),
		"maxOp":       ruleReduce("ReduceMax", "MaxAlong"),
		"sizeOp":      ruleSize,
		"repeatOp":    ruleRepeat,
		"concatOp":    ruleConcat,
		"sliceOp":     ruleSlice,
	}
}

// operands translates a node's children, checking their number.
func (im *importer) operands(n *G.Node, want int) ([]*graph.Value, error) {
	kids := im.children(n)
	if len(kids) != want {
		return nil, fmt.Errorf("node %s (%v) has %d operands, want %d", n.Name(), n.Op(), len(kids), want)
	}
	out := make([]*graph.Value, len(kids))
	for i, k := range kids {
		v, err := im.value(k)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// binaryOps gives the ONNX op of each of gorgonia's arithmetic operators,
// keyed by the operator's String.
var binaryOps = map[string]string{"+": "Add", "-": "Sub", "⊙": "Mul", "÷": "Div", "^": "Pow"}

// parseBinary reads an elemBinOp's String, "<operator> <retSame>".
func parseBinary(op G.Op) (sym string, retSame bool) {
	f := strings.Fields(fmt.Sprint(op))
	if len(f) == 0 {
		return "", false
	}
	return f[0], len(f) > 1 && f[1] == "true"
}

// ruleElemBinary: + - ⊙ ÷ ^ on scalars and tensors. Gorgonia requires equal
// shapes (up to vector and scalar equivalence) or a scalar operand; its
// Broadcast* functions reach here through Reshape and Repeat nodes.
func ruleElemBinary(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	sym, _ := parseBinary(n.Op())
	op, ok := binaryOps[sym]
	if !ok {
		return result{}, unsupported(n, "comparisons are imported only inside Rectify and LeakyRelu")
	}
	kids := im.children(n)
	if len(kids) != 2 {
		return result{}, fmt.Errorf("node %s (%v) has %d operands, want 2", n.Name(), n.Op(), len(kids))
	}
	if sym == "⊙" {
		if r, ok, err := im.signMask(kids, t); ok || err != nil {
			return r, err
		}
	}
	a, b, err := im.broadcastOperands(kids, t.Shape)
	if err != nil {
		return result{}, err
	}
	return apply(op, nil, a, b)
}

// signMask recognises x ⊙ (x ≥ 0) (Rectify) and x ⊙ (x < 0) (in LeakyRelu),
// where the comparison returns 1 or 0 in x's dtype (retSame). They become
// Relu(x) and −Relu(−x) (= min(x, 0)): flashgraph has no comparison ops, and
// these are the functions meant.
func (im *importer) signMask(kids []*G.Node, t graph.TensorType) (result, bool, error) {
	for i := range 2 {
		x, c := kids[i], kids[1-i]
		if opType(c.Op()) != "elemBinOp" || !graph.Shape(x.Shape()).Equal(t.Shape) {
			continue
		}
		sym, retSame := parseBinary(c.Op())
		ck := im.children(c)
		if !retSame || len(ck) != 2 || ck[0] != x || !isZeroConstant(ck[1]) {
			continue
		}
		switch sym {
		case ">=", ">":
			xv, err := im.value(x)
			if err != nil {
				return result{}, true, err
			}
			r, err := apply("Relu", nil, xv)
			return r, true, err
		case "<", "<=":
			xv, err := im.value(x)
			if err != nil {
				return result{}, true, err
			}
			neg, err := im.emit("Neg", nil, xv)
			if err != nil {
				return result{}, true, err
			}
			relu, err := im.emit("Relu", nil, neg)
			if err != nil {
				return result{}, true, err
			}
			r, err := apply("Neg", nil, relu)
			return r, true, err
		}
	}
	return result{}, false, nil
}

func isZeroConstant(n *G.Node) bool {
	if !isConstant(n) || !n.IsScalar() || n.Value() == nil {
		return false
	}
	switch x := n.Value().Data().(type) {
	case float64:
		return x == 0
	case float32:
		return x == 0
	}
	return false
}

// broadcastOperands returns the two operands of an elementwise op whose
// gorgonia result has shape out. An operand that gorgonia broadcast with
// Repeat (of size-1 axes, after a Reshape that only prepends 1s) is used
// from before the broadcast where ONNX broadcasting of it gives out: the
// same elements meet, without materialising the repeated tensor. An operand
// of out's size but another shape ((n) against (1, n)) is reshaped: gorgonia
// pairs such operands element by element.
func (im *importer) broadcastOperands(kids []*G.Node, out graph.Shape) (*graph.Value, *graph.Value, error) {
	fit := func(s graph.Shape) graph.Shape {
		if s.Numel() == out.Numel() {
			return out
		}
		return s
	}
	pa, pb := im.peel(kids[0]), im.peel(kids[1])
	cands := [][2]*G.Node{{pa, pb}, {pa, kids[1]}, {kids[0], pb}, {kids[0], kids[1]}}
	for _, c := range cands {
		sa, sb := fit(graph.Shape(c[0].Shape())), fit(graph.Shape(c[1].Shape()))
		if s, err := graph.Broadcast(sa, sb); err != nil || !s.Equal(out) {
			continue
		}
		a, err := im.value(c[0])
		if err != nil {
			return nil, nil, err
		}
		b, err := im.value(c[1])
		if err != nil {
			return nil, nil, err
		}
		if a, err = im.reshape(a, sa); err != nil {
			return nil, nil, err
		}
		if b, err = im.reshape(b, sb); err != nil {
			return nil, nil, err
		}
		return a, b, nil
	}
	return nil, nil, fmt.Errorf("operands of shapes %v and %v do not make %v", kids[0].Shape(), kids[1].Shape(), out)
}

// peel looks through gorgonia's broadcast: Repeat nodes that only expand
// size-1 axes (or a scalar), and below them a Reshape that only prepends 1s.
func (im *importer) peel(n *G.Node) *G.Node {
	repeated := false
	for {
		var kids []*G.Node
		switch opType(n.Op()) {
		case "repeatOp":
			kids = im.children(n)
			if len(kids) == 0 || !expands(graph.Shape(kids[0].Shape()), graph.Shape(n.Shape())) {
				return n
			}
			repeated = true
		case "reshapeOp":
			kids = im.children(n)
			if !repeated || len(kids) == 0 || !prependsOnes(graph.Shape(kids[0].Shape()), graph.Shape(n.Shape())) {
				return n
			}
		default:
			return n
		}
		n = kids[0]
	}
}

// expands reports whether out is in with size-1 axes enlarged (or in is a scalar).
func expands(in, out graph.Shape) bool {
	if in.Rank() == 0 {
		return true
	}
	if in.Rank() != out.Rank() {
		return false
	}
	for i := range in {
		if in[i] != out[i] && in[i] != 1 {
			return false
		}
	}
	return true
}

// prependsOnes reports whether out is in with leading 1s.
func prependsOnes(in, out graph.Shape) bool {
	k := out.Rank() - in.Rank()
	if k < 0 {
		return false
	}
	for i := range k {
		if out[i] != 1 {
			return false
		}
	}
	return graph.Shape(out[k:]).Equal(in)
}

// unaryOps translate gorgonia's unary operators (their String) whose name
// is not their op's into a chain of flashgraph ops applied in order: the
// one place where the names differ. Any other operator whose name,
// capitalised, is a one-operand elementwise op of the table (exp, neg,
// sqrt, abs, tanh, sigmoid, softplus) maps to it (unaryChain). Square and
// cube are products, as gorgonia computes them (x·x, x·x·x); invSqrt is
// 1/sqrt(x), as gorgonia's.
var unaryOps = map[string][]string{
	"ln": {"Log"}, "inv": {"Reciprocal"}, "invSqrt": {"Sqrt", "Reciprocal"},
	"square": {"square"}, "cube": {"cube"},
}

// unaryChain is the translation of a gorgonia unary operator.
func unaryChain(name string) ([]string, bool) {
	if chain, ok := unaryOps[name]; ok {
		return chain, true
	}
	if name == "" {
		return nil, false
	}
	op := strings.ToUpper(name[:1]) + name[1:]
	if s, ok := graph.LookupOp(op); ok && s.Expr != nil && len(s.Inputs) == 1 {
		return []string{op}, true
	}
	return nil, false
}

// noUnary says why a gorgonia unary operator is refused.
var noUnary = map[string]string{
	"log2": "no Log2 op", "log1p": "no Log1p op", "expm1": "no Expm1 op",
}

func ruleElemUnary(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	name := fmt.Sprint(n.Op())
	chain, ok := unaryChain(name)
	if !ok {
		return result{}, unsupported(n, noUnary[name])
	}
	in, err := im.operands(n, 1)
	if err != nil {
		return result{}, err
	}
	x := in[0]
	for i, op := range chain {
		var r result
		switch op {
		case "square":
			r, _ = apply("Mul", nil, x, x)
		case "cube":
			sq, err := im.emit("Mul", nil, x, x)
			if err != nil {
				return result{}, err
			}
			r, _ = apply("Mul", nil, sq, x)
		default:
			r, _ = apply(op, nil, x)
		}
		if i == len(chain)-1 {
			return r, nil
		}
		if x, err = im.emit(r.op, r.attrs, r.in...); err != nil {
			return result{}, err
		}
	}
	return result{}, fmt.Errorf("node %s: empty translation", n.Name())
}

// ruleLinAlg: gorgonia's linAlgBinOp prints as "A × B" (matmul), "A × b"
// (matrix-vector), "a ⋅ b" (dot), "a ⊗ b" (outer), "A ××× B" (batched), with
// ᵀ after A or B where that operand is transposed first.
func ruleLinAlg(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	f := strings.Fields(fmt.Sprint(n.Op()))
	if len(f) != 3 {
		return result{}, unsupported(n, "unrecognised linear algebra op")
	}
	left, sym, right := f[0], f[1], f[2]
	transA, transB := strings.HasSuffix(left, "ᵀ"), strings.HasSuffix(right, "ᵀ")
	in, err := im.operands(n, 2)
	if err != nil {
		return result{}, err
	}
	a, b := in[0], in[1]
	// swap transposes the last two axes: gorgonia's transA/transB on
	// matrices and on each matrix of a batch.
	swap := func(x *graph.Value) (*graph.Value, error) {
		r := x.Type.Shape.Rank()
		if r < 2 {
			return nil, fmt.Errorf("node %s: cannot transpose a rank-%d operand", n.Name(), r)
		}
		perm := make([]int, r)
		for i := range perm {
			perm[i] = i
		}
		perm[r-2], perm[r-1] = r-1, r-2
		return im.transpose(x, perm)
	}
	switch {
	case sym == "×××" || sym == "×":
		if transA {
			if a, err = swap(a); err != nil {
				return result{}, err
			}
		}
		if transB {
			if b, err = swap(b); err != nil {
				return result{}, err
			}
		}
		return apply("MatMul", nil, a, b)
	case sym == "⋅":
		return apply("MatMul", nil, a, b)
	case sym == "⊗":
		// Outer product as a matmul over an inner dimension of 1: each
		// element is one product, as in gorgonia.
		if a, err = im.reshape(a, graph.Shape{a.Type.Shape.Numel(), 1}); err != nil {
			return result{}, err
		}
		if b, err = im.reshape(b, graph.Shape{1, b.Type.Shape.Numel()}); err != nil {
			return result{}, err
		}
		return apply("MatMul", nil, a, b)
	}
	return result{}, unsupported(n, "unrecognised linear algebra op")
}

// parseInts reads the integers of a list such as "{0, 2, 1}" or "[0 1]".
func parseInts(s string) ([]int, error) {
	f := strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' })
	out := make([]int, len(f))
	for i, x := range f {
		v, err := strconv.Atoi(x)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// ruleTranspose: "Aᵀ{0, 2, 1}", numpy's transpose by that pattern.
func ruleTranspose(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	s := fmt.Sprint(n.Op())
	body, ok := strings.CutPrefix(s, "Aᵀ{")
	body, ok2 := strings.CutSuffix(body, "}")
	perm, err := parseInts(body)
	if !ok || !ok2 || err != nil {
		return result{}, unsupported(n, "unrecognised transpose pattern")
	}
	in, err := im.operands(n, 1)
	if err != nil {
		return result{}, err
	}
	p := make([]int64, len(perm))
	for i, a := range perm {
		p[i] = int64(a)
	}
	return apply("Transpose", graph.Attrs{"perm": graph.Ints(p...)}, in[0])
}

// ruleReshape: gorgonia's Reshape has a static target, the node's shape.
func ruleReshape(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	in, err := im.operands(n, 1)
	if err != nil {
		return result{}, err
	}
	return apply("Reshape", nil, in[0], im.intsConst("shape", t.Shape))
}

// ruleSoftmax: "Softmax{axis, isLog}()". Gorgonia resolves the axis when it
// runs: -1 means the last axis, except that a column vector (n, 1) or a
// rank-1 tensor uses axis 0; any other axis is taken modulo the rank.
func ruleSoftmax(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	var axis int
	var isLog bool
	if _, err := fmt.Sscanf(fmt.Sprint(n.Op()), "Softmax{%d, %t}()", &axis, &isLog); err != nil {
		return result{}, unsupported(n, "unrecognised softmax")
	}
	kids := im.children(n)
	if len(kids) != 1 {
		return result{}, fmt.Errorf("node %s (%v) has %d operands, want 1", n.Name(), n.Op(), len(kids))
	}
	s := kids[0].Shape()
	dims := s.Dims()
	if dims == 0 {
		return result{}, unsupported(n, "softmax of a scalar")
	}
	ax := dims - 1
	if s.IsColVec() || (s.IsVector() && !s.IsRowVec()) {
		ax = 0
	}
	if axis != -1 {
		if ax = axis % dims; ax < 0 {
			ax += dims
		}
	}
	x, err := im.value(kids[0])
	if err != nil {
		return result{}, err
	}
	// The last axis is written -1, the op's default, as models write it.
	attr := int64(ax)
	if ax == dims-1 {
		attr = -1
	}
	op := "Softmax"
	if isLog {
		op = "LogSoftmax"
	}
	return apply(op, graph.Attrs{"axis": graph.Int(attr)}, x)
}

// ruleReduce: Sum ("Σ[0 1]") and Max ("MaxAlong[0 1]") drop the reduced axes.
func ruleReduce(op, prefix string) rule {
	return func(im *importer, n *G.Node, t graph.TensorType) (result, error) {
		body, ok := strings.CutPrefix(fmt.Sprint(n.Op()), prefix+"[")
		body, ok2 := strings.CutSuffix(body, "]")
		axes, err := parseInts(body)
		if !ok || !ok2 || err != nil || len(axes) == 0 {
			return result{}, unsupported(n, "unrecognised reduction axes")
		}
		in, err := im.operands(n, 1)
		if err != nil {
			return result{}, err
		}
		return apply(op, graph.Attrs{"keepdims": graph.Int(0)}, in[0], im.intsConst("axes", axes))
	}
}

// ruleSize: SizeOf is a scalar of the operand's dtype holding one of its
// (static) dimensions: a const. Mean divides by products of these.
func ruleSize(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	kids := im.children(n)
	if len(kids) != 1 {
		return result{}, fmt.Errorf("node %s (%v) has %d operands, want 1", n.Name(), n.Op(), len(kids))
	}
	s := fmt.Sprint(n.Op())
	var size, axis int
	if _, err := fmt.Sscanf(s, "SizeOf=%d", &size); err != nil {
		if _, err := fmt.Sscanf(s, "SizeOf(%d)", &axis); err != nil {
			return result{}, unsupported(n, "unrecognised SizeOf")
		}
		shape := kids[0].Shape()
		switch {
		case shape.Dims() == 0:
			size = 1 // gorgonia's size of a scalar
		case axis >= 0 && axis < shape.Dims():
			size = shape[axis]
		default:
			return result{}, fmt.Errorf("node %s: SizeOf axis %d of shape %v", n.Name(), axis, shape)
		}
	}
	init := graph.Literal(float64(size))
	return result{v: im.leaf(graph.Const, im.name(n, "size"), t, &init), own: true}, nil
}

// ruleRepeat: "Repeat<axis>" repeats each element along the axis (numpy's
// repeat). Where the axis has size 1, as in gorgonia's broadcasting, that is
// Expand; otherwise a new axis after it is expanded and merged back. The
// operand is first given the node's rank (gorgonia repeats a scalar or a
// short vector into a longer shape with size-1 axes).
func ruleRepeat(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	var along int
	if _, err := fmt.Sscanf(fmt.Sprint(n.Op()), "Repeat%d", &along); err != nil {
		return result{}, unsupported(n, "unrecognised repeat")
	}
	kids := im.children(n)
	if len(kids) != 2 {
		return result{}, fmt.Errorf("node %s (%v) has %d operands, want 2", n.Name(), n.Op(), len(kids))
	}
	// The second operand is the size node; the repeat count is static.
	x, err := im.value(kids[0])
	if err != nil {
		return result{}, err
	}
	out := t.Shape
	if along < 0 || along >= out.Rank() || x.Type.Shape.Numel() == 0 || out.Numel()%x.Type.Shape.Numel() != 0 {
		return result{}, fmt.Errorf("node %s: cannot repeat %v into %v along %d", n.Name(), x.Type.Shape, out, along)
	}
	rep := out.Numel() / x.Type.Shape.Numel()
	if out[along]%rep != 0 {
		return result{}, fmt.Errorf("node %s: cannot repeat %v into %v along %d", n.Name(), x.Type.Shape, out, along)
	}
	pre := out.Clone()
	pre[along] /= rep
	if x, err = im.reshape(x, pre); err != nil {
		return result{}, err
	}
	if pre[along] == 1 {
		return apply("Expand", nil, x, im.intsConst("shape", out))
	}
	mid := append(append(pre[:along+1].Clone(), 1), pre[along+1:]...)
	if x, err = im.reshape(x, mid); err != nil {
		return result{}, err
	}
	mid[along+1] = rep
	e, err := im.emit("Expand", nil, x, im.intsConst("shape", mid))
	if err != nil {
		return result{}, err
	}
	return apply("Reshape", nil, e, im.intsConst("shape", out))
}

// ruleConcat: "Concat(axis=1)"; one operand is that operand itself.
func ruleConcat(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	var axis int
	if _, err := fmt.Sscanf(fmt.Sprint(n.Op()), "Concat(axis=%d)", &axis); err != nil {
		return result{}, unsupported(n, "unrecognised concat")
	}
	kids := im.children(n)
	if len(kids) == 0 {
		return result{}, fmt.Errorf("node %s: concat of nothing", n.Name())
	}
	in, err := im.operands(n, len(kids))
	if err != nil {
		return result{}, err
	}
	if len(in) == 1 {
		return result{v: in[0]}, nil
	}
	return apply("Concat", graph.Attrs{"axis": graph.Int(int64(axis))}, in...)
}

// ruleSlice: "T[:, :, start:end:step...]" slices one axis (the number of
// ":, " before it); gorgonia drops the axis when it selects one index,
// which is a Reshape to the node's shape after the Slice.
func ruleSlice(im *importer, n *G.Node, t graph.TensorType) (result, error) {
	body, ok := strings.CutPrefix(fmt.Sprint(n.Op()), "T[")
	body, ok2 := strings.CutSuffix(body, "...]")
	if !ok || !ok2 {
		return result{}, unsupported(n, "unrecognised slice")
	}
	parts := strings.Split(body, ", ")
	along := len(parts) - 1
	in, err := im.operands(n, 1)
	if err != nil {
		return result{}, err
	}
	x := in[0]
	spec := parts[along]
	if spec == ":" {
		// The whole axis: gorgonia's result is its operand.
		return result{v: x}, nil
	}
	var start, end, step int
	if _, err := fmt.Sscanf(spec, "%d:%d:%d", &start, &end, &step); err != nil || step < 0 || along >= x.Type.Shape.Rank() {
		return result{}, unsupported(n, "unrecognised slice")
	}
	if step == 0 {
		step = 1 // gorgonia's S(i): one index, step 0
	}
	// Gorgonia sizes a strided slice (end−start)/step rounded down; the
	// elements it takes are ONNX's only when the step divides the range.
	if size := min(end, x.Type.Shape[along]) - start; step > 1 && size%step != 0 {
		return result{}, unsupported(n, fmt.Sprintf("a step of %d that does not divide the range %d:%d", step, start, end))
	}
	_, sliced, err := graph.ResolveSlice(x.Type.Shape, []int{start}, []int{end}, []int{along}, []int{step})
	if err != nil {
		return result{}, fmt.Errorf("node %s: %w", n.Name(), err)
	}
	args := []*graph.Value{x, im.intsConst("starts", []int{start}), im.intsConst("ends", []int{end}),
		im.intsConst("axes", []int{along}), im.intsConst("steps", []int{step})}
	if sliced.Equal(t.Shape) {
		return apply("Slice", nil, args...)
	}
	s, err := im.emit("Slice", nil, args...)
	if err != nil {
		return result{}, err
	}
	return apply("Reshape", nil, s, im.intsConst("shape", t.Shape))
}
