package driver

import (
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/flashgraph/flashgraph/kernels"
)

// TestCacheKeyCoversHeaders checks that the cubin cache key of a compile
// unit changes when a header it includes changes, and only then: CompileFile
// keys the unit as kernels.Expand gives it, headers inlined.
func TestCacheKeyCoversHeaders(t *testing.T) {
	fsys := fstest.MapFS{
		"a.cu":       {Data: []byte("#include \"common.cuh\"\nextern \"C\" __global__ void a() {}\n")},
		"common.cuh": {Data: []byte("__device__ int one() { return 1; }\n")},
		"other.cuh":  {Data: []byte("__device__ int two() { return 2; }\n")},
	}
	key := func() string {
		t.Helper()
		src, inc, err := kernels.Expand(fsys, "a.cu")
		if err != nil {
			t.Fatal(err)
		}
		if len(inc) != 1 || inc[0] != "common.cuh" {
			t.Fatalf("a.cu includes %v, want [common.cuh]", inc)
		}
		return cacheKey(src, []string{"-a"}, "sm_90a", "13.0")
	}
	base := key()
	fsys["other.cuh"] = &fstest.MapFile{Data: []byte("__device__ int two() { return 3; }\n")}
	if key() != base {
		t.Error("editing a header the unit does not include changed its cache key")
	}
	fsys["common.cuh"] = &fstest.MapFile{Data: []byte("__device__ int one() { return 2; }\n")}
	if key() == base {
		t.Error("editing a header the unit includes left its cache key unchanged: a stale cubin would load")
	}
	// The embedded sm90 units: the text CompileFile hands NVRTC holds the
	// shared header's.
	common, err := kernels.Source("flash_sm90_common.cuh")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flashSM90Files {
		src, err := kernels.Unit(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(src, common) {
			t.Errorf("kernels.Unit(%q) does not hold flash_sm90_common.cuh's text", f)
		}
		if strings.Contains(src, "#include \"") {
			t.Errorf("kernels.Unit(%q) still has a local #include", f)
		}
	}
}

// TestNVRTCFirstRun measures what a first run on an empty cubin cache
// spends in NVRTC for the attention kernels: each sm90 unit compiled alone
// for sm_90a (the cache bypassed), FA2's flash_attention.cu, and, for the
// record of what the split saved, every sm90 kernel in one unit as
// flash_attention_sm90.cu was before (the three units' texts in one
// program; the headers' include guards keep one copy of the shared code).
// It needs NVRTC (12.0 or newer), no GPU. Slow (tens of seconds): skipped
// with -short, and unless FLASHGRAPH_NVRTC_FIRST_RUN=1, so that plain test
// runs do not pay for it twice (TestFlashSM90Compile compiles the units too).
//
//	FLASHGRAPH_NVRTC_FIRST_RUN=1 go test ./backend/cuda/driver -run TestNVRTCFirstRun -v
func TestNVRTCFirstRun(t *testing.T) {
	if testing.Short() || os.Getenv("FLASHGRAPH_NVRTC_FIRST_RUN") != "1" {
		t.Skip("set FLASHGRAPH_NVRTC_FIRST_RUN=1 to time the NVRTC compiles (tens of seconds)")
	}
	nv, err := loadNVRTC()
	if err != nil {
		t.Skip(err)
	}
	if strings.HasPrefix(nv.version, "11.") {
		t.Skipf("NVRTC %s cannot target sm_90a", nv.version)
	}
	opts := compileOptions("sm_90a", nil)
	timeUnit := func(name, src string) time.Duration {
		t.Helper()
		start := time.Now()
		if _, _, err := nv.compile(name, src, opts); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		d := time.Since(start)
		t.Logf("NVRTC %s, sm_90a, cache off: %-40s %6.2f s", nv.version, name, d.Seconds())
		return d
	}
	srcs := flashSM90Sources(t)
	fwd := timeUnit(flashSM90FwdFile, srcs[flashSM90FwdFile])
	bwd := timeUnit(flashSM90BwdFile, srcs[flashSM90BwdFile])
	timeUnit(flashSM90DevFile, srcs[flashSM90DevFile])
	all := timeUnit("every sm90 kernel in one unit (before the split)", srcs[flashSM90DevFile]+srcs[flashSM90FwdFile]+srcs[flashSM90BwdFile])
	fa2src, err := kernels.Unit("flash_attention.cu")
	if err != nil {
		t.Fatal(err)
	}
	fa2 := timeUnit("flash_attention.cu", fa2src)
	t.Logf("first training step (forward and backward), sm90 units: %.2f s now, %.2f s as one unit; FA2's flash_attention.cu %.2f s on top of either; a forward-only run compiles %.2f s",
		(fwd + bwd).Seconds(), all.Seconds(), fa2.Seconds(), fwd.Seconds())
}
