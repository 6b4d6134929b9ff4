package driver

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"github.com/ebitengine/purego"
)

// cublasAPI holds the cuBLAS entry points.
type cublasAPI struct {
	lib                                          *library
	cublasCreate, cublasDestroy, cublasSetStream uintptr
	cublasGemmStridedBatchedEx                   uintptr
	cublasSetWorkspace                           uintptr            // 0 when the library lacks it
	statusName                                   func(int32) string // nil when the library lacks it
}

var cublasLoad loadOnce[*cublasAPI]

func loadCublas() (*cublasAPI, error) {
	return cublasLoad.get(func() (*cublasAPI, error) {
		lib, err := openLibrary("cuBLAS", "libcublas.so.13", "libcublas.so.12")
		if err != nil {
			return nil, fmt.Errorf("cuda: %w (install the CUDA toolkit's cuBLAS or set CUDA_HOME)", err)
		}
		api := &cublasAPI{lib: lib}
		err = lib.symbols(map[string]*uintptr{
			"cublasCreate_v2":            &api.cublasCreate,
			"cublasDestroy_v2":           &api.cublasDestroy,
			"cublasSetStream_v2":         &api.cublasSetStream,
			"cublasGemmStridedBatchedEx": &api.cublasGemmStridedBatchedEx,
		})
		if err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		api.cublasSetWorkspace = lib.optionalSymbol("cublasSetWorkspace_v2")
		if p := lib.optionalSymbol("cublasGetStatusName"); p != 0 {
			purego.RegisterFunc(&api.statusName, p)
		}
		return api, nil
	})
}

func (api *cublasAPI) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	name := cublasStatusNames[r]
	if name == "" && api.statusName != nil {
		name = api.statusName(r)
	}
	return &Error{Call: call, Code: int(r), Name: name}
}

// GemmType selects the element type of A, B and C. Every type accumulates and
// computes in float32 (CUBLAS_COMPUTE_32F), so GemmF32 is full float32, not TF32.
type GemmType int

const (
	GemmF32  GemmType = iota // float32 A, B, C
	GemmBF16                 // bfloat16 A, B, C (as uint16 bit patterns on the host)
	GemmF16                  // IEEE half A, B, C (as uint16 bit patterns on the host)
)

func (t GemmType) String() string {
	switch t {
	case GemmF32:
		return "f32"
	case GemmBF16:
		return "bf16"
	case GemmF16:
		return "f16"
	}
	return fmt.Sprintf("GemmType(%d)", int(t))
}

// ElemSize is the size in bytes of one element of t.
func (t GemmType) ElemSize() int {
	if t == GemmF32 {
		return 4
	}
	return 2
}

// cudaDataType values (library_types.h).
func (t GemmType) cudaDataType() (uintptr, error) {
	switch t {
	case GemmF32:
		return 0, nil // CUDA_R_32F
	case GemmF16:
		return 2, nil // CUDA_R_16F
	case GemmBF16:
		return 14, nil // CUDA_R_16BF
	}
	return 0, fmt.Errorf("cuda: unknown GemmType %d", int(t))
}

const (
	cublasCompute32F  = 68          // CUBLAS_COMPUTE_32F: float32 math, no TF32 shortcut
	cublasGemmDefault = ^uintptr(0) // CUBLAS_GEMM_DEFAULT = -1
)

// cublas returns the device's cuBLAS handle, creating it on first use and binding
// it to the device's stream so GEMMs are ordered with launches and copies. It runs
// on the device goroutine.
func (d *Device) cublas() (*cublasAPI, uintptr, error) {
	api, err := loadCublas()
	if err != nil {
		return nil, 0, err
	}
	if d.cublasHandle == 0 {
		var h uintptr
		if err := api.check("cublasCreate_v2", ccall(api.cublasCreate, uintptr(unsafe.Pointer(&h)))); err != nil {
			return nil, 0, err
		}
		if err := api.check("cublasSetStream_v2", ccall(api.cublasSetStream, h, d.stream)); err != nil {
			ccall(api.cublasDestroy, h)
			return nil, 0, err
		}
		d.cublasHandle = h
		if err := d.setCublasWorkspace(api); err != nil {
			return nil, 0, err
		}
	}
	return api, d.cublasHandle, nil
}

// cublasWorkspaceBytes is the workspace the handle gets: 32 MiB, what the
// cuBLAS documentation recommends for Hopper (4 MiB before it). With a
// workspace of its own the library may pick split-K and stream-K kernels, and
// needs no allocation of its own while a step is captured as a CUDA graph.
// FLASHGRAPH_CUBLAS_WORKSPACE_MIB overrides the size (0: leave cuBLAS its
// default).
const cublasWorkspaceBytes = 32 << 20

// cublasWorkspaceSize is the workspace size the user asked for, or the default.
func cublasWorkspaceSize() (int, error) {
	v := os.Getenv("FLASHGRAPH_CUBLAS_WORKSPACE_MIB")
	if v == "" {
		return cublasWorkspaceBytes, nil
	}
	mib, err := strconv.Atoi(v)
	if err != nil || mib < 0 || mib > 4096 {
		return 0, fmt.Errorf("cuda: FLASHGRAPH_CUBLAS_WORKSPACE_MIB=%q: want a size in MiB from 0 to 4096", v)
	}
	return mib << 20, nil
}

// setCublasWorkspace gives the new handle its workspace (device goroutine).
func (d *Device) setCublasWorkspace(api *cublasAPI) error {
	size, err := cublasWorkspaceSize()
	if err != nil {
		return err
	}
	if size == 0 || api.cublasSetWorkspace == 0 {
		return nil
	}
	p, err := d.alloc(size)
	if err != nil {
		return fmt.Errorf("cuda: cuBLAS workspace of %.2f MiB: %w", float64(size)/(1<<20), err)
	}
	if err := api.check("cublasSetWorkspace_v2", ccall(api.cublasSetWorkspace, d.cublasHandle, uintptr(p), uintptr(size))); err != nil {
		return errors.Join(err, d.free(p))
	}
	d.cublasWorkspace = p
	return nil
}

// GemmStridedBatched is cublasGemmStridedBatchedEx with float32 compute. Like all of
// cuBLAS it is COLUMN-MAJOR: for each b in [0, batch)
//
//	C_b = alpha * op(A_b) * op(B_b) + beta * C_b
//
// where X_b starts strideX elements after X_{b-1}, op(A_b) is m×k, op(B_b) is k×n,
// C_b is m×n, and element (i, j) of a matrix with leading dimension ld lives at
// offset i + j*ld. transA means A_b is stored k×m (lda ≥ k) and used transposed;
// otherwise it is stored m×k (lda ≥ m); likewise for B. A stride of 0 reuses one
// matrix for every batch entry. alpha and beta are float32 for every GemmType.
// For row-major data use RowMajorBatchedMatMul.
func (d *Device) GemmStridedBatched(t GemmType, transA, transB bool, m, n, k int, alpha float32, A DevicePtr, lda int, strideA int64, B DevicePtr, ldb int, strideB int64, beta float32, C DevicePtr, ldc int, strideC int64, batch int) error {
	dt, err := t.cudaDataType()
	if err != nil {
		return err
	}
	if m < 0 || n < 0 || k < 0 || batch < 0 {
		return fmt.Errorf("cuda: GemmStridedBatched: negative size m=%d n=%d k=%d batch=%d", m, n, k, batch)
	}
	if m == 0 || n == 0 || batch == 0 {
		return nil
	}
	opA, opB := uintptr(0), uintptr(0) // CUBLAS_OP_N
	if transA {
		opA = 1 // CUBLAS_OP_T
	}
	if transB {
		opB = 1
	}
	err = d.do(func() error {
		api, h, err := d.cublas()
		if err != nil {
			return err
		}
		return api.check("cublasGemmStridedBatchedEx", ccall(api.cublasGemmStridedBatchedEx, h, opA, opB,
			uintptr(m), uintptr(n), uintptr(k),
			uintptr(unsafe.Pointer(&alpha)),
			uintptr(A), dt, uintptr(lda), uintptr(strideA),
			uintptr(B), dt, uintptr(ldb), uintptr(strideB),
			uintptr(unsafe.Pointer(&beta)),
			uintptr(C), dt, uintptr(ldc), uintptr(strideC),
			uintptr(batch), cublasCompute32F, cublasGemmDefault))
	})
	if err != nil {
		return fmt.Errorf("cuda: %s GEMM m=%d n=%d k=%d batch=%d transA=%v transB=%v: %w", t, m, n, k, batch, transA, transB, err)
	}
	return nil
}

// colMajorGemm is the argument list of one GemmStridedBatched call.
type colMajorGemm struct {
	transA, transB bool
	m, n, k        int
	A              DevicePtr
	lda            int
	strideA        int64
	B              DevicePtr
	ldb            int
	strideB        int64
	C              DevicePtr
	ldc            int
	strideC        int64
}

// rowMajorAsColMajor maps a row-major product onto cuBLAS. A row-major r×c matrix
// is, read column-major, its c×r transpose. So C = op(A)·op(B) (row-major, M×N) is
// computed as Cᵀ = op(B)ᵀ·op(A)ᵀ column-major: swap the operands and M with N, keep
// each operand's transpose flag, and take each leading dimension as the row length
// of the matrix as stored.
func rowMajorAsColMajor(transA, transB bool, m, n, k int, A DevicePtr, strideA int64, B DevicePtr, strideB int64, C DevicePtr, strideC int64) colMajorGemm {
	// cuBLAS wants every leading dimension ≥ 1, even for empty matrices.
	lda := max(1, k) // A stored M×K
	if transA {
		lda = max(1, m) // A stored K×M
	}
	ldb := max(1, n) // B stored K×N
	if transB {
		ldb = max(1, k) // B stored N×K
	}
	return colMajorGemm{
		transA: transB, transB: transA,
		m: n, n: m, k: k,
		A: B, lda: ldb, strideA: strideB,
		B: A, ldb: lda, strideB: strideA,
		C: C, ldc: max(1, n), strideC: strideC,
	}
}

// RowMajorBatchedMatMul computes, for b in [0, batch), on ROW-MAJOR dense buffers
//
//	C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]
//
// with op(A[b]) M×K, op(B[b]) K×N and C[b] M×N. A[b] is stored M×K, or K×M when
// transA; B[b] is stored K×N, or N×K when transB. Rows are dense (no padding);
// strides are in elements between consecutive batch entries (M*K, K*N, M*N for
// packed batches; 0 broadcasts one matrix to every entry).
func (d *Device) RowMajorBatchedMatMul(t GemmType, transA, transB bool, m, n, k int, alpha float32, A DevicePtr, strideA int64, B DevicePtr, strideB int64, beta float32, C DevicePtr, strideC int64, batch int) error {
	g := rowMajorAsColMajor(transA, transB, m, n, k, A, strideA, B, strideB, C, strideC)
	return d.GemmStridedBatched(t, g.transA, g.transB, g.m, g.n, g.k, alpha, g.A, g.lda, g.strideA, g.B, g.ldb, g.strideB, beta, g.C, g.ldc, g.strideC, batch)
}
