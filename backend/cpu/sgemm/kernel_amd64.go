//go:build amd64 && !noasm

package sgemm

import "golang.org/x/sys/cpu"

var (
	// have16 says whether kernel4x16 may run: it uses AVX2-era
	// instructions (VBROADCASTSS from memory, 256-bit VMULPS/VADDPS).
	have16 = cpu.X86.HasAVX2
	// have32 says whether kernel4x32 may run (AVX-512 Foundation, with the
	// OS saving its registers).
	have32 = cpu.X86.HasAVX2 && cpu.X86.HasAVX512F
)

// kernel4x16 is C[0:4,0:16] += A[0:4,0:k]·B[0:k,0:16], A's element [r][l] at
// a[r·ars + l·als]; without load, C's old contents are not read (C =
// A·B) (kernel_amd64.s).
//
//go:noescape
func kernel4x16(k int, a *float32, ars, als int, b *float32, ldb int, c *float32, ldc int, load bool)

// kernel4x32 is kernel4x16 on 32 columns, with 512-bit registers.
//
//go:noescape
func kernel4x32(k int, a *float32, ars, als int, b *float32, ldb int, c *float32, ldc int, load bool)

// zeroIn reports whether a[0:n] holds a zero of either sign
// (kernel_amd64.s, AVX2).
//
//go:noescape
func zeroIn(a *float32, n int) bool
