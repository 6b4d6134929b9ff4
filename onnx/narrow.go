package onnx

import (
	"slices"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Ops on narrow integers (INT8 to INT32, UINT8 to UINT32, and UINT64 below
// 2^63), which the graph holds as Int64 (cval.go). Constant operands fold at their own width
// (fold.go wraps every result). At run time an op computes in int64, which
// is what it computes at the narrow width exactly when no result leaves
// the narrow range: ops that only move, select or compare values are
// exact; the ring operations (Add, Sub, Mul, Pow) are computed in
// int64 and reduced to the width (narrowWrapped); other arithmetic that may
// wrap (Sum, MatMul, the reductions that add, ...) is refused with the op
// and the type. A Cast into a narrow type follows ONNX's rules (castNarrow):
// a wider integer keeps its low bits, a float is truncated and, out of
// range, where the spec leaves the result undefined, saturated.

// narrowExact are the ops whose result on narrow integers is one of their
// operands' values (moved, selected, padded with an operand of the same
// type) or, for Mod, a remainder smaller in magnitude than the divisor, and
// for Sign, -1, 0 or 1: never outside the type's range.
var narrowExact = map[string]bool{
	"Identity": true, "Reshape": true, "Flatten": true, "Squeeze": true, "Unsqueeze": true,
	"Transpose": true, "Concat": true, "Slice": true, "Split": true, "Gather": true,
	"GatherElements": true, "GatherND": true, "Expand": true, "Tile": true, "Pad": true,
	"Where": true, "Max": true, "Min": true, "Clip": true, "ReduceMax": true, "ReduceMin": true,
	"MaxPool": true, "GlobalMaxPool": true, "TopK": true, "Relu": true, "Sign": true,
	"Trilu": true, "DepthToSpace": true, "SpaceToDepth": true, "Compress": true,
	"Dropout": true, "OneHot": true, "Mod": true, "ScatterElements": true, "Scatter": true,
}

// narrowWrapped are the ring operations: on narrow integers their int64
// result, reduced to the type's width, is the narrow result exactly (int64
// arithmetic wraps modulo 2^64, which 2^width divides), so they are
// imported as the int64 op followed by that reduction (importWrapped).
var narrowWrapped = map[string]bool{"Add": true, "Sub": true, "Mul": true, "Pow": true}

// narrowUnsigned are exact on unsigned types only: a quotient or absolute
// value of non-negative operands stays in range; a signed one overflows
// (the type's minimum divided by -1, or negated). BitShift, defined on
// unsigned types alone, reduces a left shift to the width (importBitShift).
var narrowUnsigned = map[string]bool{"Div": true, "Abs": true, "BitShift": true}

// notDataTyped are the ops whose outputs do not take their data's element
// type (a comparison's bool, an index, Cast's target): a narrow operand is
// read as the same numbers in int64.
var notDataTyped = map[string]bool{
	"Equal": true, "Less": true, "Greater": true, "LessOrEqual": true, "GreaterOrEqual": true,
	"ArgMax": true, "ArgMin": true, "Shape": true, "Size": true, "NonZero": true,
	"Cast": true, "CastLike": true, "IsNaN": true, "IsInf": true, "TfIdfVectorizer": true,
}

func isUnsigned(dt onnxpb.DataType) bool {
	return dt == onnxpb.Uint8 || dt == onnxpb.Uint16 || dt == onnxpb.Uint32 || dt == onnxpb.Uint64
}

// narrowData is the narrow integer type of the node's data (the operand
// whose element type its outputs take), Undefined when it is of another type.
func (c *opCtx) narrowData() onnxpb.DataType {
	if notDataTyped[c.n.OpType] {
		return onnxpb.Undefined
	}
	i := 0
	switch c.n.OpType {
	case "Where":
		i = 1
	case "OneHot":
		i = 2
	}
	e := c.input(i)
	if e == nil {
		return onnxpb.Undefined
	}
	if dt, _ := e.typ(); isNarrowInt(dt) {
		return dt
	}
	return onnxpb.Undefined
}

// narrowCheck refuses a runtime op on narrow integers whose int64 result
// could differ from the narrow one, and returns the data's narrow type.
func (c *opCtx) narrowCheck() (onnxpb.DataType, error) {
	dt := c.narrowData()
	if dt == onnxpb.Undefined {
		return dt, nil
	}
	op := c.n.OpType
	switch {
	case narrowWrapped[op]:
	case narrowUnsigned[op] && isUnsigned(dt):
	case !narrowExact[op] && !narrowUnsigned[op]:
		return dt, c.errf("integer semantics differ: %s on %v (int64 arithmetic does not wrap at %v's width)", op, dt, dt)
	case !narrowExact[op]:
		return dt, c.errf("integer semantics differ: %s on %v (the type's minimum overflows)", op, dt)
	case op == "ScatterElements" || op == "Scatter":
		if r, _ := c.attrs["reduction"]; r != nil && string(r.S) != "none" && string(r.S) != "max" && string(r.S) != "min" {
			return dt, c.errf("integer semantics differ: %s with reduction %s on %v", op, r.S, dt)
		}
	case op == "Pad" && c.ver < 11:
		// Its value attribute is a float, which a narrow type may not hold.
		return dt, c.errf("integer semantics differ: Pad on %v (before opset 11 its value is a float attribute)", dt)
	case op == "ReduceMax" || op == "ReduceMin":
		// An empty reduction gives the type's lowest (highest) value.
		if e := c.input(0); e.v != nil && e.v.Type.Shape.Numel() == 0 {
			return dt, c.errf("integer semantics differ: %s of no elements on %v", op, dt)
		}
	}
	return dt, nil
}

// markNarrow gives the node's new Int64 outputs the data's narrow type
// (TopK's and MaxPool's indices stay INT64).
func (c *opCtx) markNarrow(dt onnxpb.DataType) {
	for i, e := range c.out {
		if e == nil || e.c != nil || e.v == nil || e.odt != onnxpb.Undefined || e.v.Type.DType != graph.Int64 {
			continue
		}
		if (c.n.OpType == "TopK" || c.n.OpType == "MaxPool") && i == 1 {
			continue
		}
		e.odt = dt
	}
}

// castNarrow imports a cast of runtime x (of ONNX type from) to a narrow
// integer type as ONNX's Cast defines it: exact when every value of from is
// one of to (a bool, a narrower integer); from a wider integer, the value
// with its higher bits discarded (the spec's "discard higher bits and
// reinterpret", the reduction wrapTo makes); from a float, truncated toward
// zero, and a value outside to's range, whose result the spec leaves
// undefined, saturated at the range's bounds (saturateTo; NaN is an error
// at run time). UINT64 is held below 2^63 only: a cast into it from a type
// with values that would land outside that is refused.
func (c *opCtx) castNarrow(x *graph.Value, from, to onnxpb.DataType) error {
	lo, hi, _ := intRange(to)
	flo, fhi, isInt := intRange(from)
	exact := isInt && flo >= lo && fhi <= hi
	switch {
	case exact:
	case to == onnxpb.Uint64:
		return c.errf("integer semantics differ: Cast on %v to %v (values below 0 or at or above 2^63 have no int64 value)", from, to)
	case !isInt && !isFloatType(from):
		return c.errf("integer semantics differ: Cast on %v to %v", from, to)
	}
	toInt64 := graph.Attrs{"to": graph.Str(graph.Int64.String())}
	c.outNames = c.n.Output[:1]
	var err error
	switch {
	case exact:
		_, err = c.emit("Cast", toInt64, x)
	case isInt:
		var v *graph.Value
		if v, err = c.sub("Cast", toInt64, x); err == nil {
			err = c.wrapTo(to, v)
		}
	default:
		err = c.saturateTo(to, x)
	}
	if err != nil {
		return err
	}
	if c.out[0] != nil {
		c.out[0].odt = to
	}
	return nil
}

// saturateTo emits float x cast to dt: clamped to dt's range, truncated
// toward zero into int64, and clamped again in int64 (dt's highest value
// may round up in x's type: 2^31 − 1 is 2^31 in float32). NaN stays NaN
// through the clamps, and the Cast refuses it at run time: no integer
// holds it.
func (c *opCtx) saturateTo(dt onnxpb.DataType, x *graph.Value) error {
	lo, hi, _ := intRange(dt)
	bound := func(what string, t graph.DType, v int64) (*graph.Value, error) { return c.scalar(what, t, float64(v)) }
	flo, err := bound("lowest", x.Type.DType, lo)
	if err != nil {
		return err
	}
	fhi, err := bound("highest", x.Type.DType, hi)
	if err != nil {
		return err
	}
	ihi, err := bound("highest_int", graph.Int64, hi)
	if err != nil {
		return err
	}
	v, err := c.sub("Max", nil, x, flo)
	if err == nil {
		v, err = c.sub("Min", nil, v, fhi)
	}
	if err == nil {
		v, err = c.sub("Cast", graph.Attrs{"to": graph.Str(graph.Int64.String())}, v)
	}
	if err != nil {
		return err
	}
	_, err = c.emit("Min", nil, v, ihi)
	return err
}

// boundary imports a Cast our export wrote at a graph input or output
// declared with a narrow integer type (metaBoundary): the graph holds the
// value as Int64 on both sides, so the Cast goes and the declared type is
// recorded again. An output's values are checked against its type's range
// where it is read (graph.CheckNarrow), not assumed.
func (c *opCtx) boundary(kind string, to onnxpb.DataType) error {
	in, out := c.in[0], c.n.Output[0]
	isOutput := slices.ContainsFunc(c.im.m.Graph.Output, func(o *onnxpb.ValueInfo) bool { return o.Name == out })
	switch {
	case kind == "input" && to == onnxpb.Int64 && in.v != nil && in.v.Kind == graph.Input && in.odt != onnxpb.Undefined:
		// Inside, the export computes on INT64 (its value_info says so).
		c.out[0] = &entry{name: c.n.Output[0], v: in.v}
		return nil
	case kind == "output" && isNarrowInt(to) && isOutput:
		v, err := c.im.val(in)
		if err != nil {
			return c.errf("%v", err)
		}
		if v.Type.DType != graph.Int64 || v.Kind == graph.Input {
			break
		}
		v.Name = out // the value's name in the graph, which the export moved
		c.out[0] = &entry{name: out, v: v, odt: to}
		return nil
	}
	return c.errf("a %s boundary Cast to %v on %q is not one our export writes", kind, to, in.name)
}

// importWrapped imports a ring operation on narrow integers of type dt: the
// int64 op, then its result reduced to dt's range (wrapTo).
func importWrapped(c *opCtx) error {
	dt := c.narrowData()
	in, err := c.values()
	if err != nil {
		return err
	}
	if c.n.OpType == "Pow" && len(in) == 2 && in[0] != nil && in[1] != nil && in[1].Type.DType.IsFloat() {
		return c.powFloatExponent(dt, in[0], in[1])
	}
	for i, v := range in {
		if v == nil || v.Type.DType != graph.Int64 {
			return c.errf("integer semantics differ: %s on %v (input %d is not an integer of the same width)", c.n.OpType, dt, i)
		}
	}
	if dt == onnxpb.Uint64 {
		if err := c.uint64Wraps(); err != nil {
			return err
		}
		_, err := c.emit(c.n.OpType, nil, in...)
		return err
	}
	v, err := c.sub(c.n.OpType, nil, in...)
	if err != nil {
		return err
	}
	c.outNames = c.n.Output[:1]
	return c.wrapTo(dt, v)
}

// powFloatExponent imports Pow of a narrow integer base x to a float
// exponent e: x^e is a float, computed in float64 (as the import of an
// INT64 base does), and converted to dt as Cast converts a float
// (saturateTo: truncated; out of dt's range, where ONNX leaves the result
// undefined, saturated). For UINT64 a power at or above 2^63 would
// saturate where it has a value, so that is refused.
func (c *opCtx) powFloatExponent(dt onnxpb.DataType, x, e *graph.Value) error {
	if dt == onnxpb.Uint64 {
		return c.errf("integer semantics differ: Pow on %v (a float power may reach 2^63, beyond what int64 holds)", dt)
	}
	wide := graph.Attrs{"to": graph.Str(graph.Float64.String())}
	xf, err := c.sub("Cast", wide, x)
	if err != nil {
		return err
	}
	if e.Type.DType != graph.Float64 {
		if e, err = c.sub("Cast", wide, e); err != nil {
			return err
		}
	}
	p, err := c.sub("Pow", nil, xf, e)
	if err != nil {
		return err
	}
	c.outNames = c.n.Output[:1]
	return c.saturateTo(dt, p)
}

// wrapTo emits int64 v reduced to the narrow type dt's range, as a store of
// dt's width would keep its low bits: v mod 2^width for an unsigned type,
// ((v + 2^(width−1)) mod 2^width) − 2^(width−1) for a signed one (mod with
// the divisor's sign, never negative). Not for UINT64, whose 2^64 no int64
// holds.
func (c *opCtx) wrapTo(dt onnxpb.DataType, v *graph.Value) error {
	lo, hi, _ := intRange(dt)
	k := func(what string, x int64) (*graph.Value, error) { return c.scalar(what, graph.Int64, float64(x)) }
	mod, err := k("modulus", hi-lo+1)
	if err != nil {
		return err
	}
	if lo == 0 {
		_, err = c.emit("Mod", nil, v, mod)
		return err
	}
	half, err := k("half", -lo)
	if err != nil {
		return err
	}
	if v, err = c.sub("Add", nil, v, half); err != nil {
		return err
	}
	if v, err = c.sub("Mod", nil, v, mod); err != nil {
		return err
	}
	_, err = c.emit("Sub", nil, v, half)
	return err
}

// uint64Wraps refuses a UINT64 op whose result may wrap (a ring operation,
// a left shift) unless each of its results is only a graph output. int64
// arithmetic wraps modulo 2^64 as UINT64's does, so the int64 result is the
// UINT64 one's bits; but one at or above 2^63 reads as a negative int64,
// which an op taking it would compare, divide or shift as such. A graph
// output is checked against UINT64's held range where it is read
// (graph.CheckNarrow), so there such a result is an error, never a number.
func (c *opCtx) uint64Wraps() error {
	for _, out := range c.n.Output {
		if out == "" {
			continue
		}
		isOutput := slices.ContainsFunc(c.im.m.Graph.Output, func(o *onnxpb.ValueInfo) bool { return o.Name == out })
		if !isOutput || readsValue(c.im.m.Graph, out) {
			return c.errf("integer semantics differ: %s on UINT64 (a result at or above 2^63 has no int64 value, and %q is not only a graph output)", c.n.OpType, out)
		}
	}
	return nil
}

// readsValue reports whether a node of g, or of a graph in one of its
// nodes' attributes, takes the value named name as an input.
func readsValue(g *onnxpb.Graph, name string) bool {
	for _, n := range g.Node {
		if slices.Contains(n.Input, name) {
			return true
		}
		for _, a := range n.Attribute {
			if a.G != nil && readsValue(a.G, name) {
				return true
			}
			for _, sg := range a.Graphs {
				if readsValue(sg, name) {
					return true
				}
			}
		}
	}
	return false
}
