package driver

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unsafe"
)

// cuBLASLt computes the same GEMMs as cublasGemmStridedBatchedEx, but lets
// the caller pick the kernel ("algorithm"). cublasGemmStridedBatchedEx takes
// the heuristic's first guess on every call; for a fixed shape a few other
// candidates are often a few percent faster, and which one wins is only
// known by timing them on the card. TuneGemm does that once per shape
// (before a CUDA graph records the GEMM: timing needs events and
// synchronisation, which capture forbids) and GemmPlan.RunRaw then queues
// the chosen kernel. The library is optional: without it every plan runs
// cublasGemmStridedBatchedEx, as before.

// cublasLtAPI holds the cuBLASLt entry points.
type cublasLtAPI struct {
	lib                                                *library
	create, destroy                                    uintptr
	matmulDescCreate, matmulDescDestroy, matmulDescSet uintptr
	layoutCreate, layoutDestroy, layoutSet             uintptr
	preferenceCreate, preferenceDestroy, preferenceSet uintptr
	algoGetHeuristic, matmul                           uintptr
}

var cublasLtLoad loadOnce[*cublasLtAPI]

// cublasLtNames are the sonames tried, newest first, as for libcublas.
var cublasLtNames = []string{"libcublasLt.so.13", "libcublasLt.so.12"}

func loadCublasLt() (*cublasLtAPI, error) {
	return cublasLtLoad.get(func() (*cublasLtAPI, error) { return loadCublasLtFrom(cublasLtNames...) })
}

// loadCublasLtFrom opens the first of names that loads and resolves the
// entry points TuneGemm and RunRaw use.
func loadCublasLtFrom(names ...string) (*cublasLtAPI, error) {
	lib, err := openLibrary("cuBLASLt", names...)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	api := &cublasLtAPI{lib: lib}
	err = lib.symbols(map[string]*uintptr{
		"cublasLtCreate":                       &api.create,
		"cublasLtDestroy":                      &api.destroy,
		"cublasLtMatmulDescCreate":             &api.matmulDescCreate,
		"cublasLtMatmulDescDestroy":            &api.matmulDescDestroy,
		"cublasLtMatmulDescSetAttribute":       &api.matmulDescSet,
		"cublasLtMatrixLayoutCreate":           &api.layoutCreate,
		"cublasLtMatrixLayoutDestroy":          &api.layoutDestroy,
		"cublasLtMatrixLayoutSetAttribute":     &api.layoutSet,
		"cublasLtMatmulPreferenceCreate":       &api.preferenceCreate,
		"cublasLtMatmulPreferenceDestroy":      &api.preferenceDestroy,
		"cublasLtMatmulPreferenceSetAttribute": &api.preferenceSet,
		"cublasLtMatmulAlgoGetHeuristic":       &api.algoGetHeuristic,
		"cublasLtMatmul":                       &api.matmul,
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	return api, nil
}

// check turns a cublasStatus_t into an *Error (cuBLASLt shares cuBLAS's statuses).
func (api *cublasLtAPI) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: cublasStatusNames[r]}
}

// Enum values of cublasLt.h and cublas_api.h (the same in cuBLAS 12 and 13;
// checked against NVIDIA's cuBLASLt documentation of each enum).
const (
	// cublasLtMatmulDescAttributes_t (cublasLt.h); both int32_t cublasOperation_t.
	cublasLtMatmulDescTransA = 3 // CUBLASLT_MATMUL_DESC_TRANSA
	cublasLtMatmulDescTransB = 4 // CUBLASLT_MATMUL_DESC_TRANSB

	// cublasLtMatrixLayoutAttribute_t (cublasLt.h).
	cublasLtMatrixLayoutBatchCount         = 5 // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t
	cublasLtMatrixLayoutStridedBatchOffset = 6 // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t, in elements

	// cublasLtMatmulPreferenceAttributes_t (cublasLt.h).
	cublasLtMatmulPrefMaxWorkspaceBytes = 1 // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t
	// CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES, uint32_t each,
	// default 256: an algorithm chosen under the default may assume
	// 256-byte aligned buffers, which a GEMM on a slice of the activation
	// arena need not have.
	cublasLtMatmulPrefMinAlignmentA = 5
	cublasLtMatmulPrefMinAlignmentB = 6
	cublasLtMatmulPrefMinAlignmentC = 7
	cublasLtMatmulPrefMinAlignmentD = 8

	// cublasOperation_t (cublas_api.h).
	cublasOpN = 0 // CUBLAS_OP_N
	cublasOpT = 1 // CUBLAS_OP_T

	// cudaDataType_t CUDA_R_32F (library_types.h): alpha and beta are float
	// for every GemmType, as for cublasGemmStridedBatchedEx with
	// CUBLAS_COMPUTE_32F.
	cudaR32F = 0
)

// cublasLtMatmulAlgo is cublasLtMatmulAlgo_t: an opaque uint64_t data[8].
type cublasLtMatmulAlgo [8]uint64

// cublasLtHeuristicResult is cublasLtMatmulHeuristicResult_t (cublasLt.h):
//
//	cublasLtMatmulAlgo_t algo;  // 64 bytes
//	size_t workspaceSize;
//	cublasStatus_t state;       // fields are valid only when this is SUCCESS
//	float wavesCount;
//	int reserved[4];
//
// 96 bytes on the 64-bit targets purego supports (a test checks the offsets).
type cublasLtHeuristicResult struct {
	algo          cublasLtMatmulAlgo
	workspaceSize uint64
	state         int32
	wavesCount    float32
	reserved      [4]int32
}

// gemmTuneCandidates is how many algorithms the heuristic is asked for.
const gemmTuneCandidates = 8

// GemmShape is a row-major GEMM as RowMajorBatchedMatMul takes it, less the
// buffers and the scalars' values: what the choice of a kernel depends on.
// Beta says whether C is read (beta != 0), which cuBLAS kernels may treat
// differently.
type GemmShape struct {
	Type                      GemmType
	TransA, TransB            bool
	M, N, K                   int
	StrideA, StrideB, StrideC int64 // elements between batch entries; 0 broadcasts
	Batch                     int
	Beta                      bool
}

func (s GemmShape) String() string {
	t := func(b bool) string {
		if b {
			return "T"
		}
		return "N"
	}
	b := ""
	if s.Batch != 1 {
		b = fmt.Sprintf(" batch %d (strides %d,%d,%d)", s.Batch, s.StrideA, s.StrideB, s.StrideC)
	}
	beta := ""
	if s.Beta {
		beta = " beta≠0"
	}
	return fmt.Sprintf("%s M=%d N=%d K=%d %s%s%s%s", s.Type, s.M, s.N, s.K, t(s.TransA), t(s.TransB), b, beta)
}

func (s GemmShape) validate() error {
	if _, err := s.Type.cudaDataType(); err != nil {
		return err
	}
	if s.M < 0 || s.N < 0 || s.K < 0 || s.Batch < 0 {
		return fmt.Errorf("cuda: GEMM %v: negative size", s)
	}
	if s.M > math.MaxInt32 || s.N > math.MaxInt32 || s.K > math.MaxInt32 || s.Batch > math.MaxInt32 {
		return fmt.Errorf("cuda: GEMM %v: a size passes 2^31-1", s)
	}
	return nil
}

// gemmKey is what a tuned choice is cached under: the shape and the
// alignment of the three (row-major) operands, which limits the kernels
// that may run on them.
type gemmKey struct {
	GemmShape
	alignA, alignB, alignC int
}

func (k gemmKey) String() string {
	return fmt.Sprintf("%v align %d,%d,%d", k.GemmShape, k.alignA, k.alignB, k.alignC)
}

// gemmAlign is the largest power of two up to 256 that divides the address
// of every batch entry of an operand at p whose entries lie strideBytes
// apart.
func gemmAlign(p DevicePtr, strideBytes int64, batch int) int {
	a := 256
	for a > 1 && (uint64(p)%uint64(a) != 0 || (batch > 1 && strideBytes%int64(a) != 0)) {
		a /= 2
	}
	return a
}

// gemmKeyOf is the cache key of shape s on buffers A, B, C.
func gemmKeyOf(s GemmShape, A, B, C DevicePtr) gemmKey {
	esz := int64(s.Type.ElemSize())
	return gemmKey{GemmShape: s,
		alignA: gemmAlign(A, s.StrideA*esz, s.Batch),
		alignB: gemmAlign(B, s.StrideB*esz, s.Batch),
		alignC: gemmAlign(C, s.StrideC*esz, s.Batch)}
}

// cublasLtLayout is one matrix's cuBLASLt layout: column-major rows×cols with
// leading dimension ld; batch matrices, stride elements apart.
type cublasLtLayout struct {
	rows, cols, ld int
	batch          int
	stride         int64
}

// cublasLtLayouts gives the layouts of A, B and C (C is also D, the output)
// of the column-major GEMM g (from rowMajorAsColMajor): op(A) is m×k, so A
// is stored m×k, or k×m when transposed; likewise B with k×n; C is m×n.
func cublasLtLayouts(g colMajorGemm, batch int) (a, b, c cublasLtLayout) {
	a = cublasLtLayout{rows: g.m, cols: g.k, ld: g.lda, batch: batch, stride: g.strideA}
	if g.transA {
		a.rows, a.cols = g.k, g.m
	}
	b = cublasLtLayout{rows: g.k, cols: g.n, ld: g.ldb, batch: batch, stride: g.strideB}
	if g.transB {
		b.rows, b.cols = g.n, g.k
	}
	c = cublasLtLayout{rows: g.m, cols: g.n, ld: g.ldc, batch: batch, stride: g.strideC}
	return a, b, c
}

// GemmCandidate is one kernel TuneGemm timed.
type GemmCandidate struct {
	Name string  // "cublasGemmStridedBatchedEx" or "cuBLASLt heuristic #i"
	Ms   float64 // milliseconds per GEMM, the best of the rounds; +Inf when it failed
	Err  error   // why it could not run
}

// GemmPlan is the kernel chosen for one GEMM shape on one device. Plans are
// cached in the Device and live until it closes.
type GemmPlan struct {
	key gemmKey
	// lt: run cuBLASLt with algo; otherwise cublasGemmStridedBatchedEx.
	lt   bool
	algo cublasLtMatmulAlgo
	// The cuBLASLt descriptors (0 when none were made), destroyed by Close.
	desc, layA, layB, layC uintptr
	// heuristic holds the algorithms the heuristic offered, candidates 1...
	heuristic []cublasLtHeuristicResult
	// Candidates are the kernels timed, candidate 0 being
	// cublasGemmStridedBatchedEx; Chosen indexes the one RunRaw runs.
	Candidates []GemmCandidate
	Chosen     int
	// Note says why cuBLASLt was not tried, when it was not.
	Note string
}

// Shape is the GEMM shape the plan was tuned for.
func (p *GemmPlan) Shape() GemmShape { return p.key.GemmShape }

// UsesLt reports whether RunRaw runs a cuBLASLt kernel.
func (p *GemmPlan) UsesLt() bool { return p.lt }

// String says what was chosen and how fast it and the default were.
func (p *GemmPlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: ", p.key)
	if p.Note != "" {
		fmt.Fprintf(&b, "cublasGemmStridedBatchedEx (%s)", p.Note)
		return b.String()
	}
	c := p.Candidates[p.Chosen]
	fmt.Fprintf(&b, "%s, %.4f ms", c.Name, c.Ms)
	if p.Chosen != 0 {
		fmt.Fprintf(&b, " (cublasGemmStridedBatchedEx %.4f ms)", p.Candidates[0].Ms)
	} else if len(p.Candidates) > 1 {
		lt := math.Inf(1)
		for _, c := range p.Candidates[1:] {
			lt = min(lt, c.Ms)
		}
		fmt.Fprintf(&b, " (best cuBLASLt %.4f ms)", lt)
	}
	fmt.Fprintf(&b, " of %d candidates", len(p.Candidates))
	return b.String()
}

// TuneGemm returns the plan for GEMMs of shape s on buffers aligned as A, B
// and C are, tuning it on these buffers the first time the device meets the
// shape: cuBLASLt's heuristic proposes up to 8 algorithms, each is timed
// with events against cublasGemmStridedBatchedEx (candidate 0), and the
// fastest is kept. A cuBLASLt kernel has to beat candidate 0 by
// gemmTuneMargin to be chosen, so that noise does not swap one kernel for
// an equal one, and so a plan is never slower than the default path. The
// timing runs write C (and read it when s.Beta), so C must hold nothing
// that is needed later. Without cuBLASLt, or for a shape it cannot run,
// the plan runs cublasGemmStridedBatchedEx and says why in Note.
//
// TuneGemm takes RunMu: its GEMMs and events must not land in a run being
// captured as a CUDA graph. It must not be called on the device goroutine.
func (d *Device) TuneGemm(s GemmShape, A, B, C DevicePtr) (*GemmPlan, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	key := gemmKeyOf(s, A, B, C)
	d.gemmPlansMu.Lock()
	defer d.gemmPlansMu.Unlock()
	if d.gemmPlansClosed {
		return nil, errClosed
	}
	if p := d.gemmPlans[key]; p != nil {
		return p, nil
	}
	d.RunMu.Lock()
	defer d.RunMu.Unlock()
	var p *GemmPlan
	err := d.do(func() error {
		var err error
		p, err = d.tuneGemmRaw(key, A, B, C)
		return err
	})
	if p != nil {
		// Listed even when tuning failed, so that Close destroys its descriptors.
		d.gemmPlanList = append(d.gemmPlanList, p)
	}
	if err != nil {
		return nil, fmt.Errorf("cuda: tuning GEMM %v: %w", key, err)
	}
	if d.gemmPlans == nil {
		d.gemmPlans = map[gemmKey]*GemmPlan{}
	}
	d.gemmPlans[key] = p
	return p, nil
}

// CachedGemmPlan returns the plan TuneGemm made for shape s on buffers
// aligned as A, B and C are, or nil.
func (d *Device) CachedGemmPlan(s GemmShape, A, B, C DevicePtr) *GemmPlan {
	d.gemmPlansMu.Lock()
	defer d.gemmPlansMu.Unlock()
	return d.gemmPlans[gemmKeyOf(s, A, B, C)]
}

// GemmPlans lists the device's tuned plans, in the order they were made.
func (d *Device) GemmPlans() []*GemmPlan {
	d.gemmPlansMu.Lock()
	defer d.gemmPlansMu.Unlock()
	var ps []*GemmPlan
	for _, p := range d.gemmPlanList {
		if d.gemmPlans[p.key] == p {
			ps = append(ps, p)
		}
	}
	return ps
}

// Timing: each candidate runs gemmTuneWarmup times, then gemmTuneRuns times
// between two events, in each of gemmTuneRounds rounds over all candidates
// (so a clock change or a neighbour's burst hits them alike); its time is the
// best round's mean.
const (
	gemmTuneWarmup = 2
	gemmTuneRuns   = 8
	gemmTuneRounds = 2
	gemmTuneMargin = 0.01
)

// tuneGemmRaw builds the plan for key (device goroutine). It returns the
// plan also with an error when it made descriptors, so they can be freed.
func (d *Device) tuneGemmRaw(key gemmKey, A, B, C DevicePtr) (*GemmPlan, error) {
	s := key.GemmShape
	p := &GemmPlan{key: key, Candidates: []GemmCandidate{{Name: "cublasGemmStridedBatchedEx"}}}
	switch {
	case s.M == 0 || s.N == 0 || s.Batch == 0:
		p.Note = "empty GEMM"
		return p, nil
	case s.K == 0:
		p.Note = "K = 0, C is only scaled"
		return p, nil
	}
	if _, _, err := d.cublas(); err != nil { // also makes the workspace cuBLASLt shares
		return nil, err
	}
	api, err := loadCublasLt()
	if err != nil {
		p.Note = err.Error()
		return p, nil
	}
	if err := d.cublasLtDescribe(api, p); err != nil {
		return p, err
	}
	if p.heuristic, err = d.cublasLtHeuristic(api, p); err != nil {
		p.Note = err.Error()
		return p, nil
	}
	if len(p.heuristic) == 0 {
		p.Note = "cuBLASLt offers no algorithm"
		return p, nil
	}
	for i := range p.heuristic {
		p.Candidates = append(p.Candidates, GemmCandidate{Name: fmt.Sprintf("cuBLASLt heuristic #%d", i)})
	}
	if err := d.timeGemmCandidates(api, p, A, B, C); err != nil {
		return p, err
	}
	best := 0
	for i, c := range p.Candidates[1:] {
		if c.Err == nil && c.Ms < p.Candidates[best].Ms {
			best = i + 1
		}
	}
	if best != 0 && p.Candidates[best].Ms > (1-gemmTuneMargin)*p.Candidates[0].Ms {
		best = 0
	}
	p.Chosen = best
	if best != 0 {
		p.lt = true
		p.algo = p.heuristic[best-1].algo
	}
	return p, nil
}

// cublasLtHandle returns the device's cuBLASLt handle, creating it on first
// use (device goroutine).
func (d *Device) cublasLtHandle(api *cublasLtAPI) (uintptr, error) {
	if d.ltHandle == 0 {
		var h uintptr
		if err := api.check("cublasLtCreate", ccall(api.create, uintptr(unsafe.Pointer(&h)))); err != nil {
			return 0, err
		}
		d.ltHandle = h
	}
	return d.ltHandle, nil
}

// cublasLtDescribe makes p's operation and layout descriptors (device goroutine).
func (d *Device) cublasLtDescribe(api *cublasLtAPI, p *GemmPlan) error {
	s := p.key.GemmShape
	dt, err := s.Type.cudaDataType()
	if err != nil {
		return err
	}
	g := rowMajorAsColMajor(s.TransA, s.TransB, s.M, s.N, s.K, 0, s.StrideA, 0, s.StrideB, 0, s.StrideC)
	if err := api.check("cublasLtMatmulDescCreate", ccall(api.matmulDescCreate, uintptr(unsafe.Pointer(&p.desc)), cublasCompute32F, cudaR32F)); err != nil {
		return err
	}
	for _, a := range []struct {
		attr  uintptr
		trans bool
	}{{cublasLtMatmulDescTransA, g.transA}, {cublasLtMatmulDescTransB, g.transB}} {
		op := int32(cublasOpN)
		if a.trans {
			op = cublasOpT
		}
		if err := api.check("cublasLtMatmulDescSetAttribute", ccall(api.matmulDescSet, p.desc, a.attr, uintptr(unsafe.Pointer(&op)), 4)); err != nil {
			return err
		}
	}
	la, lb, lc := cublasLtLayouts(g, s.Batch)
	for _, l := range []struct {
		dst    *uintptr
		layout cublasLtLayout
	}{{&p.layA, la}, {&p.layB, lb}, {&p.layC, lc}} {
		if err := api.check("cublasLtMatrixLayoutCreate", ccall(api.layoutCreate, uintptr(unsafe.Pointer(l.dst)), dt,
			uintptr(l.layout.rows), uintptr(l.layout.cols), uintptr(l.layout.ld))); err != nil {
			return err
		}
		if l.layout.batch <= 1 {
			continue
		}
		count, stride := int32(l.layout.batch), l.layout.stride
		if err := api.check("cublasLtMatrixLayoutSetAttribute", ccall(api.layoutSet, *l.dst, cublasLtMatrixLayoutBatchCount, uintptr(unsafe.Pointer(&count)), 4)); err != nil {
			return err
		}
		if err := api.check("cublasLtMatrixLayoutSetAttribute", ccall(api.layoutSet, *l.dst, cublasLtMatrixLayoutStridedBatchOffset, uintptr(unsafe.Pointer(&stride)), 8)); err != nil {
			return err
		}
	}
	return nil
}

// cublasLtHeuristic asks for up to gemmTuneCandidates algorithms that fit the
// device's workspace and p's alignments, and returns those whose state is
// success (device goroutine).
func (d *Device) cublasLtHeuristic(api *cublasLtAPI, p *GemmPlan) ([]cublasLtHeuristicResult, error) {
	h, err := d.cublasLtHandle(api)
	if err != nil {
		return nil, err
	}
	var pref uintptr
	if err := api.check("cublasLtMatmulPreferenceCreate", ccall(api.preferenceCreate, uintptr(unsafe.Pointer(&pref)))); err != nil {
		return nil, err
	}
	defer ccall(api.preferenceDestroy, pref)
	ws := uint64(d.cublasWorkspaceBytes)
	if err := api.check("cublasLtMatmulPreferenceSetAttribute", ccall(api.preferenceSet, pref, cublasLtMatmulPrefMaxWorkspaceBytes, uintptr(unsafe.Pointer(&ws)), 8)); err != nil {
		return nil, err
	}
	// cuBLASLt's A is the row-major B and its B the row-major A (rowMajorAsColMajor).
	k := p.key
	for _, a := range []struct {
		attr  uintptr
		bytes int
	}{{cublasLtMatmulPrefMinAlignmentA, k.alignB}, {cublasLtMatmulPrefMinAlignmentB, k.alignA},
		{cublasLtMatmulPrefMinAlignmentC, k.alignC}, {cublasLtMatmulPrefMinAlignmentD, k.alignC}} {
		v := uint32(a.bytes)
		if err := api.check("cublasLtMatmulPreferenceSetAttribute", ccall(api.preferenceSet, pref, a.attr, uintptr(unsafe.Pointer(&v)), 4)); err != nil {
			return nil, err
		}
	}
	var results [gemmTuneCandidates]cublasLtHeuristicResult
	var n int32
	err = api.check("cublasLtMatmulAlgoGetHeuristic", ccall(api.algoGetHeuristic, h, p.desc, p.layA, p.layB, p.layC, p.layC, pref,
		gemmTuneCandidates, uintptr(unsafe.Pointer(&results[0])), uintptr(unsafe.Pointer(&n))))
	if err != nil {
		return nil, err
	}
	var ok []cublasLtHeuristicResult
	for _, r := range results[:max(0, min(int(n), len(results)))] {
		if r.state == 0 && r.workspaceSize <= ws {
			ok = append(ok, r)
		}
	}
	return ok, nil
}

// runCandidateRaw queues candidate i of p (0: cublasGemmStridedBatchedEx)
// on the device's stream (device goroutine).
func (d *Device) runCandidateRaw(api *cublasLtAPI, p *GemmPlan, i int, alpha float32, A, B DevicePtr, beta float32, C DevicePtr) error {
	s := p.key.GemmShape
	if i == 0 {
		return d.GemmRaw(s.Type, s.TransA, s.TransB, s.M, s.N, s.K, alpha, A, s.StrideA, B, s.StrideB, beta, C, s.StrideC, s.Batch)
	}
	return d.cublasLtMatmulRaw(api, p, &p.heuristic[i-1].algo, alpha, A, B, beta, C)
}

// cublasLtMatmulRaw queues C = alpha·op(A)·op(B) + beta·C with algo on the
// device's stream (device goroutine). Like GemmRaw it makes no allocation
// and no synchronisation, so a CUDA graph may capture it.
func (d *Device) cublasLtMatmulRaw(api *cublasLtAPI, p *GemmPlan, algo *cublasLtMatmulAlgo, alpha float32, A, B DevicePtr, beta float32, C DevicePtr) error {
	s := p.key.GemmShape
	g := rowMajorAsColMajor(s.TransA, s.TransB, s.M, s.N, s.K, A, s.StrideA, B, s.StrideB, C, s.StrideC)
	return api.check("cublasLtMatmul", ccall(api.matmul, d.ltHandle, p.desc,
		uintptr(unsafe.Pointer(&alpha)), uintptr(g.A), p.layA, uintptr(g.B), p.layB,
		uintptr(unsafe.Pointer(&beta)), uintptr(g.C), p.layC, uintptr(g.C), p.layC,
		uintptr(unsafe.Pointer(algo)), uintptr(d.cublasWorkspace), uintptr(d.cublasWorkspaceBytes), d.stream))
}

// timeGemmCandidates fills in p.Candidates[i].Ms (device goroutine). A
// cuBLASLt candidate that fails is marked and skipped; candidate 0 failing
// is an error, since it is the path every GEMM takes without a plan.
func (d *Device) timeGemmCandidates(api *cublasLtAPI, p *GemmPlan, A, B, C DevicePtr) error {
	var start, end uintptr
	if err := d.EventCreateRaw(&start); err != nil {
		return err
	}
	defer d.EventDestroyRaw(start)
	if err := d.EventCreateRaw(&end); err != nil {
		return err
	}
	defer d.EventDestroyRaw(end)
	beta := float32(0)
	if p.key.Beta {
		beta = 1
	}
	for i := range p.Candidates {
		p.Candidates[i].Ms = math.Inf(1)
	}
	for range gemmTuneRounds {
		for i := range p.Candidates {
			c := &p.Candidates[i]
			if c.Err != nil {
				continue
			}
			run := func(n int) error {
				for range n {
					if err := d.runCandidateRaw(api, p, i, 1, A, B, beta, C); err != nil {
						return err
					}
				}
				return nil
			}
			err := run(gemmTuneWarmup)
			if err == nil {
				err = d.EventRecordRaw(start)
			}
			if err == nil {
				err = run(gemmTuneRuns)
			}
			if err == nil {
				err = d.EventRecordRaw(end)
			}
			var ms float32
			if err == nil {
				err = d.EventSynchronizeRaw(end)
			}
			if err == nil {
				err = d.EventElapsedRaw(&ms, start, end)
			}
			if err != nil {
				if i == 0 {
					return err
				}
				c.Err, c.Ms = err, math.Inf(1)
				continue
			}
			c.Ms = min(c.Ms, float64(ms)/gemmTuneRuns)
		}
	}
	return nil
}

// RunRaw queues the plan's GEMM on A, B, C (device goroutine): for each
// batch entry, C = alpha·op(A)·op(B) + beta·C on row-major buffers, as
// RowMajorBatchedMatMul with the plan's shape. The buffers must be aligned at
// least as those the plan was tuned on, and beta must be zero exactly when
// it was for the tuning.
func (p *GemmPlan) RunRaw(d *Device, alpha float32, A, B DevicePtr, beta float32, C DevicePtr) error {
	s := p.key.GemmShape
	if (beta != 0) != s.Beta {
		return fmt.Errorf("cuda: GEMM plan for %v run with beta = %v", p.key, beta)
	}
	if !p.lt {
		return d.GemmRaw(s.Type, s.TransA, s.TransB, s.M, s.N, s.K, alpha, A, s.StrideA, B, s.StrideB, beta, C, s.StrideC, s.Batch)
	}
	if k := gemmKeyOf(s, A, B, C); k.alignA < p.key.alignA || k.alignB < p.key.alignB || k.alignC < p.key.alignC {
		return fmt.Errorf("cuda: GEMM plan for %v run on buffers aligned to %d,%d,%d bytes", p.key, k.alignA, k.alignB, k.alignC)
	}
	api, err := loadCublasLt()
	if err != nil {
		return err
	}
	if err := d.cublasLtMatmulRaw(api, p, &p.algo, alpha, A, B, beta, C); err != nil {
		return fmt.Errorf("cuda: GEMM %v: %w", p.key, err)
	}
	return nil
}

// Run is RunRaw as one request to the device goroutine.
func (p *GemmPlan) Run(d *Device, alpha float32, A, B DevicePtr, beta float32, C DevicePtr) error {
	return d.do(func() error { return p.RunRaw(d, alpha, A, B, beta, C) })
}

// closeGemmPlans takes the device's plans away, so that no more are made;
// Close then frees their descriptors on the device goroutine.
func (d *Device) closeGemmPlans() []*GemmPlan {
	d.gemmPlansMu.Lock()
	defer d.gemmPlansMu.Unlock()
	ps := d.gemmPlanList
	d.gemmPlanList, d.gemmPlans, d.gemmPlansClosed = nil, nil, true
	return ps
}

// destroyGemmPlans destroys the plans' cuBLASLt descriptors and the
// cuBLASLt handle (device goroutine).
func (d *Device) destroyGemmPlans(ps []*GemmPlan) error {
	if len(ps) == 0 && d.ltHandle == 0 {
		return nil
	}
	api, err := loadCublasLt()
	if err != nil {
		return nil // nothing can have been made without the library
	}
	// Descriptors are host memory, but let no queued cublasLtMatmul outlive them.
	errs := []error{d.api.check("cuStreamSynchronize", ccall(d.api.cuStreamSync, d.stream))}
	for _, p := range ps {
		for _, l := range []*uintptr{&p.layA, &p.layB, &p.layC} {
			if *l != 0 {
				errs = append(errs, api.check("cublasLtMatrixLayoutDestroy", ccall(api.layoutDestroy, *l)))
				*l = 0
			}
		}
		if p.desc != 0 {
			errs = append(errs, api.check("cublasLtMatmulDescDestroy", ccall(api.matmulDescDestroy, p.desc)))
			p.desc = 0
		}
		p.lt = false
	}
	if d.ltHandle != 0 {
		errs = append(errs, api.check("cublasLtDestroy", ccall(api.destroy, d.ltHandle)))
		d.ltHandle = 0
	}
	return errors.Join(errs...)
}
