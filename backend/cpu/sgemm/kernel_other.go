//go:build !amd64 || noasm

package sgemm

// Off amd64, or built with -tags noasm (as gonum honours it), there is no
// kernel: every product goes to gonum.
var have16, have32 = false, false

func kernel4x16(k int, a *float32, ars, als int, b *float32, ldb int, c *float32, ldc int, load bool) {
	panic("sgemm: kernel4x16 without the amd64 kernel")
}

func kernel4x32(k int, a *float32, ars, als int, b *float32, ldb int, c *float32, ldc int, load bool) {
	panic("sgemm: kernel4x32 without the amd64 kernel")
}

func zeroIn(a *float32, n int) bool {
	panic("sgemm: zeroIn without the amd64 kernel")
}
