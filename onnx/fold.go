package onnx

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Constant folding: ONNX ops evaluated at import time on constant inputs. The
// arithmetic follows ONNX: float results are rounded to the element type after
// every op (computing in float64 and rounding once is exact for + − × ÷ and sqrt
// of float32 operands), integer results wrap to their width and integer division
// truncates toward zero, as ONNX Runtime's C++ kernels do.
//
// What an op computes is the op table's: an op that graph has is folded with
// its row's scalar function (Map) or reference evaluation (Eval); only the
// ONNX forms around it (attribute versions, element types graph lacks, Less,
// Floor, ...) are written here.

// folder evaluates one op; in[i] is nil for an omitted optional input.
type folder func(c *opCtx, in []*cval) ([]*cval, error)

var folders map[string]folder

func init() {
	folders = map[string]folder{
		"Constant": foldConstant, "ConstantOfShape": foldConstantOfShape, "Range": foldRange,
		"Identity": func(_ *opCtx, in []*cval) ([]*cval, error) { return in[:1], nil },
		"Cast":     foldCast, "Not": foldNot,
		"Pow":            foldPow,
		"Less":           foldCompare(func(a, b float64) bool { return a < b }, func(a, b int64) bool { return a < b }),
		"LessOrEqual":    foldCompare(func(a, b float64) bool { return a <= b }, func(a, b int64) bool { return a <= b }),
		"GreaterOrEqual": foldCompare(func(a, b float64) bool { return a >= b }, func(a, b int64) bool { return a >= b }),
		"Sin":            foldUnary(math.Sin, false),
		"Cos":            foldUnary(math.Cos, false),
		"Floor":          foldUnary(math.Floor, false),
		"Ceil":           foldUnary(math.Ceil, false),
		"Gather":         foldGather, "Unsqueeze": foldUnsqueeze, "Squeeze": foldSqueeze,
		"Concat": foldConcat, "Slice": foldSlice, "Reshape": foldReshape, "Expand": foldExpand,
		"Transpose": foldTranspose, "Trilu": foldTrilu,
	}
	// Every elementwise op of the table folds with its own definition
	// (Pow keeps its ONNX form above: a float base with an integer
	// exponent); ONNX's variadic Max and Min, which take any number of
	// inputs where the table's take two, fold as a chain of the table's.
	for _, s := range graph.ExprOps() {
		if _, ok := folders[s.Name]; !ok {
			folders[s.Name] = foldExpr(s)
			if onnxVariadic[s.Name] {
				folders[s.Name] = foldVariadic(folders[s.Name])
			}
		}
	}
}

// onnxVariadic are the ONNX ops of a table op's name that take any number of
// inputs (importVariadic).
var onnxVariadic = map[string]bool{"Max": true, "Min": true}

// foldVariadic folds a variadic op as its two-input form applied left to
// right; one input is itself.
func foldVariadic(two folder) folder {
	return func(c *opCtx, in []*cval) ([]*cval, error) {
		if len(in) == 0 || slices.Contains(in, nil) {
			return nil, c.errf("needs at least one input, none omitted")
		}
		acc := in[0]
		for _, v := range in[1:] {
			out, err := two(c, []*cval{acc, v})
			if err != nil {
				return nil, err
			}
			acc = out[0]
		}
		return []*cval{acc}, nil
	}
}

// tableMap is the op table's scalar function of an elementwise op. Every op
// named here is elementwise in the table; a missing one is a programming
// error found at init.
func tableMap(op string) *graph.MapFunc {
	s, ok := graph.LookupOp(op)
	if !ok || s.Map == nil {
		panic("onnx: op table has no elementwise " + op)
	}
	return s.Map
}

// foldExpr folds an op the table defines by an expression, with its
// broadcasting and the ONNX element types around it: operands of one type
// (a select's condition apart, which is bool), float math rounded to that
// type, integer math (where the definition has an integer form) wrapped to
// its width, a comparison's result bool.
func foldExpr(s *graph.OpSpec) folder {
	cond := -1 // the operand that is a condition, not a value
	if s.Expr.Prim == graph.PrimSelect && s.Expr.Args[0].Prim == graph.PrimVar {
		cond = s.Expr.Args[0].Var
	}
	compare := s.Expr.Prim == graph.PrimGreater || s.Expr.Prim == graph.PrimEqual
	// A logical op takes and gives bools; a predicate (IsNaN) gives a bool
	// of floats: the table's type inference says which.
	boolOut := false
	if !s.Logical() && !compare {
		if types, err := inferScalars(s, nil, graph.Float64); err == nil && types[0].DType == graph.Bool {
			boolOut = true
		}
	}
	return func(c *opCtx, in []*cval) ([]*cval, error) {
		m := s.Map
		if s.HasExprAttrs() {
			attrs, err := c.tableAttrs(s)
			if err != nil {
				return nil, err
			}
			// The node's types and attributes as the table checks them
			// (Mod refuses fmod=0 on floats).
			if len(in) > 0 && in[0].f != nil {
				if _, err := inferScalars(s, attrs, graph.Float64); err != nil {
					return nil, c.errf("%v", err)
				}
			}
			if m, err = s.MapFor(attrs); err != nil {
				return nil, c.errf("%v", err)
			}
		}
		var values []*cval
		for k, v := range in {
			if k == cond {
				if v.dt != onnxpb.Bool {
					return nil, c.errf("condition must be bool, got %v", v.dt)
				}
				continue
			}
			values = append(values, v)
		}
		if err := sameType(c, values...); err != nil {
			return nil, err
		}
		dt := values[0].dt
		float := values[0].f != nil
		switch {
		case !float && m.Int == nil:
			return nil, c.errf("not defined for %v", dt)
		case s.Logical() && dt != onnxpb.Bool:
			return nil, c.errf("not defined for %v (bool only)", dt)
		case !s.Logical() && dt == onnxpb.Bool && !compare && cond < 0:
			return nil, c.errf("arithmetic on bool")
		case boolOut && !float:
			return nil, c.errf("not defined for %v", dt)
		}
		shape, idx, err := broadcastAll(c, in...)
		if err != nil {
			return nil, err
		}
		outDT := dt
		if compare || boolOut {
			outDT = onnxpb.Bool
		}
		out := newCval(outDT, shape)
		fx, ix := make([]float64, len(in)), make([]int64, len(in))
		for k := range out.n() {
			var v float64
			if float {
				for j, x := range in {
					fx[j] = x.at(idx[j][k])
				}
				v = m.Float(fx)
			} else {
				for j, x := range in {
					ix[j] = x.i[idx[j][k]]
				}
				r, err := m.Int(ix)
				if err == nil {
					err = uint64Result(outDT, r)
				}
				if err != nil {
					return nil, c.errf("%v", err)
				}
				out.i[k] = wrapInt(outDT, r)
				continue
			}
			if out.f != nil {
				out.f[k] = roundTo(outDT, v)
			} else {
				out.i[k] = boolInt(v != 0)
			}
		}
		return []*cval{out}, nil
	}
}

// inferScalars is the table's type inference for a node of s over scalar
// operands of type dt.
func inferScalars(s *graph.OpSpec, attrs graph.Attrs, dt graph.DType) ([]graph.TensorType, error) {
	in := make([]*graph.Value, len(s.Inputs))
	for i := range in {
		in[i] = &graph.Value{Type: graph.TensorType{DType: dt, Shape: graph.Shape{}}}
	}
	_, types, err := graph.InferNode(s.Name, in, attrs)
	return types, err
}

// tensor gives the data as a graph tensor for the op table's Eval: float
// types as float64, integer types and bool as int64; both hold every value
// exactly.
func (c *cval) tensor() *graph.Tensor {
	if c.f != nil {
		return &graph.Tensor{DType: graph.Float64, Shape: c.shape.Clone(), F64: c.f}
	}
	return &graph.Tensor{DType: graph.Int64, Shape: c.shape.Clone(), I64: c.i}
}

func intsTensor(v []int64) *graph.Tensor {
	return &graph.Tensor{DType: graph.Int64, Shape: graph.Shape{len(v)}, I64: v}
}

// evalTable folds an op that moves data (Transpose, Gather, Slice, ...) with
// the op table's Eval; the result keeps the element type dt of the data.
func evalTable(c *opCtx, op string, attrs graph.Attrs, dt onnxpb.DataType, in ...*graph.Tensor) ([]*cval, error) {
	outs, err := graph.Eval(op, attrs, in...)
	if err != nil {
		return nil, c.errf("%v", err)
	}
	t := outs[0]
	return []*cval{{dt: dt, shape: t.Shape, f: t.F64, i: t.I64}}, nil
}

// shapeOnly are ops whose result depends only on the static type of their input,
// so they fold even when the input is a runtime value.
var shapeOnly = map[string]func(c *opCtx) ([]*cval, error){
	"Shape": foldShape,
	"Size":  foldSize,
}

func foldConstant(c *opCtx, _ []*cval) ([]*cval, error) {
	var out *cval
	set := func(v *cval) error {
		if out != nil {
			return c.errf("more than one value attribute")
		}
		out = v
		return nil
	}
	if a, err := c.attr("value", onnxpb.AttrTensor); err != nil {
		return nil, err
	} else if a != nil {
		v, err := cvalFromTensor(a.T)
		if err != nil {
			return nil, c.errf("%v", err)
		}
		if err := set(v); err != nil {
			return nil, err
		}
	}
	if a, err := c.attr("value_float", onnxpb.AttrFloat); err != nil {
		return nil, err
	} else if a != nil {
		if err := set(&cval{dt: onnxpb.Float, shape: graph.Shape{}, f: []float64{float64(a.F)}}); err != nil {
			return nil, err
		}
	}
	if a, err := c.attr("value_floats", onnxpb.AttrFloats); err != nil {
		return nil, err
	} else if a != nil {
		f := make([]float64, len(a.Floats))
		for i, v := range a.Floats {
			f[i] = float64(v)
		}
		if err := set(&cval{dt: onnxpb.Float, shape: graph.Shape{len(f)}, f: f}); err != nil {
			return nil, err
		}
	}
	if a, err := c.attr("value_int", onnxpb.AttrInt); err != nil {
		return nil, err
	} else if a != nil {
		if err := set(&cval{dt: onnxpb.Int64, shape: graph.Shape{}, i: []int64{a.I}}); err != nil {
			return nil, err
		}
	}
	if a, err := c.attr("value_ints", onnxpb.AttrInts); err != nil {
		return nil, err
	} else if a != nil {
		if err := set(&cval{dt: onnxpb.Int64, shape: graph.Shape{len(a.Ints)}, i: slices.Clone(a.Ints)}); err != nil {
			return nil, err
		}
	}
	if out == nil {
		return nil, c.errf("no supported value attribute (value, value_float(s), value_int(s)); string and sparse constants are not supported")
	}
	return []*cval{out}, nil
}

func foldShape(c *opCtx) ([]*cval, error) {
	e := c.input(0)
	if e == nil {
		return nil, c.errf("needs an input")
	}
	_, shape := e.typ()
	r := int64(len(shape))
	start, err := c.attrInt("start", 0)
	if err != nil {
		return nil, err
	}
	end, err := c.attrInt("end", r)
	if err != nil {
		return nil, err
	}
	// Opset 15: negative bounds count from the back; both clamp to [0, rank].
	norm := func(v int64) int64 {
		if v < 0 {
			v += r
		}
		return min(max(v, 0), r)
	}
	start, end = norm(start), norm(end)
	out := &cval{dt: onnxpb.Int64, shape: graph.Shape{int(max(end-start, 0))}}
	for a := start; a < end; a++ {
		out.i = append(out.i, int64(shape[a]))
	}
	if out.i == nil {
		out.i = []int64{}
	}
	return []*cval{out}, nil
}

func foldSize(c *opCtx) ([]*cval, error) {
	e := c.input(0)
	if e == nil {
		return nil, c.errf("needs an input")
	}
	_, shape := e.typ()
	return []*cval{{dt: onnxpb.Int64, shape: graph.Shape{}, i: []int64{int64(shape.Numel())}}}, nil
}

// shapeFrom reads a 1-D int64 shape operand.
func shapeFrom(c *opCtx, v *cval, what string) (graph.Shape, error) {
	ints, err := v.ints()
	if err != nil || v.shape.Rank() != 1 {
		return nil, c.errf("%s must be a 1-D integer tensor, got %v", what, v)
	}
	s := make(graph.Shape, len(ints))
	n := int64(1)
	for i, d := range ints {
		if d < 0 || d > math.MaxInt32 {
			return nil, c.errf("%s %v has a bad dimension", what, ints)
		}
		s[i] = int(d)
		if d > 0 && n > int64(c.foldCap())/d {
			return nil, tooBigDims(ints)
		}
		n *= d
	}
	return s, nil
}

var errTooBig = errors.New("result too large to fold")

// errNotFolded is a folder's answer for a node of the op table it leaves
// to run time although its inputs are known (a Cast to strings).
var errNotFolded = errors.New("computed at run time")

// tooBig is errTooBig saying what the fold would have made.
func tooBig(what string) error { return fmt.Errorf("%w: %s", errTooBig, what) }

// tooBigShape is tooBig for a result of shape s.
func tooBigShape(s graph.Shape) error {
	return tooBigDims(dims64(s))
}

// tooBigDims is tooBig for a result of dimensions dims.
func tooBigDims(dims []int64) error {
	n := 1.0
	for _, d := range dims {
		n *= float64(d)
	}
	return tooBig(fmt.Sprintf("a %v result of %.6g elements", dims, n))
}

func foldConstantOfShape(c *opCtx, in []*cval) ([]*cval, error) {
	shape, err := shapeFrom(c, in[0], "shape")
	if err != nil {
		return nil, err
	}
	fill := &cval{dt: onnxpb.Float, shape: graph.Shape{1}, f: []float64{0}}
	if a, err := c.attr("value", onnxpb.AttrTensor); err != nil {
		return nil, err
	} else if a != nil {
		if fill, err = cvalFromTensor(a.T); err != nil {
			return nil, c.errf("value: %v", err)
		}
		if fill.n() != 1 {
			return nil, c.errf("value must hold one element, got %v", fill)
		}
	}
	out := newCval(fill.dt, shape)
	for k := range out.n() {
		out.set(k, fill.at(0))
	}
	return []*cval{out}, nil
}

func foldRange(c *opCtx, in []*cval) ([]*cval, error) {
	for i, v := range in[:3] {
		if v == nil || v.n() != 1 || v.dt != in[0].dt {
			return nil, c.errf("start, limit and delta must be scalars of one type (input %d)", i)
		}
	}
	start, limit, delta := in[0].at(0), in[1].at(0), in[2].at(0)
	if delta == 0 {
		return nil, c.errf("delta is 0")
	}
	n := math.Ceil((limit - start) / delta)
	if n > float64(c.foldCap()) {
		return nil, tooBig(fmt.Sprintf("a range of %.6g elements", n))
	}
	count := int(max(n, 0))
	out := newCval(in[0].dt, graph.Shape{count})
	for k := range count {
		if out.f != nil {
			// ONNX defines element k as start + k·delta in the element type.
			out.f[k] = roundTo(out.dt, in[0].f[0]+float64(k)*in[2].f[0])
		} else {
			out.i[k] = wrapInt(out.dt, in[0].i[0]+int64(k)*in[2].i[0])
		}
	}
	return []*cval{out}, nil
}

func foldCast(c *opCtx, in []*cval) ([]*cval, error) {
	to, err := c.attrInt("to", 0)
	if err != nil {
		return nil, err
	}
	if _, err := c.attrInt("saturate", 1); err != nil { // only affects float8 targets
		return nil, err
	}
	dt := onnxpb.DataType(to)
	if dt == onnxpb.String {
		// Text is not a cval: the Cast node computes it (the op table's
		// definition, graph/ops_string.go).
		return nil, errNotFolded
	}
	if !numericType(dt) {
		return nil, c.errf("cast to %v is not supported", dt)
	}
	x := in[0]
	out := newCval(dt, x.shape)
	for k := range out.n() {
		switch {
		case out.f != nil:
			out.f[k] = roundTo(dt, x.at(k))
		case x.f != nil:
			if dt == onnxpb.Bool {
				out.i[k] = wrapInt(dt, boolInt(x.f[k] != 0))
			} else {
				if dt == onnxpb.Uint64 && x.f[k] >= 1<<63 {
					// truncInt saturates at 2^63 − 1.
					return nil, c.errf("cast of %g to UINT64: at or above 2^63, beyond what int64 holds", x.f[k])
				}
				// Truncated; out of range, where ONNX leaves the result
				// undefined, saturated, and NaN refused, as a run-time Cast
				// into a narrow type does (castNarrow).
				if isNarrowInt(dt) && math.IsNaN(x.f[k]) {
					return nil, c.errf("cast of NaN to %v: no integer holds it", dt)
				}
				lo, hi, _ := intRange(dt)
				out.i[k] = min(max(truncInt(x.f[k]), lo), hi)
			}
		default:
			out.i[k] = wrapInt(dt, x.i[k])
		}
		if out.i != nil {
			if err := uint64Result(dt, out.i[k]); err != nil {
				return nil, c.errf("cast to UINT64: %v", err)
			}
		}
	}
	return []*cval{out}, nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// broadcastAll returns the broadcast shape of the inputs and each input's index map.
func broadcastAll(c *opCtx, in ...*cval) (graph.Shape, [][]int, error) {
	shapes := make([]graph.Shape, len(in))
	for i, v := range in {
		shapes[i] = v.shape
	}
	out, err := graph.Broadcast(shapes...)
	if err != nil {
		return nil, nil, c.errf("%v", err)
	}
	if c.foldTooBig(out) {
		return nil, nil, tooBigShape(out)
	}
	idx := make([][]int, len(in))
	for i, v := range in {
		idx[i] = broadcastIndex(v.shape, out)
	}
	return out, idx, nil
}

func sameType(c *opCtx, in ...*cval) error {
	for _, v := range in[1:] {
		if v.dt != in[0].dt {
			return c.errf("input types differ: %v and %v", in[0].dt, v.dt)
		}
	}
	return nil
}

func foldPow(c *opCtx, in []*cval) ([]*cval, error) {
	a, b := in[0], in[1]
	if a.dt == onnxpb.Bool || b.dt == onnxpb.Bool {
		return nil, c.errf("Pow on bool")
	}
	shape, idx, err := broadcastAll(c, a, b)
	if err != nil {
		return nil, err
	}
	out := newCval(a.dt, shape)
	pow, x := tableMap("Pow"), make([]float64, 2)
	for k := range out.n() {
		x[0], x[1] = a.at(idx[0][k]), b.at(idx[1][k])
		out.set(k, pow.Float(x))
	}
	return []*cval{out}, nil
}

func foldCompare(ff func(a, b float64) bool, fi func(a, b int64) bool) folder {
	return func(c *opCtx, in []*cval) ([]*cval, error) {
		a, b := in[0], in[1]
		if err := sameType(c, a, b); err != nil {
			return nil, err
		}
		shape, idx, err := broadcastAll(c, a, b)
		if err != nil {
			return nil, err
		}
		out := newCval(onnxpb.Bool, shape)
		for k := range out.n() {
			var r bool
			if a.f != nil {
				r = ff(a.f[idx[0][k]], b.f[idx[1][k]])
			} else {
				r = fi(a.i[idx[0][k]], b.i[idx[1][k]])
			}
			out.i[k] = boolInt(r)
		}
		return []*cval{out}, nil
	}
}

func foldUnary(f func(float64) float64, ints bool) folder {
	return func(c *opCtx, in []*cval) ([]*cval, error) {
		x := in[0]
		if !x.isFloat() && !(ints && isIntType(x.dt)) {
			return nil, c.errf("not defined for %v", x.dt)
		}
		out := newCval(x.dt, x.shape)
		for k := range out.n() {
			if out.f != nil {
				out.f[k] = roundTo(x.dt, f(x.f[k]))
			} else {
				out.i[k] = wrapInt(x.dt, truncInt(f(float64(x.i[k]))))
			}
		}
		return []*cval{out}, nil
	}
}

func foldNot(c *opCtx, in []*cval) ([]*cval, error) {
	if in[0].dt != onnxpb.Bool {
		return nil, c.errf("Not needs bool, got %v", in[0].dt)
	}
	out := newCval(onnxpb.Bool, in[0].shape)
	for k, v := range in[0].i {
		out.i[k] = 1 - v
	}
	return []*cval{out}, nil
}

func foldGather(c *opCtx, in []*cval) ([]*cval, error) {
	data, indices := in[0], in[1]
	axis, err := c.attrInt("axis", 0)
	if err != nil {
		return nil, err
	}
	r := data.shape.Rank()
	ax, err := graph.NormAxis(int(axis), r)
	if err != nil {
		return nil, c.errf("%v", err)
	}
	if _, err := indices.ints(); err != nil {
		return nil, c.errf("indices: %v", err)
	}
	shape := append(append(data.shape[:ax].Clone(), indices.shape...), data.shape[ax+1:]...)
	if c.foldTooBig(shape) {
		return nil, tooBigShape(shape)
	}
	return evalTable(c, "Gather", graph.Attrs{"axis": graph.Int(int64(ax))}, data.dt, data.tensor(), indices.tensor())
}

// axesOperand returns axes passed as an attribute (opsets before since) or as
// input i; ok is false when absent.
func (c *opCtx) axesOperand(i int, since int64) (axes []int, ok bool, err error) {
	var vals []int64
	if c.ver < since {
		if vals, ok, err = c.attrInts("axes"); !ok || err != nil {
			return nil, false, err
		}
	} else {
		v, err := c.constInput(i, "axes")
		if v == nil || err != nil {
			return nil, false, err
		}
		if vals, err = v.ints(); err != nil {
			return nil, false, c.errf("axes: %v", err)
		}
	}
	axes = make([]int, len(vals))
	for k, a := range vals {
		axes[k] = int(a)
	}
	return axes, true, nil
}

func unsqueezeShape(c *opCtx, in graph.Shape, axes []int) (graph.Shape, error) {
	r := in.Rank() + len(axes)
	ins := make([]bool, r)
	for _, ax := range axes {
		a, err := graph.NormAxis(ax, r)
		if err != nil || ins[a] {
			return nil, c.errf("bad axes %v for output rank %d", axes, r)
		}
		ins[a] = true
	}
	out := make(graph.Shape, 0, r)
	j := 0
	for i := range r {
		if ins[i] {
			out = append(out, 1)
		} else {
			out = append(out, in[j])
			j++
		}
	}
	return out, nil
}

func foldUnsqueeze(c *opCtx, in []*cval) ([]*cval, error) {
	axes, ok, err := c.axesOperand(1, 13)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, c.errf("axes are required")
	}
	s, err := unsqueezeShape(c, in[0].shape, axes)
	if err != nil {
		return nil, err
	}
	return []*cval{in[0].reshaped(s)}, nil
}

func foldSqueeze(c *opCtx, in []*cval) ([]*cval, error) {
	axes, ok, err := c.axesOperand(1, 13)
	if err != nil {
		return nil, err
	}
	s := in[0].shape
	drop := make([]bool, s.Rank())
	for i, d := range s {
		drop[i] = !ok && d == 1
	}
	for _, ax := range axes {
		a, err := graph.NormAxis(ax, s.Rank())
		if err != nil || s[a] != 1 {
			return nil, c.errf("cannot squeeze axis %d of %v", ax, s)
		}
		drop[a] = true
	}
	out := graph.Shape{}
	for i, d := range s {
		if !drop[i] {
			out = append(out, d)
		}
	}
	return []*cval{in[0].reshaped(out)}, nil
}

func foldConcat(c *opCtx, in []*cval) ([]*cval, error) {
	axis, err := c.attrInt("axis", 0)
	if err != nil {
		return nil, err
	}
	if !c.has("axis") {
		return nil, c.errf("axis is required")
	}
	if len(in) == 0 || slices.Contains(in, nil) {
		return nil, c.errf("needs inputs")
	}
	if err := sameType(c, in...); err != nil {
		return nil, err
	}
	r := in[0].shape.Rank()
	ax, err := graph.NormAxis(int(axis), r)
	if err != nil {
		return nil, c.errf("%v", err)
	}
	shape := in[0].shape.Clone()
	shape[ax] = 0
	for _, v := range in {
		if v.shape.Rank() != r {
			return nil, c.errf("inputs differ in rank")
		}
		for a := range r {
			if a != ax && v.shape[a] != in[0].shape[a] {
				return nil, c.errf("inputs differ off the concat axis: %v and %v", in[0].shape, v.shape)
			}
		}
		shape[ax] += v.shape[ax]
	}
	if c.foldTooBig(shape) {
		return nil, tooBigShape(shape)
	}
	ts := make([]*graph.Tensor, len(in))
	for i, v := range in {
		ts[i] = v.tensor()
	}
	return evalTable(c, "Concat", graph.Attrs{"axis": graph.Int(int64(ax))}, in[0].dt, ts...)
}

// sliceOperands reads Slice's starts, ends, axes and steps (attributes before
// opset 10, inputs after).
func (c *opCtx) sliceOperands() (starts, ends, axes, steps []int64, err error) {
	if c.ver < 10 {
		var ok bool
		if starts, ok, err = c.attrInts("starts"); err != nil || !ok {
			return nil, nil, nil, nil, c.errf("starts is required")
		}
		if ends, ok, err = c.attrInts("ends"); err != nil || !ok {
			return nil, nil, nil, nil, c.errf("ends is required")
		}
		if axes, _, err = c.attrInts("axes"); err != nil {
			return nil, nil, nil, nil, err
		}
		return starts, ends, axes, nil, nil
	}
	read := func(i int, what string) ([]int64, error) {
		v, err := c.constInput(i, what)
		if v == nil || err != nil {
			return nil, err
		}
		vals, err := v.ints()
		if err != nil {
			return nil, c.errf("%s: %v", what, err)
		}
		return vals, nil
	}
	if starts, err = read(1, "starts"); err == nil && starts == nil {
		err = c.errf("starts is required")
	}
	if err != nil {
		return
	}
	if ends, err = read(2, "ends"); err == nil && ends == nil {
		err = c.errf("ends is required")
	}
	if err != nil {
		return
	}
	if axes, err = read(3, "axes"); err != nil {
		return
	}
	steps, err = read(4, "steps")
	return
}

// clampSlice rewrites Slice bounds into [-dim-1, dim], which keeps their meaning
// (the clamping rules of Slice map every value beyond to the same element) but
// makes INT64_MAX-style "to the end" markers small enough to hold exactly.
func clampSlice(shape graph.Shape, starts, ends, axes []int64) (s, e, ax []int64, err error) {
	s, e = slices.Clone(starts), slices.Clone(ends)
	if axes == nil {
		for i := range starts {
			axes = append(axes, int64(i))
		}
	}
	if len(axes) != len(starts) || len(ends) != len(starts) {
		return nil, nil, nil, fmt.Errorf("starts %v, ends %v and axes %v differ in length", starts, ends, axes)
	}
	for i, a := range axes {
		n, err := graph.NormAxis(int(a), shape.Rank())
		if err != nil {
			return nil, nil, nil, err
		}
		dim := int64(shape[n])
		s[i] = min(max(s[i], -dim-1), dim)
		e[i] = min(max(e[i], -dim-1), dim)
	}
	return s, e, axes, nil
}

func toInts(v []int64) []int {
	if v == nil {
		return nil
	}
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

func foldSlice(c *opCtx, in []*cval) ([]*cval, error) {
	starts, ends, axes, steps, err := c.sliceOperands()
	if err != nil {
		return nil, err
	}
	x := in[0]
	starts, ends, axes, err = clampSlice(x.shape, starts, ends, axes)
	if err != nil {
		return nil, c.errf("%v", err)
	}
	if _, _, err := graph.ResolveSlice(x.shape, toInts(starts), toInts(ends), toInts(axes), toInts(steps)); err != nil {
		return nil, c.errf("%v", err)
	}
	operands := []*graph.Tensor{x.tensor(), intsTensor(starts), intsTensor(ends), intsTensor(axes), nil}
	if steps != nil {
		operands[4] = intsTensor(steps)
	}
	return evalTable(c, "Slice", nil, x.dt, operands...)
}

func foldReshape(c *opCtx, in []*cval) ([]*cval, error) {
	target, err := in[1].ints()
	if err != nil {
		return nil, c.errf("shape: %v", err)
	}
	allowzero, err := c.attrInt("allowzero", 0)
	if err != nil {
		return nil, err
	}
	if allowzero != 0 && slices.Contains(target, 0) {
		return nil, c.errf("allowzero=1 with a 0 in the shape is not supported")
	}
	s, err := graph.ReshapeShape(in[0].shape, toInts(target))
	if err != nil {
		return nil, c.errf("%v", err)
	}
	return []*cval{in[0].reshaped(s)}, nil
}

func foldExpand(c *opCtx, in []*cval) ([]*cval, error) {
	target, err := in[1].ints()
	if err != nil {
		return nil, c.errf("shape: %v", err)
	}
	for _, d := range target {
		if d < 0 || d > math.MaxInt32 {
			return nil, c.errf("bad shape %v", target)
		}
	}
	s, err := graph.Broadcast(in[0].shape, graph.Shape(toInts(target)))
	if err != nil {
		return nil, c.errf("%v", err)
	}
	if c.foldTooBig(s) {
		return nil, tooBigShape(s)
	}
	return evalTable(c, "Expand", nil, in[0].dt, in[0].tensor(), intsTensor(target))
}

func foldTranspose(c *opCtx, in []*cval) ([]*cval, error) {
	x := in[0]
	attrs := graph.Attrs{}
	if perm, ok, err := c.attrInts("perm"); err != nil {
		return nil, err
	} else if ok {
		attrs["perm"] = graph.Ints(perm...)
	}
	return evalTable(c, "Transpose", attrs, x.dt, x.tensor())
}

func foldTrilu(c *opCtx, in []*cval) ([]*cval, error) {
	x := in[0]
	upper, err := c.attrInt("upper", 1)
	if err != nil {
		return nil, err
	}
	k := int64(0)
	if len(in) > 1 && in[1] != nil {
		ks, err := in[1].ints()
		if err != nil || len(ks) != 1 {
			return nil, c.errf("k must be one integer")
		}
		k = ks[0]
	}
	r := x.shape.Rank()
	if r < 2 {
		return nil, c.errf("input must have rank >= 2, got %v", x.shape)
	}
	return evalTable(c, "Trilu", graph.Attrs{"upper": graph.Int(upper)}, x.dt, x.tensor(), intsTensor([]int64{k}))
}
