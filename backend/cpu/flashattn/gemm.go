package flashattn

import (
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/flashgraph/flashgraph/backend/cpu/sgemm"
)

var impl gonum.Implementation

// maxSerialN is the widest C gonum multiplies without spawning goroutines
// when C has at most one 64-row block (it goes parallel at 4 blocks of 64×64).
// Our tiles already run one per worker; nested goroutines would only add
// scheduling and allocations, so wider products (d ≥ 256) are split.
const maxSerialN = 3 * 64

// gemm computes C = alpha·op(A)·op(B) + beta·C (row-major, like gonum) with
// gonum's Sgemm or Dgemm chosen by T's size. Slices of ~float32/~float64
// types are reinterpreted in place: same size and representation.
func gemm[T Float](tA, tB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	ta, tb := blas.NoTrans, blas.NoTrans
	if tA {
		ta = blas.Trans
	}
	if tB {
		tb = blas.Trans
	}
	var zero T
	for n0 := 0; n0 < n; n0 += maxSerialN {
		nn := min(maxSerialN, n-n0)
		bOff := n0 // column n0 of B
		if tB {
			bOff = n0 * ldb // row n0 of Bᵀ's storage
		}
		bs, cs := b[bOff:], c[n0:]
		if unsafe.Sizeof(zero) == 4 && !tB && alpha == 1 && beta == 1 {
			// The same bits as impl.Sgemm, faster (package sgemm).
			sgemm.Acc(tA, m, nn, k, as32(a), lda, as32(bs), ldb, as32(cs), ldc, false)
		} else if unsafe.Sizeof(zero) == 4 {
			impl.Sgemm(ta, tb, m, nn, k, float32(alpha), as32(a), lda, as32(bs), ldb, float32(beta), as32(cs), ldc)
		} else {
			impl.Dgemm(ta, tb, m, nn, k, float64(alpha), as64(a), lda, as64(bs), ldb, float64(beta), as64(cs), ldc)
		}
	}
}

func as32[T Float](x []T) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}

func as64[T Float](x []T) []float64 {
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}
