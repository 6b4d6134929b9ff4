package onnx

import (
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// The tensor ops of graph/ops_tensor.go, imported as themselves: CumSum,
// GatherND, ScatterND, ReverseSequence, MaxUnpool, LRN and Det. Operands
// that fix a shape or an axis (CumSum's axis, MaxUnpool's output_shape) must
// be constants, as every shape operand must.

func init() {
	for op, h := range map[string]handler{
		"CumSum": importCumSum, "GatherND": importIndexed, "ScatterND": importIndexed,
		"ReverseSequence": importReverseSequence, "MaxUnpool": importMaxUnpool,
		"LRN": importTableAttrs, "Det": importTableAttrs, "BitShift": importBitShift,
		"GridSample": importGridSample, "RoiAlign": importRoiAlign, "TfIdfVectorizer": importTfIdf,
	} {
		handlers[op] = h
	}
	for op, v := range map[string]int64{"CumSum": 11, "GatherND": 11, "ScatterND": 11, "ReverseSequence": 10, "MaxUnpool": 9, "Det": 11, "BitShift": 11, "GridSample": 16, "RoiAlign": 10, "TfIdfVectorizer": 9} {
		introduced[op] = v
	}
}

// importTableAttrs maps an op whose ONNX inputs and scalar attributes are
// the table row's.
func importTableAttrs(c *opCtx) error {
	s, ok := graph.LookupOp(c.n.OpType)
	if !ok {
		return c.errf("op is not supported")
	}
	return directAttrs(s)(c)
}

// importCumSum needs the axis known (int32 or int64 in ONNX; ours is int64).
func importCumSum(c *opCtx) error {
	s, _ := graph.LookupOp("CumSum")
	r := c.rewrite()
	attrs := r.tableAttrs(s)
	x := r.need(0)
	axis := r.constInput(1, "axis")
	if r.err != nil {
		return r.err
	}
	if axis == nil || axis.n() != 1 {
		return c.errf("axis: want one value")
	}
	ax, err := axis.ints()
	if err != nil {
		return c.errf("axis: %v", err)
	}
	// The model's own int64 operand, or an int32 one as an int64 scalar.
	var av *graph.Value
	if axis.dt == onnxpb.Int64 {
		av = r.value(1)
	} else {
		av = r.scalar("axis", graph.Int64, float64(ax[0]))
	}
	r.emit("CumSum", attrs, x, av)
	return r.err
}

// importIndexed maps GatherND and ScatterND (constant int32 indices become
// int64). ScatterND's max and min reductions are from opset 18.
func importIndexed(c *opCtx) error {
	s, _ := graph.LookupOp(c.n.OpType)
	r := c.rewrite()
	attrs := r.tableAttrs(s)
	in := r.values()
	if r.err != nil {
		return r.err
	}
	if len(in) < 2 || in[0] == nil {
		return c.errf("needs data and indices")
	}
	in[1] = r.indices(1)
	r.emit(c.n.OpType, attrs, in...)
	return r.err
}

func importReverseSequence(c *opCtx) error {
	s, _ := graph.LookupOp("ReverseSequence")
	r := c.rewrite()
	attrs := r.tableAttrs(s)
	x, lens := r.need(0), r.indices(1)
	r.emit("ReverseSequence", attrs, x, lens)
	return r.err
}

// importMaxUnpool reads the window attributes; output_shape, when given,
// must be a constant.
func importMaxUnpool(c *opCtx) error {
	r := c.rewrite()
	attrs := graph.Attrs{}
	for _, name := range []string{"kernel_shape", "strides", "pads"} {
		if v, ok := r.attrInts(name); ok {
			attrs[name] = graph.Ints(v...)
		}
	}
	if r.err != nil {
		return r.err
	}
	if _, ok := attrs["kernel_shape"]; !ok {
		return c.errf("kernel_shape is required")
	}
	in := []*graph.Value{r.need(0), r.indices(1)}
	if c.input(2) != nil {
		shape := r.constInput(2, "output_shape")
		if r.err != nil {
			return r.err
		}
		vals, err := shape.ints()
		if err != nil {
			return c.errf("output_shape: %v", err)
		}
		in = append(in, r.ints("output_shape", vals))
	}
	r.emit("MaxUnpool", attrs, in...)
	return r.err
}

// importBitShift maps BitShift, which ONNX defines on unsigned types: UINT8
// to UINT64 held as int64. A right shift stays in the type's range; a left
// shift is reduced modulo 2^width, as a store of that width drops the bits
// shifted out (for UINT64 the int64 shift drops them; uint64Wraps says
// where its result may be used).
func importBitShift(c *opCtx) error {
	if !c.has("direction") {
		return c.errf("direction is required")
	}
	dir, err := c.attrString("direction", "")
	if err != nil {
		return err
	}
	if dir != "LEFT" && dir != "RIGHT" {
		return c.errf("direction %q is not LEFT or RIGHT", dir)
	}
	in, err := c.values()
	if err != nil {
		return err
	}
	if len(in) != 2 || in[0] == nil || in[1] == nil {
		return c.errf("needs X and Y")
	}
	dt, _ := c.in[0].typ()
	if dt == onnxpb.Int64 && c.im.faithful {
		// Our own export: the graph's BitShift on int64 (unsigned values).
		_, err = c.emit("BitShift", graph.Attrs{"direction": graph.Str(dir)}, in...)
		return err
	}
	if !isUnsigned(dt) {
		return c.errf("BitShift on %v: ONNX defines it on unsigned integers", dt)
	}
	attrs := graph.Attrs{"direction": graph.Str(dir)}
	r := c.rewrite()
	if dir == "RIGHT" {
		r.emit("BitShift", attrs, in...)
		return r.err
	}
	if dt == onnxpb.Uint64 {
		if err := c.uint64Wraps(); err != nil {
			return err
		}
		r.emit("BitShift", attrs, in...)
		return r.err
	}
	y := r.sub("BitShift", attrs, in...)
	_, hi, _ := intRange(dt)
	r.emit("Mod", nil, y, r.scalar("modulus", graph.Int64, float64(hi+1)))
	return r.err
}

// importGridSample maps GridSample on 4-D X; opset 20's mode names linear
// and cubic are the table's bilinear and bicubic.
func importGridSample(c *opCtx) error {
	r := c.rewrite()
	attrs := graph.Attrs{"align_corners": graph.Int(r.attrInt("align_corners", 0))}
	mode := r.attrString("mode", "bilinear")
	if r.err != nil {
		return r.err
	}
	if m, ok := map[string]string{"linear": "bilinear", "cubic": "bicubic"}[mode]; ok {
		mode = m
	}
	if mode != "bilinear" && mode != "nearest" && mode != "bicubic" {
		return c.errf("mode %q is not supported", mode)
	}
	attrs["mode"] = graph.Str(mode)
	pad := r.attrString("padding_mode", "zeros")
	if r.err != nil {
		return r.err
	}
	if pad != "zeros" && pad != "border" && pad != "reflection" {
		return c.errf("padding_mode %q is not supported", pad)
	}
	attrs["padding_mode"] = graph.Str(pad)
	in := r.values()
	if r.err != nil {
		return r.err
	}
	if len(in) != 2 || in[0] == nil || in[1] == nil {
		return c.errf("needs X and grid")
	}
	if in[0].Type.Shape.Rank() != 4 {
		return c.errf("X %v: only 4-D input is supported", in[0].Type)
	}
	r.emit("GridSample", attrs, in...)
	return r.err
}

// importRoiAlign maps RoiAlign; before opset 16 there is no
// coordinate_transformation_mode and the coordinates are output_half_pixel.
func importRoiAlign(c *opCtx) error {
	s, _ := graph.LookupOp("RoiAlign")
	r := c.rewrite()
	attrs := r.tableAttrs(s)
	if r.err != nil {
		return r.err
	}
	if _, ok := attrs["coordinate_transformation_mode"]; !ok && c.ver < 16 {
		attrs["coordinate_transformation_mode"] = graph.Str("output_half_pixel")
	}
	x, rois, idx := r.need(0), r.need(1), r.indices(2)
	r.emit("RoiAlign", attrs, x, rois, idx)
	return r.err
}

// importTfIdf maps TfIdfVectorizer on integer input (a pool of strings is
// refused); its attributes are the table row's.
func importTfIdf(c *opCtx) error {
	if c.has("pool_strings") {
		return c.errf("pool_strings: string type is not supported")
	}
	return importTableAttrs(c)
}
