package sgemm

import "golang.org/x/sys/cpu"

// haveKernel says whether kernel4x16 may run: it uses AVX2-era instructions
// (VBROADCASTSS from memory, 256-bit VMULPS/VADDPS).
var haveKernel = cpu.X86.HasAVX2

// kernel4x16 is C[0:4,0:16] += A[0:4,0:k]·B[0:k,0:16], A's element [r][l] at
// a[r·ars + l·als] (kernel_amd64.s).
//
//go:noescape
func kernel4x16(k int, a *float32, ars, als int, b *float32, ldb int, c *float32, ldc int)
