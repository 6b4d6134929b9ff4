package onnx

import (
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// The linear quantization ops, written in table ops exactly as ONNX
// defines them: DequantizeLinear is (x − zero_point)·scale; QuantizeLinear
// saturate(round(x / scale) + zero_point), rounding halves to even, into
// the zero point's 8-bit type (held as int64, its type recorded);
// DynamicQuantizeLinear picks the uint8 scale and zero point from x's range
// first. The integer matrix products (MatMulInteger, QLinearMatMul) take
// (a − a_zero_point)·(b − b_zero_point) in float64, where sums of 8-bit
// products are exact, then requantize.

func init() {
	for op, h := range map[string]handler{
		"DequantizeLinear": importDequantize, "QuantizeLinear": importQuantize,
		"DynamicQuantizeLinear": importDynamicQuantize,
		"MatMulInteger":         importMatMulInteger, "QLinearMatMul": importQLinearMatMul,
	} {
		handlers[op] = h
		notDataTyped[op] = true // outputs of their own types (set below)
	}
	introduced["DequantizeLinear"], introduced["QuantizeLinear"] = 10, 10
	introduced["DynamicQuantizeLinear"], introduced["MatMulInteger"], introduced["QLinearMatMul"] = 11, 10, 10
	introduced["ConvInteger"], introduced["QLinearConv"] = 10, 10
	notDataTyped["ConvInteger"], notDataTyped["QLinearConv"] = true, true
}

// requantizeConv finishes ConvInteger (the exact float64 convolution y of
// the centred inputs, as INT32) and QLinearConv (y plus the int32 bias B,
// requantized with x_scale·w_scale / y_scale, one w_scale per output
// channel allowed).
func (c *opCtx) requantizeConv(y *graph.Value) error {
	if c.n.OpType == "ConvInteger" {
		if err := c.emitOutput(0, "Cast", graph.Attrs{"to": graph.Str(graph.Int64.String())}, y); err != nil {
			return err
		}
		c.out[0].odt = onnxpb.Int32
		return nil
	}
	ys := y.Type.Shape
	r := c.rewrite()
	if b := r.value(8); b != nil {
		b = r.perAxis(b, ys, 1)
		y = r.sub("Add", nil, y, r.sub("Cast", graph.Attrs{"to": graph.Str(graph.Float64.String())}, b))
	}
	xs, ws := r.need(1), r.need(4)
	ws = r.perAxis(ws, ys, 1)
	if r.err != nil {
		return r.err
	}
	y = r.sub("Cast", graph.Attrs{"to": graph.Str(xs.Type.DType.String())}, y)
	y = r.sub("Mul", nil, r.sub("Mul", nil, y, xs), ws)
	yScale, zp := r.need(6), r.need(7)
	if r.err != nil {
		return r.err
	}
	dt, _ := c.in[7].typ()
	return c.quantized(0, y, yScale, zp, dt)
}

// perAxis makes a scale or zero point broadcast against a rank-r tensor: a
// scalar (or one value) as it is, a 1-D one of size x's dim along axis as
// [C, 1, ...].
func (c *opCtx) perAxis(v *graph.Value, xs graph.Shape, axis int64) (*graph.Value, error) {
	s := v.Type.Shape
	if s.Numel() == 1 && s.Rank() <= 1 {
		return v, nil
	}
	a, err := graph.NormAxis(int(axis), xs.Rank())
	if err != nil {
		return nil, c.errf("axis: %v", err)
	}
	if s.Rank() != 1 || s[0] != xs[a] {
		return nil, c.errf("scale or zero point %v: want one value or one per entry of axis %d of %v", s, a, xs)
	}
	dims := []int64{int64(s[0])}
	for range xs.Rank() - 1 - a {
		dims = append(dims, 1)
	}
	sv, err := c.ints("per_axis", dims)
	if err != nil {
		return nil, err
	}
	return c.sub("Reshape", nil, v, sv)
}

func (r *rewrite) perAxis(v *graph.Value, xs graph.Shape, axis int64) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.perAxis(v, xs, axis) })
}

// centred is the integer input i minus its zero point (input zi, absent:
// none), as a float64 value: exact for 8- and 32-bit integers.
func (c *opCtx) centred(i, zi int, xs graph.Shape, axis int64, dt graph.DType) (*graph.Value, error) {
	x, err := c.need(i)
	if err != nil {
		return nil, err
	}
	if xt, _ := c.in[i].typ(); !isIntType(xt) {
		return nil, c.errf("input %d is %v: want an integer type", i, xt)
	}
	if z, err := c.value(zi); err != nil {
		return nil, err
	} else if z != nil {
		if z, err = c.perAxis(z, xs, axis); err != nil {
			return nil, err
		}
		if z.Type.DType != graph.Int64 {
			return nil, c.errf("zero point %v: want an integer type", z.Type)
		}
		if x, err = c.sub("Sub", nil, x, z); err != nil {
			return nil, err
		}
	}
	return c.sub("Cast", graph.Attrs{"to": graph.Str(dt.String())}, x)
}

func importDequantize(c *opCtx) error {
	r := c.rewrite()
	axis := r.attrInt("axis", 1)
	r.need(0)
	scale := r.need(1)
	if r.err != nil {
		return r.err
	}
	_, xs := c.in[0].typ()
	if !scale.Type.DType.IsFloat() {
		return c.errf("x_scale %v: want a float", scale.Type)
	}
	dt := scale.Type.DType
	scale = r.perAxis(scale, xs, axis)
	r.emit("Mul", nil, r.centred(0, 2, xs, axis, dt), scale)
	return r.err
}

// quantized writes output i: saturate(round(v / scale) + zero point) in
// type dt, with zero point zp (nil: 0) already broadcastable, as float.
func (c *opCtx) quantized(i int, v, scale, zp *graph.Value, dt onnxpb.DataType) error {
	lo, hi, ok := intRange(dt)
	if !ok || !isNarrowInt(dt) {
		return c.errf("quantizing to %v is not supported", dt)
	}
	fdt := v.Type.DType
	r := c.rewrite()
	q := r.sub("Round", nil, r.sub("Div", nil, v, scale))
	if zp != nil {
		q = r.sub("Add", nil, q, r.sub("Cast", graph.Attrs{"to": graph.Str(fdt.String())}, zp))
	}
	lov, hiv := r.scalar("qmin", fdt, float64(lo)), r.scalar("qmax", fdt, float64(hi))
	q = r.sub("Min", nil, r.sub("Max", nil, q, lov), hiv)
	if r.emitOutput(i, "Cast", graph.Attrs{"to": graph.Str(graph.Int64.String())}, q); r.err != nil {
		return r.err
	}
	c.out[i].odt = dt
	return nil
}

func importQuantize(c *opCtx) error {
	r := c.rewrite()
	axis := r.attrInt("axis", 1)
	if s := r.attrInt("saturate", 1); r.err == nil && s != 1 {
		return c.errf("saturate=0 (float8 targets) is not supported")
	}
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	if !x.Type.DType.IsFloat() {
		return c.errf("x %v: want a float", x.Type)
	}
	scale := r.perAxis(r.need(1), x.Type.Shape, axis)
	dt := onnxpb.Uint8
	zp := r.value(2)
	if zp != nil {
		dt, _ = c.in[2].typ()
		zp = r.perAxis(zp, x.Type.Shape, axis)
	}
	if r.err != nil {
		return r.err
	}
	return c.quantized(0, x, scale, zp, dt)
}

// importDynamicQuantizeLinear: scale = (max(0, max x) − min(0, min x)) / 255,
// zero point = round(saturate(−min(0, min x) / scale)), then x quantized.
func importDynamicQuantize(c *opCtx) error {
	x, err := c.need(0)
	if err != nil {
		return err
	}
	dt := x.Type.DType
	if !dt.IsFloat() {
		return c.errf("x %v: want a float", x.Type)
	}
	r := c.rewrite()
	zero := r.scalar("zero", dt, 0)
	all := graph.Attrs{"keepdims": graph.Int(0)}
	hi := r.sub("Max", nil, r.sub("ReduceMax", all, x), zero)
	negLo := r.sub("ReduceMax", all, r.sub("Neg", nil, x)) // −min x
	negLo = r.sub("Max", nil, negLo, zero)                 // −min(0, min x)
	span := r.sub("Add", nil, hi, negLo)
	steps := r.scalar("steps", dt, 255)
	scale := r.sub("Div", nil, span, steps)
	zf := r.sub("Min", nil, r.sub("Div", nil, negLo, scale), steps) // saturate to [0, 255]
	zp := r.sub("Cast", graph.Attrs{"to": graph.Str(graph.Int64.String())}, r.sub("Round", nil, zf))
	if r.err != nil {
		return r.err
	}
	if err := c.quantized(0, x, scale, zp, onnxpb.Uint8); err != nil {
		return err
	}
	r.optionalOutput(1, scale)
	if r.optionalOutput(2, zp) {
		c.out[2].odt = onnxpb.Uint8
	}
	return r.err
}

// intProduct is (a − a_zero_point)·(b − b_zero_point) in float64 (exact):
// inputs ai, bi and zero points azi, bzi (a per-row a zero point is [M]).
func (c *opCtx) intProduct(ai, azi, bi, bzi int) (*graph.Value, error) {
	for _, i := range []int{ai, bi} {
		if _, err := c.need(i); err != nil {
			return nil, err
		}
	}
	_, as := c.in[ai].typ()
	_, bs := c.in[bi].typ()
	if as.Rank() < 1 || bs.Rank() < 1 {
		return nil, c.errf("A %v and B %v: want matrices", as, bs)
	}
	r := c.rewrite()
	a := r.centred(ai, azi, as, int64(as.Rank()-2), graph.Float64)
	b := r.centred(bi, bzi, bs, int64(bs.Rank()-1), graph.Float64)
	return r.sub("MatMul", nil, a, b), r.err
}

// importMatMulInteger is the exact integer product, as INT32.
func importMatMulInteger(c *opCtx) error {
	p, err := c.intProduct(0, 2, 1, 3)
	if err != nil {
		return err
	}
	if err := c.emitOutput(0, "Cast", graph.Attrs{"to": graph.Str(graph.Int64.String())}, p); err != nil {
		return err
	}
	c.out[0].odt = onnxpb.Int32
	return nil
}

// importQLinearMatMul requantizes the integer product with a_scale·b_scale /
// y_scale (scalars).
func importQLinearMatMul(c *opCtx) error {
	var scales [3]*graph.Value
	for k, i := range []int{1, 4, 6} {
		s, err := c.need(i)
		if err != nil {
			return err
		}
		if s.Type.Shape.Numel() != 1 || !s.Type.DType.IsFloat() {
			return c.errf("scale %v: only a single float scale is supported", s.Type)
		}
		scales[k] = s
	}
	p, err := c.intProduct(0, 2, 3, 5)
	if err != nil {
		return err
	}
	fdt := scales[0].Type.DType
	r := c.rewrite()
	p = r.sub("Cast", graph.Attrs{"to": graph.Str(fdt.String())}, p)
	m := r.sub("Mul", nil, p, r.sub("Mul", nil, scales[0], scales[1]))
	zp := r.need(7)
	if r.err != nil {
		return r.err
	}
	dt, _ := c.in[7].typ()
	return c.quantized(0, m, scales[2], zp, dt)
}

func (r *rewrite) centred(i, zi int, xs graph.Shape, axis int64, dt graph.DType) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.centred(i, zi, xs, axis, dt) })
}
