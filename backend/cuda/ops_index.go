package cuda

import (
	"fmt"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// Lowerings of the index ops the ONNX backend test suite added: each
// launches its kernel of the "index ops" section of kernels/ops.cu, whose
// loop is the op table's Eval (graph/ops_conform.go, ops_index.go,
// ops_tensor.go) one output element at a time.

func init() {
	for op, l := range map[string]lowerFn{
		"GatherElements": lowerGatherElements, "ScatterElements": lowerScatterElements,
		"ArgMax": lowerArgMax, "OneHot": lowerOneHot, "CumSum": lowerCumSum,
		"GatherND": lowerGatherND, "ScatterND": lowerScatterND, "Pad": lowerPad,
		"ReduceProd": lowerReduceProd, "ReverseSequence": lowerReverseSequence, "MaxUnpool": lowerMaxUnpool,
	} {
		lowerings[op] = lowering{lower: l}
	}
}

// six pads a list of dims or strides to the kernels' six scalars (pad
// fills the rest).
func six(v []int64, pad int64) []any { return padSix(v, pad) }

// sixF pads a list of floats to the kernels' six scalars.
func sixF(v []float64, pad float64) []any { return padSix(v, pad) }

func padSix[T int64 | float64](v []T, pad T) []any {
	out := make([]any, maxRank)
	for i := range out {
		out[i] = pad
		if i < len(v) {
			out[i] = v[i]
		}
	}
	return out
}

func dims64(s graph.Shape) []int64 {
	out := make([]int64, len(s))
	for i, d := range s {
		out[i] = int64(d)
	}
	return out
}

// rankOK refuses shapes past the kernels' six dims.
func rankOK(op string, shapes ...graph.Shape) error {
	for _, s := range shapes {
		if s.Rank() > maxRank {
			return fmt.Errorf("%s of rank %d: the kernel takes at most %d dims", op, s.Rank(), maxRank)
		}
	}
	return nil
}

func (c *lowerCtx) launch1D(name string, n int64, args ...any) (func() error, error) {
	if n == 0 {
		return nop, nil
	}
	return c.kernel(name, c.gridFor(n, 256), [3]uint32{256, 1, 1}, args...)
}

func lowerGatherElements(c *lowerCtx) (func() error, error) {
	xs, is := c.n.Inputs[0].Type.Shape, c.n.Inputs[1].Type.Shape
	ax, err := graph.NormAxis(int(c.n.Attrs.Int("axis", 0)), xs.Rank())
	if err != nil {
		return nil, err
	}
	dims, strides, cax := collapseGatherDims(dims64(is), dims64(xs), dims64(graph.Shape(xs.Strides())), ax)
	if len(dims) > maxRank {
		return nil, fmt.Errorf("GatherElements of rank %d (%d after merging the dims where indices and data agree): the kernel takes at most %d dims", xs.Rank(), len(dims), maxRank)
	}
	x, y := c.in(0), c.out(0)
	n := int64(is.Numel())
	args := []any{n, int32(len(dims)), int32(cax), int64(xs[ax])}
	args = append(args, six(dims, 1)...)
	args = append(args, six(strides, 0)...)
	args = append(args, x.ptr, dtCode(x.dt), c.in(1).ptr, y.ptr, dtCode(y.dt), c.flag(), c.code())
	return c.launch1D("gather_elements", n, args...)
}

// collapseGatherDims merges neighbouring dims of a GatherElements (index
// dims id, data dims xd and strides xs, gather axis ax) into one wherever
// the index walks the data contiguously: dims k and k+1, neither the axis,
// merge when id[k+1] == xd[k+1], since then index coordinate
// c_k·id[k+1] + c_{k+1} lands at data offset (c_k·xd[k+1] + c_{k+1})·xs[k+1].
// A loss over [N, C, d1..d5] (rank 7) gathers at rank 3 this way.
func collapseGatherDims(id, xd, xs []int64, ax int) (dims, strides []int64, axis int) {
	dims, strides, axis = []int64{id[0]}, []int64{xs[0]}, -1
	if ax == 0 {
		axis = 0
	}
	for k := 1; k < len(id); k++ {
		last := len(dims) - 1
		if k != ax && last != axis && id[k] == xd[k] {
			dims[last] *= id[k]
			strides[last] = xs[k]
			continue
		}
		dims, strides = append(dims, id[k]), append(strides, xs[k])
		if k == ax {
			axis = len(dims) - 1
		}
	}
	return dims, strides, axis
}

// scatterReduction is the kernels' code of a reduction attribute.
func scatterReduction(a graph.Attrs) (int32, error) {
	switch r := a.String("reduction", "none"); r {
	case "none":
		return 0, nil
	case "add":
		return 1, nil
	case "mul":
		return 2, nil
	case "max":
		return 3, nil
	case "min":
		return 4, nil
	default:
		return 0, fmt.Errorf("reduction %q", r)
	}
}

func lowerScatterElements(c *lowerCtx) (func() error, error) {
	xs, is := c.n.Inputs[0].Type.Shape, c.n.Inputs[1].Type.Shape
	if err := rankOK("ScatterElements", xs); err != nil {
		return nil, err
	}
	ax, err := graph.NormAxis(int(c.n.Attrs.Int("axis", 0)), xs.Rank())
	if err != nil {
		return nil, err
	}
	red, err := scatterReduction(c.n.Attrs)
	if err != nil {
		return nil, err
	}
	x, u, y := c.in(0), c.in(2), c.out(0)
	n := int64(xs.Numel())
	args := []any{n, int32(xs.Rank()), int32(ax), red}
	args = append(args, six(dims64(xs), 1)...)
	args = append(args, six(dims64(is), 1)...)
	args = append(args, x.ptr, dtCode(x.dt), c.in(1).ptr, u.ptr, dtCode(u.dt), y.ptr, dtCode(y.dt), c.flag(), c.code())
	return c.launch1D("scatter_elements", n, args...)
}

func lowerArgMax(c *lowerCtx) (func() error, error) {
	xs := c.n.Inputs[0].Type.Shape
	outer, dim, inner, err := gatherDims(xs, c.n.Attrs.Int("axis", 0))
	if err != nil {
		return nil, err
	}
	x := c.in(0)
	return c.launch1D("argmax", outer*inner, outer, dim, inner, int32(c.n.Attrs.Int("select_last_index", 0)),
		x.ptr, dtCode(x.dt), c.out(0).ptr)
}

func lowerOneHot(c *lowerCtx) (func() error, error) {
	ys := c.n.Outputs[0].Type.Shape
	outer, depth, inner, err := gatherDims(ys, c.n.Attrs.Int("axis", -1))
	if err != nil {
		return nil, err
	}
	if _, err := c.constInts(1, "depth"); err != nil {
		return nil, err
	}
	idx, vals, y := c.in(0), c.in(2), c.out(0)
	return c.launch1D("one_hot", outer*depth*inner, outer*depth*inner, depth, inner,
		idx.ptr, dtCode(idx.dt), vals.ptr, dtCode(vals.dt), y.ptr, dtCode(y.dt))
}

func lowerCumSum(c *lowerCtx) (func() error, error) {
	xs := c.n.Inputs[0].Type.Shape
	ax, err := c.constInts(1, "axis")
	if err != nil {
		return nil, err
	}
	if len(ax) != 1 {
		return nil, fmt.Errorf("axis: want one value, got %v", ax)
	}
	outer, dim, inner, err := gatherDims(xs, int64(ax[0]))
	if err != nil {
		return nil, err
	}
	x, y := c.in(0), c.out(0)
	return c.launch1D("cumsum", outer*inner, outer, dim, inner, int32(c.n.Attrs.Int("exclusive", 0)),
		int32(c.n.Attrs.Int("reverse", 0)), x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt))
}

// ndGeometry is GatherND's and ScatterND's view of data: k indexed axes
// (dims nd) after b batch axes, each tuple picking a slice of slice
// elements.
func ndGeometry(op string, data, idx graph.Shape, b int) (k int, nd []int64, slice, perBatch int64, err error) {
	q := idx.Rank()
	if q < 1 {
		return 0, nil, 0, 0, fmt.Errorf("%s indices %v", op, idx)
	}
	k = idx[q-1]
	if k < 1 || k > maxRank || b+k > data.Rank() {
		return 0, nil, 0, 0, fmt.Errorf("%s: tuples of %d coordinates (the kernel takes 1 to %d) for data %v", op, k, maxRank, data)
	}
	return k, dims64(data[b : b+k]), int64(data[b+k:].Numel()), int64(idx[b : q-1].Numel()), nil
}

func lowerGatherND(c *lowerCtx) (func() error, error) {
	xs, is := c.n.Inputs[0].Type.Shape, c.n.Inputs[1].Type.Shape
	k, nd, slice, perBatch, err := ndGeometry("GatherND", xs, is, int(c.n.Attrs.Int("batch_dims", 0)))
	if err != nil {
		return nil, err
	}
	x, y := c.in(0), c.out(0)
	n := int64(c.n.Outputs[0].Type.Shape.Numel())
	args := []any{n, int32(k), slice, max(perBatch, 1)}
	args = append(args, six(nd, 1)...)
	args = append(args, x.ptr, dtCode(x.dt), c.in(1).ptr, y.ptr, dtCode(y.dt), c.flag(), c.code())
	return c.launch1D("gather_nd", n, args...)
}

// lowerScatterND copies data into the output, then writes or combines each
// update (a reduction combines atomically: float32, float64 and int64
// storage; with reduction none a slice named twice keeps either write, as
// ONNX leaves it).
func lowerScatterND(c *lowerCtx) (func() error, error) {
	xs, is := c.n.Inputs[0].Type.Shape, c.n.Inputs[1].Type.Shape
	k, nd, slice, _, err := ndGeometry("ScatterND", xs, is, 0)
	if err != nil {
		return nil, err
	}
	red, err := scatterReduction(c.n.Attrs)
	if err != nil {
		return nil, err
	}
	x, u, y := c.in(0), c.in(2), c.out(0)
	if red != 0 && y.dt != graph.Float32 && y.dt != graph.Float64 && y.dt != graph.Int64 {
		return nil, fmt.Errorf("ScatterND with reduction %s on %v storage: the atomic update takes float32, float64 or int64: %w",
			c.n.Attrs.String("reduction", ""), y.dt, backend.ErrUnsupported)
	}
	n := int64(xs.Numel())
	var copyIn func() error = nop
	if n > 0 && x.ptr != y.ptr {
		if copyIn, err = c.kernel("copy2d", c.gridFor(n, 256), [3]uint32{256, 1, 1}, int64(1), n, y.ptr, dtCode(y.dt), n, x.ptr, dtCode(x.dt), n); err != nil {
			return nil, err
		}
	}
	nu := int64(c.n.Inputs[2].Type.Shape.Numel())
	args := []any{nu, int32(k), slice, red}
	args = append(args, six(nd, 1)...)
	args = append(args, c.in(1).ptr, u.ptr, dtCode(u.dt), y.ptr, dtCode(y.dt), c.flag(), c.code())
	update, err := c.launch1D("scatter_nd_updates", nu, args...)
	if err != nil {
		return nil, err
	}
	return seq(copyIn, update), nil
}

func lowerPad(c *lowerCtx) (func() error, error) {
	xs, ys := c.n.Inputs[0].Type.Shape, c.n.Outputs[0].Type.Shape
	if err := rankOK("Pad", xs); err != nil {
		return nil, err
	}
	pads, err := c.constInts(1, "pads")
	if err != nil {
		return nil, err
	}
	r := xs.Rank()
	if len(pads) != 2*r {
		return nil, fmt.Errorf("pads %v for rank %d", pads, r)
	}
	mode := map[string]int32{"constant": 0, "reflect": 1, "edge": 2}[c.n.Attrs.String("mode", "constant")]
	begin := make([]int64, r)
	for i := range r {
		begin[i] = int64(pads[i])
	}
	x, y := c.in(0), c.out(0)
	fill, fdt := DevicePtr(0), dtCode(x.dt)
	if c.hasIn(2) {
		fill, fdt = c.in(2).ptr, dtCode(c.in(2).dt)
	}
	n := int64(ys.Numel())
	args := []any{n, int32(r), mode}
	args = append(args, six(dims64(ys), 1)...)
	args = append(args, six(dims64(xs), 1)...)
	args = append(args, six(begin, 0)...)
	args = append(args, x.ptr, dtCode(x.dt), fill, fdt, y.ptr, dtCode(y.dt))
	return c.launch1D("pad", n, args...)
}

func lowerReduceProd(c *lowerCtx) (func() error, error) { return c.reduction(reduceProdKernel) }

// reduceProdKernel runs reduce_cols with the product (op 1) in one chunk: a
// thread per output multiplies its elements in order.
func reduceProdKernel(c *lowerCtx, rp reducePlan, x, y buffer) (func() error, error) {
	block, bw := colBlock(rp.nout)
	args := append([]any{int32(1), 1.0, rp.nout, rp.count, rp.count, x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt)},
		redDims(rp.kept, rp.keptS, rp.red, rp.redS)...)
	return c.kernel("reduce_cols"+reduceSuffix(x.dt, y.dt), c.gridFor(rp.nout, bw), block, args...)
}

func lowerReverseSequence(c *lowerCtx) (func() error, error) {
	xs := c.n.Inputs[0].Type.Shape
	ba := c.n.Attrs.Int("batch_axis", 1)
	ta := c.n.Attrs.Int("time_axis", 0)
	if xs.Rank() < 2 || (ba != 0 && ba != 1) || ba == ta {
		return nil, fmt.Errorf("batch_axis %d and time_axis %d of %v", ba, ta, xs)
	}
	x, y := c.in(0), c.out(0)
	n := int64(xs.Numel())
	return c.launch1D("reverse_sequence", n, n, int64(xs[1]), int64(xs[2:].Numel()), int32(ba), int64(xs[ta]),
		c.in(1).ptr, x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt), c.flag(), c.code())
}

// lowerMaxUnpool zeroes the output, then writes each X element at the
// multi-index its MaxPool index numbers in the default unpooled shape.
func lowerMaxUnpool(c *lowerCtx) (func() error, error) {
	xs, ys := c.n.Inputs[0].Type.Shape, c.n.Outputs[0].Type.Shape
	if err := rankOK("MaxUnpool", ys); err != nil {
		return nil, err
	}
	if c.hasIn(2) {
		if _, err := c.constInts(2, "output_shape"); err != nil {
			return nil, err
		}
	}
	def, err := graph.UnpoolShape(c.n.Attrs, xs)
	if err != nil {
		return nil, err
	}
	x, y := c.in(0), c.out(0)
	zero, err := c.launch1D("zero_fill", int64(ys.Numel()), int64(ys.Numel()), y.ptr, dtCode(y.dt))
	if err != nil {
		return nil, err
	}
	n := int64(xs.Numel())
	args := []any{n, int32(ys.Rank())}
	args = append(args, six(dims64(def), 1)...)
	args = append(args, six(dims64(ys), 1)...)
	args = append(args, x.ptr, dtCode(x.dt), c.in(1).ptr, y.ptr, dtCode(y.dt), c.flag(), c.code())
	scatter, err := c.launch1D("max_unpool_scatter", n, args...)
	if err != nil {
		return nil, err
	}
	return seq(zero, scatter), nil
}
