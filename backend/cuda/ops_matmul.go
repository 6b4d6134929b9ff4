package cuda

import (
	"fmt"

	"github.com/flashgraph/flashgraph/backend/cuda/codegen"
	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/graph"
)

// GEMMs go to cuBLAS (float32 with float32 compute, no TF32; bfloat16 and
// float16 with float32 accumulation); float64 to gemm_f64 in ops.cu, since
// the cuBLAS bindings do not cover double.

func gemmTypeOf(dt graph.DType) (GemmType, error) {
	switch dt {
	case graph.Float32:
		return GemmF32, nil
	case graph.BFloat16:
		return GemmBF16, nil
	case graph.Float16:
		return GemmF16, nil
	}
	return 0, fmt.Errorf("no cuBLAS GEMM for %v", dt)
}

// gemmF64Tile matches G64 in ops.cu: gemm_f64 computes tile×tile outputs
// per block of tile×tile threads.
const gemmF64Tile = 16

// gemm returns a device-goroutine closure computing, for z < batch, on row-major buffers of
// element type gt,
//
//	C[z] = alpha·op(A[z])·op(B[z]) + beta·C[z]
//
// with op(A) m×k, op(B) k×n and batch strides in elements (0 broadcasts).
func (c *lowerCtx) gemm(gt graph.DType, transA, transB bool, m, n, k int, alpha float64,
	A DevicePtr, sA int64, B DevicePtr, sB int64, beta float64, C DevicePtr, sC int64, batch int) (func() error, error) {
	if m == 0 || n == 0 || batch == 0 {
		return nop, nil
	}
	d := c.dev()
	if gt != graph.Float64 {
		t, err := gemmTypeOf(gt)
		if err != nil {
			return nil, err
		}
		return func() error {
			return d.GemmRaw(t, transA, transB, m, n, k, float32(alpha), A, sA, B, sB, float32(beta), C, sC, batch)
		}, nil
	}
	const tile = gemmF64Tile
	gy := (m + tile - 1) / tile
	if gy > 65535 {
		return nil, fmt.Errorf("float64 GEMM with %d rows is too tall for the grid", m)
	}
	f, err := c.x.b.fn("gemm_f64")
	if err != nil {
		return nil, err
	}
	ta, tb := int32(0), int32(0)
	if transA {
		ta = 1
	}
	if transB {
		tb = 1
	}
	var calls []func() error
	for z0 := 0; z0 < batch; z0 += 65535 {
		nz := min(65535, batch-z0)
		grid := [3]uint32{uint32((n + tile - 1) / tile), uint32(gy), uint32(nz)}
		l, err := driver.NewRawLaunch(f, grid, [3]uint32{tile, tile, 1}, 0, ta, tb, int64(m), int64(n), int64(k), alpha,
			A.Offset(z0*int(sA)*8), sA, B.Offset(z0*int(sB)*8), sB, beta, C.Offset(z0*int(sC)*8), sC)
		if err != nil {
			return nil, err
		}
		calls = append(calls, func() error { return l.Run(d) })
	}
	return seq(calls...), nil
}

// gemmType is the element type a GEMM producing storage type dt runs in
// (cuBLAS takes A, B and C in one type; float64 uses our own kernel).
func gemmType(dt graph.DType) graph.DType {
	switch dt {
	case graph.BFloat16, graph.Float16, graph.Float64:
		return dt
	}
	return graph.Float32
}

// gemmScratch: MatMul and Gemm multiply in gemmType of their output's
// storage; an operand stored in another type is converted into scratch
// first (gemmOperand).
func gemmScratch(n *graph.Node, storage func(*graph.Value) graph.DType, _ PlanOptions) []scratchReq {
	l := scratchList{storage: storage}
	gt := gemmType(storage(n.Outputs[0]))
	l.cast("A", n.Inputs[0], gt)
	l.cast("B", n.Inputs[1], gt)
	return l.reqs
}

// gemmOperand returns v's buffer in GEMM type gt: the buffer itself, or a
// scratch buffer and the conversion that fills it (mixed precision: a
// float32 weight multiplied in bfloat16).
func (c *lowerCtx) gemmOperand(buf buffer, gt graph.DType) (buffer, func() error, error) {
	if buf.dt == gt {
		return buf, nil, nil
	}
	s, err := c.takeScratch()
	if err != nil {
		return buffer{}, nil, err
	}
	conv, err := c.convert(s, buf)
	return s, conv, err
}

// lowerMatMul: numpy matmul. Rank-1 operands are promoted (the data is the
// same); batch dims broadcast. The batch is coalesced into as few cuBLAS
// strided-batched calls as the strides allow, usually one; a weight shared by
// every batch entry folds the batch into M (one plain GEMM). An operand that
// is a folded Transpose (see placeFolded) is its input read with the GEMM's
// transpose flag.
func lowerMatMul(c *lowerCtx) (func() error, error) {
	tA := c.x.plan.values[c.n.Inputs[0]].kind == placeFolded
	tB := c.x.plan.values[c.n.Inputs[1]].kind == placeFolded
	as, bs := c.n.Inputs[0].Type.Shape, c.n.Inputs[1].Type.Shape
	if as.Rank() == 1 {
		as = graph.Shape{1, as[0]}
	}
	if bs.Rank() == 1 {
		bs = graph.Shape{bs[0], 1}
	}
	m, k, n := as[as.Rank()-2], as[as.Rank()-1], bs[bs.Rank()-1]
	batch, err := graph.Broadcast(as[:as.Rank()-2], bs[:bs.Rank()-2])
	if err != nil {
		return nil, err
	}
	y := c.out(0)
	gt := gemmType(y.dt)
	A, convA, err := c.gemmOperand(c.in(0), gt)
	if err != nil {
		return nil, err
	}
	B, convB, err := c.gemmOperand(c.in(1), gt)
	if err != nil {
		return nil, err
	}
	if y.dt != gt {
		return nil, fmt.Errorf("internal error: output stored as %v, GEMM in %v", y.dt, gt)
	}
	if batch.Numel() == 0 || m == 0 || n == 0 {
		return nop, nil
	}
	dims := make([]int64, batch.Rank())
	for i, d := range batch {
		dims[i] = int64(d)
	}
	sa := codegen.BroadcastOperand(codegen.Buffer{}, as[:as.Rank()-2], batch).Strides
	sb := codegen.BroadcastOperand(codegen.Buffer{}, bs[:bs.Rank()-2], batch).Strides
	sc := codegen.ContiguousStrides(batch)
	dims, st := codegen.Coalesce(dims, [][]int64{sa, sb, sc})
	last := len(dims) - 1
	inner := dims[last]
	mk, kn, mn := int64(m*k), int64(k*n), int64(m*n)
	esz := gt.Size()

	var calls []func() error
	if len(dims) == 1 && st[1][0] == 0 && st[0][0] == 1 && !tA {
		// One B for every entry and consecutive A matrices: one GEMM of
		// inner·m rows.
		g, err := c.gemm(gt, false, tB, int(inner)*m, n, k, 1, A.ptr, 0, B.ptr, 0, 0, y.ptr, 0, 1)
		if err != nil {
			return nil, err
		}
		calls = append(calls, g)
	} else {
		outer := int64(1)
		for _, d := range dims[:last] {
			outer *= d
		}
		for o := range outer {
			var offA, offB, offC int64
			rem := o
			for i := last - 1; i >= 0; i-- {
				x := rem % dims[i]
				rem /= dims[i]
				offA += x * st[0][i]
				offB += x * st[1][i]
				offC += x * st[2][i]
			}
			g, err := c.gemm(gt, tA, tB, m, n, k, 1,
				A.ptr.Offset(int(offA*mk)*esz), st[0][last]*mk, B.ptr.Offset(int(offB*kn)*esz), st[1][last]*kn,
				0, y.ptr.Offset(int(offC*mn)*esz), st[2][last]*mn, int(inner))
			if err != nil {
				return nil, err
			}
			calls = append(calls, g)
		}
	}
	return seq(append([]func() error{convA, convB}, calls...)...), nil
}

// lowerGemm: Y = alpha·op(A)·op(B) + beta·C. C is first broadcast into Y,
// then one GEMM accumulates onto it with beta.
func lowerGemm(c *lowerCtx) (func() error, error) {
	a, b := c.n.Inputs[0].Type.Shape, c.n.Inputs[1].Type.Shape
	tA, tB := c.n.Attrs.Int("transA", 0) != 0, c.n.Attrs.Int("transB", 0) != 0
	m, k := a[0], a[1]
	if tA {
		m, k = k, m
	}
	n := b[1]
	if tB {
		n = b[0]
	}
	y := c.out(0)
	gt := gemmType(y.dt)
	A, convA, err := c.gemmOperand(c.in(0), gt)
	if err != nil {
		return nil, err
	}
	B, convB, err := c.gemmOperand(c.in(1), gt)
	if err != nil {
		return nil, err
	}
	alpha, beta := c.n.Attrs.Float("alpha", 1), c.n.Attrs.Float("beta", 1)
	var fillC func() error
	if c.hasIn(2) && beta != 0 {
		ys := c.n.Outputs[0].Type.Shape
		if fillC, err = c.copyTo(y, ys, codegen.BroadcastOperand(c.inGen(2), c.n.Inputs[2].Type.Shape, ys)); err != nil {
			return nil, err
		}
	} else {
		beta = 0
	}
	g, err := c.gemm(gt, tA, tB, m, n, k, alpha, A.ptr, 0, B.ptr, 0, beta, y.ptr, 0, 1)
	if err != nil {
		return nil, err
	}
	return seq(convA, convB, fillC, g), nil
}
