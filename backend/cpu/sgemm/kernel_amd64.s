#include "textflag.h"

// func kernel4x16(k int, a *float32, ars, als int, b *float32, ldb int, c *float32, ldc int)
//
// C[0:4, 0:16] += A[0:4, 0:k] · B[0:k, 0:16], with strides in elements (A's
// element [r][l] at a[r·ars + l·als]; B and C row-major), with AVX (no FMA):
// for each l in order, each element of C gets c = a[r][l]·b[l][j] + c, the
// product rounded, then the sum: the sequence gonum's Sgemm gives each
// element (sgemm.go says why that matters). The caller guarantees that no
// a[r][l] is zero (gonum skips those terms).
TEXT ·kernel4x16(SB), NOSPLIT, $0-64
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ ars+16(FP), R8
	MOVQ als+24(FP), R15
	MOVQ b+32(FP), DI
	MOVQ ldb+40(FP), R9
	MOVQ c+48(FP), DX
	MOVQ ldc+56(FP), R10
	SHLQ $2, R8
	SHLQ $2, R15
	SHLQ $2, R9
	SHLQ $2, R10

	// A's rows: SI, R11, R12, R13. C's fourth row: AX.
	LEAQ (SI)(R8*1), R11
	LEAQ (R11)(R8*1), R12
	LEAQ (R12)(R8*1), R13
	LEAQ (DX)(R10*2), AX
	ADDQ R10, AX

	VMOVUPS (DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS (DX)(R10*1), Y2
	VMOVUPS 32(DX)(R10*1), Y3
	VMOVUPS (DX)(R10*2), Y4
	VMOVUPS 32(DX)(R10*2), Y5
	VMOVUPS (AX), Y6
	VMOVUPS 32(AX), Y7

	XORQ BX, BX // byte offset of element l in A's rows
	TESTQ CX, CX
	JE   done

loop:
	VMOVUPS (DI), Y8
	VMOVUPS 32(DI), Y9

	VBROADCASTSS (SI)(BX*1), Y10
	VMULPS       Y8, Y10, Y11
	VMULPS       Y9, Y10, Y12
	VADDPS       Y0, Y11, Y0
	VADDPS       Y1, Y12, Y1

	VBROADCASTSS (R11)(BX*1), Y10
	VMULPS       Y8, Y10, Y11
	VMULPS       Y9, Y10, Y12
	VADDPS       Y2, Y11, Y2
	VADDPS       Y3, Y12, Y3

	VBROADCASTSS (R12)(BX*1), Y10
	VMULPS       Y8, Y10, Y11
	VMULPS       Y9, Y10, Y12
	VADDPS       Y4, Y11, Y4
	VADDPS       Y5, Y12, Y5

	VBROADCASTSS (R13)(BX*1), Y10
	VMULPS       Y8, Y10, Y11
	VMULPS       Y9, Y10, Y12
	VADDPS       Y6, Y11, Y6
	VADDPS       Y7, Y12, Y7

	ADDQ R15, BX
	ADDQ R9, DI
	DECQ CX
	JNE  loop

done:
	VMOVUPS Y0, (DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, (DX)(R10*1)
	VMOVUPS Y3, 32(DX)(R10*1)
	VMOVUPS Y4, (DX)(R10*2)
	VMOVUPS Y5, 32(DX)(R10*2)
	VMOVUPS Y6, (AX)
	VMOVUPS Y7, 32(AX)
	VZEROUPPER
	RET
