package cpu

import (
	"fmt"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/flashgraph/flashgraph/backend/cpu/sgemm"

	"github.com/flashgraph/flashgraph/graph"
)

var impl gonum.Implementation

// gemm is C = alpha·op(A)·op(B) + beta·C on row-major slices through gonum's
// Sgemm/Dgemm. k == 0 is handled here because gonum's length checks reject
// empty operands with m > 1.
func gemm[T float](tA, tB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		for i := range m {
			row := c[i*ldc : i*ldc+n]
			for j := range row {
				if beta == 0 {
					row[j] = 0
				} else {
					row[j] *= beta
				}
			}
		}
		return
	}
	ta, tb := blas.NoTrans, blas.NoTrans
	if tA {
		ta = blas.Trans
	}
	if tB {
		tb = blas.Trans
	}
	switch cs := any(c).(type) {
	case []float32:
		// The same bits as impl.Sgemm, faster (package sgemm).
		switch {
		case !tB && alpha == 1 && beta == 0:
			sgemm.Mul(tA, m, n, k, any(a).([]float32), lda, any(b).([]float32), ldb, cs, ldc, true)
			return
		case !tB && alpha == 1 && beta == 1:
			sgemm.Acc(tA, m, n, k, any(a).([]float32), lda, any(b).([]float32), ldb, cs, ldc, true)
			return
		}
		impl.Sgemm(ta, tb, m, n, k, float32(alpha), any(a).([]float32), lda, any(b).([]float32), ldb, float32(beta), cs, ldc)
	case []float64:
		impl.Dgemm(ta, tb, m, n, k, float64(alpha), any(a).([]float64), lda, any(b).([]float64), ldb, float64(beta), cs, ldc)
	}
}

// matmulKernel is numpy matmul: rank-1 operands are promoted (and the added
// dim dropped from the result), batch dims broadcast; one GEMM per batch.
func matmulKernel(n *graph.Node, in, out []*graph.Tensor) error {
	a, b, y := in[0], in[1], out[0]
	as, bs := a.Shape, b.Shape
	if as.Rank() == 1 {
		as = graph.Shape{1, as[0]}
	}
	if bs.Rank() == 1 {
		bs = graph.Shape{bs[0], 1}
	}
	m, k := as[as.Rank()-2], as[as.Rank()-1]
	nn := bs[bs.Rank()-1]
	if bs[bs.Rank()-2] != k {
		return fmt.Errorf("inner dimensions differ: %v @ %v", a.Shape, b.Shape)
	}
	batch, err := graph.Broadcast(as[:as.Rank()-2], bs[:bs.Rank()-2])
	if err != nil {
		return err
	}
	if batch.Numel()*m*nn != y.Len() {
		return fmt.Errorf("output %v does not match %v @ %v", y.Shape, a.Shape, b.Shape)
	}
	aOff := batchOffsets(batch, as[:as.Rank()-2], m*k)
	bOff := batchOffsets(batch, bs[:bs.Rank()-2], k*nn)
	switch storageOf(y.DType) {
	case stF32:
		batchedGemm(y.F32, a.F32, b.F32, aOff, bOff, m, nn, k)
	case stF64:
		batchedGemm(y.F64, a.F64, b.F64, aOff, bOff, m, nn, k)
	default:
		return errDType(y.DType)
	}
	return nil
}

// batchOffsets gives, for each index of the broadcast batch shape, the offset
// (in elements) of the operand's matrix, whose batch shape is in.
func batchOffsets(batch, in graph.Shape, matSize int) []int {
	nb := batch.Numel()
	offs := make([]int, nb)
	p := newBPlan(batch, in)
	st := p.inner(0)
	p.walk(0, nb, func(o, cnt int, off []int) {
		for i := range cnt {
			offs[o+i] = (off[0] + i*st) * matSize
		}
	})
	return offs
}

func batchedGemm[T float](y, a, b []T, aOff, bOff []int, m, n, k int) {
	one := func(i int) {
		gemm(false, false, m, n, k, 1, a[aOff[i]:], max(k, 1), b[bOff[i]:], max(n, 1), 0, y[i*m*n:], max(n, 1))
	}
	// gonum parallelises one large GEMM itself; many small ones are spread
	// over goroutines here instead. Each batch owns its output matrix.
	if len(aOff) > 1 && m*n*k < 1<<18 {
		parallelFor(len(aOff), max(1, (1<<16)/max(m*n*k, 1)), func(lo, hi int) {
			for i := lo; i < hi; i++ {
				one(i)
			}
		})
		return
	}
	for i := range aOff {
		one(i)
	}
}

// gemmKernel is ONNX Gemm: alpha·op(A)·op(B) + beta·C, C broadcast to [M, N].
func gemmKernel(n *graph.Node, in, out []*graph.Tensor) error {
	a, b, c, y := in[0], in[1], optIn(in, 2), out[0]
	tA, tB := n.Attrs.Int("transA", 0) != 0, n.Attrs.Int("transB", 0) != 0
	alpha, beta := n.Attrs.Float("alpha", 1), n.Attrs.Float("beta", 1)
	m, k := a.Shape[0], a.Shape[1]
	if tA {
		m, k = k, m
	}
	nn := y.Shape[1]
	if c == nil {
		beta = 0
	}
	switch storageOf(y.DType) {
	case stF32:
		gemmOp(y.F32, a.F32, b.F32, c, tA, tB, m, nn, k, float32(alpha), float32(beta), a.Shape[1], b.Shape[1])
	case stF64:
		gemmOp(y.F64, a.F64, b.F64, c, tA, tB, m, nn, k, alpha, beta, a.Shape[1], b.Shape[1])
	default:
		return errDType(y.DType)
	}
	return nil
}

func gemmOp[T float](y, a, b []T, c *graph.Tensor, tA, tB bool, m, n, k int, alpha, beta T, lda, ldb int) {
	if beta != 0 {
		// y = C broadcast; the GEMM then scales it by beta and adds.
		var cs []T
		switch any(y).(type) {
		case []float32:
			cs = any(c.F32).([]T)
		case []float64:
			cs = any(c.F64).([]T)
		}
		p := newBPlan(graph.Shape{m, n}, c.Shape)
		st := p.inner(0)
		p.walk(0, m*n, func(o, cnt int, offs []int) {
			for i := range cnt {
				y[o+i] = cs[offs[0]+i*st]
			}
		})
	}
	gemm(tA, tB, m, n, k, alpha, a, max(lda, 1), b, max(ldb, 1), beta, y, max(n, 1))
}
