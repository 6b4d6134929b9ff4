package cpu

import "golang.org/x/sys/cpu"

// haveSgemmKernel says whether sgemm4x16 may run: it uses AVX2-era
// instructions (VBROADCASTSS from memory, 256-bit VMULPS/VADDPS).
var haveSgemmKernel = cpu.X86.HasAVX2

// sgemm4x16 is C[0:4,0:16] += A[0:4,0:k]·B[0:k,0:16] (sgemm_amd64.s).
//
//go:noescape
func sgemm4x16(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int)
