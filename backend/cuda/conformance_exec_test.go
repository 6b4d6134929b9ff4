package cuda

// The conformance suite (backend/backendtest) on the CUDA backend. Without a
// GPU these tests skip with the reason Available gives.

import (
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/backendtest"
	"github.com/flashgraph/flashgraph/graph"
)

// newTestBackend opens a CUDA backend for one test, or skips the test with
// the reason there is none.
func newTestBackend(t *testing.T, opts Options) *Backend {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err)
	}
	if opts.CubinCacheDir == "" {
		opts.CubinCacheDir = cubinCacheForTests(t)
	}
	b, err := newBackend(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cubinCacheForTests keeps compiled kernels for the whole test binary, so
// that each backend after the first loads them from disk.
var testCubinDir string

func cubinCacheForTests(t *testing.T) string {
	if testCubinDir == "" {
		testCubinDir = t.TempDir()
	}
	return testCubinDir
}

// suiteBackend adapts newTestBackend to backendtest.Run's constructor.
func suiteBackend(t *testing.T, opts Options) func() backend.Backend {
	return func() backend.Backend { return newTestBackend(t, opts) }
}

// TestConformance: every op in float32, float64, bfloat16 and float16
// graphs, against the float64 reference with the default tolerances; the
// attention nodes on the fused kernels wherever they apply.
func TestConformance(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	backendtest.Run(t, suiteBackend(t, Options{}), backendtest.DefaultTolerances())
}

// TestConformanceComposedAttention: the same suite with FlashAttention(Grad)
// lowered to cuBLAS GEMMs and the row kernels.
func TestConformanceComposedAttention(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	backendtest.Run(t, suiteBackend(t, Options{ComposedAttention: true}), backendtest.DefaultTolerances())
}

// TestConformanceMixedBF16: float32 graphs in the mixed-precision mode. Graph
// inputs and initializers stay float32 but every intermediate is rounded to
// bfloat16 (half an ulp: 2⁻⁹ relative) and GEMM operands are rounded to
// bfloat16 before float32 accumulation, so an output of a K-term product
// (K ≤ 70 here, unit-normal operands) is off by about 2⁻⁸·√K·|a||b| ≈ 0.03
// absolute; multi-op graphs compound a few such roundings. The tolerance
// covers that and nothing wider; float32 arithmetic itself is checked at
// 1e-5 by TestConformance.
func TestConformanceMixedBF16(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	tol := backendtest.Tolerances{graph.Float32: {Atol: 0.05, Rtol: 0.02}}
	backendtest.Run(t, suiteBackend(t, Options{Compute: graph.BFloat16}), tol)
}
