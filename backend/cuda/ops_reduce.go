package cuda

import (
	"fmt"
	"slices"

	"github.com/flashgraph/flashgraph/backend/cuda/codegen"
	"github.com/flashgraph/flashgraph/graph"
)

// reducePlan is how a ReduceSum/Mean/Max runs. It is pure shape arithmetic
// (the memory planner sizes the partials scratch from it).
type reducePlan struct {
	op          int32 // 0 sum, 2 max (a mean is a sum divided by count)
	mean        bool
	copy        bool // noop_with_empty_axes with no axes: the data as it is
	nout, count int64
	kept, keptS []int64 // kept dims and their input strides, coalesced
	red, redS   []int64 // reduced dims and strides, coalesced
	rows        bool    // a block per output (the innermost input axis is reduced)
	colsContig  bool    // [count, nout] row-major over float data: generated column kernels
	chunks      int64   // cols: blocks along the reduced range (>1: two passes)
	clen        int64   // cols: reduced elements per chunk
}

// accType is the partials' type: float32 for 16-bit data, else float64.
func (rp reducePlan) accType(in graph.DType) graph.DType {
	if codegen.Is16(in) {
		return graph.Float32
	}
	return graph.Float64
}

func planReduce(n *graph.Node) (reducePlan, error) {
	var rp reducePlan
	switch n.Op {
	case "ReduceMax":
		rp.op = 2
	case "ReduceMean":
		rp.mean = true
	}
	x := n.Inputs[0].Type.Shape
	var axes []int
	if len(n.Inputs) > 1 && n.Inputs[1] != nil {
		v := n.Inputs[1]
		if v.Kind != graph.Const || v.Init == nil {
			return rp, fmt.Errorf("axes must be a constant")
		}
		t, err := v.Init.Materialize(v.Type)
		if err != nil {
			return rp, err
		}
		for _, a := range t.I64 {
			axes = append(axes, int(a))
		}
	}
	noop := n.Attrs.Int("noop_with_empty_axes", 0) != 0
	ax, err := graph.ReduceAxes(x, axes, noop)
	if err != nil {
		return rp, err
	}
	if len(ax) == 0 && noop {
		rp.copy = true
		return rp, nil
	}
	st := codegen.ContiguousStrides(x)
	var kd, ks, rd, rs []int64
	for i, d := range x {
		if slices.Contains(ax, i) {
			rd, rs = append(rd, int64(d)), append(rs, st[i])
		} else {
			kd, ks = append(kd, int64(d)), append(ks, st[i])
		}
	}
	rp.nout, rp.count = prod(kd), prod(rd)
	var s [][]int64
	rp.kept, s = codegen.Coalesce(kd, [][]int64{ks})
	rp.keptS = s[0]
	rp.red, s = codegen.Coalesce(rd, [][]int64{rs})
	rp.redS = s[0]
	if len(rp.kept) > maxRank || len(rp.red) > maxRank {
		return rp, fmt.Errorf("reduction of %v over %v needs more than %d dims", x, ax, maxRank)
	}
	rp.rows = rp.redS[len(rp.redS)-1] == 1 && rp.count > 1
	rp.chunks, rp.clen = 1, rp.count
	// A float tensor [count, nout] reduced over its leading axes goes to the
	// generated column kernels, which pick their own chunks.
	rp.colsContig = !rp.rows && n.Inputs[0].Type.DType.IsFloat() && len(rp.red) == 1 && rp.redS[0] == rp.nout &&
		len(rp.kept) == 1 && rp.keptS[0] == 1
	if rp.colsContig {
		rp.chunks = codegen.ColChunks(rp.count)
		rp.clen = (rp.count + rp.chunks - 1) / rp.chunks
		rp.chunks = (rp.count + rp.clen - 1) / rp.clen
	} else if !rp.rows && rp.count >= 128 {
		// About a million threads, each summing at least 8 elements: the
		// loads of one thread depend on nothing, but a thread walks its chunk
		// serially, so many short chunks keep enough of them in flight (64
		// per thread ran a [B,H,S,64] -> [64] sum at 0.2 TB/s).
		rp.chunks = min(rp.count/8, max(1, (1<<20)/max(rp.nout, 1)), 65535)
		rp.clen = (rp.count + rp.chunks - 1) / rp.chunks
		rp.chunks = (rp.count + rp.clen - 1) / rp.clen
	}
	return rp, nil
}

// warpRowMax is the longest row reduce_rows_warp takes: beyond it a block
// per row keeps more loads in flight.
const warpRowMax = 4096

func prod(d []int64) int64 {
	p := int64(1)
	for _, x := range d {
		p *= x
	}
	return p
}

// redDims lays out the kernel arguments that follow (op, div, nout, count,
// clen, x, xdt, y, ydt): each list padded to maxRank.
func redDims(kept, keptS, red, redS []int64) []any {
	var args []any
	pad := func(list []int64) {
		for i := range maxRank {
			v := int64(1)
			if i < len(list) {
				v = list[i]
			}
			args = append(args, v)
		}
	}
	args = append(args, int32(len(kept)))
	pad(kept)
	pad(keptS)
	args = append(args, int32(len(red)))
	pad(red)
	pad(redS)
	return args
}

// reduceScratch: a reduction over too many rows for one pass writes
// per-chunk partials, then sums them.
func reduceScratch(n *graph.Node, storage func(*graph.Value) graph.DType, _ PlanOptions) []scratchReq {
	rp, err := planReduce(n)
	if err != nil || rp.chunks <= 1 {
		return nil
	}
	return []scratchReq{{"partials", rp.accType(storage(n.Inputs[0])), graph.Shape{int(rp.chunks), int(rp.nout)}}}
}

// reduction lowers a Reduce* node (ReduceSum, Mean, Max, Prod): it plans
// it, marks its axes input a shape operand (read when compiling, never
// uploaded), lowers the two cases that need no reduction kernel (a copy for
// noop_with_empty_axes with no axes, nothing for an empty output), and
// leaves the rest to kernels.
func (c *lowerCtx) reduction(kernels func(c *lowerCtx, rp reducePlan, x, y buffer) (func() error, error)) (func() error, error) {
	rp, err := planReduce(c.n)
	if err != nil {
		return nil, err
	}
	if c.hasIn(1) {
		c.x.shapeOperands[c.n.Inputs[1]] = true
	}
	x, y := c.in(0), c.out(0)
	if rp.copy {
		return c.convert(y, x)
	}
	if rp.nout == 0 {
		return nop, nil
	}
	return kernels(c, rp, x, y)
}

// colBlock is the block of the reduce_cols kernel, a thread per output
// column: 32 to 256 threads, no wider than the outputs need.
func colBlock(nout int64) (block [3]uint32, width int) {
	bw := 32
	for int64(bw) < nout && bw < 256 {
		bw *= 2
	}
	return [3]uint32{uint32(bw), 1, 1}, bw
}

func lowerReduce(c *lowerCtx) (func() error, error) { return c.reduction(reduceKernels) }

// reduceKernels lowers ReduceSum, Mean and Max: a generated row or column
// kernel where one fits, else reduce_rows or reduce_cols (in two passes when
// the reduced range is split in chunks).
func reduceKernels(c *lowerCtx, rp reducePlan, x, y buffer) (func() error, error) {
	suffix := reduceSuffix(x.dt, y.dt)
	div := 1.0
	if rp.mean {
		div = float64(rp.count)
	}
	if f, err := c.lowerRowReduceGenerated(rp, x, y); f != nil || err != nil {
		return f, err
	}
	if rp.colsContig && x.dt.IsFloat() && y.dt.IsFloat() {
		return c.lowerColReduceGenerated(rp, x, y)
	}
	if rp.rows {
		args := append([]any{rp.op, div, rp.nout, rp.count, rp.count, x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt)},
			redDims(rp.kept, rp.keptS, rp.red, rp.redS)...)
		if len(rp.red) == 1 && rp.count <= warpRowMax {
			// A warp per row: 8 rows per 256-thread block.
			return c.kernel("reduce_rows_warp"+suffix, c.gridFor((rp.nout+7)/8, 1), [3]uint32{256, 1, 1}, args...)
		}
		return c.kernel("reduce_rows"+suffix, rowGrid(rp.nout), rowBlock(rp.count), args...)
	}
	// A thread per output column.
	block, bw := colBlock(rp.nout)
	grid := c.gridFor(rp.nout, bw)
	if rp.chunks == 1 {
		args := append([]any{rp.op, div, rp.nout, rp.count, rp.clen, x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt)},
			redDims(rp.kept, rp.keptS, rp.red, rp.redS)...)
		return c.kernel("reduce_cols"+suffix, grid, block, args...)
	}
	// Two passes: chunk partials [chunks, nout], then their sum in chunk order.
	part, err := c.takeScratch()
	if err != nil {
		return nil, err
	}
	grid[1] = uint32(rp.chunks)
	args1 := append([]any{rp.op, 1.0, rp.nout, rp.count, rp.clen, x.ptr, dtCode(x.dt), part.ptr, dtCode(part.dt)},
		redDims(rp.kept, rp.keptS, rp.red, rp.redS)...)
	first, err := c.kernel("reduce_cols"+suffix, grid, block, args1...)
	if err != nil {
		return nil, err
	}
	// The partials are summed by a block per output (a fixed tree, so the
	// result stays deterministic): one thread per output walking every chunk
	// in turn left the GPU idle (0.46 ms for a [B,H,S,64] -> [64] sum).
	args2 := append([]any{rp.op, div, rp.nout, rp.chunks, rp.chunks, part.ptr, dtCode(part.dt), y.ptr, dtCode(y.dt)},
		redDims([]int64{rp.nout}, []int64{1}, []int64{rp.chunks}, []int64{rp.nout})...)
	second, err := c.kernel("reduce_rows"+suffix, rowGrid(rp.nout), rowBlock(rp.chunks), args2...)
	if err != nil {
		return nil, err
	}
	return seq(first, second), nil
}

// ---------------------------------------------------------------- softmax family

// axisRows views a shape around axis as rows of m elements at stride inner.
func axisRows(s graph.Shape, axis int64) (rows, m, inner int64, err error) {
	ax, err := graph.NormAxis(int(axis), s.Rank())
	if err != nil {
		return 0, 0, 0, err
	}
	outer, in := int64(s[:ax].Numel()), int64(s[ax+1:].Numel())
	return outer * in, int64(s[ax]), in, nil
}

func lowerSoftmax(mode int32) lowerFn {
	return func(c *lowerCtx) (func() error, error) {
		rows, m, inner, err := axisRows(c.n.Inputs[0].Type.Shape, c.n.Attrs.Int("axis", -1))
		if err != nil {
			return nil, err
		}
		if rows*m == 0 {
			return nop, nil
		}
		x, y := c.in(0), c.out(0)
		return c.kernel("softmax_f64", rowGrid(rows), rowBlock(m),
			mode, rows, m, inner, x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt))
	}
}

func lowerSoftmaxGrad(c *lowerCtx) (func() error, error) {
	rows, m, inner, err := axisRows(c.n.Inputs[0].Type.Shape, c.n.Attrs.Int("axis", -1))
	if err != nil {
		return nil, err
	}
	if rows*m == 0 {
		return nop, nil
	}
	y, dy, dx := c.in(0), c.in(1), c.out(0)
	return c.kernel("softmax_grad_f64", rowGrid(rows), rowBlock(m),
		rows, m, inner, y.ptr, dtCode(y.dt), dy.ptr, dtCode(dy.dt), dx.ptr, dtCode(dx.dt))
}

// sceDivisor is what the loss sum is divided by: N for "mean", 1 for "sum".
func sceDivisor(n *graph.Node, rows int64) (float64, error) {
	switch r := n.Attrs.String("reduction", "mean"); r {
	case "mean":
		return float64(rows), nil
	case "sum":
		return 1, nil
	default:
		return 0, fmt.Errorf("reduction %q not supported (mean, sum)", r)
	}
}

// sceLossScratch: the loss sums float64 per-row losses in row order.
func sceLossScratch(n *graph.Node, _ func(*graph.Value) graph.DType, _ PlanOptions) []scratchReq {
	return []scratchReq{{"rowloss", graph.Float64, graph.Shape{n.Inputs[0].Type.Shape[0]}}}
}

func lowerSCELoss(c *lowerCtx) (func() error, error) {
	sh := c.n.Inputs[0].Type.Shape
	rows, classes := int64(sh[0]), int64(sh[1])
	div, err := sceDivisor(c.n, rows)
	if err != nil {
		return nil, err
	}
	rowloss, err := c.takeScratch()
	if err != nil {
		return nil, err
	}
	s, y := c.in(0), c.out(0)
	var first func() error
	if rows > 0 {
		if first, err = c.kernel("sce_rows_f64", rowGrid(rows), rowBlock(classes),
			rows, classes, s.ptr, dtCode(s.dt), c.in(1).ptr, rowloss.ptr, c.flag(), c.code()); err != nil {
			return nil, err
		}
	}
	second, err := c.kernel("sum_scalar", [3]uint32{1, 1, 1}, [3]uint32{1024, 1, 1}, rows, rowloss.ptr, div, y.ptr, dtCode(y.dt))
	if err != nil {
		return nil, err
	}
	return seq(first, second), nil
}

func lowerSCELossGrad(c *lowerCtx) (func() error, error) {
	sh := c.n.Inputs[1].Type.Shape
	rows, classes := int64(sh[0]), int64(sh[1])
	div, err := sceDivisor(c.n, rows)
	if err != nil {
		return nil, err
	}
	if rows*classes == 0 {
		return nop, nil
	}
	dl, s, ds := c.in(0), c.in(1), c.out(0)
	return c.kernel("sce_grad_f64", rowGrid(rows), rowBlock(classes),
		rows, classes, dl.ptr, dtCode(dl.dt), div, s.ptr, dtCode(s.dt), c.in(2).ptr, ds.ptr, dtCode(ds.dt), c.flag(), c.code())
}
