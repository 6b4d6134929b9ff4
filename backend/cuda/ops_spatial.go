package cuda

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// Lowerings of the convolution, pooling and resampling ops: each launches
// its kernel of the "spatial ops" section of kernels/ops.cu, whose loop is
// the op table's Eval (graph/ops_conv.go, ops_resize.go, ops_gridsample.go,
// ops_roialign.go) one output element at a time. Windows are resolved here
// by the op table's own functions (graph.ConvWindow, PoolWindow,
// ConvTransposeWindow), so the kernels and the reference slide the same one.

func init() {
	for op, l := range map[string]lowering{
		"Conv": {lower: lowerConv}, "ConvTranspose": {lower: lowerConvTranspose},
		"MaxPool": {lower: lowerMaxPool}, "AveragePool": {lower: lowerAveragePool},
		"Interpolate": {lower: lowerInterpolate}, "GridSample": {lower: lowerGridSample},
		"RoiAlign": {lower: lowerRoiAlign},
	} {
		lowerings[op] = l
	}
}

// windowArgs are a window's kernel arguments (WIN_PARAMS in ops.cu): the
// spatial rank, then the input, kernel and output dims, strides, dilations
// and begin and end pads, six scalars each.
func windowArgs(op string, w *graph.SpatialWindow) ([]any, error) {
	ns := len(w.In)
	if ns > maxRank {
		return nil, fmt.Errorf("%s over %d spatial axes: the kernel takes at most %d: %w", op, ns, maxRank, backend.ErrUnsupported)
	}
	args := []any{int32(ns)}
	for _, v := range [][]int{w.In, w.K, w.Out, w.Stride, w.Dil, w.PadBegin, w.PadEnd} {
		args = append(args, six(ints64(v), 1)...)
	}
	return args, nil
}

func ints64(v []int) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// optIn is optional input i's pointer and type code (a null pointer when
// it is absent).
func (c *lowerCtx) optIn(i int) (DevicePtr, int32) {
	if !c.hasIn(i) {
		return 0, dtCode(graph.Float32)
	}
	b := c.in(i)
	return b.ptr, dtCode(b.dt)
}

// lowerConvLike lowers Conv (transposed false) and ConvTranspose: the
// output channels m, the input channels and the group go with the window.
func lowerConvLike(c *lowerCtx, transposed bool) (func() error, error) {
	xs, ws := c.n.Inputs[0].Type.Shape, c.n.Inputs[1].Type.Shape
	resolve, kernel := graph.ConvWindow, "conv"
	if transposed {
		resolve, kernel = graph.ConvTransposeWindow, "conv_transpose"
	}
	w, err := resolve(c.n.Attrs, xs, ws)
	if err != nil {
		return nil, err
	}
	wargs, err := windowArgs(c.n.Op, w)
	if err != nil {
		return nil, err
	}
	group := c.n.Attrs.Int("group", 1)
	m := int64(c.n.Outputs[0].Type.Shape[1])
	if group <= 0 || int64(xs[1])%group != 0 || m%group != 0 {
		return nil, fmt.Errorf("group %d does not fit X %v and W %v", group, xs, ws)
	}
	x, wt, y := c.in(0), c.in(1), c.out(0)
	bp, bdt := c.optIn(2)
	args := append([]any{int64(xs[0]), m, int64(xs[1]), group}, wargs...)
	args = append(args, x.ptr, dtCode(x.dt), wt.ptr, dtCode(wt.dt), bp, bdt, y.ptr, dtCode(y.dt))
	return c.launch1D(kernel, int64(c.n.Outputs[0].Type.Shape.Numel()), args...)
}

func lowerConv(c *lowerCtx) (func() error, error)          { return lowerConvLike(c, false) }
func lowerConvTranspose(c *lowerCtx) (func() error, error) { return lowerConvLike(c, true) }

func lowerMaxPool(c *lowerCtx) (func() error, error) {
	xs := c.n.Inputs[0].Type.Shape
	w, err := graph.PoolWindow(c.n.Attrs, xs)
	if err != nil {
		return nil, err
	}
	wargs, err := windowArgs("MaxPool", w)
	if err != nil {
		return nil, err
	}
	var idx DevicePtr
	if len(c.n.Outputs) > 1 && c.n.Outputs[1] != nil {
		idx = c.out(1).ptr
	}
	planes := int64(xs[0] * xs[1])
	x, y := c.in(0), c.out(0)
	args := append([]any{planes}, wargs...)
	args = append(args, int32(c.n.Attrs.Int("storage_order", 0)), x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt), idx, c.flag(), c.code())
	return c.launch1D("max_pool", int64(c.n.Outputs[0].Type.Shape.Numel()), args...)
}

func lowerAveragePool(c *lowerCtx) (func() error, error) {
	xs := c.n.Inputs[0].Type.Shape
	w, err := graph.PoolWindow(c.n.Attrs, xs)
	if err != nil {
		return nil, err
	}
	wargs, err := windowArgs("AveragePool", w)
	if err != nil {
		return nil, err
	}
	planes := int64(xs[0] * xs[1])
	x, y := c.in(0), c.out(0)
	args := append([]any{planes}, wargs...)
	args = append(args, int32(c.n.Attrs.Int("count_include_pad", 0)), x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt))
	return c.launch1D("avg_pool", int64(c.n.Outputs[0].Type.Shape.Numel()), args...)
}

// code is the position of s in names: the kernels' code of a string
// attribute.
func code(what, s string, names ...string) (int32, error) {
	for i, n := range names {
		if n == s {
			return int32(i), nil
		}
	}
	return 0, fmt.Errorf("%s %q is not one of %v", what, s, names)
}

func lowerInterpolate(c *lowerCtx) (func() error, error) {
	xs, ys := c.n.Inputs[0].Type.Shape, c.n.Outputs[0].Type.Shape
	if err := rankOK("Interpolate", xs); err != nil {
		return nil, fmt.Errorf("%w: %w", err, backend.ErrUnsupported)
	}
	a := c.n.Attrs
	r := xs.Rank()
	scales := a["scales"].Floats
	if len(scales) != r || ys.Rank() != r {
		return nil, fmt.Errorf("scales %v for rank %d", scales, r)
	}
	starts, ends := make([]float64, r), make([]float64, r)
	if roi := a["roi"].Floats; roi != nil {
		if len(roi) != 2*r {
			return nil, fmt.Errorf("roi %v for rank %d", roi, r)
		}
		copy(starts, roi[:r])
		copy(ends, roi[r:])
	}
	mode, err := code("mode", a.String("mode", "nearest"), "nearest", "linear", "cubic")
	if err != nil {
		return nil, err
	}
	ct, err := code("coordinate_transformation_mode", a.String("coordinate_transformation_mode", "half_pixel"),
		"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")
	if err != nil {
		return nil, err
	}
	nm, err := code("nearest_mode", a.String("nearest_mode", "round_prefer_floor"), "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
	if err != nil {
		return nil, err
	}
	x, y := c.in(0), c.out(0)
	n := int64(ys.Numel())
	args := []any{n, int32(r)}
	args = append(args, six(dims64(xs), 1)...)
	args = append(args, six(dims64(ys), 1)...)
	args = append(args, sixF(scales, 1)...)
	args = append(args, sixF(starts, 0)...)
	args = append(args, sixF(ends, 0)...)
	args = append(args, mode, ct, nm, a.Float("cubic_coeff_a", -0.75), int32(a.Int("exclude_outside", 0)),
		a.Float("extrapolation_value", 0), x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt))
	return c.launch1D("interpolate", n, args...)
}

func lowerGridSample(c *lowerCtx) (func() error, error) {
	xs, gs := c.n.Inputs[0].Type.Shape, c.n.Inputs[1].Type.Shape
	if xs.Rank() != 4 || gs.Rank() != 4 {
		return nil, fmt.Errorf("GridSample of X %v and grid %v: want 4-D", xs, gs)
	}
	a := c.n.Attrs
	mode, err := code("mode", a.String("mode", "bilinear"), "bilinear", "nearest", "bicubic")
	if err != nil {
		return nil, err
	}
	pad, err := code("padding_mode", a.String("padding_mode", "zeros"), "zeros", "border", "reflection")
	if err != nil {
		return nil, err
	}
	x, g, y := c.in(0), c.in(1), c.out(0)
	return c.launch1D("grid_sample", int64(c.n.Outputs[0].Type.Shape.Numel()),
		int64(xs[0]), int64(xs[1]), int64(xs[2]), int64(xs[3]), int64(gs[1]), int64(gs[2]), mode, pad,
		int32(a.Int("align_corners", 0)), x.ptr, dtCode(x.dt), g.ptr, dtCode(g.dt), y.ptr, dtCode(y.dt))
}

func lowerRoiAlign(c *lowerCtx) (func() error, error) {
	xs, rs := c.n.Inputs[0].Type.Shape, c.n.Inputs[1].Type.Shape
	if xs.Rank() != 4 || rs.Rank() != 2 {
		return nil, fmt.Errorf("RoiAlign of X %v and rois %v: want [N, C, H, W] and [num_rois, 4]", xs, rs)
	}
	a := c.n.Attrs
	oh, ow, ratio := a.Int("output_height", 1), a.Int("output_width", 1), a.Int("sampling_ratio", 0)
	if oh < 1 || ow < 1 || ratio < 0 || ratio > graph.MaxRoiSamples {
		return nil, fmt.Errorf("output %d×%d, sampling_ratio %d", oh, ow, ratio)
	}
	scale := a.Float("spatial_scale", 1)
	if math.IsNaN(scale) {
		return nil, fmt.Errorf("spatial_scale %v", scale)
	}
	x, rois, y := c.in(0), c.in(1), c.out(0)
	halfPixel := a.String("coordinate_transformation_mode", "half_pixel") == "half_pixel"
	useMax := a.String("mode", "avg") == "max"
	return c.launch1D("roi_align", int64(c.n.Outputs[0].Type.Shape.Numel()),
		int64(rs[0]), int64(xs[0]), int64(xs[1]), int64(xs[2]), int64(xs[3]), oh, ow, ratio, scale,
		b32(halfPixel), b32(useMax), int64(graph.MaxRoiSamples), x.ptr, dtCode(x.dt), rois.ptr, dtCode(rois.dt),
		c.in(2).ptr, y.ptr, dtCode(y.dt), c.flag(), c.code())
}

func b32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
