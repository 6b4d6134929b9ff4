//go:build amd64 && !noasm

#include "textflag.h"

// func kernel4x16(k int, a *float32, ars, als int, b *float32, ldb int, c *float32, ldc int, load bool)
//
// C[0:4, 0:16] += A[0:4, 0:k] · B[0:k, 0:16], with strides in elements (A's
// element [r][l] at a[r·ars + l·als]; B and C row-major), with AVX (no FMA):
// for each l in order, each element of C gets c = a[r][l]·b[l][j] + c, the
// product rounded, then the sum: the sequence gonum's Sgemm gives each
// element (sgemm.go says why that matters). The caller guarantees that no
// a[r][l] is zero (gonum skips those terms). Without load, C starts at +0
// instead of its contents (what gonum's beta 0 does: C zeroed, then summed
// into), and need not be cleared first.
TEXT ·kernel4x16(SB), NOSPLIT, $0-65
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

	MOVBQZX load+64(FP), BX
	TESTQ   BX, BX
	JNE     loadc
	VXORPS  Y0, Y0, Y0
	VXORPS  Y1, Y1, Y1
	VXORPS  Y2, Y2, Y2
	VXORPS  Y3, Y3, Y3
	VXORPS  Y4, Y4, Y4
	VXORPS  Y5, Y5, Y5
	VXORPS  Y6, Y6, Y6
	VXORPS  Y7, Y7, Y7
	JMP     start

loadc:
	VMOVUPS (DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS (DX)(R10*1), Y2
	VMOVUPS 32(DX)(R10*1), Y3
	VMOVUPS (DX)(R10*2), Y4
	VMOVUPS 32(DX)(R10*2), Y5
	VMOVUPS (AX), Y6
	VMOVUPS 32(AX), Y7

start:

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

// func kernel4x32(k int, a *float32, ars, als int, b *float32, ldb int, c *float32, ldc int, load bool)
//
// C[0:4, 0:32] += A[0:4, 0:k] · B[0:k, 0:32], with strides in elements (A's
// element [r][l] at a[r·ars + l·als]; B and C row-major), with AVX-512 (no FMA):
// for each l in order, each element of C gets c = a[r][l]·b[l][j] + c, the
// product rounded, then the sum: the sequence gonum's Sgemm gives each
// element (sgemm.go says why that matters). The caller guarantees that no
// a[r][l] is zero (gonum skips those terms). Without load, C starts at +0
// instead of its contents (what gonum's beta 0 does: C zeroed, then summed
// into), and need not be cleared first.
TEXT ·kernel4x32(SB), NOSPLIT, $0-65
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

	MOVBQZX load+64(FP), BX
	TESTQ   BX, BX
	JNE     loadc512
	VPXORD  Z0, Z0, Z0
	VPXORD  Z1, Z1, Z1
	VPXORD  Z2, Z2, Z2
	VPXORD  Z3, Z3, Z3
	VPXORD  Z4, Z4, Z4
	VPXORD  Z5, Z5, Z5
	VPXORD  Z6, Z6, Z6
	VPXORD  Z7, Z7, Z7
	JMP     start512

loadc512:
	VMOVUPS (DX), Z0
	VMOVUPS 64(DX), Z1
	VMOVUPS (DX)(R10*1), Z2
	VMOVUPS 64(DX)(R10*1), Z3
	VMOVUPS (DX)(R10*2), Z4
	VMOVUPS 64(DX)(R10*2), Z5
	VMOVUPS (AX), Z6
	VMOVUPS 64(AX), Z7

start512:

	XORQ BX, BX // byte offset of element l in A's rows
	TESTQ CX, CX
	JE   done512

loop512:
	VMOVUPS (DI), Z8
	VMOVUPS 64(DI), Z9

	VBROADCASTSS (SI)(BX*1), Z10
	VMULPS       Z8, Z10, Z11
	VMULPS       Z9, Z10, Z12
	VADDPS       Z0, Z11, Z0
	VADDPS       Z1, Z12, Z1

	VBROADCASTSS (R11)(BX*1), Z10
	VMULPS       Z8, Z10, Z11
	VMULPS       Z9, Z10, Z12
	VADDPS       Z2, Z11, Z2
	VADDPS       Z3, Z12, Z3

	VBROADCASTSS (R12)(BX*1), Z10
	VMULPS       Z8, Z10, Z11
	VMULPS       Z9, Z10, Z12
	VADDPS       Z4, Z11, Z4
	VADDPS       Z5, Z12, Z5

	VBROADCASTSS (R13)(BX*1), Z10
	VMULPS       Z8, Z10, Z11
	VMULPS       Z9, Z10, Z12
	VADDPS       Z6, Z11, Z6
	VADDPS       Z7, Z12, Z7

	ADDQ R15, BX
	ADDQ R9, DI
	DECQ CX
	JNE  loop512

done512:
	VMOVUPS Z0, (DX)
	VMOVUPS Z1, 64(DX)
	VMOVUPS Z2, (DX)(R10*1)
	VMOVUPS Z3, 64(DX)(R10*1)
	VMOVUPS Z4, (DX)(R10*2)
	VMOVUPS Z5, 64(DX)(R10*2)
	VMOVUPS Z6, (AX)
	VMOVUPS Z7, 64(AX)
	VZEROUPPER
	RET

// func zeroIn(a *float32, n int) bool
//
// zeroIn reports whether a[0:n] holds a zero of either sign (NaN is not
// zero), eight values per compare.
TEXT ·zeroIn(SB), NOSPLIT, $0-17
	MOVQ   a+0(FP), SI
	MOVQ   n+8(FP), CX
	VXORPS Y1, Y1, Y1

zloop8:
	CMPQ     CX, $8
	JL       ztail
	VMOVUPS  (SI), Y0
	VCMPPS   $0, Y1, Y0, Y2 // EQ_OQ: a == 0
	VPTEST   Y2, Y2
	JNE      zfound
	ADDQ     $32, SI
	SUBQ     $8, CX
	JMP      zloop8

ztail:
	TESTQ   CX, CX
	JE      znone
	VMOVSS  (SI), X0
	VUCOMISS X1, X0
	JNP     zeq // ordered: compare the value
	JMP     znext

zeq:
	JE zfound

znext:
	ADDQ $4, SI
	DECQ CX
	JMP  ztail

znone:
	VZEROUPPER
	MOVB $0, ret+16(FP)
	RET

zfound:
	VZEROUPPER
	MOVB $1, ret+16(FP)
	RET
