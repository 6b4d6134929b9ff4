//go:build !amd64

package sgemm

// haveKernel is false off amd64: every product goes to gonum.
const haveKernel = false

func kernel4x16(k int, a *float32, ars, als int, b *float32, ldb int, c *float32, ldc int) {
	panic("sgemm: kernel4x16 without the amd64 kernel")
}
