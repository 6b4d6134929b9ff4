package driver

// Tests that need no GPU: they run everywhere, including CI.

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/kernels"
)

func TestAvailableSaysWhatIsMissing(t *testing.T) {
	err := Available()
	if err == nil {
		t.Skip("a GPU is usable here; the missing-library path is covered by TestOpenLibraryNamesTheLibrary")
	}
	msg := err.Error()
	t.Logf("Available: %v", msg)
	if !strings.HasPrefix(msg, "cuda: ") {
		t.Errorf("error %q does not start with the package name", msg)
	}
	// Either a library is missing (named, with the names tried) or a call failed
	// (named, with the driver's own error name).
	named := regexp.MustCompile(`lib(cuda|nvrtc|cublas)\.so|cu[A-Z][A-Za-z]+(_v2)?: CUDA_ERROR_|no CUDA device`)
	if !named.MatchString(msg) {
		t.Errorf("error %q names neither a library nor a failing call", msg)
	}
	if err2 := Available(); err2 == nil || err2.Error() != msg {
		t.Errorf("second Available() = %v, want the same error", err2)
	}
	if _, err := Open(0); err == nil {
		t.Errorf("Open(0) succeeded although Available() failed")
	}
}

func TestOpenLibraryNamesTheLibrary(t *testing.T) {
	_, err := openLibrary("test library", "libflashgraph-missing.so.7", "libflashgraph-missing.so.6")
	if err == nil {
		t.Fatal("openLibrary of a missing library succeeded")
	}
	for _, want := range []string{"test library not found", "libflashgraph-missing.so.7", "libflashgraph-missing.so.6"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestErrorMessage(t *testing.T) {
	e := &Error{Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Desc: "out of memory"}
	if got, want := e.Error(), "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	e = &Error{Call: "nvrtcCompileProgram", Code: 6, Name: "NVRTC_ERROR_COMPILATION", Log: "x.cu(3): error: boom\n\x00"}
	if got, want := e.Error(), "nvrtcCompileProgram: NVRTC_ERROR_COMPILATION\nx.cu(3): error: boom"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestArchFor(t *testing.T) {
	for _, c := range []struct {
		major, minor int
		want         string
	}{{9, 0, "sm_90a"}, {8, 0, "sm_80"}, {8, 9, "sm_89"}, {10, 0, "sm_100a"}, {7, 5, "sm_75"}} {
		if got := archFor(c.major, c.minor); got != c.want {
			t.Errorf("archFor(%d, %d) = %q, want %q", c.major, c.minor, got, c.want)
		}
	}
}

func TestPackArgs(t *testing.T) {
	slots, err := packArgs([]any{DevicePtr(0xdeadbeef00), int32(-2), uint32(7), int64(-3), uint64(1 << 40), float32(1.5), float64(-0.25)})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{0xdeadbeef00, 0xfffffffe, 7, 0xfffffffffffffffd, 1 << 40, uint64(math.Float32bits(1.5)), math.Float64bits(-0.25)}
	if len(slots) != len(want) {
		t.Fatalf("got %d slots, want %d", len(slots), len(want))
	}
	for i := range want {
		if slots[i] != want[i] {
			t.Errorf("slot %d = %#x, want %#x", i, slots[i], want[i])
		}
	}
	if _, err := packArgs([]any{DevicePtr(1), 3}); err == nil || !strings.Contains(err.Error(), "argument 1 has type int") {
		t.Errorf("a Go int argument: got %v, want an error naming argument 1", err)
	}
	if s, err := packArgs(nil); err != nil || len(s) != 0 {
		t.Errorf("no arguments: got %v, %v", s, err)
	}
}

func TestCacheKey(t *testing.T) {
	base := cacheKey("src", []string{"-a", "-b"}, "sm_90a", "13.0")
	if base != cacheKey("src", []string{"-a", "-b"}, "sm_90a", "13.0") {
		t.Fatal("cacheKey is not deterministic")
	}
	for name, k := range map[string]string{
		"source":     cacheKey("src ", []string{"-a", "-b"}, "sm_90a", "13.0"),
		"options":    cacheKey("src", []string{"-a"}, "sm_90a", "13.0"),
		"split":      cacheKey("src", []string{"-a-b"}, "sm_90a", "13.0"),
		"arch":       cacheKey("src", []string{"-a", "-b"}, "sm_90", "13.0"),
		"version":    cacheKey("src", []string{"-a", "-b"}, "sm_90a", "12.8"),
		"option set": cacheKey("src", []string{"-b", "-a"}, "sm_90a", "13.0"),
	} {
		if k == base {
			t.Errorf("changing the %s does not change the key", name)
		}
	}
}

func TestCacheReadWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b") // created on first write
	if readCache(dir, "k") != nil {
		t.Fatal("empty cache returned data")
	}
	writeCache(dir, "k", []byte("cubin"))
	if got := readCache(dir, "k"); string(got) != "cubin" {
		t.Fatalf("readCache = %q, want %q", got, "cubin")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("cache dir holds %d files, want 1 (no temporary files left)", len(entries))
	}
	// An unwritable cache must be silently skipped, not fail the compile.
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	writeCache(filepath.Join(file, "sub"), "k", []byte("x"))
	writeCache("", "k", []byte("x"))
	if readCache("", "k") != nil {
		t.Error("disabled cache returned data")
	}
}

func TestDefaultCacheDir(t *testing.T) {
	t.Setenv("FLASHGRAPH_CUBIN_CACHE", "off")
	if d := defaultCacheDir(); d != "" {
		t.Errorf("FLASHGRAPH_CUBIN_CACHE=off gives %q", d)
	}
	t.Setenv("FLASHGRAPH_CUBIN_CACHE", "/tmp/x")
	if d := defaultCacheDir(); d != "/tmp/x" {
		t.Errorf("FLASHGRAPH_CUBIN_CACHE=/tmp/x gives %q", d)
	}
	t.Setenv("FLASHGRAPH_CUBIN_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "/tmp/xdg")
	if d := defaultCacheDir(); d != "/tmp/xdg/flashgraph/cubin" {
		t.Errorf("default cache dir = %q", d)
	}
}

// TestNVRTCWithoutGPU compiles with NVRTC where it is installed: NVRTC needs no GPU.
func TestNVRTCWithoutGPU(t *testing.T) {
	nv, err := loadNVRTC()
	if err != nil {
		t.Skip(err)
	}
	arch := "sm_80"
	if !strings.HasPrefix(nv.version, "11.") {
		arch = "sm_90a"
	}
	t.Logf("NVRTC %s from %s, target %s", nv.version, nv.lib.name, arch)
	src, err := kernels.Source("util.cu")
	if err != nil {
		t.Fatal(err)
	}
	cubin, _, err := nv.compile("util.cu", src, compileOptions(arch, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(cubin, []byte("\x7fELF")) {
		t.Errorf("cubin does not start with the ELF magic: % x", cubin[:min(8, len(cubin))])
	}
	for _, k := range []string{"fill_f32", "axpy_f32"} {
		if !bytes.Contains(cubin, []byte(k)) {
			t.Errorf("cubin has no symbol %s", k)
		}
	}
	_, _, err = nv.compile("broken.cu", brokenKernel, compileOptions(arch, nil))
	checkBrokenKernelError(t, err)
}

const brokenKernel = `extern "C" __global__ void broken(float* x) {
    x[0] = flashgraph_undefined_identifier;
}
`

func checkBrokenKernelError(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("compiling a broken kernel succeeded")
	}
	t.Logf("broken kernel: %v", err)
	for _, want := range []string{"nvrtcCompileProgram", "NVRTC_ERROR_COMPILATION", "broken.cu", "flashgraph_undefined_identifier", "undefined"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q", want)
		}
	}
}

// colMajorGemmHost is cuBLAS's GEMM definition, executed on the host over a flat
// float64 "memory" in which a DevicePtr is an element index.
func colMajorGemmHost(mem []float64, g colMajorGemm, alpha, beta float64, batch int) {
	at := func(p DevicePtr, ld, i, j int, b int, stride int64) int {
		return int(p) + int(stride)*b + i + j*ld
	}
	for b := range batch {
		for i := range g.m {
			for j := range g.n {
				var s float64
				for l := range g.k {
					var a, bb float64
					if g.transA {
						a = mem[at(g.A, g.lda, l, i, b, g.strideA)]
					} else {
						a = mem[at(g.A, g.lda, i, l, b, g.strideA)]
					}
					if g.transB {
						bb = mem[at(g.B, g.ldb, j, l, b, g.strideB)]
					} else {
						bb = mem[at(g.B, g.ldb, l, j, b, g.strideB)]
					}
					s += a * bb
				}
				c := at(g.C, g.ldc, i, j, b, g.strideC)
				mem[c] = alpha*s + beta*mem[c]
			}
		}
	}
}

// rowMajorMatMulRef is the definition RowMajorBatchedMatMul promises.
func rowMajorMatMulRef(transA, transB bool, m, n, k int, alpha float64, A []float64, strideA int, B []float64, strideB int, beta float64, C []float64, strideC int, batch int) {
	for b := range batch {
		for i := range m {
			for j := range n {
				var s float64
				for l := range k {
					var a, bb float64
					if transA {
						a = A[b*strideA+l*m+i]
					} else {
						a = A[b*strideA+i*k+l]
					}
					if transB {
						bb = B[b*strideB+j*k+l]
					} else {
						bb = B[b*strideB+l*n+j]
					}
					s += a * bb
				}
				C[b*strideC+i*n+j] = alpha*s + beta*C[b*strideC+i*n+j]
			}
		}
	}
}

// TestRowMajorMapping checks the row-major to column-major argument mapping
// against both definitions, on the host, for every transpose combination and for
// a broadcast (stride 0) operand.
func TestRowMajorMapping(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const m, n, k, batch = 3, 5, 4, 2
	for _, transA := range []bool{false, true} {
		for _, transB := range []bool{false, true} {
			for _, broadcastB := range []bool{false, true} {
				strideA, strideB, strideC := m*k, k*n, m*n
				if broadcastB {
					strideB = 0
				}
				A := randSlice(r, strideA*batch)
				B := randSlice(r, k*n*batch)
				C := randSlice(r, strideC*batch)
				// Lay A, B, C out in one "memory" at offsets 0, 100, 200.
				mem := make([]float64, 300)
				copy(mem[0:], A)
				copy(mem[100:], B)
				copy(mem[200:], C)
				g := rowMajorAsColMajor(transA, transB, m, n, k, 0, int64(strideA), 100, int64(strideB), 200, int64(strideC))
				colMajorGemmHost(mem, g, 0.5, -2, batch)
				want := append([]float64(nil), C...)
				rowMajorMatMulRef(transA, transB, m, n, k, 0.5, A, strideA, B, strideB, -2, want, strideC, batch)
				for i := range want {
					if math.Abs(mem[200+i]-want[i]) > 1e-12 {
						t.Fatalf("transA=%v transB=%v broadcastB=%v: C[%d] = %v, want %v", transA, transB, broadcastB, i, mem[200+i], want[i])
					}
				}
			}
		}
	}
}

func randSlice(r *rand.Rand, n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = r.Float64()*2 - 1
	}
	return s
}

// TestKernelsCompileEveryArch compiles each kernel file that runs on more
// than one GPU generation for Ampere, Ada and Hopper with NVRTC where it is
// installed (no GPU needed): an intrinsic that exists on one architecture
// only (float2 atomicAdd is sm_90's) fails here rather than on a user's
// A100. Skipped without NVRTC 12 or without the toolkit's headers.
func TestKernelsCompileEveryArch(t *testing.T) {
	nv, err := loadNVRTC()
	if err != nil {
		t.Skip(err)
	}
	if strings.HasPrefix(nv.version, "11.") {
		t.Skipf("NVRTC %s cannot target sm_90a", nv.version)
	}
	inc := includeDir()
	if _, err := os.Stat(filepath.Join(inc, "cuda_bf16.h")); inc == "" || err != nil {
		t.Skipf("no CUDA headers (cuda_bf16.h) under %q: set CUDA_HOME", inc)
	}
	for _, file := range []string{"util.cu", "ops.cu", "flash_attention.cu"} {
		src, err := kernels.Source(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, arch := range []string{"sm_80", "sm_86", "sm_89", "sm_90a"} {
			if _, _, err := nv.compile(file, src, compileOptions(arch, nil)); err != nil {
				t.Errorf("%s for %s: %v", file, arch, err)
			}
		}
	}
}

func TestCublasWorkspaceSize(t *testing.T) {
	for _, c := range []struct {
		env  string
		want int
		bad  bool
	}{{"", 32 << 20, false}, {"0", 0, false}, {"4", 4 << 20, false}, {"-1", 0, true}, {"lots", 0, true}, {"5000", 0, true}} {
		t.Setenv("FLASHGRAPH_CUBLAS_WORKSPACE_MIB", c.env)
		got, err := cublasWorkspaceSize()
		if c.bad {
			if err == nil || !strings.Contains(err.Error(), "FLASHGRAPH_CUBLAS_WORKSPACE_MIB") {
				t.Errorf("%q: %d, %v; want an error naming the variable", c.env, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %d, %v; want %d", c.env, got, err, c.want)
		}
	}
}
