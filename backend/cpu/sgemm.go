package cpu

import "gonum.org/v1/gonum/blas"

// The float32 product C = A·B (MatMul: no transposes, alpha 1, beta 0) is
// most of a CPU training step. gonum's Sgemm computes each element of C as
//
//	c = 0; for l in 0..k-1: if a[i][l] != 0 { c = round(round(a[i][l]·b[l][j]) + c) }
//
// (sgemmSerialNotNot: one axpy of a row of B into a row of C per term, C
// loaded and stored each time). sgemmNN computes the same sequence for each
// element, in the same order, with a 4×16 block of C held in registers
// across all of k (sgemm4x16), so the results are bit-identical to gonum's
// and the time goes to arithmetic instead of reloading C. What the kernel
// cannot do gonum still does, on the same elements with the same sequence:
// rows past the last block of 4, columns past the last block of 16, and any
// block of 4 rows with a zero in A (gonum skips a zero term, and 0·b is not
// a no-op when b is infinite or NaN).

// Block of C one sgemm4x16 call computes.
const (
	sgemmRows = 4
	sgemmCols = 16
)

// sgemmNN is C = A·B for row-major float32 A [m,k], B [k,n], C [m,n]
// (leading dimensions lda, ldb, ldc), bit-identical to gonum's
// Sgemm(NoTrans, NoTrans, m, n, k, 1, a, lda, b, ldb, 0, c, ldc). With par,
// blocks of rows are spread over goroutines; each owns its rows of C.
func sgemmNN(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, par bool) {
	if !haveSgemmKernel || m < sgemmRows || n < sgemmCols || k == 0 {
		impl.Sgemm(blas.NoTrans, blas.NoTrans, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
		return
	}
	// gonum's bounds, checked once here since the kernel reads by pointer.
	if len(a) < (m-1)*lda+k || len(b) < (k-1)*ldb+n || len(c) < (m-1)*ldc+n || lda < k || ldb < n || ldc < n {
		panic("sgemmNN: operand shorter than its shape")
	}
	for i := range m {
		clear(c[i*ldc : i*ldc+n])
	}
	panels := m / sgemmRows
	n16 := n - n%sgemmCols
	run := func(lo, hi int) {
		for p := lo; p < hi; p++ {
			i := p * sgemmRows
			if hasZero(a[i*lda:], lda, sgemmRows, k) {
				impl.Sgemm(blas.NoTrans, blas.NoTrans, sgemmRows, n16, k, 1, a[i*lda:], lda, b, ldb, 1, c[i*ldc:], ldc)
				continue
			}
			for j := 0; j < n16; j += sgemmCols {
				sgemm4x16(k, &a[i*lda], lda, &b[j], ldb, &c[i*ldc+j], ldc)
			}
		}
	}
	// Each goroutine gets at least ~1M multiply-adds.
	if par {
		parallelFor(panels, max(1, (1<<20)/(sgemmRows*n16*k)), run)
	} else {
		run(0, panels)
	}
	// The edges, by gonum, on elements the kernel did not touch (C is zero
	// there, so beta 1 adds to zero as beta 0 would).
	if n16 < n {
		impl.Sgemm(blas.NoTrans, blas.NoTrans, panels*sgemmRows, n-n16, k, 1, a, lda, b[n16:], ldb, 1, c[n16:], ldc)
	}
	if r := panels * sgemmRows; r < m {
		impl.Sgemm(blas.NoTrans, blas.NoTrans, m-r, n, k, 1, a[r*lda:], lda, b, ldb, 1, c[r*ldc:], ldc)
	}
}

// hasZero reports whether rows×k block of A (leading dimension lda) holds a
// zero (either sign).
func hasZero(a []float32, lda, rows, k int) bool {
	for r := range rows {
		for _, v := range a[r*lda : r*lda+k] {
			if v == 0 {
				return true
			}
		}
	}
	return false
}
