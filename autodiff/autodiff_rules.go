package autodiff

import (
	"github.com/flashgraph/flashgraph/graph"
)

// gradRule is the vector-Jacobian product of one op.
type gradRule struct {
	// Diff lists the inputs a gradient can flow into; the others are
	// indices, masks or shape operands and never get one. Nil: all inputs.
	Diff []int
	// VJP emits the nodes computing the input cotangents of n from its
	// output cotangents dy (nil where an output has none). need[i] says
	// whether input i wants one; the result has an entry per input, nil
	// where none is needed.
	VJP func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value
}

// gradRules is the table of gradient rules, keyed by op name; the driver
// never names an op. The ops defined by an expression get theirs from it
// (exprRule, added at init); the rest are written here.
var gradRules = map[string]gradRule{
	"Identity": {VJP: unary(func(e *emitter, x, y, dy *graph.Value) *graph.Value { return dy })},
	"Cast": {VJP: unary(func(e *emitter, x, y, dy *graph.Value) *graph.Value {
		if x.Type.DType == dy.Type.DType {
			return dy
		}
		return e.op("Cast", graph.Attrs{"to": graph.Str(x.Type.DType.String())}, dy)
	})},
	"MatMul": {VJP: matmulVJP},
	"Gemm":   {VJP: gemmVJP},
	"Transpose": {VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		perm, err := graph.TransposePerm(n.Attrs, n.Inputs[0].Type.Shape.Rank())
		if err != nil {
			return []*graph.Value{e.fail("%w", err)}
		}
		inv := make([]int64, len(perm))
		for i, p := range perm {
			inv[p] = int64(i)
		}
		return []*graph.Value{e.op("Transpose", graph.Attrs{"perm": graph.Ints(inv...)}, dy[0])}
	}},
	// Shape-only ops: the cotangent is dy with the input's shape back.
	"Reshape":   {Diff: []int{0}, VJP: reshapeBack},
	"Unsqueeze": {Diff: []int{0}, VJP: reshapeBack},
	"Squeeze":   {Diff: []int{0}, VJP: reshapeBack},
	"Expand": {Diff: []int{0}, VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		return []*graph.Value{e.sumTo(dy[0], n.Inputs[0].Type.Shape)}
	}},
	"Concat":     {VJP: concatVJP},
	"Slice":      {Diff: []int{0}, VJP: sliceVJP},
	"ReduceSum":  {Diff: []int{0}, VJP: reduceVJP(false)},
	"ReduceMean": {Diff: []int{0}, VJP: reduceVJP(true)},
	// CumSum is linear: each input element reaches the sums after it (before
	// it, reversed), so its cotangent is the running sum of dy the other way.
	"CumSum": {Diff: []int{0}, VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		a := n.Attrs.Clone()
		a["reverse"] = graph.Int(1 - n.Attrs.Int("reverse", 0))
		return []*graph.Value{e.op("CumSum", a, dy[0], n.Inputs[1])}
	}},
	// GatherElements and GatherND read each data element any number of
	// times: its cotangent is the sum of dy over the reads, a scatter-add of
	// dy into zeros at the same indices.
	"GatherElements": {Diff: []int{0}, VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		attrs := graph.Attrs{"axis": graph.Int(n.Attrs.Int("axis", 0)), "reduction": graph.Str("add")}
		return []*graph.Value{e.op("ScatterElements", attrs, e.zeros(n.Inputs[0].Type), n.Inputs[1], dy[0])}
	}},
	"GatherND": {Diff: []int{0}, VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		if b := n.Attrs.Int("batch_dims", 0); b != 0 {
			return []*graph.Value{e.fail("GatherND with batch_dims %d has no gradient rule (ScatterND has no batch axes)", b)}
		}
		return []*graph.Value{e.op("ScatterND", graph.Attrs{"reduction": graph.Str("add")}, e.zeros(n.Inputs[0].Type), n.Inputs[1], dy[0])}
	}},
	// ReverseSequence is a permutation that is its own inverse.
	"ReverseSequence": {Diff: []int{0}, VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		return []*graph.Value{e.op("ReverseSequence", n.Attrs.Clone(), dy[0], n.Inputs[1])}
	}},
	// Trilu is linear and keeps the same triangle of the cotangent.
	"Trilu": {Diff: []int{0}, VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		in := []*graph.Value{dy[0]}
		if len(n.Inputs) > 1 && n.Inputs[1] != nil {
			in = append(in, n.Inputs[1])
		}
		return []*graph.Value{e.op("Trilu", n.Attrs.Clone(), in...)}
	}},
	"Gather": {Diff: []int{0}, VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		data, idx := n.Inputs[0], n.Inputs[1]
		shape := make([]int64, data.Type.Shape.Rank())
		for i, d := range data.Type.Shape {
			shape[i] = int64(d)
		}
		attrs := graph.Attrs{"axis": graph.Int(n.Attrs.Int("axis", 0)), "shape": graph.Ints(shape...)}
		return []*graph.Value{e.op("GatherGrad", attrs, dy[0], idx)}
	}},
	"Softmax": {VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		attrs := graph.Attrs{"axis": graph.Int(n.Attrs.Int("axis", -1))}
		return []*graph.Value{e.op("SoftmaxGrad", attrs, n.Outputs[0], dy[0])}
	}},
	// y = x − logsumexp(x): dx = dy − softmax(x)·Σ dy, softmax(x) = e^y.
	"LogSoftmax": {VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		y := n.Outputs[0]
		ax := int(n.Attrs.Int("axis", -1))
		s := e.op("ReduceSum", graph.Attrs{"keepdims": graph.Int(1)}, dy[0], e.ints(ax))
		return []*graph.Value{e.op("Sub", nil, dy[0], e.op("Mul", nil, e.op("Exp", nil, y), s))}
	}},
	"SoftmaxCrossEntropyLoss": {Diff: []int{0}, VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		attrs := graph.Attrs{"reduction": graph.Str(n.Attrs.String("reduction", "mean"))}
		return []*graph.Value{e.op("SoftmaxCrossEntropyLossGrad", attrs, dy[0], n.Inputs[0], n.Inputs[1])}
	}},
	// FlashAttention's backward is one fused node that recomputes the
	// probabilities from the saved logsumexp L, so no S×S tensor exists in
	// the training graph either.
	"FlashAttention": {VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		if len(dy) > 1 && dy[1] != nil {
			return []*graph.Value{e.fail("gradient through the logsumexp output %s is not supported", n.Outputs[1].Name)}
		}
		if dy[0] == nil {
			return []*graph.Value{e.fail("output %s has no gradient", n.Outputs[0].Name)}
		}
		attrs := graph.Attrs{"causal": graph.Int(n.Attrs.Int("causal", 0)), "scale": graph.Float(n.Attrs.Float("scale", 0))}
		in := n.Inputs
		return e.opN("FlashAttentionGrad", attrs, in[0], in[1], in[2], n.Outputs[0], n.Outputs[1], dy[0])
	}},
}

func init() {
	for _, spec := range graph.ExprOps() {
		if r, ok := exprRule(spec); ok {
			gradRules[spec.Name] = r
		}
	}
}

// exprRule derives the gradient rule of an op defined by an expression:
// each operand's cotangent is the expression's VJP (graph.Expr.VJP, the
// symbolic derivative), emitted as nodes of the ops that compute its
// subexpressions (graph.MatchOp) and summed down to the operand's shape.
// The forward output stands for the whole expression wherever the
// derivative uses it (e^x, tanh x, σ(x)). Operands the value does not
// depend on smoothly (a condition, a compared value) get no gradient; an op
// with none has no rule (a comparison).
//
// An op whose expression reads attributes (graph.OpSpec.ExprFor) is
// differentiated at each node's values: its operands that may get a
// gradient are those of the expression with the attributes unbound.
func exprRule(spec *graph.OpSpec) (gradRule, bool) {
	if spec.Logical() || spec.IntegerOnly() {
		return gradRule{}, false // bools, integer bit work
	}
	nIn := len(spec.Inputs)
	vjps := make([]*graph.Expr, nIn)
	diff := []int{}
	for i := range nIn {
		if vjps[i] = spec.Expr.VJP(i, nIn); vjps[i] != nil {
			diff = append(diff, i)
		}
	}
	if len(diff) == 0 {
		return gradRule{}, false
	}
	root := spec.Expr.String()
	return gradRule{Diff: diff, VJP: func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		vjps, root := vjps, root
		if spec.HasExprAttrs() {
			bound, err := spec.ExprFor(n.Attrs)
			if err != nil {
				return []*graph.Value{e.fail("%s: %w", n.Name, err)}
			}
			root = bound.String()
			vjps = make([]*graph.Expr, nIn)
			for _, i := range diff {
				if vjps[i] = bound.VJP(i, nIn); vjps[i] == nil {
					// Zero at these values: dy·0, dy's shape.
					vjps[i] = graph.ExprOf(graph.PrimMul, graph.ExprVar(nIn), graph.ExprConst(0))
				}
			}
		}
		memo := map[string]*graph.Value{}
		var emit func(x *graph.Expr) *graph.Value
		emit = func(x *graph.Expr) *graph.Value {
			key := x.String()
			if v, ok := memo[key]; ok {
				return v
			}
			var v *graph.Value
			switch {
			case key == root:
				v = n.Outputs[0]
			case x.Prim == graph.PrimVar && x.Var == nIn:
				v = dy[0]
			case x.Prim == graph.PrimVar:
				v = n.Inputs[x.Var]
			case x.Prim == graph.PrimConst:
				v = e.scalar(dy[0].Type.DType, x.Const)
			default:
				op, operands, ok := graph.MatchOp(x)
				if !ok {
					return e.fail("the derivative of %s needs %s, which no op of the table computes", spec.Name, key)
				}
				in := make([]*graph.Value, len(operands))
				for j, o := range operands {
					in[j] = emit(o)
				}
				v = e.op(op, nil, in...)
			}
			memo[key] = v
			return v
		}
		out := make([]*graph.Value, len(n.Inputs))
		for _, i := range diff {
			if i < len(need) && need[i] {
				out[i] = e.sumTo(emit(vjps[i]), n.Inputs[i].Type.Shape)
			}
		}
		return out
	}}, true
}

// unary adapts f(x, y, dy) → dx into a rule for a one-input op.
func unary(f func(e *emitter, x, y, dy *graph.Value) *graph.Value) func(*emitter, *graph.Node, []*graph.Value, []bool) []*graph.Value {
	return func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		return []*graph.Value{f(e, n.Inputs[0], n.Outputs[0], dy[0])}
	}
}

func reshapeBack(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
	return []*graph.Value{e.reshape(dy[0], n.Inputs[0].Type.Shape)}
}

// matmulVJP: for Y = A·B (numpy batching), dA = dY·Bᵀ and dB = Aᵀ·dY, each
// summed over the batch axes its operand was broadcast along. Rank-1
// operands are promoted as MatMul promotes them, then the result is
// reshaped back.
func matmulVJP(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
	a, b := n.Inputs[0], n.Inputs[1]
	as, bs := a.Type.Shape, b.Type.Shape
	ap, bp := a, b
	if as.Rank() == 1 {
		ap = e.reshape(a, graph.Shape{1, as[0]})
	}
	if bs.Rank() == 1 {
		bp = e.reshape(b, graph.Shape{bs[0], 1})
	}
	if e.err != nil {
		return nil
	}
	ys, err := graph.MatMulShape(ap.Type.Shape, bp.Type.Shape)
	if err != nil {
		return []*graph.Value{e.fail("%w", err)}
	}
	g := e.reshape(dy[0], ys)
	out := make([]*graph.Value, 2)
	if need[0] {
		da := e.op("MatMul", nil, g, e.swapLast2(bp))
		out[0] = e.reshape(e.sumTo(da, ap.Type.Shape), as)
	}
	if need[1] {
		if bp.Type.Shape.Rank() == 2 && ap.Type.Shape.Rank() > 2 {
			// A shared weight under batched activations (x·W): fold the
			// batch into the rows, one 2-D product instead of a batched
			// one summed afterwards.
			k, m := bp.Type.Shape[0], bp.Type.Shape[1]
			a2 := e.reshape(ap, graph.Shape{ap.Type.Shape.Numel() / k, k})
			g2 := e.reshape(g, graph.Shape{g.Type.Shape.Numel() / m, m})
			out[1] = e.reshape(e.op("MatMul", nil, e.swapLast2(a2), g2), bs)
		} else {
			db := e.op("MatMul", nil, e.swapLast2(ap), g)
			out[1] = e.reshape(e.sumTo(db, bp.Type.Shape), bs)
		}
	}
	return out
}

// gemmVJP: Y = α·op(A)·op(B) + β·C. With G = α·dY, d op(A) = G·op(B)ᵀ and
// d op(B) = op(A)ᵀ·G; a transposed operand takes the transpose back.
func gemmVJP(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
	a, b := n.Inputs[0], n.Inputs[1]
	dt := dy[0].Type.DType
	ta, tb := n.Attrs.Int("transA", 0) != 0, n.Attrs.Int("transB", 0) != 0
	alpha, beta := n.Attrs.Float("alpha", 1), n.Attrs.Float("beta", 1)
	scaled := func(x *graph.Value, s float64) *graph.Value {
		if s == 1 {
			return x
		}
		return e.op("Mul", nil, x, e.scalar(dt, s))
	}
	opA, opB := a, b
	if ta {
		opA = e.swapLast2(a)
	}
	if tb {
		opB = e.swapLast2(b)
	}
	g := scaled(dy[0], alpha)
	out := make([]*graph.Value, 3)
	if need[0] {
		if ta { // dA = (G·op(B)ᵀ)ᵀ = op(B)·Gᵀ
			out[0] = e.op("MatMul", nil, opB, e.swapLast2(g))
		} else {
			out[0] = e.op("MatMul", nil, g, e.swapLast2(opB))
		}
	}
	if need[1] {
		if tb { // dB = (op(A)ᵀ·G)ᵀ = Gᵀ·op(A)
			out[1] = e.op("MatMul", nil, e.swapLast2(g), opA)
		} else {
			out[1] = e.op("MatMul", nil, e.swapLast2(opA), g)
		}
	}
	if len(need) > 2 && need[2] {
		out[2] = e.sumTo(scaled(dy[0], beta), n.Inputs[2].Type.Shape)
	}
	return out
}

// concatVJP slices each input's part back out of the cotangent.
func concatVJP(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
	r := n.Outputs[0].Type.Shape.Rank()
	ax, err := graph.NormAxis(int(n.Attrs.Int("axis", 0)), r)
	if err != nil {
		return []*graph.Value{e.fail("%w", err)}
	}
	out := make([]*graph.Value, len(n.Inputs))
	off := 0
	for i, in := range n.Inputs {
		w := in.Type.Shape[ax]
		if need[i] {
			out[i] = e.op("Slice", nil, dy[0], e.ints(off), e.ints(off+w), e.ints(ax))
		}
		off += w
	}
	return out
}

// sliceVJP puts the cotangent back where the slice came from, zeros around
// it: one Concat with zero blocks per sliced axis (the op table has no Pad).
// Steps other than 1 are refused with the reason.
func sliceVJP(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
	x := n.Inputs[0]
	xs := x.Type.Shape
	operand := func(i int, what string) []int {
		if i >= len(n.Inputs) || n.Inputs[i] == nil {
			return nil
		}
		return e.constInts(n.Inputs[i], what)
	}
	starts, ends := operand(1, "starts"), operand(2, "ends")
	axes, steps := operand(3, "axes"), operand(4, "steps")
	if e.err != nil {
		return nil
	}
	sp, ys, err := graph.ResolveSlice(xs, starts, ends, axes, steps)
	if err != nil {
		return []*graph.Value{e.fail("%w", err)}
	}
	if ys.Numel() == 0 {
		return []*graph.Value{e.zeros(x.Type)}
	}
	cur := dy[0]
	shape := ys.Clone()
	for a := range xs {
		if sp.Step[a] != 1 {
			return []*graph.Value{e.fail("Slice gradient needs step 1, axis %d has step %d", a, sp.Step[a])}
		}
		before, after := sp.Start[a], xs[a]-sp.End[a]
		if before == 0 && after == 0 {
			continue
		}
		block := func(w int) *graph.Value {
			s := shape.Clone()
			s[a] = w
			return e.zeros(graph.TensorType{DType: x.Type.DType, Shape: s})
		}
		parts := []*graph.Value{}
		if before > 0 {
			parts = append(parts, block(before))
		}
		parts = append(parts, cur)
		if after > 0 {
			parts = append(parts, block(after))
		}
		cur = e.op("Concat", graph.Attrs{"axis": graph.Int(int64(a))}, parts...)
		shape[a] = xs[a]
	}
	return []*graph.Value{cur}
}

// reduceVJP spreads the cotangent back over the reduced axes (divided by
// their size for a mean): reshape to the keepdims shape, then Expand.
func reduceVJP(mean bool) func(*emitter, *graph.Node, []*graph.Value, []bool) []*graph.Value {
	return func(e *emitter, n *graph.Node, dy []*graph.Value, need []bool) []*graph.Value {
		x := n.Inputs[0]
		xs := x.Type.Shape
		var axes []int
		if len(n.Inputs) > 1 && n.Inputs[1] != nil {
			axes = e.constInts(n.Inputs[1], "axes")
		}
		if e.err != nil {
			return nil
		}
		ax, err := graph.ReduceAxes(xs, axes, n.Attrs.Int("noop_with_empty_axes", 0) != 0)
		if err != nil {
			return []*graph.Value{e.fail("%w", err)}
		}
		if len(ax) == 0 {
			return []*graph.Value{dy[0]}
		}
		g := e.reshape(dy[0], graph.ReducedShape(xs, ax, true))
		if mean {
			cnt := 1
			for _, a := range ax {
				cnt *= xs[a]
			}
			g = e.op("Mul", nil, g, e.scalar(g.Type.DType, 1/float64(cnt)))
		}
		if g.Type.Shape.Equal(xs) {
			return []*graph.Value{g}
		}
		return []*graph.Value{e.op("Expand", nil, g, e.ints(xs...))}
	}
}
