//go:build !amd64

package cpu

// haveSgemmKernel is false off amd64: every float32 GEMM goes to gonum.
const haveSgemmKernel = false

func sgemm4x16(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int) {
	panic("sgemm4x16 without the amd64 kernel")
}
