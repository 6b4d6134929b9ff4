// Package sgemm is the float32 product C (+)= op(A)·B of the CPU backend,
// bit-identical to gonum's Sgemm and several times faster.
//
// The CPU backend's numbers are the reference ("the same numbers on every
// machine"), pinned by golden files, and they were first computed by gonum.
// For C += op(A)·B with alpha 1, gonum's Sgemm computes each element as
//
//	for l in 0..k-1: if a[i][l] != 0 { c = round(round(a[i][l]·b[l][j]) + c) }
//
// (sgemmSerialNotNot and sgemmSerialTransNot: one axpy of a row of B into a
// row of C per term, C loaded and stored each time; its k blocks of 64 run in
// order). Acc computes the same sequence for each element, in the same order,
// with a 4×16 or 4×32 block of C held in registers across all of k
// (kernel4x16 with AVX2, kernel4x32 with AVX-512), so
// the results are the same bits and the time goes to arithmetic instead of
// reloading C. What the kernel cannot do gonum still does, on the same
// elements with the same sequence: rows past the last block of 4, columns
// past the last block of 16, and any block of 4 rows with a zero in op(A)
// (gonum skips a zero term, and 0·b is not a no-op when b is infinite or
// NaN, or -0 where c is -0).
//
// Products with B transposed are not here: gonum computes those as dot
// products with several partial sums (DotUnitary), a different order.
package sgemm

import (
	"github.com/flashgraph/flashgraph/internal/parallel"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

var impl gonum.Implementation

// Block of C one kernel4x16 call computes.
const (
	rows = 4
	cols = 16
)

// Acc is C += op(A)·B for row-major float32 matrices: op(A) [m,k] (A
// stored [k,m] when tA), B [k,n], C [m,n], leading dimensions lda, ldb, ldc.
// It gives the bits of gonum's Sgemm(tA, NoTrans, m, n, k, 1, a, lda, b,
// ldb, 1, c, ldc). With par, blocks of rows are spread over goroutines
// (GOMAXPROCS); each owns its rows of C, so the split changes nothing.
func Acc(tA bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, par bool) {
	product(tA, m, n, k, a, lda, b, ldb, c, ldc, par, true)
}

// Mul is C = op(A)·B, Acc without reading C: the bits of gonum's Sgemm with
// beta 0 (C zeroed, then summed into).
func Mul(tA bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, par bool) {
	product(tA, m, n, k, a, lda, b, ldb, c, ldc, par, false)
}

func product(tA bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, par, acc bool) {
	ta := blas.NoTrans
	ars, als := lda, 1 // op(A)[r][l] is a[r·ars + l·als]
	if tA {
		ta = blas.Trans
		ars, als = 1, lda
	}
	beta := float32(0)
	if acc {
		beta = 1
	}
	if !have16 || m < rows || n < cols || k == 0 {
		impl.Sgemm(ta, blas.NoTrans, m, n, k, 1, a, lda, b, ldb, beta, c, ldc)
		return
	}
	// gonum's bounds, checked here since the kernel reads by pointer.
	aLen, aMin := (m-1)*lda+k, k
	if tA {
		aLen, aMin = (k-1)*lda+m, m
	}
	if lda < aMin || ldb < n || ldc < n || len(a) < aLen || len(b) < (k-1)*ldb+n || len(c) < (m-1)*ldc+n {
		panic("sgemm: operand shorter than its shape")
	}
	panels := m / rows
	n16 := n - n%cols // the columns the kernels compute
	run := func(lo, hi int) {
		for p := lo; p < hi; p++ {
			i := p * rows
			ai := a[i*ars:] // op(A)'s row i onwards
			if hasZero(ai, ars, als, k) {
				impl.Sgemm(ta, blas.NoTrans, rows, n16, k, 1, ai, lda, b, ldb, beta, c[i*ldc:], ldc)
				continue
			}
			j := 0
			if have32 {
				for ; j+2*cols <= n16; j += 2 * cols {
					kernel4x32(k, &ai[0], ars, als, &b[j], ldb, &c[i*ldc+j], ldc, acc)
				}
			}
			for ; j < n16; j += cols {
				kernel4x16(k, &ai[0], ars, als, &b[j], ldb, &c[i*ldc+j], ldc, acc)
			}
		}
	}
	if par {
		// Each goroutine gets at least ~1M multiply-adds.
		parallelFor(panels, max(1, (1<<20)/(rows*n16*k)), run)
	} else {
		run(0, panels)
	}
	// The edges, by gonum, on elements the kernels did not touch.
	if n16 < n {
		impl.Sgemm(ta, blas.NoTrans, panels*rows, n-n16, k, 1, a, lda, b[n16:], ldb, beta, c[n16:], ldc)
	}
	if r := panels * rows; r < m {
		impl.Sgemm(ta, blas.NoTrans, m-r, n, k, 1, a[r*ars:], lda, b, ldb, beta, c[r*ldc:], ldc)
	}
}

// hasZero reports whether op(A)'s rows×k block at a (element [r][l] at
// a[r·ars + l·als]) holds a zero of either sign.
func hasZero(a []float32, ars, als, k int) bool {
	if als == 1 { // rows of A: contiguous runs
		for r := range rows {
			if zeroIn(&a[r*ars], k) {
				return true
			}
		}
		return false
	}
	for l := range k { // columns of A stored as rows: 4 adjacent values each
		for _, v := range a[l*als : l*als+rows] {
			if v == 0 {
				return true
			}
		}
	}
	return false
}

// parallelFor is parallel.For (one index, one call: results do not
// depend on the split).
func parallelFor(n, minChunk int, fn func(lo, hi int)) { parallel.For(n, minChunk, fn) }
