package driver

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/flashgraph/flashgraph/graph"
)

// CPU tests of the cuBLASLt path (no GPU needed), then GPU tests that skip
// without one.

// TestCublasLtHeuristicResultLayout pins cublasLtHeuristicResult to
// cublasLtMatmulHeuristicResult_t of cublasLt.h: algo (uint64_t data[8]) at
// 0, size_t workspaceSize at 64, cublasStatus_t state at 72, float
// wavesCount at 76, int reserved[4] at 80, 96 bytes in all. The heuristic
// writes an array of them, so a wrong size would misread every result
// after the first.
func TestCublasLtHeuristicResultLayout(t *testing.T) {
	var r cublasLtHeuristicResult
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(cublasLtMatmulAlgo_t)", unsafe.Sizeof(r.algo), 64},
		{"sizeof(cublasLtMatmulHeuristicResult_t)", unsafe.Sizeof(r), 96},
		{"offsetof(algo)", unsafe.Offsetof(r.algo), 0},
		{"offsetof(workspaceSize)", unsafe.Offsetof(r.workspaceSize), 64},
		{"offsetof(state)", unsafe.Offsetof(r.state), 72},
		{"offsetof(wavesCount)", unsafe.Offsetof(r.wavesCount), 76},
		{"offsetof(reserved)", unsafe.Offsetof(r.reserved), 80},
		{"sizeof(reserved)", unsafe.Sizeof(r.reserved), 16},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
	var arr [2]cublasLtHeuristicResult
	if d := uintptr(unsafe.Pointer(&arr[1])) - uintptr(unsafe.Pointer(&arr[0])); d != 96 {
		t.Errorf("array stride %d, want 96", d)
	}
}

func TestGemmAlign(t *testing.T) {
	for _, c := range []struct {
		p      DevicePtr
		stride int64
		batch  int
		want   int
	}{
		{0x7f0000000000, 0, 1, 256},
		{0x7f0000000100, 1 << 20, 4, 256},
		{0x7f0000000040, 0, 1, 64},
		{0x7f0000000002, 0, 1, 2},
		{0x7f0000000000, 2 * 37 * 129, 3, 2},   // odd element stride of bf16: entry 1 is 2-byte aligned
		{0x7f0000000000, 2 * 37 * 129, 1, 256}, // one entry: the stride is never used
		{0x7f0000000000, 0, 8, 256},            // broadcast: every entry is the same matrix
		{0x7f0000000010, 96, 2, 16},
	} {
		if got := gemmAlign(c.p, c.stride, c.batch); got != c.want {
			t.Errorf("gemmAlign(%#x, %d, %d) = %d, want %d", uint64(c.p), c.stride, c.batch, got, c.want)
		}
	}
}

// TestGemmKey: one key per shape, beta flag and operand alignment, so the
// gpt2 step's repeated GEMMs share a plan and a GEMM on a less aligned
// slice gets its own.
func TestGemmKey(t *testing.T) {
	const base = DevicePtr(0x7f0000000000)
	s := GemmShape{Type: GemmBF16, M: 8192, N: 2304, K: 768, Batch: 1}
	k := gemmKeyOf(s, base, base+1<<24, base+1<<26)
	if k.alignA != 256 || k.alignB != 256 || k.alignC != 256 {
		t.Errorf("aligned buffers: key %v", k)
	}
	if k2 := gemmKeyOf(s, base+1<<28, base+1<<29, base+1<<30); k2 != k {
		t.Errorf("same shape on other aligned buffers: key %v, want %v", k2, k)
	}
	other := []GemmShape{s, s, s, s, s}
	other[0].TransB = true
	other[1].Beta = true
	other[2].Type = GemmF16
	other[3].N = 768
	other[4].Batch, other[4].StrideA, other[4].StrideC = 2, 8192*768, 8192*2304
	for _, o := range other {
		if ko := gemmKeyOf(o, base, base+1<<24, base+1<<26); ko == k {
			t.Errorf("%v has the key of %v", o, s)
		}
	}
	if ku := gemmKeyOf(s, base+32, base+1<<24, base+1<<26); ku == k || ku.alignA != 32 {
		t.Errorf("A at a 32-byte offset: key %v", ku)
	}
	if !strings.Contains(k.String(), "bf16 M=8192 N=2304 K=768 NN") {
		t.Errorf("key reads %q", k)
	}
}

func TestGemmShapeValidate(t *testing.T) {
	for _, s := range []GemmShape{
		{Type: GemmF32, M: -1, N: 2, K: 2, Batch: 1},
		{Type: GemmF32, M: 2, N: 2, K: 2, Batch: -3},
		{Type: GemmType(9), M: 2, N: 2, K: 2, Batch: 1},
		{Type: GemmF32, M: 1 << 31, N: 2, K: 2, Batch: 1},
	} {
		if err := s.validate(); err == nil {
			t.Errorf("%+v: no error", s)
		}
	}
	if err := (GemmShape{Type: GemmBF16, M: 8192, N: 768, K: 3072, Batch: 1}).validate(); err != nil {
		t.Error(err)
	}
}

// cublasLtMatmulHost is cuBLASLt's definition, D = alpha·op(A)·op(B) +
// beta·C with D = C, on column-major layouts over a flat float64 memory in
// which a pointer is an element index. It fails the test when the layouts
// do not describe one consistent product.
func cublasLtMatmulHost(t *testing.T, mem []float64, transA, transB bool, la, lb, lc cublasLtLayout, pA, pB, pC DevicePtr, alpha, beta float64) {
	t.Helper()
	opRows := func(l cublasLtLayout, trans bool) (int, int) {
		if trans {
			return l.cols, l.rows
		}
		return l.rows, l.cols
	}
	am, ak := opRows(la, transA)
	bk, bn := opRows(lb, transB)
	if am != lc.rows || bn != lc.cols || ak != bk {
		t.Fatalf("layouts disagree: op(A) %d×%d, op(B) %d×%d, C %d×%d", am, ak, bk, bn, lc.rows, lc.cols)
	}
	for _, l := range []cublasLtLayout{la, lb, lc} {
		if l.ld < max(1, l.rows) {
			t.Fatalf("layout %+v: ld below the rows (cuBLASLt refuses it)", l)
		}
		if l.batch != lc.batch {
			t.Fatalf("batch counts differ: %+v vs %+v", l, lc)
		}
	}
	at := func(p DevicePtr, l cublasLtLayout, i, j, b int) int { return int(p) + int(l.stride)*b + i + j*l.ld }
	for b := range lc.batch {
		for i := range lc.rows {
			for j := range lc.cols {
				var s float64
				for x := range ak {
					ia, ja := i, x
					if transA {
						ia, ja = x, i
					}
					ib, jb := x, j
					if transB {
						ib, jb = j, x
					}
					s += mem[at(pA, la, ia, ja, b)] * mem[at(pB, lb, ib, jb, b)]
				}
				c := at(pC, lc, i, j, b)
				mem[c] = alpha*s + beta*mem[c]
			}
		}
	}
}

// TestCublasLtLayouts checks the layouts cuBLASLt gets for a row-major GEMM
// (rowMajorAsColMajor, then cublasLtLayouts) against the row-major
// definition, on the host, for every transpose combination, a batch, and a
// broadcast (stride 0) B.
func TestCublasLtLayouts(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
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
				mem := make([]float64, 300)
				copy(mem[0:], A)
				copy(mem[100:], B)
				copy(mem[200:], C)
				g := rowMajorAsColMajor(transA, transB, m, n, k, 0, int64(strideA), 100, int64(strideB), 200, int64(strideC))
				la, lb, lc := cublasLtLayouts(g, batch)
				cublasLtMatmulHost(t, mem, g.transA, g.transB, la, lb, lc, g.A, g.B, g.C, 0.5, -2)
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

// TestCublasLtMissing: without the library, the loader names what it tried
// (TuneGemm then keeps cublasGemmStridedBatchedEx and says why in the
// plan's Note), and such a plan describes itself so.
func TestCublasLtMissing(t *testing.T) {
	_, err := loadCublasLtFrom("libcublasLt.so.0-flashgraph-test-missing")
	if err == nil || !strings.Contains(err.Error(), "cuBLASLt not found") || !strings.Contains(err.Error(), "libcublasLt.so.0-flashgraph-test-missing") {
		t.Errorf("missing library: %v", err)
	}
	p := &GemmPlan{key: gemmKey{GemmShape: GemmShape{Type: GemmBF16, M: 8, N: 8, K: 8, Batch: 1}, alignA: 256, alignB: 256, alignC: 256},
		Candidates: []GemmCandidate{{Name: "cublasGemmStridedBatchedEx"}}, Note: err.Error()}
	if p.UsesLt() || !strings.Contains(p.String(), "cublasGemmStridedBatchedEx (cuda: cuBLASLt not found") {
		t.Errorf("fallback plan: UsesLt %v, %q", p.UsesLt(), p)
	}
}

// ---- GPU ----

// tuneOnScratch tunes shape s on fresh buffers (256-byte aligned, as every
// allocation is, so the plan serves any other allocation of the shape).
func tuneOnScratch(t *testing.T, d *Device, s GemmShape, bytesA, bytesB, bytesC int) *GemmPlan {
	t.Helper()
	var ptrs [3]DevicePtr
	for i, n := range []int{bytesA, bytesB, bytesC} {
		p, err := d.Alloc(max(n, 1))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Free(p)
		if err := d.Memset(p, 0, n); err != nil {
			t.Fatal(err)
		}
		ptrs[i] = p
	}
	p, err := d.TuneGemm(s, ptrs[0], ptrs[1], ptrs[2])
	if err != nil {
		t.Fatal(err)
	}
	if d.CachedGemmPlan(s, ptrs[0], ptrs[1], ptrs[2]) != p {
		t.Fatal("the plan is not cached under its shape")
	}
	return p
}

// TestGemmLtMatchesDefault: every candidate TuneGemm timed (the default and
// each cuBLASLt algorithm) and the chosen plan compute C = alpha·op(A)·op(B)
// + beta·C within the float32-accumulation bound of the float64 reference
// (runRowMajorGemm's check), for batched, transposed, broadcast and beta ≠ 0
// GEMMs in float32 and bfloat16; with beta = 0, C holds NaN before the run
// and must not be read.
func TestGemmLtMatchesDefault(t *testing.T) {
	d := gpu(t)
	if _, err := loadCublasLt(); err != nil {
		t.Logf("no cuBLASLt (%v): only the fallback to cublasGemmStridedBatchedEx is checked", err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	cases := []gemmCase{
		{false, false, 64, 96, 128, 1, 1, 0, false},
		{false, true, 37, 53, 129, 3, 1, 0, false},   // batched, odd sizes: entries 2-byte aligned in bf16
		{true, false, 64, 48, 256, 4, 0.5, 1, false}, // transposed A, beta = 1
		{true, true, 33, 17, 300, 2, 1, 0.5, true},   // both transposed, B broadcast
		{false, false, 256, 512, 384, 1, 1, 1, false},
		{false, true, 512, 256, 768, 1, 1, 0, false}, // gpt2's backward dX form
		{true, false, 256, 384, 1024, 1, 1, 1, false},
	}
	for _, typ := range []GemmType{GemmF32, GemmBF16} {
		esz := typ.ElemSize()
		for _, c := range cases {
			strideB := int64(c.k * c.n)
			if c.broadcastB {
				strideB = 0
			}
			s := GemmShape{Type: typ, TransA: c.transA, TransB: c.transB, M: c.m, N: c.n, K: c.k,
				StrideA: int64(c.m * c.k), StrideB: strideB, StrideC: int64(c.m * c.n), Batch: c.batch, Beta: c.beta != 0}
			bBytes := c.k * c.n * esz * c.batch
			if c.broadcastB {
				bBytes = c.k * c.n * esz
			}
			p := tuneOnScratch(t, d, s, c.m*c.k*esz*c.batch, bBytes, c.m*c.n*esz*c.batch)
			t.Logf("%v", p)
			for i, cand := range p.Candidates {
				if cand.Err != nil {
					t.Logf("  %s could not run: %v", cand.Name, cand.Err)
					continue
				}
				checkRowMajorGemm(t, d, typ, c, r, func(pA, pB, pC DevicePtr, sA, sB, sC int64) error {
					if sA != s.StrideA || sB != s.StrideB || sC != s.StrideC {
						t.Fatalf("strides %d,%d,%d, plan for %v", sA, sB, sC, s)
					}
					if c.beta == 0 {
						// With beta = 0, C must not be read: all-ones bytes are NaN in every type.
						if err := d.Memset(pC, 0xff, c.m*c.n*esz*c.batch); err != nil {
							return err
						}
					}
					return d.do(func() error {
						api, _ := loadCublasLt() // nil is fine for candidate 0
						return d.runCandidateRaw(api, p, i, c.alpha, pA, pB, c.beta, pC)
					})
				})
			}
			checkRowMajorGemm(t, d, typ, c, r, func(pA, pB, pC DevicePtr, _, _, _ int64) error {
				if c.beta == 0 {
					if err := d.Memset(pC, 0xff, c.m*c.n*esz*c.batch); err != nil {
						return err
					}
				}
				return p.Run(d, c.alpha, pA, pB, c.beta, pC)
			})
		}
	}
	// A plan refuses a beta it was not tuned for and buffers less aligned than its own.
	s := GemmShape{Type: GemmBF16, M: 64, N: 64, K: 64, Batch: 1}
	p := tuneOnScratch(t, d, s, 64*64*2, 64*64*2, 64*64*2)
	buf, err := d.Alloc(3 * 64 * 64 * 2)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(buf)
	if err := p.Run(d, 1, buf, buf, 1, buf); err == nil || !strings.Contains(err.Error(), "beta") {
		t.Errorf("beta = 1 on a beta = 0 plan: %v", err)
	}
	if p.UsesLt() {
		if err := p.Run(d, 1, buf+2, buf, 0, buf+64*64*4); err == nil || !strings.Contains(err.Error(), "aligned") {
			t.Errorf("A at a 2-byte offset: %v", err)
		}
	}
}

// timeGemmMs is the mean time of n runs of run queued back to back after
// warm-up, measured with events on the device goroutine.
func timeGemmMs(t *testing.T, d *Device, n int, run func() error) float64 {
	t.Helper()
	var ms float32
	err := d.do(func() error {
		var start, end uintptr
		if err := d.EventCreateRaw(&start); err != nil {
			return err
		}
		defer d.EventDestroyRaw(start)
		if err := d.EventCreateRaw(&end); err != nil {
			return err
		}
		defer d.EventDestroyRaw(end)
		for range 3 {
			if err := run(); err != nil {
				return err
			}
		}
		if err := d.EventRecordRaw(start); err != nil {
			return err
		}
		for range n {
			if err := run(); err != nil {
				return err
			}
		}
		if err := d.EventRecordRaw(end); err != nil {
			return err
		}
		if err := d.EventSynchronizeRaw(end); err != nil {
			return err
		}
		return d.EventElapsedRaw(&ms, start, end)
	})
	if err != nil {
		t.Fatal(err)
	}
	return float64(ms) / float64(n)
}

// TestGemmLtGPT2Shapes logs, for the bf16 GEMMs of gpt2's training step
// (8×1024 tokens; the QKV, attention-output and two MLP projections;
// forward Y = X·W, backward dX = dY·Wᵀ and dW = Xᵀ·dY), the TFLOP/s of
// cublasGemmStridedBatchedEx's default kernel and of the tuned plan, timed
// again after tuning, and fails if a plan is clearly slower than the
// default (the choice includes the default, so it can only lose by noise).
func TestGemmLtGPT2Shapes(t *testing.T) {
	d := gpu(t)
	const tokens = 8 * 1024
	r := rand.New(rand.NewPCG(9, 10))
	upload := func(n int) DevicePtr {
		v := make([]uint16, n)
		for i := range v {
			v[i] = graph.BF16FromFloat32(float32(r.NormFloat64()))
		}
		p, err := Upload(d, v)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Free(p) })
		return p
	}
	// Operands big enough for every shape (dW reads X and dY, 8192×3072 at most).
	A, B := upload(tokens*3072), upload(tokens*3072)
	C, err := d.Alloc(tokens * 3072 * 2)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(C)
	type gemm struct {
		name           string
		transA, transB bool
		m, n, k        int
	}
	var shapes []gemm
	for _, w := range []struct {
		name string
		k, n int // the weight is k×n: Y[tokens×n] = X[tokens×k]·W
	}{{"qkv", 768, 2304}, {"attn-out", 768, 768}, {"mlp-up", 768, 3072}, {"mlp-down", 3072, 768}} {
		shapes = append(shapes,
			gemm{w.name + " fwd", false, false, tokens, w.n, w.k},
			gemm{w.name + " dX", false, true, tokens, w.k, w.n},
			gemm{w.name + " dW", true, false, w.k, w.n, tokens})
	}
	const runs = 20
	var sumDefault, sumTuned float64
	t.Logf("%-16s %-22s %9s %9s %7s  %s", "GEMM", "M×N×K", "default", "tuned", "ratio", "choice")
	for _, g := range shapes {
		s := GemmShape{Type: GemmBF16, TransA: g.transA, TransB: g.transB, M: g.m, N: g.n, K: g.k, Batch: 1}
		p, err := d.TuneGemm(s, A, B, C)
		if err != nil {
			t.Fatal(err)
		}
		def := timeGemmMs(t, d, runs, func() error {
			return d.GemmRaw(GemmBF16, g.transA, g.transB, g.m, g.n, g.k, 1, A, 0, B, 0, 0, C, 0, 1)
		})
		tuned := timeGemmMs(t, d, runs, func() error { return p.RunRaw(d, 1, A, B, 0, C) })
		flop := 2 * float64(g.m) * float64(g.n) * float64(g.k)
		choice := p.Candidates[p.Chosen].Name
		if p.Note != "" {
			choice = "default (" + p.Note + ")"
		}
		dims := fmt.Sprintf("%d×%d×%d %s", g.m, g.n, g.k, map[[2]bool]string{{false, false}: "NN", {false, true}: "NT", {true, false}: "TN"}[[2]bool{g.transA, g.transB}])
		t.Logf("%-16s %-22s %6.0f TF %6.0f TF %6.3f×  %s", g.name, dims, flop/def/1e9, flop/tuned/1e9, def/tuned, choice)
		sumDefault += def
		sumTuned += tuned
		if tuned > 1.1*def {
			t.Errorf("%s: tuned plan %.4f ms, default %.4f ms", g.name, tuned, def)
		}
	}
	t.Logf("all %d GEMMs once: default %.3f ms, tuned %.3f ms (%.3f×)", len(shapes), sumDefault, sumTuned, sumDefault/sumTuned)
}

func TestGemmPlanString(t *testing.T) {
	k := gemmKey{GemmShape: GemmShape{Type: GemmBF16, M: 8192, N: 768, K: 3072, Batch: 1}, alignA: 256, alignB: 256, alignC: 256}
	cands := []GemmCandidate{{Name: "cublasGemmStridedBatchedEx", Ms: 0.07}, {Name: "cuBLASLt heuristic #0", Ms: 0.071}, {Name: "cuBLASLt heuristic #1", Ms: 0.06}}
	lt := &GemmPlan{key: k, lt: true, Candidates: cands, Chosen: 2}
	if got, want := lt.String(), "bf16 M=8192 N=768 K=3072 NN align 256,256,256: cuBLASLt heuristic #1, 0.0600 ms (cublasGemmStridedBatchedEx 0.0700 ms) of 3 candidates"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	def := &GemmPlan{key: k, Candidates: cands[:2]}
	if got, want := def.String(), "bf16 M=8192 N=768 K=3072 NN align 256,256,256: cublasGemmStridedBatchedEx, 0.0700 ms (best cuBLASLt 0.0710 ms) of 2 candidates"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}
