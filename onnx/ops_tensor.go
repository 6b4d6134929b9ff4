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
	attrs, err := c.tableAttrs(s)
	if err != nil {
		return err
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	axis, err := c.constInput(1, "axis")
	if err != nil {
		return err
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
		av, err = c.value(1)
	} else {
		av, err = c.scalar("axis", graph.Int64, float64(ax[0]))
	}
	if err != nil {
		return err
	}
	_, err = c.emit("CumSum", attrs, x, av)
	return err
}

// importIndexed maps GatherND and ScatterND (constant int32 indices become
// int64). ScatterND's max and min reductions are from opset 18.
func importIndexed(c *opCtx) error {
	s, _ := graph.LookupOp(c.n.OpType)
	attrs, err := c.tableAttrs(s)
	if err != nil {
		return err
	}
	in, err := c.values()
	if err != nil {
		return err
	}
	if len(in) < 2 || in[0] == nil {
		return c.errf("needs data and indices")
	}
	if in[1], err = c.indicesValue(1); err != nil {
		return err
	}
	_, err = c.emit(c.n.OpType, attrs, in...)
	return err
}

func importReverseSequence(c *opCtx) error {
	s, _ := graph.LookupOp("ReverseSequence")
	attrs, err := c.tableAttrs(s)
	if err != nil {
		return err
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	lens, err := c.indicesValue(1)
	if err != nil {
		return err
	}
	_, err = c.emit("ReverseSequence", attrs, x, lens)
	return err
}

// importMaxUnpool reads the window attributes; output_shape, when given,
// must be a constant.
func importMaxUnpool(c *opCtx) error {
	attrs := graph.Attrs{}
	for _, name := range []string{"kernel_shape", "strides", "pads"} {
		v, ok, err := c.attrInts(name)
		if err != nil {
			return err
		}
		if ok {
			attrs[name] = graph.Ints(v...)
		}
	}
	if _, ok := attrs["kernel_shape"]; !ok {
		return c.errf("kernel_shape is required")
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	idx, err := c.indicesValue(1)
	if err != nil {
		return err
	}
	in := []*graph.Value{x, idx}
	if c.input(2) != nil {
		shape, err := c.constInput(2, "output_shape")
		if err != nil {
			return err
		}
		vals, err := shape.ints()
		if err != nil {
			return c.errf("output_shape: %v", err)
		}
		sv, err := c.ints("output_shape", vals)
		if err != nil {
			return err
		}
		in = append(in, sv)
	}
	_, err = c.emit("MaxUnpool", attrs, in...)
	return err
}

// importBitShift maps BitShift, which ONNX defines on unsigned types: UINT8
// to UINT32 held as int64 (UINT64 has no dtype here). A right shift stays in
// the type's range; a left shift is reduced modulo 2^width, as a store of
// that width drops the bits shifted out.
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
	if dir == "RIGHT" {
		_, err = c.emit("BitShift", attrs, in...)
		return err
	}
	y, err := c.sub("BitShift", attrs, in...)
	if err != nil {
		return err
	}
	_, hi, _ := intRange(dt)
	m, err := c.scalar("modulus", graph.Int64, float64(hi+1))
	if err != nil {
		return err
	}
	_, err = c.emit("Mod", nil, y, m)
	return err
}

// importGridSample maps GridSample on 4-D X; opset 20's mode names linear
// and cubic are the table's bilinear and bicubic.
func importGridSample(c *opCtx) error {
	attrs := graph.Attrs{}
	ac, err := c.attrInt("align_corners", 0)
	if err != nil {
		return err
	}
	attrs["align_corners"] = graph.Int(ac)
	mode, err := c.attrString("mode", "bilinear")
	if err != nil {
		return err
	}
	if m, ok := map[string]string{"linear": "bilinear", "cubic": "bicubic"}[mode]; ok {
		mode = m
	}
	if mode != "bilinear" && mode != "nearest" && mode != "bicubic" {
		return c.errf("mode %q is not supported", mode)
	}
	attrs["mode"] = graph.Str(mode)
	pad, err := c.attrString("padding_mode", "zeros")
	if err != nil {
		return err
	}
	if pad != "zeros" && pad != "border" && pad != "reflection" {
		return c.errf("padding_mode %q is not supported", pad)
	}
	attrs["padding_mode"] = graph.Str(pad)
	in, err := c.values()
	if err != nil {
		return err
	}
	if len(in) != 2 || in[0] == nil || in[1] == nil {
		return c.errf("needs X and grid")
	}
	if in[0].Type.Shape.Rank() != 4 {
		return c.errf("X %v: only 4-D input is supported", in[0].Type)
	}
	_, err = c.emit("GridSample", attrs, in...)
	return err
}

// importRoiAlign maps RoiAlign; before opset 16 there is no
// coordinate_transformation_mode and the coordinates are output_half_pixel.
func importRoiAlign(c *opCtx) error {
	s, _ := graph.LookupOp("RoiAlign")
	attrs, err := c.tableAttrs(s)
	if err != nil {
		return err
	}
	if _, ok := attrs["coordinate_transformation_mode"]; !ok && c.ver < 16 {
		attrs["coordinate_transformation_mode"] = graph.Str("output_half_pixel")
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	rois, err := c.need(1)
	if err != nil {
		return err
	}
	idx, err := c.indicesValue(2)
	if err != nil {
		return err
	}
	_, err = c.emit("RoiAlign", attrs, x, rois, idx)
	return err
}

// importTfIdf maps TfIdfVectorizer on integer input (a pool of strings is
// refused); its attributes are the table row's.
func importTfIdf(c *opCtx) error {
	if c.has("pool_strings") {
		return c.errf("pool_strings: string type is not supported")
	}
	return importTableAttrs(c)
}
