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
// and the type, as are casts into a narrow type from one whose values it
// may not hold (float to UINT8 saturates or wraps by rules of its own).

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
// integer type: exact when every value of from is one of to (a bool, a
// narrower integer), refused otherwise.
func (c *opCtx) castNarrow(x *graph.Value, from, to onnxpb.DataType) error {
	lo, hi, _ := intRange(to)
	if flo, fhi, ok := intRange(from); !ok || flo < lo || fhi > hi {
		return c.errf("integer semantics differ: Cast on %v to %v (values outside %v's range wrap or saturate)", from, to, to)
	}
	if _, err := c.emit("Cast", graph.Attrs{"to": graph.Str(graph.Int64.String())}, x); err != nil {
		return err
	}
	if c.out[0] != nil {
		c.out[0].odt = to
	}
	return nil
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
// int64 op, then its result reduced to dt's range, v mod 2^width for an
// unsigned type, ((v + 2^(width−1)) mod 2^width) − 2^(width−1) for a
// signed one (mod with the divisor's sign, never negative).
func importWrapped(c *opCtx) error {
	dt := c.narrowData()
	in, err := c.values()
	if err != nil {
		return err
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
	lo, hi, _ := intRange(dt)
	k := func(what string, x int64) (*graph.Value, error) { return c.scalar(what, graph.Int64, float64(x)) }
	mod, err := k("modulus", hi-lo+1)
	if err != nil {
		return err
	}
	c.outNames = c.n.Output[:1]
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
			return c.errf("integer semantics differ: %s on UINT64 (a result at or above 2^63 has no int64 value, and %q is read by another node)", c.n.OpType, out)
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
