package driver

// Tests that need a GPU. Without one they skip with the reason Available gives.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"
	"github.com/flashgraph/flashgraph/graph"
)

// The shared test device of this package's GPU tests. Without a GPU the
// tests skip with the reason Available gives.
var testGPU cudatest.Device[*Device]

func TestMain(m *testing.M) { testGPU.Main(m, Available, Open) }

// gpu returns the shared test device or skips the test with the reason.
func gpu(t testing.TB) *Device {
	t.Helper()
	return testGPU.Get(t)
}

// utilModule compiles kernels/util.cu into a fresh cache directory.
func utilModule(t *testing.T, d *Device) *Module {
	t.Helper()
	d.SetCubinCacheDir(t.TempDir())
	m, err := d.CompileFile("util.cu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Unload(); err != nil {
			t.Error(err)
		}
	})
	return m
}

func function(t *testing.T, m *Module, name string) *Function {
	t.Helper()
	f, err := m.Function(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestDeviceInfo(t *testing.T) {
	d := gpu(t)
	free, total, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	major, minor := d.ComputeCapability()
	t.Logf("%s: cc %d.%d, arch %s, %d SMs, %d KiB opt-in smem/block, driver %d, %.1f/%.1f GiB free",
		d.Name(), major, minor, d.Arch(), d.SMCount(), d.MaxSharedMemoryPerBlockOptin()>>10, d.DriverVersion(),
		float64(free)/(1<<30), float64(total)/(1<<30))
	if d.Name() == "" || d.SMCount() <= 0 || total == 0 || free > total || d.MaxSharedMemoryPerBlockOptin() < 48<<10 {
		t.Errorf("implausible device info")
	}
	if !regexp.MustCompile(`^sm_\d+a?$`).MatchString(d.Arch()) {
		t.Errorf("Arch() = %q", d.Arch())
	}
	nv, _ := loadNVRTC()
	cb, _ := loadCublas()
	t.Logf("libraries: %s, %s (NVRTC %s), %s", d.api.lib.name, nv.lib.name, nv.version, cb.lib.name)
}

func TestCopyRoundTrip(t *testing.T) {
	d := gpu(t)
	r := rand.New(rand.NewPCG(3, 4))
	const n = 1<<20 + 3 // not a multiple of anything convenient
	src := make([]float32, n)
	for i := range src {
		src[i] = r.Float32()*2 - 1
	}
	a, err := Upload(d, src)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(a)
	b, err := d.Alloc(n * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(b)
	if err := d.CopyDeviceToDevice(b, a, n*4); err != nil {
		t.Fatal(err)
	}
	// Zero a window in the middle: checks Memset and DevicePtr.Offset.
	const lo, hi = 1000, 5000
	if err := d.Memset(b.Offset(lo*4), 0, (hi-lo)*4); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := Download(d, b, got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		want := src[i]
		if i >= lo && i < hi {
			want = 0
		}
		if math.Float32bits(got[i]) != math.Float32bits(want) {
			t.Fatalf("element %d: got %v, want %v", i, got[i], want)
		}
	}
	// Other element types travel byte for byte too.
	u16 := []uint16{1, 0xffff, 0x3f80, 7}
	p, err := Upload(d, u16)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	back := make([]uint16, len(u16))
	if err := Download(d, p, back); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(back) != fmt.Sprint(u16) {
		t.Errorf("uint16 round trip: got %v, want %v", back, u16)
	}
	// Empty buffers are allowed and need no special case.
	if p, err := Upload(d, []float64{}); err != nil || p != 0 {
		t.Errorf("empty Upload = %v, %v", p, err)
	}
}

func TestCompileAndLaunch(t *testing.T) {
	d := gpu(t)
	m := utilModule(t, d)
	fill := function(t, m, "fill_f32")
	axpy := function(t, m, "axpy_f32")

	// fill_f32 writes exactly n elements: poison a longer buffer with NaN bits
	// (0xffffffff) and check that the tail keeps them. A small grid exercises the
	// grid-stride loop.
	const n, pad = 100003, 77
	buf, err := d.Alloc((n + pad) * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(buf)
	if err := d.Memset(buf, 0xff, (n+pad)*4); err != nil {
		t.Fatal(err)
	}
	if err := d.Launch(fill, [3]uint32{7, 1, 1}, [3]uint32{128, 1, 1}, 0, buf, int64(n), float32(3.5)); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n+pad)
	if err := Download(d, buf, got); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if i < n && v != 3.5 {
			t.Fatalf("fill: element %d = %v, want 3.5", i, v)
		}
		if i >= n && math.Float32bits(v) != 0xffffffff {
			t.Fatalf("fill wrote past n: element %d = %#x", i, math.Float32bits(v))
		}
	}

	// axpy on values whose results are exact in float32, so fused or not, the
	// answer has one correct value.
	x := make([]float32, n)
	y := make([]float32, n)
	for i := range x {
		x[i] = float32(i%1000 - 500)
		y[i] = float32(3 * (i % 7))
	}
	px, err := Upload(d, x)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(px)
	py, err := Upload(d, y)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(py)
	if err := d.Launch(axpy, [3]uint32{Grid1D(n, 256), 1, 1}, [3]uint32{256, 1, 1}, 0, py, px, float32(0.25), int32(n)); err != nil {
		t.Fatal(err)
	}
	if err := Download(d, py, got[:n]); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if want := 0.25*x[i] + y[i]; got[i] != want {
			t.Fatalf("axpy: element %d = %v, want %v", i, got[i], want)
		}
	}
	a, err := axpy.Attributes()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("axpy_f32: %+v", a)
	if a.NumRegs <= 0 || a.MaxThreadsPerBlock <= 0 || a.LocalBytes != 0 {
		t.Errorf("implausible attributes %+v", a)
	}
}

func TestCompileCache(t *testing.T) {
	d := gpu(t)
	dir := t.TempDir()
	d.SetCubinCacheDir(dir)
	src := `extern "C" __global__ void set_i32(int* p, int v) { p[threadIdx.x] = v + threadIdx.x; }`
	m1, err := d.Compile("cache_test.cu", src, "-lineinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Unload()
	if m1.FromCache() {
		t.Fatal("first compile into an empty cache came from the cache")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.cubin"))
	if len(files) != 1 {
		t.Fatalf("cache holds %v, want one cubin", files)
	}
	m2, err := d.Compile("cache_test.cu", src, "-lineinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Unload()
	if !m2.FromCache() {
		t.Fatal("second compile of the same source did not hit the cache")
	}
	checkSetI32(t, d, m2, 40)
	// Other options are another cubin.
	m3, err := d.Compile("cache_test.cu", src)
	if err != nil {
		t.Fatal(err)
	}
	defer m3.Unload()
	if m3.FromCache() {
		t.Error("compile with other options hit the cache")
	}
	// A corrupt cache entry is recompiled and replaced.
	if err := os.WriteFile(files[0], []byte("not a cubin"), 0o644); err != nil {
		t.Fatal(err)
	}
	m4, err := d.Compile("cache_test.cu", src, "-lineinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer m4.Unload()
	if m4.FromCache() {
		t.Error("a corrupt cache entry was used")
	}
	checkSetI32(t, d, m4, -5)
	if b, _ := os.ReadFile(files[0]); string(b) == "not a cubin" {
		t.Error("the corrupt cache entry was not replaced")
	}
}

func checkSetI32(t *testing.T, d *Device, m *Module, v int32) {
	t.Helper()
	f := function(t, m, "set_i32")
	p, err := d.Alloc(32 * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	if err := d.Launch(f, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, p, v); err != nil {
		t.Fatal(err)
	}
	got := make([]int32, 32)
	if err := Download(d, p, got); err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		if g != v+int32(i) {
			t.Fatalf("set_i32: element %d = %d, want %d", i, g, v+int32(i))
		}
	}
}

func TestCompileErrorCarriesLog(t *testing.T) {
	d := gpu(t)
	d.SetCubinCacheDir(t.TempDir())
	_, err := d.Compile("broken.cu", brokenKernel)
	checkBrokenKernelError(t, err)
	if !strings.Contains(err.Error(), d.Arch()) {
		t.Errorf("error does not name the target %s", d.Arch())
	}
}

func TestLaunchErrors(t *testing.T) {
	d := gpu(t)
	m := utilModule(t, d)
	fill := function(t, m, "fill_f32")
	if err := d.Launch(fill, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, DevicePtr(0), 5, float32(1)); err == nil || !strings.Contains(err.Error(), "type int") {
		t.Errorf("Go int argument: got %v", err)
	}
	if err := d.Launch(fill, [3]uint32{0, 1, 1}, [3]uint32{32, 1, 1}, 0, DevicePtr(0), int64(0), float32(1)); err == nil {
		t.Error("zero grid dimension accepted")
	}
	// 2048 threads per block is over every GPU's limit: the driver refuses it, and
	// the error names the call and the driver's error.
	err := d.Launch(fill, [3]uint32{1, 1, 1}, [3]uint32{2048, 1, 1}, 0, DevicePtr(0), int64(0), float32(1))
	t.Logf("oversized block: %v", err)
	if err == nil || !strings.Contains(err.Error(), "cuLaunchKernel: CUDA_ERROR_INVALID_VALUE") {
		t.Errorf("oversized block: got %v, want cuLaunchKernel: CUDA_ERROR_INVALID_VALUE", err)
	}
	if _, err := m.Function("no_such_kernel"); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_NOT_FOUND") {
		t.Errorf("missing kernel: got %v", err)
	}
	if err := d.Synchronize(); err != nil {
		t.Errorf("the device is unusable after refused launches: %v", err)
	}
}

func TestDynamicSharedMemory(t *testing.T) {
	d := gpu(t)
	d.SetCubinCacheDir(t.TempDir())
	src := `extern "C" __global__ void smem_sum(float* out, int n) {
    extern __shared__ float s[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = (float)i;
    __syncthreads();
    if (threadIdx.x == 0) { float t = 0; for (int i = 0; i < n; i++) t += s[i]; out[0] = t; }
}`
	m, err := d.Compile("smem.cu", src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	f := function(t, m, "smem_sum")
	const smem = 100 << 10
	const n = smem / 4
	out, err := d.Alloc(4)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(out)
	if err := d.Launch(f, [3]uint32{1, 1, 1}, [3]uint32{256, 1, 1}, smem, out, int32(n)); err == nil {
		t.Error("100 KiB of dynamic shared memory launched without opting in")
	}
	if err := f.SetMaxDynamicSharedMemory(smem); err != nil {
		t.Fatal(err)
	}
	if a, err := f.Attributes(); err != nil || a.MaxDynamicShared != smem {
		t.Errorf("Attributes = %+v, %v; want MaxDynamicShared %d", a, err, smem)
	}
	if err := d.Launch(f, [3]uint32{1, 1, 1}, [3]uint32{256, 1, 1}, smem, out, int32(n)); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 1)
	if err := Download(d, out, got); err != nil {
		t.Fatal(err)
	}
	// The sum of 0..n-1 is exact in float32 only for small n; compare with the same
	// sequential float32 sum.
	var want float32
	for i := range n {
		want += float32(i)
	}
	if got[0] != want {
		t.Errorf("smem_sum = %v, want %v", got[0], want)
	}
}

// gammaBound is the rounding-error bound of a length-n dot product in a format with
// unit roundoff u: |computed - exact| <= gamma_n * sum |a_i b_i|.
func gammaBound(n int, u float64) float64 { return float64(n) * u / (1 - float64(n)*u) }

type gemmCase struct {
	transA, transB bool
	m, n, k, batch int
	alpha, beta    float32
	broadcastB     bool
}

// runRowMajorGemm runs RowMajorBatchedMatMul on random data of type typ and
// compares with a float64 reference computed from the very values the GPU saw
// (after rounding to typ). The tolerance is the rigorous bound for float32
// accumulation, with u = 2^-23 rather than 2^-24 because tensor cores may
// truncate instead of rounding, plus the rounding of the output to typ.
func runRowMajorGemm(t *testing.T, d *Device, typ GemmType, c gemmCase, r *rand.Rand) {
	t.Helper()
	round := func(v float64) float64 { return float64(float32(v)) }
	uOut := math.Ldexp(1, -24)
	switch typ {
	case GemmBF16:
		round = func(v float64) float64 { return float64(graph.BF16ToFloat32(graph.BF16FromFloat32(float32(v)))) }
		uOut = math.Ldexp(1, -8)
	case GemmF16:
		round = func(v float64) float64 { return float64(graph.F16ToFloat32(graph.F16FromFloat32(float32(v)))) }
		uOut = math.Ldexp(1, -11)
	}
	strideA, strideB, strideC := c.m*c.k, c.k*c.n, c.m*c.n
	if c.broadcastB {
		strideB = 0
	}
	gen := func(n int) []float64 {
		s := make([]float64, n)
		for i := range s {
			s[i] = round(r.Float64()*2 - 1)
		}
		return s
	}
	nB := strideB * c.batch
	if c.broadcastB {
		nB = c.k * c.n // one matrix serves every batch entry
	}
	A, B, C := gen(strideA*c.batch), gen(nB), gen(strideC*c.batch)
	upload := func(s []float64) DevicePtr {
		var p DevicePtr
		var err error
		if typ == GemmF32 {
			v := make([]float32, len(s))
			for i, x := range s {
				v[i] = float32(x)
			}
			p, err = Upload(d, v)
		} else {
			v := make([]uint16, len(s))
			for i, x := range s {
				if typ == GemmBF16 {
					v[i] = graph.BF16FromFloat32(float32(x))
				} else {
					v[i] = graph.F16FromFloat32(float32(x))
				}
			}
			p, err = Upload(d, v)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Free(p) })
		return p
	}
	pA, pB, pC := upload(A), upload(B), upload(C)
	if err := d.RowMajorBatchedMatMul(typ, c.transA, c.transB, c.m, c.n, c.k, c.alpha, pA, int64(strideA), pB, int64(strideB), c.beta, pC, int64(strideC), c.batch); err != nil {
		t.Fatal(err)
	}
	got := make([]float64, len(C))
	if typ == GemmF32 {
		v := make([]float32, len(C))
		if err := Download(d, pC, v); err != nil {
			t.Fatal(err)
		}
		for i, x := range v {
			got[i] = float64(x)
		}
	} else {
		v := make([]uint16, len(C))
		if err := Download(d, pC, v); err != nil {
			t.Fatal(err)
		}
		for i, x := range v {
			if typ == GemmBF16 {
				got[i] = float64(graph.BF16ToFloat32(x))
			} else {
				got[i] = float64(graph.F16ToFloat32(x))
			}
		}
	}
	// Reference and the magnitude sum that scales the accumulation bound.
	ref := append([]float64(nil), C...)
	rowMajorMatMulRef(c.transA, c.transB, c.m, c.n, c.k, float64(c.alpha), A, strideA, B, strideB, float64(c.beta), ref, strideC, c.batch)
	absA, absB := make([]float64, len(A)), make([]float64, len(B))
	for i := range A {
		absA[i] = math.Abs(A[i])
	}
	for i := range B {
		absB[i] = math.Abs(B[i])
	}
	mag := make([]float64, len(C))
	for i := range C {
		mag[i] = math.Abs(C[i])
	}
	rowMajorMatMulRef(c.transA, c.transB, c.m, c.n, c.k, math.Abs(float64(c.alpha)), absA, strideA, absB, strideB, math.Abs(float64(c.beta)), mag, strideC, c.batch)
	gamma := gammaBound(c.k+2, math.Ldexp(1, -23))
	worst := 0.0
	for i := range ref {
		tol := gamma*mag[i]*(1+uOut) + uOut*math.Abs(ref[i])
		e := math.Abs(got[i] - ref[i])
		if !(e <= tol) { // also catches NaN
			t.Fatalf("%s %+v: C[%d] = %v, want %v (|err| %.3g > tol %.3g)", typ, c, i, got[i], ref[i], e, tol)
		}
		worst = max(worst, e/tol)
	}
	t.Logf("%s %+v: worst |err|/tol = %.3f", typ, c, worst)
}

func TestGemm(t *testing.T) {
	d := gpu(t)
	r := rand.New(rand.NewPCG(5, 6))
	for _, typ := range []GemmType{GemmF32, GemmBF16, GemmF16} {
		for _, transA := range []bool{false, true} {
			for _, transB := range []bool{false, true} {
				runRowMajorGemm(t, d, typ, gemmCase{transA, transB, 37, 53, 129, 3, 1, 0, false}, r)
			}
		}
		runRowMajorGemm(t, d, typ, gemmCase{false, true, 64, 96, 256, 4, 0.5, -1, false}, r)
		runRowMajorGemm(t, d, typ, gemmCase{true, false, 33, 17, 300, 2, 1, 0.5, true}, r)
	}
}

// TestGemmColumnMajor calls GemmStridedBatched directly with padded leading
// dimensions, to pin down the documented column-major convention.
func TestGemmColumnMajor(t *testing.T) {
	d := gpu(t)
	const m, n, k, lda, ldb, ldc = 3, 2, 4, 5, 6, 4
	A := make([]float32, lda*k) // m×k with lda
	B := make([]float32, ldb*n) // k×n with ldb
	C := make([]float32, ldc*n)
	for i := range A {
		A[i] = float32(i%7) - 3
	}
	for i := range B {
		B[i] = float32(i%5) - 2
	}
	for i := range C {
		C[i] = 100 // rows past m must keep it
	}
	pA, _ := Upload(d, A)
	pB, _ := Upload(d, B)
	pC, err := Upload(d, C)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(pA)
	defer d.Free(pB)
	defer d.Free(pC)
	if err := d.GemmStridedBatched(GemmF32, false, false, m, n, k, 1, pA, lda, 0, pB, ldb, 0, 0, pC, ldc, 0, 1); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(C))
	if err := Download(d, pC, got); err != nil {
		t.Fatal(err)
	}
	for j := range n {
		for i := range ldc {
			want := float32(100)
			if i < m {
				want = 0
				for l := range k {
					want += A[i+l*lda] * B[l+j*ldb] // small integers: exact
				}
			}
			if got[i+j*ldc] != want {
				t.Errorf("C(%d,%d) = %v, want %v", i, j, got[i+j*ldc], want)
			}
		}
	}
	// cuBLAS refuses lda < m, and the error names the call and the status.
	err = d.GemmStridedBatched(GemmF32, false, false, m, n, k, 1, pA, 1, 0, pB, ldb, 0, 0, pC, ldc, 0, 1)
	if err == nil || !strings.Contains(err.Error(), "cublasGemmStridedBatchedEx: CUBLAS_STATUS_INVALID_VALUE") {
		t.Errorf("lda < m: got %v", err)
	}
}

func TestEventsTime(t *testing.T) {
	d := gpu(t)
	fill := function(t, utilModule(t, d), "fill_f32")
	const n = 1 << 28 // 1 GiB of float32
	buf, err := d.Alloc(n * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(buf)
	start, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer start.Destroy()
	end, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer end.Destroy()
	grid := [3]uint32{uint32(d.SMCount() * 8), 1, 1}
	launch := func() {
		if err := d.Launch(fill, grid, [3]uint32{256, 1, 1}, 0, buf, int64(n), float32(1)); err != nil {
			t.Fatal(err)
		}
	}
	launch() // warm-up
	const reps = 10
	if err := d.Record(start); err != nil {
		t.Fatal(err)
	}
	for range reps {
		launch()
	}
	if err := d.Record(end); err != nil {
		t.Fatal(err)
	}
	ms, err := d.ElapsedMs(start, end)
	if err != nil {
		t.Fatal(err)
	}
	gbps := float64(reps) * n * 4 / (float64(ms) / 1e3) / 1e9
	t.Logf("%d fills of 1 GiB: %.3f ms, %.0f GB/s", reps, ms, gbps)
	// Writing 10 GiB takes real time; no GPU writes faster than ~10 TB/s.
	if !(ms > 0) || gbps > 10000 {
		t.Errorf("implausible timing: %v ms (%.0f GB/s)", ms, gbps)
	}
}

func TestMemoryIsFreed(t *testing.T) {
	d := gpu(t)
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	free0, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 30
	var ptrs []DevicePtr
	for range 2 {
		p, err := d.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		ptrs = append(ptrs, p)
	}
	free1, _, _ := d.MemInfo()
	if free0-free1 < 2*size {
		t.Errorf("two 1 GiB allocations lowered free memory by only %d MiB", (free0-free1)>>20)
	}
	for _, p := range ptrs {
		if err := d.Free(p); err != nil {
			t.Fatal(err)
		}
	}
	// Repeated upload/download/free, module load/unload and event churn leak nothing.
	for range 20 {
		p, err := Upload(d, make([]float32, 16<<20))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			t.Fatal(err)
		}
		e, err := d.NewEvent()
		if err != nil {
			t.Fatal(err)
		}
		e.Destroy()
	}
	free2, _, _ := d.MemInfo()
	const slack = 16 << 20
	t.Logf("free: %d MiB before, %d MiB with 2 GiB allocated, %d MiB after freeing", free0>>20, free1>>20, free2>>20)
	if free2+slack < free0 {
		t.Errorf("free memory did not come back: %d MiB before, %d MiB after", free0>>20, free2>>20)
	}
}

// The ledger behind AllocatedBytes follows Alloc and Free on the device:
// live bytes, their peak, the reset, and a pointer the ledger never saw
// (allocated around it), which Free still frees.
func TestAllocatedBytes(t *testing.T) {
	d := gpu(t)
	base := d.ResetPeakAllocated()
	if base != d.AllocatedBytes() || d.PeakAllocatedBytes() != base {
		t.Fatalf("after reset: live %d peak %d, want both %d", d.AllocatedBytes(), d.PeakAllocatedBytes(), base)
	}
	a, err := d.Alloc(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.AllocatedBytes()-base, int64(3<<20+1000); got != want {
		t.Errorf("two allocations: %d bytes live over the base, want %d", got, want)
	}
	if err := d.Free(a); err != nil {
		t.Fatal(err)
	}
	if got, want := d.AllocatedBytes()-base, int64(1000); got != want {
		t.Errorf("after one free: %d bytes live over the base, want %d", got, want)
	}
	if got, want := d.PeakAllocatedBytes()-base, int64(3<<20+1000); got != want {
		t.Errorf("peak %d over the base, want %d", got, want)
	}
	if live := d.ResetPeakAllocated(); live != base+1000 || d.PeakAllocatedBytes() != live {
		t.Errorf("second reset: returned %d, peak %d; want both %d", live, d.PeakAllocatedBytes(), base+1000)
	}
	var raw DevicePtr
	if err := d.do(func() error {
		return d.api.check("cuMemAlloc_v2", ccall(d.api.cuMemAlloc, uintptr(unsafe.Pointer(&raw)), 4096))
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(raw); err != nil {
		t.Errorf("Free of a pointer the ledger never saw: %v", err)
	}
	if err := d.Free(b); err != nil {
		t.Fatal(err)
	}
	if got := d.AllocatedBytes(); got != base {
		t.Errorf("everything freed: %d bytes live, want the base %d", got, base)
	}
}

func TestConcurrentCallers(t *testing.T) {
	d := gpu(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := make([]int32, 4096)
			for i := range src {
				src[i] = int32(g*100000 + i)
			}
			for range 20 {
				p, err := Upload(d, src)
				if err != nil {
					errs <- err
					return
				}
				got := make([]int32, len(src))
				err = Download(d, p, got)
				d.Free(p)
				if err != nil {
					errs <- err
					return
				}
				for i := range got {
					if got[i] != src[i] {
						errs <- fmt.Errorf("goroutine %d: element %d = %d, want %d", g, i, got[i], src[i])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestSecondDeviceAndClose(t *testing.T) {
	d := gpu(t)
	d2, err := Open(d.Ordinal())
	if err != nil {
		t.Fatal(err)
	}
	p, err := d2.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.Free(p); err != nil {
		t.Fatal(err)
	}
	if err := d2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d2.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := d2.Alloc(16); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Alloc after Close: got %v", err)
	}
	// The shared primary context is still held by d.
	var x [4]float32
	p, err = d.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	if err := d.CopyToDevice(p, unsafe.Pointer(&x[0]), 16); err != nil {
		t.Errorf("first device unusable after closing the second: %v", err)
	}
	if _, err := Open(1 << 20); err == nil {
		t.Error("Open of a nonexistent ordinal succeeded")
	}
}
