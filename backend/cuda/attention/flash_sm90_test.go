package attention

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/kernels"
)

// flashSM90AllKernels are every entry point of the sm90 compile units
// (flashSM90Files).
var flashSM90AllKernels = []string{
	"flash_fwd_sm90_warpspec_bf16_d64", "flash_fwd_sm90_warpspec_bf16_d128", "flash_fwd_sm90_warpspec_fp16_d64", "flash_fwd_sm90_warpspec_fp16_d128",
	"flash_fwd_sm90_pingpong_bf16_d64", "flash_fwd_sm90_pingpong_bf16_d128", "flash_fwd_sm90_pingpong_fp16_d64", "flash_fwd_sm90_pingpong_fp16_d128",
	"flash_fwd_sm90_pingpong3wg_bf16_d64", "flash_fwd_sm90_pingpong3wg_fp16_d64",
	"flash_fwd_sm90_persistent_bf16_d64", "flash_fwd_sm90_persistent_bf16_d128", "flash_fwd_sm90_persistent_fp16_d64", "flash_fwd_sm90_persistent_fp16_d128",
	"flash_fwd_sm90_persistent3wg_bf16_d64", "flash_fwd_sm90_persistent3wg_fp16_d64",
	"flash_bwd_sm90_baseline_bf16_d64", "flash_bwd_sm90_baseline_bf16_d128", "flash_bwd_sm90_baseline_fp16_d64", "flash_bwd_sm90_baseline_fp16_d128",
	"flash_bwd_sm90_pipelined_bf16_d64", "flash_bwd_sm90_pipelined_bf16_d128", "flash_bwd_sm90_pipelined_fp16_d64", "flash_bwd_sm90_pipelined_fp16_d128",
	"flash_bwd_sm90_pingpong_bf16_d64", "flash_bwd_sm90_pingpong_fp16_d64",
	"flash_bwd_sm90_alternating_bf16_d128", "flash_bwd_sm90_alternating_fp16_d128",
}

// flashSM90Instance matches an instantiation of an sm90 entry point.
var flashSM90Instance = regexp.MustCompile(`(?m)^FA90_(?:FWD_WARPSPEC|FWD_PINGPONG|FWD_PERSISTENT|BWD|BWD_PINGPONG)\((flash_\w+),`)

// flashSM90Files are the sm90 compile units: the forward and backward that
// the dispatcher selects, and the dev unit of the variants kept to time
// against.
var flashSM90Files = []string{flashSM90FwdFile, flashSM90BwdFile, flashSM90DevFile}

// flashSM90Sources returns the compile units' texts as NVRTC sees them
// (kernels.Unit: headers inlined), by file.
func flashSM90Sources(tb testing.TB) map[string]string {
	tb.Helper()
	srcs := map[string]string{}
	for _, f := range flashSM90Files {
		src, err := kernels.Unit(f)
		if err != nil {
			tb.Fatal(err)
		}
		srcs[f] = src
	}
	return srcs
}

// sm90GPU is the test GPU (gpu) when it is compute capability 9.0, where
// the sm_90a kernels run; elsewhere the test skips and says why.
func sm90GPU(tb testing.TB) *Device {
	tb.Helper()
	d := gpu(tb)
	if maj, mnr := d.ComputeCapability(); maj != 9 || mnr != 0 {
		tb.Skipf("device is compute capability %d.%d, the sm90 kernels need 9.0", maj, mnr)
	}
	return d
}

// flashSM90MaxSmem is the dynamic shared memory an H100/H200 block may opt
// into (227 KiB); every sm90 kernel's launch must fit.
const flashSM90MaxSmem = 227 * 1024

// TestFlashSM90Entries checks, without NVRTC, that the entry points the .cu
// defines (its FA90_* instantiations) are exactly flashSM90AllKernels, that
// every name the launchers can produce is one of them, and that the shared
// memory sizes the launchers ask for are the ones the .cu header states and
// fit in a block.
func TestFlashSM90Entries(t *testing.T) {
	srcs := flashSM90Sources(t)
	src := srcs[flashSM90FwdFile] + srcs[flashSM90BwdFile] + srcs[flashSM90DevFile]
	var defined []string
	for _, f := range flashSM90Files {
		for _, m := range flashSM90Instance.FindAllStringSubmatch(srcs[f], -1) {
			defined = append(defined, m[1])
			if got := flashSM90UnitOf(m[1]); got != f {
				t.Errorf("%s defines %s, flashSM90UnitOf says %s does", f, m[1], got)
			}
		}
	}
	want := slices.Clone(flashSM90AllKernels)
	slices.Sort(defined)
	slices.Sort(want)
	if !slices.Equal(defined, want) {
		t.Errorf("%v define %v,\nflashSM90AllKernels lists %v", flashSM90Files, defined, want)
	}
	for _, dt := range []GemmType{GemmBF16, GemmF16} {
		for _, dim := range []int{64, 128} {
			for _, v := range flashSM90BwdVariants {
				name := flashSM90BwdName(dt, dim, v)
				if name == "" && !flashSM90BwdHasDim(v, dim) {
					continue // pingpong is D=64 only, alternating D=128 only
				}
				if !slices.Contains(flashSM90AllKernels, name) {
					t.Errorf("flashSM90BwdName(%v, %d, %q) = %q, not a kernel of the file", dt, dim, v, name)
				}
			}
		}
	}
	// The header states each size in bytes; a formula changed on one side
	// only shows here.
	for _, c := range []struct {
		variant string
		dim     int
		want    int
	}{{"baseline", 64, 182848}, {"baseline", 128, 232000}, {"pipelined", 64, 150080}, {"pipelined", 128, 232000}, {"alternating", 128, 232000}, {"pingpong", 64, 182848}} {
		got := flashSM90BwdSmem(c.dim, c.variant)
		if got != c.want {
			t.Errorf("backward %q d%d smem %d, want %d (the .cu header)", c.variant, c.dim, got, c.want)
		}
		if !strings.Contains(string(src), fmt.Sprint(c.want)) {
			t.Errorf("the .cu header does not state %d (backward %q d%d)", c.want, c.variant, c.dim)
		}
		if got > flashSM90MaxSmem {
			t.Errorf("backward %q d%d needs %d bytes of shared memory, a block may have %d", c.variant, c.dim, got, flashSM90MaxSmem)
		}
	}
	for _, dim := range []int{64, 128} {
		if n := flashSM90WarpSpecSmem(dim); n > flashSM90MaxSmem {
			t.Errorf("TMA forward d%d needs %d bytes of shared memory, a block may have %d", dim, n, flashSM90MaxSmem)
		}
	}
	// The ping-pong forwards: the sizes the header states, and the ring
	// depths and warpgroup counts of the .cu's instantiations.
	for _, c := range []struct {
		variant    string
		dim        int
		want       int
		instance   string
		wantThread int
	}{
		{"pingpong", 64, 148616, "flash_fwd_sm90_pingpong_bf16_d64, false, 64, 2, 4, true", 384},
		{"pingpong", 128, 164936, "flash_fwd_sm90_pingpong_bf16_d128, false, 128, 2, 2, true", 384},
		{"pingpong3wg", 64, 156808, "flash_fwd_sm90_pingpong3wg_bf16_d64, false, 64, 3, 4, false", 512},
		{"persistent", 64, 181440, "flash_fwd_sm90_persistent_bf16_d64, false, 64, 2, 4, true", 384},
		{"persistent", 128, 230528, "flash_fwd_sm90_persistent_fp16_d128, true, 128, 2, 2, true", 384},
		{"persistent3wg", 64, 206016, "flash_fwd_sm90_persistent3wg_bf16_d64, false, 64, 3, 4, false", 512},
	} {
		tl := flashSM90PingPongOf(c.variant, c.dim)
		if got := tl.smem(c.dim); got != c.want {
			t.Errorf("forward %s d%d smem %d, want %d (the .cu header)", c.variant, c.dim, got, c.want)
		}
		if !strings.Contains(string(src), fmt.Sprint(c.want)) {
			t.Errorf("the .cu header does not state %d (forward %s d%d)", c.want, c.variant, c.dim)
		}
		if got := tl.smem(c.dim); got > flashSM90MaxSmem {
			t.Errorf("forward %s d%d needs %d bytes of shared memory, a block may have %d", c.variant, c.dim, got, flashSM90MaxSmem)
		}
		macro := "FA90_FWD_PINGPONG"
		if tl.persistent {
			macro = "FA90_FWD_PERSISTENT"
		}
		if !strings.Contains(string(src), macro+"("+c.instance+")") {
			t.Errorf("the .cu has no %s(%s) (forward %s d%d: %d warpgroups, %d stages)", macro, c.instance, c.variant, c.dim, tl.warpgroups, tl.stages)
		}
		if tl.threads() != c.wantThread {
			t.Errorf("forward %s d%d: %d threads, want %d", c.variant, c.dim, tl.threads(), c.wantThread)
		}
	}
	// The bulk-reduction backward's dQ path: one bulk add-reduction per tile
	// from shared memory, committed as a group, the staging tile reused only
	// after a wait on the group's reads, and the generic-proxy stores fenced
	// for the async proxy that the bulk copy reads through.
	for _, ptx := range []string{
		"cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;",
		"cp.async.bulk.commit_group;",
		"cp.async.bulk.wait_group.read %0;",
		"cp.async.bulk.wait_group %0;",
		"fence.proxy.async.shared::cta;",
	} {
		if !strings.Contains(srcs[flashSM90BwdFile], ptx) {
			t.Errorf("%s has no %q", flashSM90BwdFile, ptx)
		}
	}
}

// TestFlashSM90Compile compiles each sm90 unit (flashSM90Files) for sm_90a
// with NVRTC where it is installed (no GPU needed; NVRTC 12.0 or newer),
// checks that every entry point is in the cubin of the unit that defines it,
// and logs ptxas's resource report (registers, spill bytes per kernel;
// "wgmma ... serialized" warnings mean the compiler had to wait on each
// wgmma and the kernel will be slow).
func TestFlashSM90Compile(t *testing.T) {
	version, err := driver.NVRTCVersion()
	if err != nil {
		t.Skip(err)
	}
	if strings.HasPrefix(version, "11.") {
		t.Skipf("NVRTC %s cannot target sm_90a", version)
	}
	for file, src := range flashSM90Sources(t) {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".cu"), func(t *testing.T) {
			cubin, log, err := driver.NVRTCCompile(file, src, driver.CompileOptions("sm_90a", []string{"--ptxas-options=-v"}))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("NVRTC %s, sm_90a, %s, ptxas -v:\n%s", version, file, log)
			var names []string
			for _, k := range flashSM90AllKernels {
				if flashSM90UnitOf(k) != file {
					continue
				}
				names = append(names, k)
				if !bytes.Contains(cubin, []byte(k+"\x00")) {
					t.Errorf("cubin of %s has no kernel %s", file, k)
				}
			}
			if strings.Contains(log, "serializ") {
				t.Errorf("ptxas serialized wgmma (see the log above): the kernel would be correct but slow")
			}
			if m := regexp.MustCompile(`[1-9][0-9]* bytes spill stores`).FindString(log); m != "" {
				t.Errorf("ptxas spilled registers (%s, see the log above): the kernel would be correct but slow", m)
			}
			checkSM90Descriptors(t, cubin, names)
		})
	}
}

// flashSM90MovedDescriptors are the kernels whose wgmma descriptors ptxas
// (NVRTC 13) builds in ordinary registers: the non-persistent ping-pong
// forwards, which only FlashSM90Env=pingpong/pingpong3wg runs. Their warpgroup index is
// computed per thread (warp >> 2; the broadcast warpgroup_index made ptxas
// spill there), so the Q tile's address, and with it every descriptor, is
// not uniform. Left as they are: not timed since the persistent ones
// replaced them as the default.
var flashSM90MovedDescriptors = []string{"flash_fwd_sm90_pingpong_", "flash_fwd_sm90_pingpong3wg_"}

// checkSM90Descriptors disassembles the sm90 cubin with cuobjdump, where the
// toolkit has it, and fails for a kernel whose wgmmas take descriptors moved
// in from ordinary registers (sassDescriptorMoves), which ptxas does not
// report.
func checkSM90Descriptors(t *testing.T, cubin []byte, names []string) {
	tool := cudaTool("cuobjdump")
	if tool == "" {
		t.Log("no cuobjdump in the CUDA toolkit or PATH: the wgmma descriptor check did not run")
		return
	}
	path := filepath.Join(t.TempDir(), "flash_sm90.cubin")
	if err := os.WriteFile(path, cubin, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tool, "-sass", path).CombinedOutput()
	if err != nil {
		t.Fatalf("%s -sass: %v\n%s", tool, err, out)
	}
	found := sassDescriptorMoves(string(out))
	for _, k := range names {
		d := found[k]
		t.Logf("%-34s %3d wgmma, %3d after descriptor moves", k, d.wgmmas, d.moved)
		if d.wgmmas == 0 {
			t.Errorf("%s: no wgmma in the listing of %s", k, tool)
		}
		known := slices.ContainsFunc(flashSM90MovedDescriptors, func(p string) bool { return strings.HasPrefix(k, p) })
		if d.moved > 0 && !known {
			t.Errorf("%s: %d of %d wgmmas wait for descriptors moved from ordinary registers (R2UR): ptxas left the uniform datapath, the kernel would be correct but slower", k, d.moved, d.wgmmas)
		}
	}
}

func TestFlashSM90Pick(t *testing.T) {
	for _, c := range []struct {
		maj, mnr int
		dt       GemmType
		dim      int
		scale    float32
		env      string
		want     string
	}{
		{9, 0, GemmBF16, 128, 0.1, "1", "flash_fwd_sm90_persistent_bf16_d128"},
		{9, 0, GemmBF16, 64, 0.1, "1", "flash_fwd_sm90_persistent3wg_bf16_d64"},
		{9, 0, GemmF16, 64, 0.1, "warpspec", "flash_fwd_sm90_warpspec_fp16_d64"},
		{9, 0, GemmBF16, 128, 0.1, "0", ""},
		{9, 0, GemmBF16, 128, 0.1, "", "flash_fwd_sm90_persistent_bf16_d128"}, // the default on 9.0
		{9, 0, GemmBF16, 128, 0.1, "pingpong", "flash_fwd_sm90_pingpong_bf16_d128"},
		{9, 0, GemmF16, 64, 0.1, "pingpong", "flash_fwd_sm90_pingpong_fp16_d64"},
		{9, 0, GemmBF16, 64, 0.1, "pingpong3wg", "flash_fwd_sm90_pingpong3wg_bf16_d64"},
		{9, 0, GemmF16, 128, 0.1, "pingpong3wg", "flash_fwd_sm90_pingpong_fp16_d128"}, // no 3-warpgroup d128
		{9, 0, GemmBF16, 64, 0.1, "persistent", "flash_fwd_sm90_persistent_bf16_d64"},
		{9, 0, GemmF16, 128, 0.1, "persistent", "flash_fwd_sm90_persistent_fp16_d128"},
		{9, 0, GemmBF16, 64, 0.1, "persistent3wg", "flash_fwd_sm90_persistent3wg_bf16_d64"},
		{9, 0, GemmBF16, 128, 0.1, "persistent3wg", "flash_fwd_sm90_persistent_bf16_d128"}, // no 3-warpgroup d128
		{8, 0, GemmBF16, 64, 0.1, "persistent", ""},
		{8, 0, GemmBF16, 128, 0.1, "pingpong", ""},
		{9, 0, GemmBF16, 64, 0.1, "0", ""},
		{8, 0, GemmBF16, 128, 0.1, "", ""},
		{9, 0, GemmBF16, 96, 0.1, "", ""},
		{9, 0, GemmF32, 64, 0.1, "", ""},
		{8, 0, GemmBF16, 128, 0.1, "1", ""},  // not Hopper: FA2
		{10, 0, GemmBF16, 128, 0.1, "1", ""}, // sm_90a cubins run on 9.0 only
		{9, 0, GemmBF16, 80, 0.1, "1", ""},   // no such head dim
		{9, 0, GemmF32, 128, 0.1, "1", ""},
		{9, 0, GemmBF16, 128, -1, "1", ""}, // tensor-core kernels need scale > 0
	} {
		got, err := flashSM90Pick(c.maj, c.mnr, c.dt, c.dim, 4096, false, c.scale, c.env)
		if err != nil || got != c.want {
			t.Errorf("flashSM90Pick(%d.%d, %v, d%d, %g, %q) = %q, %v; want %q", c.maj, c.mnr, c.dt, c.dim, c.scale, c.env, got, err, c.want)
		}
	}
	// The default by shape (flashSM90DefaultRules): short causal D=64 runs
	// persistent, everything else persistent3wg (persistent at D=128); a named kernel is a name.
	for _, c := range []struct {
		dim, sq int
		causal  bool
		env     string
		want    string
	}{
		{64, 1024, true, "", "flash_fwd_sm90_persistent_bf16_d64"},
		{64, 1024, true, "1", "flash_fwd_sm90_persistent_bf16_d64"},
		{64, 1025, true, "", "flash_fwd_sm90_persistent3wg_bf16_d64"},
		{64, 2048, true, "1", "flash_fwd_sm90_persistent3wg_bf16_d64"},
		{64, 1024, false, "", "flash_fwd_sm90_persistent3wg_bf16_d64"},
		{128, 1024, true, "", "flash_fwd_sm90_persistent_bf16_d128"},
		{64, 1024, true, "pingpong3wg", "flash_fwd_sm90_pingpong3wg_bf16_d64"},
	} {
		got, err := flashSM90Pick(9, 0, GemmBF16, c.dim, c.sq, c.causal, 0.1, c.env)
		if err != nil || got != c.want {
			t.Errorf("flashSM90Pick(d%d, sq %d, causal %v, %q) = %q, %v; want %q", c.dim, c.sq, c.causal, c.env, got, err, c.want)
		}
	}
	if _, err := flashSM90Pick(9, 0, GemmBF16, 128, 4096, false, 0.1, "yes"); err == nil || !strings.Contains(err.Error(), FlashSM90Env) {
		t.Errorf("bad %s value: got %v, want an error naming it", FlashSM90Env, err)
	}
	for _, v := range []string{"tmapipe", "cpasync", "ppe", "pp3e", "pppq", "ppp3q"} { // removed variants
		if _, err := flashSM90Pick(9, 0, GemmBF16, 64, 4096, false, 0.1, v); err == nil {
			t.Errorf("%s=%s: want an error (no such forward any more)", FlashSM90Env, v)
		}
	}
	// The former names (BENCHMARKS.md's runs, bench -sm90's columns) pick
	// the same kernels as the names now, forward and backward.
	for old, now := range flashSM90FwdRenamed {
		for _, dim := range []int{64, 128} {
			got, err := flashSM90Pick(9, 0, GemmBF16, dim, 4096, false, 0.1, old)
			want, werr := flashSM90Pick(9, 0, GemmBF16, dim, 4096, false, 0.1, now)
			if err != nil || werr != nil || got != want || got == "" {
				t.Errorf("%s=%s (former name of %s), d%d: %q, %v; want %q, %v", FlashSM90Env, old, now, dim, got, err, want, werr)
			}
		}
	}
	for old, now := range flashSM90BwdRenamed {
		for _, dim := range []int{64, 128} {
			got, err := flashSM90BwdPick(9, 0, GemmF16, dim, 0.1, old)
			want, werr := flashSM90BwdPick(9, 0, GemmF16, dim, 0.1, now)
			if err != nil || werr != nil || got != want || got == "" {
				t.Errorf("%s=%s (former name of %s), d%d: %q, %v; want %q, %v", FlashSM90BwdEnv, old, now, dim, got, err, want, werr)
			}
		}
	}
	if got := flashSM90WarpSpecSmem(64); got != 83008 {
		t.Errorf("d64 TMA smem %d, want 83008 (the .cu header)", got)
	}
	if got := flashSM90WarpSpecSmem(128); got != 164928 {
		t.Errorf("d128 TMA smem %d, want 164928 (the .cu header)", got)
	}
	for _, dt := range []GemmType{GemmBF16, GemmF16} {
		for _, dim := range []int{64, 128} {
			for _, v := range []string{"warpspec", "pingpong", "pingpong3wg", "persistent", "persistent3wg"} {
				name := flashSM90Name(dt, dim, v)
				if !slices.Contains(flashSM90AllKernels, name) {
					t.Errorf("flashSM90Name(%v, %d, %q) = %q, not a kernel of the file", dt, dim, v, name)
				}
			}
		}
	}
	for _, c := range []struct {
		maj, mnr int
		dt       GemmType
		dim      int
		scale    float32
		env      string
		want     string
	}{
		{9, 0, GemmBF16, 128, 0.1, "1", "flash_bwd_sm90_alternating_bf16_d128"},
		{9, 0, GemmF16, 64, 0.1, "1", "flash_bwd_sm90_pingpong_fp16_d64"},
		{9, 0, GemmF16, 128, 0.1, "pipelined", "flash_bwd_sm90_pipelined_fp16_d128"},
		{9, 0, GemmBF16, 128, 0.1, "baseline", "flash_bwd_sm90_baseline_bf16_d128"},
		{8, 0, GemmBF16, 64, 0.1, "pingpong", ""},
		{9, 0, GemmBF16, 64, 0.1, "pingpong", "flash_bwd_sm90_pingpong_bf16_d64"},
		{9, 0, GemmF16, 128, 0.1, "pingpong", "flash_bwd_sm90_alternating_fp16_d128"}, // no D=128 ping-pong: the default
		{9, 0, GemmBF16, 128, 0.1, "alternating", "flash_bwd_sm90_alternating_bf16_d128"},
		{9, 0, GemmF16, 64, 0.1, "alternating", "flash_bwd_sm90_pingpong_fp16_d64"}, // no D=64 alternating: the default
		{9, 0, GemmF16, 64, 0.1, "pipelined", "flash_bwd_sm90_pipelined_fp16_d64"},
		{9, 0, GemmF16, 64, 0.1, "baseline", "flash_bwd_sm90_baseline_fp16_d64"},
		{8, 0, GemmBF16, 128, 0.1, "baseline", ""},
		{9, 0, GemmBF16, 96, 0.1, "baseline", ""},
		{9, 0, GemmBF16, 128, 0.1, "", "flash_bwd_sm90_alternating_bf16_d128"}, // the default
		{9, 0, GemmF16, 64, 0.1, "", "flash_bwd_sm90_pingpong_fp16_d64"},
		{8, 0, GemmBF16, 128, 0.1, "", ""},
		{9, 0, GemmF32, 64, 0.1, "", ""},
		{9, 0, GemmBF16, 128, 0.1, "0", ""},
		{8, 0, GemmBF16, 128, 0.1, "1", ""},
		{9, 0, GemmBF16, 96, 0.1, "1", ""},
		{9, 0, GemmF32, 64, 0.1, "1", ""},
		{9, 0, GemmBF16, 64, -1, "1", ""},
	} {
		got, err := flashSM90BwdPick(c.maj, c.mnr, c.dt, c.dim, c.scale, c.env)
		if err != nil || got != c.want {
			t.Errorf("flashSM90BwdPick(%d.%d, %v, d%d, %g, %q) = %q, %v; want %q", c.maj, c.mnr, c.dt, c.dim, c.scale, c.env, got, err, c.want)
		}
		if got != "" && !slices.Contains(flashSM90AllKernels, got) {
			t.Errorf("flashSM90BwdPick: %q is not a kernel of the file", got)
		}
	}
	if _, err := flashSM90BwdPick(9, 0, GemmBF16, 128, 0.1, "warpspec"); err == nil || !strings.Contains(err.Error(), FlashSM90BwdEnv) {
		t.Errorf("bad %s value: got %v, want an error naming it", FlashSM90BwdEnv, err)
	}
	if name := flashSM90BwdName(GemmBF16, 128, "dq"); name != "" {
		t.Errorf("flashSM90BwdName of an unknown variant = %q, want \"\"", name)
	}
	if name := flashSM90Name(GemmBF16, 128, "vswap"); name != "" {
		t.Errorf("flashSM90Name of an unknown variant = %q, want \"\"", name)
	}
}

// TestFlashSM90PersistentGrid checks the persistent forwards' grid: one CTA
// per SM, fewer where there are fewer work items (tiles, or pairs of tiles
// for the static causal schedule), the test override, and the error where
// the kernel's int tile indices would overflow.
func TestFlashSM90PersistentGrid(t *testing.T) {
	for _, c := range []struct {
		bh, sq, rows, sms int
		causal, dynamic   bool
		override, want    int
	}{
		{256, 1024, 128, 132, false, false, 0, 132},
		{256, 1024, 128, 132, true, false, 0, 132},
		{256, 1024, 128, 132, true, true, 0, 132},
		{2, 300, 128, 132, false, false, 0, 6},   // 3 query blocks a head
		{2, 300, 128, 132, true, false, 0, 3},    // 6 tiles in pairs
		{2, 300, 128, 132, true, true, 0, 6},     // 6 tiles drawn one by one
		{1, 1000, 192, 132, true, false, 0, 3},   // 6 tiles in pairs
		{1, 1, 128, 132, true, false, 0, 1},      // one tile, half a pair
		{1, 1, 128, 132, true, true, 0, 1},       // one tile
		{1, 2048, 128, 0, false, false, 0, 16},   // no SM count: the H200's
		{64, 4096, 128, 0, false, false, 0, 132}, // no SM count: the H200's
		{1, 2048, 128, 132, true, false, 3, 3},
		{1, 2048, 128, 132, false, false, 1, 1},
		{1, 128, 128, 132, false, false, 3, 1}, // the override bounded by the work
		{1, 128, 128, 132, true, true, 3, 1},
	} {
		flashSM90PersistentGrid = c.override
		got, err := flashSM90PersistentGridFor(c.bh, c.sq, c.rows, c.sms, c.causal, c.dynamic)
		if err != nil || got != c.want {
			t.Errorf("flashSM90PersistentGridFor(bh %d, sq %d, rows %d, sms %d, causal %v, dynamic %v) with override %d = %d, %v; want %d",
				c.bh, c.sq, c.rows, c.sms, c.causal, c.dynamic, c.override, got, err, c.want)
		}
	}
	flashSM90PersistentGrid = 0
	if _, err := flashSM90PersistentGridFor(1<<25, 1<<12, 64, 132, false, false); err == nil {
		t.Errorf("2^31 tiles: no error")
	}
	if _, err := flashSM90PersistentGridFor(1<<23, 255*128, 128, 132, false, true); err != nil {
		t.Errorf("2^31 - 2^23 tiles: %v", err)
	}
}

// TestFlashSM90Schedule checks how the persistent forward's schedule is
// chosen (FlashSM90SchedEnv) and how many heads a causal section holds.
func TestFlashSM90Schedule(t *testing.T) {
	for _, c := range []struct {
		causal bool
		env    string
		want   bool
	}{
		{true, "", true}, {false, "", false},
		{false, "dynamic", true}, {true, "static", false},
	} {
		got, err := flashSM90Dynamic(c.causal, c.env)
		if err != nil || got != c.want {
			t.Errorf("flashSM90Dynamic(causal %v, %q) = %v, %v; want %v", c.causal, c.env, got, err, c.want)
		}
	}
	if _, err := flashSM90Dynamic(true, "lpt"); err == nil || !strings.Contains(err.Error(), FlashSM90SchedEnv) {
		t.Errorf("flashSM90Dynamic of an unknown value: %v, want an error naming %s", err, FlashSM90SchedEnv)
	}
	for _, c := range []struct{ bh, dim, override, want int }{
		{256, 64, 0, 64},
		{256, 128, 0, 32},
		{16, 128, 0, 16},  // fewer heads than a section holds
		{64, 128, 0, 32},  // two sections of 32
		{100, 128, 0, 25}, // four sections of 25, not 32, 32, 32 and 4
		{65, 64, 0, 33},   // 33 and 32
		{0, 64, 0, 1},
		{2, 64, 1, 1}, // the test override
		{5, 64, 2, 2}, // sections of 2, 2 and 1
		{1, 64, 2, 1},
	} {
		flashSM90SectionHeadsOverride = c.override
		if got := flashSM90SectionHeads(c.bh, c.dim); got != c.want {
			t.Errorf("flashSM90SectionHeads(bh %d, dim %d) with override %d = %d, want %d", c.bh, c.dim, c.override, got, c.want)
		}
	}
	flashSM90SectionHeadsOverride = 0
}

// flashForwardRef is the float64 forward (O, its magnitudes, LSE) of
// flashReference, without the backward's cost.
func flashForwardRef(q, k, v []float64, bh, sq, sk, dim int, scale float64, causal bool) (o, oMag, lse []float64) {
	o, oMag, lse = make([]float64, bh*sq*dim), make([]float64, bh*sq*dim), make([]float64, bh*sq)
	p := make([]float64, sk)
	for b := range bh {
		Q, K, V := q[b*sq*dim:], k[b*sk*dim:], v[b*sk*dim:]
		for i := range sq {
			n := sk
			if causal {
				n = min(sk, i+1)
			}
			m := math.Inf(-1)
			for j := range n {
				s := 0.0
				for c := range dim {
					s += Q[i*dim+c] * K[j*dim+c]
				}
				p[j] = s * scale
				m = math.Max(m, p[j])
			}
			sum := 0.0
			for j := range n {
				p[j] = math.Exp(p[j] - m)
				sum += p[j]
			}
			lse[b*sq+i] = m + math.Log(sum)
			oi, om := o[(b*sq+i)*dim:], oMag[(b*sq+i)*dim:]
			for j := range n {
				w := p[j] / sum
				for c := range dim {
					oi[c] += w * V[j*dim+c]
					om[c] += w * math.Abs(V[j*dim+c])
				}
			}
		}
	}
	return o, oMag, lse
}

// flashSM90Where says where the out-of-tolerance elements of an [bh, sq,
// dim] result lie, to tell a wrong descriptor or fragment from a wrong mask:
// by 64-column half, by warpgroup (query row % 128 < 64), by row % 8, by
// whether the row's keys span one 128-key tile or more, and how many are NaN.
func flashSM90Where(got, ref, mag []float64, bh, sq, sk, dim int, causal bool, frac, rtol float64) string {
	var half [2]int
	var wg [2]int
	var r8 [8]int
	var oneTile, moreTiles, nan, bad int
	for i := range ref {
		lim := rtol * math.Abs(ref[i])
		if mag != nil {
			lim += frac * mag[i]
		}
		if math.Abs(got[i]-ref[i]) <= lim {
			continue
		}
		bad++
		if math.IsNaN(got[i]) {
			nan++
		}
		row, col := (i/dim)%sq, i%dim
		half[col/64%2]++
		wg[row%128/64]++
		r8[row%8]++
		keys := sk
		if causal {
			keys = min(sk, row+1)
		}
		if keys <= 128 {
			oneTile++
		} else {
			moreTiles++
		}
	}
	if bad == 0 {
		return "none bad"
	}
	return fmt.Sprintf("%d bad: columns 0-63 %d, 64-127 %d; warpgroup 0 %d, 1 %d; by row%%8 %v; rows seeing <=128 keys %d, more %d; NaN %d",
		bad, half[0], half[1], wg[0], wg[1], r8, oneTile, moreTiles, nan)
}

// TestFlashSM90Resources prints each sm90 kernel's registers and local
// (spill) bytes as the driver reports them for the loaded cubin.
func TestFlashSM90Resources(t *testing.T) {
	d := sm90GPU(t)
	for _, name := range flashSM90AllKernels {
		ks, err := flashSM90KernelSet(d, flashSM90UnitOf(name))
		if err != nil {
			t.Fatal(err)
		}
		f, err := ks.Fn(name, 0)
		if err != nil {
			t.Fatal(err)
		}
		a, err := f.Attributes()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%-34s registers %3d, local (spill) bytes %4d, static smem %d, max threads %d", name, a.NumRegs, a.LocalBytes, a.StaticSharedBytes, a.MaxThreadsPerBlock)
		threads := 0
		if strings.HasPrefix(name, "flash_bwd_sm90") {
			v, _, _ := strings.Cut(strings.TrimPrefix(name, "flash_bwd_sm90_"), "_")
			threads = flashSM90BwdThreads(v)
		} else if strings.HasPrefix(name, "flash_fwd_sm90_warpspec") {
			threads = flashSM90WarpSpecThreads
		} else if v, _, _ := strings.Cut(strings.TrimPrefix(name, "flash_fwd_sm90_"), "_"); strings.HasPrefix(v, "pingpong") || strings.HasPrefix(v, "persistent") {
			threads = flashSM90PingPongOf(v, 64).threads()
		}
		if a.MaxThreadsPerBlock < threads {
			t.Errorf("%s: at most %d threads per block, the launch uses %d", name, a.MaxThreadsPerBlock, threads)
		}
	}
}

// TestFlashSM90GPU checks the Hopper forwards against the float64 reference
// with the FA2 test's tolerances (TestFlashAttentionGPU), O and LSE, over
// sequence lengths around the 128-row/128-key tiles, Sq != Sk, causal or not.
// Kernel families run one after another, the cp.async ones first: a kernel
// that faults leaves the context unusable, and the families before it have
// reported by then. A failure names the kernel and the shape and says where
// the bad elements are; LSE depends on S = Q·Kᵀ alone, so "LSE ok, O bad"
// points at P·V (P's fragments or V's descriptor), "LSE bad" at Q·Kᵀ, the
// mask or the loads.
func TestFlashSM90GPU(t *testing.T) {
	d := sm90GPU(t)
	d.SetCubinCacheDir(t.TempDir())
	type tol struct{ frac, rtol, l2 float64 }
	tols := map[GemmType]tol{GemmBF16: {1.0 / 128, 0.02, 1e-2}, GemmF16: {1.0 / 1024, 0.004, 2e-3}}
	type shape struct{ sq, sk int }
	var shapes []shape
	for _, s := range []int{1, 17, 64, 127, 128, 129, 1000, 2048} {
		shapes = append(shapes, shape{s, s})
	}
	shapes = append(shapes, shape{77, 300}, shape{300, 77}, shape{129, 1000}, shape{1000, 129}, shape{1, 257}, shape{200, 1})

	// The problems, each uploaded and solved in float64 once.
	type problem struct {
		name                string
		dt                  GemmType
		bh, sq, sk, dim     int
		causal              bool
		scale               float32
		q, k, v             DevicePtr
		ref, refMag, refLSE []float64
	}
	var problems []problem
	rng := rand.New(rand.NewPCG(90, 1))
	gen := flashNormals(rng)
	for _, dt := range []GemmType{GemmBF16, GemmF16} {
		for _, dim := range []int{64, 128} {
			for _, sh := range shapes {
				for _, causal := range []bool{false, true} {
					p := problem{name: fmt.Sprintf("%v/d%d/sq%d/sk%d/causal%v", dt, dim, sh.sq, sh.sk, causal),
						dt: dt, bh: 2, sq: sh.sq, sk: sh.sk, dim: dim, causal: causal, scale: float32(1 / math.Sqrt(float64(dim)))}
					if sh.sq*sh.sk > 1<<20 {
						p.bh = 1
					}
					var qh, kh, vh []float64
					p.q, qh = flashUpload(t, d, dt, gen(p.bh*p.sq*dim))
					p.k, kh = flashUpload(t, d, dt, gen(p.bh*p.sk*dim))
					p.v, vh = flashUpload(t, d, dt, gen(p.bh*p.sk*dim))
					p.ref, p.refMag, p.refLSE = flashForwardRef(qh, kh, vh, p.bh, p.sq, p.sk, dim, float64(p.scale), causal)
					problems = append(problems, p)
				}
			}
		}
	}

	runs, fails := map[string]int{}, map[string]int{}
	defer func() {
		for _, k := range flashSM90AllKernels {
			if runs[k] > 0 {
				t.Logf("%-34s %3d of %3d shapes failed", k, fails[k], runs[k])
			}
		}
	}()
	// The persistent kernels (persistent, persistent3wg) run once with a CTA per SM (every
	// problem here has fewer tiles than SMs: a CTA gets one tile, or a
	// causal pair) and once on grids of 1 to 3 CTAs (grid > 0), where each
	// CTA walks many tiles of different lengths through one K/V ring; with
	// the default schedule (sched "": dynamic when causal) and with each
	// schedule forced, the dynamic one in sections of one head (sec) so
	// that the two heads' tiles cross a section's bound.
	for _, fam := range []struct {
		label, variant string
		grid           int
		sched          string
		sec            int
	}{
		{"warpspec", "warpspec", 0, "", 0}, {"pingpong", "pingpong", 0, "", 0}, {"pingpong3wg", "pingpong3wg", 0, "", 0},
		{"persistent", "persistent", 0, "", 0}, {"persistent3wg", "persistent3wg", 0, "", 0}, {"persistent-grid3", "persistent", 3, "", 0},
		{"persistent3wg-grid2", "persistent3wg", 2, "", 0}, {"persistent-grid1", "persistent", 1, "", 0},
		{"persistent-static-grid3", "persistent", 3, "static", 0}, {"persistent3wg-static-grid2", "persistent3wg", 2, "static", 0},
		{"persistent-dynamic-grid3-sec1", "persistent", 3, "dynamic", 1}, {"persistent3wg-dynamic-grid2-sec1", "persistent3wg", 2, "dynamic", 1},
	} {
		t.Run(fam.label, func(t *testing.T) {
			flashSM90PersistentGrid = fam.grid
			flashSM90SectionHeadsOverride = fam.sec
			t.Setenv(FlashSM90SchedEnv, fam.sched)
			defer func() { flashSM90PersistentGrid, flashSM90SectionHeadsOverride = 0, 0 }()
			for _, p := range problems {
				kname := flashSM90Name(p.dt, p.dim, fam.variant)
				if !strings.Contains(kname, "_"+fam.variant+"_") {
					continue // pingpong3wg at d128 is pingpong's kernel (persistent3wg persistent's), checked already
				}
				t.Run(p.name, func(t *testing.T) {
					runs[kname]++
					nq := p.bh * p.sq * p.dim
					o := flashAlloc(t, d, nq, 2)
					lse := flashAlloc(t, d, p.bh*p.sq, 4)
					if err := flashForwardSM90(d, kname, p.q, p.k, p.v, o, lse, p.bh, 1, p.sq, p.sk, p.dim, p.scale, p.causal); err != nil {
						fails[kname]++
						t.Fatalf("%s: %v", kname, err)
					}
					if err := d.Synchronize(); err != nil {
						fails[kname]++
						t.Fatalf("%s: %v", kname, err)
					}
					tl := tols[p.dt]
					got := flashDownload(t, d, p.dt, o, nq)
					gotLSE := flashDownload(t, d, GemmF32, lse, p.bh*p.sq)
					errO := flashCheck("O", got, p.ref, p.refMag, tl.frac, 0, tl.rtol, tl.l2)
					errL := flashCheck("LSE", gotLSE, p.refLSE, nil, 0, 1e-3, 2e-5, 1e-5)
					if errO != nil || errL != nil {
						fails[kname]++
					}
					if errO != nil {
						t.Errorf("%s: %v [%s] (LSE %s)", kname, errO,
							flashSM90Where(got, p.ref, p.refMag, p.bh, p.sq, p.sk, p.dim, p.causal, tl.frac, tl.rtol),
							map[bool]string{true: "ok", false: "also bad"}[errL == nil])
					}
					if errL != nil {
						t.Errorf("%s: %v", kname, errL)
					}
				})
			}
		})
	}
}

// TestFlashSM90Dispatch checks that FlashForward runs the kernel that
// FlashSM90Env names (its output is bit-identical to a direct launch of that
// kernel) and FA2 when it is 0 (FA2 tiles keys by 64 for d128, so its
// rounding differs and some element of 76800 differs).
func TestFlashSM90Dispatch(t *testing.T) {
	d := sm90GPU(t)
	const bh, s, dim = 2, 300, 128
	rng := rand.New(rand.NewPCG(3, 4))
	gen := flashNormals(rng)
	n := bh * s * dim
	q, _ := flashUpload(t, d, GemmBF16, gen(n))
	k, _ := flashUpload(t, d, GemmBF16, gen(n))
	v, _ := flashUpload(t, d, GemmBF16, gen(n))
	run := func(env, kernel string) []float64 {
		t.Setenv(FlashSM90Env, env)
		o := flashAlloc(t, d, n, 2)
		lse := flashAlloc(t, d, bh*s, 4)
		var err error
		if kernel != "" {
			err = flashForwardSM90(d, kernel, q, k, v, o, lse, bh, 1, s, s, dim, 0.088, true)
		} else {
			err = FlashForward(d, GemmBF16, q, k, v, o, lse, bh, s, s, dim, 0.088, true)
		}
		if err != nil {
			t.Fatal(err)
		}
		return flashDownload(t, d, GemmBF16, o, n)
	}
	same := func(a, b []float64) bool {
		for i := range a {
			if a[i] != b[i] && !(math.IsNaN(a[i]) && math.IsNaN(b[i])) {
				return false
			}
		}
		return true
	}
	fa2 := run("0", "")
	def := flashSM90DefaultFor(dim, s, true)
	for _, c := range []struct{ env, variant string }{{"", def}, {"1", def}, {"warpspec", "warpspec"}, {"pingpong", "pingpong"}, {"pingpong3wg", "pingpong3wg"}, {"persistent", "persistent"}, {"persistent3wg", "persistent3wg"}} {
		kernel := flashSM90Name(GemmBF16, dim, c.variant)
		direct, via := run("0", kernel), run(c.env, "")
		if !same(direct, via) {
			t.Errorf("%s=%s: FlashForward's output differs from %s's", FlashSM90Env, c.env, kernel)
		}
		if same(direct, fa2) {
			t.Errorf("%s=0: FlashForward's output is bit-identical to %s's; did FA2 run?", FlashSM90Env, kernel)
		}
	}
	t.Setenv(FlashSM90Env, "on")
	if err := FlashForward(d, GemmBF16, q, k, v, q, q, bh, s, s, dim, 0.088, true); err == nil || !strings.Contains(err.Error(), FlashSM90Env) {
		t.Errorf("%s=on: got %v, want an error naming the variable", FlashSM90Env, err)
	}
}

// flashSpeedInputs uploads count bf16 tensors of n values in [-2, 2) for the
// speed tests, tensor i from a linear congruential sequence seeded seed+i;
// they are freed when the test ends.
// flashSpeedProblem is one bf16 problem of the speed tests, sized as the
// bench's (B·S = tokens, H·D = width): B·H, the elements of a tensor, count
// random inputs (Q, K, V and, for the backward, dO), O and LSE to write, and
// the softmax scale.
type flashSpeedProblem struct {
	bh, n  int
	in     []DevicePtr
	o, lse DevicePtr
	scale  float32
}

func newFlashSpeedProblem(tb testing.TB, d *Device, tokens, width, s, dim, count int, seed uint32) flashSpeedProblem {
	tb.Helper()
	bh := tokens / s * (width / dim)
	n := bh * s * dim
	in := flashSpeedInputs(tb, d, count, n, seed)
	o := flashAlloc(tb, d, n, 2)
	return flashSpeedProblem{bh: bh, n: n, in: in, o: o, lse: flashAlloc(tb, d, bh*s, 4), scale: float32(1 / math.Sqrt(float64(dim)))}
}

func flashSpeedInputs(t testing.TB, d *Device, count, n int, seed uint32) []DevicePtr {
	t.Helper()
	host := make([]uint16, n)
	in := make([]DevicePtr, count)
	for i := range in {
		x := seed + uint32(i)
		for j := range host {
			x = x*1664525 + 1013904223
			host[j] = BF16FromFloat32(float32(int32(x)>>20) / 1024)
		}
		p, err := Upload(d, host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Free(p) })
		in[i] = p
	}
	return in
}

// TestFlashSM90Speed times the forward on bench-sized bf16 problems (B·S =
// 16k tokens, H·D = 2048, S = 4096: what `flashgraph bench -sm90` runs, less
// PyTorch) for FA2 and every sm90 kernel, logs TFLOP/s, and checks each sm90
// output against FA2's (relative L2 error at most 1e-2, the bf16 tolerance
// of TestFlashAttentionGPU): the correctness test stops at S = 2048.
func TestFlashSM90Speed(t *testing.T) {
	d := sm90GPU(t)
	const tokens, width, s, iters = 16384, 2048, 4096, 10
	for _, dim := range []int{64, 128} {
		p := newFlashSpeedProblem(t, d, tokens, width, s, dim, 3, uint32(dim))
		bh, n, in, o, lse, scale := p.bh, p.n, p.in, p.o, p.lse, p.scale
		for _, causal := range []bool{false, true} {
			flops := 4 * float64(bh) * s * s * float64(dim)
			if causal {
				flops /= 2
			}
			line := fmt.Sprintf("bf16 D=%d S=%d B·H=%d causal=%v TFLOP/s:", dim, s, bh, causal)
			var fa2 []float64
			for _, variant := range []string{"fa2", "warpspec", "pingpong", "pingpong3wg", "persistent", "persistent3wg"} {
				if dim == 128 && slices.Contains([]string{"pingpong3wg", "persistent3wg"}, variant) {
					continue // pingpong3wg runs pingpong at d128, persistent3wg persistent
				}
				t.Setenv(FlashSM90Env, "0")
				launch := func() error {
					if variant == "fa2" {
						return FlashForward(d, GemmBF16, in[0], in[1], in[2], o, lse, bh, s, s, dim, scale, causal)
					}
					return flashForwardSM90(d, flashSM90Name(GemmBF16, dim, variant), in[0], in[1], in[2], o, lse, bh, 1, s, s, dim, scale, causal)
				}
				label := variant
				ms, err := timeFlash(d, launch, iters)
				if err != nil {
					t.Errorf("%s D=%d causal=%v: %v", label, dim, causal, err)
					continue
				}
				line += fmt.Sprintf(" %s %.1f", label, flops/(ms*1e-3)/1e12)
				got := flashDownload(t, d, GemmBF16, o, n)
				if variant == "fa2" {
					fa2 = got
					continue
				}
				if fa2 != nil {
					if err := flashCheck("O vs FA2", got, fa2, nil, 0, math.Inf(1), 0, 1e-2); err != nil {
						t.Errorf("%s D=%d causal=%v: %v", label, dim, causal, err)
					}
				}
			}
			t.Log(line)
		}
	}
}

// BenchmarkFlashSM90CausalSchedule times the persistent causal forwards
// (bf16, B·S = 16384 tokens, H·D = 2048, S 1024–16384) with the static
// schedule and with the dynamic one at several section sizes: 15 rounds,
// each timing every schedule once (3 launches) in a rotating order, so that
// the GPU's drift in clock and temperature falls on all alike; it reports
// the median TFLOP/s of each schedule as a metric ("static", "nh16" ..
// "nh96", and "default", the section the launcher picks). On the GPU
// machine: ./.gpu/attention.test -test.run '^$' -test.bench FlashSM90CausalSchedule -test.benchtime 1x
func BenchmarkFlashSM90CausalSchedule(b *testing.B) {
	d := sm90GPU(b)
	ks, err := flashSM90KernelSet(d, flashSM90FwdFile)
	if err != nil {
		b.Fatal(err)
	}
	sched, err := d.FlashSM90Sched()
	if err != nil {
		b.Fatal(err)
	}
	const tokens, width, rounds = 16384, 2048, 15
	for _, kc := range []struct {
		dim     int
		variant string
	}{{128, "persistent"}, {64, "persistent3wg"}, {64, "persistent"}} {
		for _, s := range []int{1024, 2048, 4096, 8192, 16384} {
			b.Run(fmt.Sprintf("%s/d%d/s%d", kc.variant, kc.dim, s), func(b *testing.B) {
				dim := kc.dim
				p := newFlashSpeedProblem(b, d, tokens, width, s, dim, 3, uint32(dim))
				bh, in, o, lse, scale := p.bh, p.in, p.o, p.lse, p.scale
				name := flashSM90Name(GemmBF16, dim, kc.variant)
				tl := flashSM90PingPongOf(kc.variant, dim)
				smem := tl.smem(dim)
				f, err := ks.Fn(name, smem)
				if err != nil {
					b.Fatal(err)
				}
				// nh 0: the static schedule; the last, the launcher's section.
				nhs := []int{0, 16, 32, 48, 64, 96, flashSM90SectionHeads(bh, dim)}
				labels := []string{"static", "nh16", "nh32", "nh48", "nh64", "nh96", "default"}
				flops := 4 * float64(bh) * float64(s) * float64(s) * float64(dim) / 2
				maps := []flashTMATensor{{in[0], s, tl.rows(), 0}, {in[1], s, flashSM90Keys, 0}, {in[2], s, flashSM90Keys, 0}, {o, s, 64, 0}}
				for range b.N {
					times := make([][]float64, len(nhs))
					for r := range rounds {
						for i := range nhs {
							c := (i + r) % len(nhs)
							nh, dyn := nhs[c], nhs[c] != 0
							grid, err := flashSM90PersistentGridFor(bh, s, tl.rows(), d.SMCount(), true, dyn)
							if err != nil {
								b.Fatal(err)
							}
							var sp DevicePtr
							if dyn {
								sp = sched
							}
							ms, err := timeFlash(d, func() error {
								return launchFlashTMA(d, f, name, [3]uint32{uint32(grid), 1, 1}, tl.threads(), smem, bh, dim, maps,
									[]any{lse, int32(bh), int32(s), int32(s), scale, int32(1), sp, int32(nh), int32(1)})
							}, 3)
							if err != nil {
								b.Fatal(err)
							}
							times[c] = append(times[c], ms)
						}
					}
					for c := range nhs {
						slices.Sort(times[c])
						b.ReportMetric(flops/(times[c][len(times[c])/2]*1e-3)/1e12, labels[c]+"-TFLOP/s")
					}
				}
			})
		}
	}
}

// timeFlash runs launch once to warm up, then iters times between two
// events, and returns the mean milliseconds per launch.
func timeFlash(d *Device, launch func() error, iters int) (float64, error) {
	if err := launch(); err != nil {
		return 0, err
	}
	start, err := d.NewEvent()
	if err != nil {
		return 0, err
	}
	defer start.Destroy()
	end, err := d.NewEvent()
	if err != nil {
		return 0, err
	}
	defer end.Destroy()
	if err := d.Record(start); err != nil {
		return 0, err
	}
	for range iters {
		if err := launch(); err != nil {
			return 0, err
		}
	}
	if err := d.Record(end); err != nil {
		return 0, err
	}
	ms, err := d.ElapsedMs(start, end)
	return float64(ms) / float64(iters), err
}

// TestFlashSM90Backward checks FlashBackward with each Hopper backward
// (FlashSM90BwdEnv=pipelined, the default, and =baseline) against the float64
// reference with the tolerances of TestFlashAttentionGPU (dQ, dK, dV), over
// shapes around its 128-key and 64-query tiles, Sq != Sk, causal or not; O
// and LSE come from FlashForward (the default forward). A failing problem
// also runs FA2's backward on the same inputs: "FA2 ok" there puts the fault
// in the sm90 kernel. The bad elements' places are given as for the forward
// (for dK and dV the rows are keys: the "warpgroup" is the one that owns
// them). Which gradients fail says where: dV uses P alone (Q·Kᵀ, LSE, mask,
// Pᵀ·dO with dO as an N-major B); dK adds dP, Dsum and dSᵀ·Q; dQ alone bad
// points at the dS tile in shared memory (its stores, its descriptor), the
// dQ product's K descriptor (pipelined at D=64 starts 64 bytes into K's rows) or
// the staging tile, its bulk reductions and their ordering ("dQ bad, only
// rows of the last query block" points at the partial-block byte count).
// Each run also checks that FlashBackward chose the variant's kernel. Runs
// after the forward tests: a kernel that faults leaves the context unusable.
func TestFlashSM90Backward(t *testing.T) {
	d := sm90GPU(t)
	d.SetCubinCacheDir(t.TempDir())
	type tol struct{ frac, rtol, l2 float64 }
	tols := map[GemmType]tol{GemmBF16: {1.0 / 128, 0.02, 1e-2}, GemmF16: {1.0 / 1024, 0.004, 2e-3}}
	// What storing a gradient alone can cost: float16 is subnormal below
	// 2^-14, its values 2^-24 apart, so a correctly rounded result may be
	// 2^-25 from the float64 reference whatever the relative tolerance
	// (seen on the H200: dK and dV of a few 1e-7..3e-6 elements, FA2's
	// backward rounding to the same values). bfloat16's subnormals lie far
	// below any gradient here.
	outAtol := map[GemmType]float64{GemmF16: 0x1p-25}
	type shape struct{ sq, sk int }
	shapes := []shape{{1, 1}, {17, 17}, {64, 64}, {128, 128}, {129, 129}, {520, 520}, {77, 300}, {300, 77}, {200, 1}, {1, 257}}
	variants := []struct{ env, variant string }{{"pingpong", "pingpong"}, {"alternating", "alternating"}, {"pipelined", "pipelined"}, {"baseline", "baseline"}}
	rng := rand.New(rand.NewPCG(90, 2))
	gen := flashNormals(rng)
	fails, runs := map[string]int{}, map[string]int{}
	defer func() {
		for _, k := range flashSM90AllKernels {
			if runs[k] > 0 {
				t.Logf("%-34s %3d of %3d problems failed", k, fails[k], runs[k])
			}
		}
	}()
	for _, dt := range []GemmType{GemmBF16, GemmF16} {
		for _, dim := range []int{64, 128} {
			for _, sh := range shapes {
				for _, causal := range []bool{false, true} {
					const bh = 2
					name := fmt.Sprintf("%v/d%d/sq%d/sk%d/causal%v", dt, dim, sh.sq, sh.sk, causal)
					t.Run(name, func(t *testing.T) {
						nq, nk := bh*sh.sq*dim, bh*sh.sk*dim
						scale := float32(1 / math.Sqrt(float64(dim)))
						q, qh := flashUpload(t, d, dt, gen(nq))
						k, kh := flashUpload(t, d, dt, gen(nk))
						v, vh := flashUpload(t, d, dt, gen(nk))
						dO, doh := flashUpload(t, d, dt, gen(nq))
						o, lse := flashAlloc(t, d, nq, 2), flashAlloc(t, d, bh*sh.sq, 4)
						if err := FlashForward(d, dt, q, k, v, o, lse, bh, sh.sq, sh.sk, dim, scale, causal); err != nil {
							t.Fatal(err)
						}
						backward := func(env string) (dq, dk, dv []float64, err error) {
							t.Setenv(FlashSM90BwdEnv, env)
							gq, gk, gv := flashAlloc(t, d, nq, 2), flashAlloc(t, d, nk, 2), flashAlloc(t, d, nk, 2)
							if err := FlashBackward(d, dt, q, k, v, o, dO, lse, gq, gk, gv, 0, bh, sh.sq, sh.sk, dim, scale, causal); err != nil {
								return nil, nil, nil, err
							}
							return flashDownload(t, d, dt, gq, nq), flashDownload(t, d, dt, gk, nk), flashDownload(t, d, dt, gv, nk), nil
						}
						ref := flashReference(qh, kh, vh, doh, bh, sh.sq, sh.sk, dim, float64(scale), causal)
						tl := tols[dt]
						check := func(dq, dk, dv []float64) (errs []error, where []string) {
							for _, c := range []struct {
								name          string
								got, ref, mag []float64
								rows, other   int
							}{{"dQ", dq, ref.dq, ref.dqMag, sh.sq, sh.sk}, {"dK", dk, ref.dk, ref.dkMag, sh.sk, sh.sq}, {"dV", dv, ref.dv, ref.dvMag, sh.sk, sh.sq}} {
								if err := flashCheck(c.name, c.got, c.ref, c.mag, tl.frac, outAtol[dt], tl.rtol, tl.l2); err != nil {
									errs = append(errs, err)
									where = append(where, c.name+": "+flashSM90Where(c.got, c.ref, c.mag, bh, c.rows, c.other, dim, causal, tl.frac, tl.rtol))
								}
							}
							return errs, where
						}
						var fa2 struct {
							done       bool
							dk, dv     []float64
							err, check string
						}
						runFA2 := func() {
							if fa2.done {
								return
							}
							fa2.done = true
							fq, fk, fv, err := backward("0")
							if err != nil {
								fa2.err = err.Error()
								return
							}
							fa2.dk, fa2.dv = fk, fv
							fa2.check = "FA2 ok on these inputs"
							if e, _ := check(fq, fk, fv); len(e) > 0 {
								fa2.check = fmt.Sprintf("FA2 also fails: %v", e)
							}
						}
						for _, vr := range variants {
							kname := flashSM90BwdName(dt, dim, vr.variant)
							if kname == "" {
								continue // pingpong at D=128, alternating at D=64
							}
							runs[kname]++
							dq, dk, dv, err := backward(vr.env)
							if err != nil {
								fails[kname]++
								t.Errorf("%s: %v", kname, err)
								continue
							}
							if errs, where := check(dq, dk, dv); len(errs) > 0 {
								fails[kname]++
								runFA2()
								t.Errorf("%s: %v\n  where: %s\n  %s%s", kname, errs, strings.Join(where, "; "), fa2.check, fa2.err)
								continue
							}
							// The kernel FlashBackward ran under this setting.
							// (Its gradients can equal FA2's bit for bit: both
							// sum the same products over query blocks in the
							// same order; seen on the 520×520 shapes.)
							if got, err := flashSM90BwdChoice(d, dt, dim, scale); err != nil || got != kname {
								t.Errorf("%s=%s: FlashBackward runs %q (%v), want %s", FlashSM90BwdEnv, vr.env, got, err, kname)
							}
						}
					})
				}
			}
		}
	}
	t.Setenv(FlashSM90BwdEnv, "on")
	z := flashAlloc(t, d, 2*64*64, 2)
	if err := FlashBackward(d, GemmBF16, z, z, z, z, z, z, z, z, z, 0, 2, 64, 64, 64, 0.125, false); err == nil || !strings.Contains(err.Error(), FlashSM90BwdEnv) {
		t.Errorf("%s=on: got %v, want an error naming the variable", FlashSM90BwdEnv, err)
	}
}

// TestFlashSM90BwdSpeed times FlashBackward (preprocessing, main kernel, dQ
// conversion) at the bench shape (bf16, B·S = 16k tokens, H·D = 2048, S =
// 4096) with FA2's main kernel and with each sm90 one, logs TFLOP/s (2.5× the
// forward's FLOPs, the bench's convention), and checks the sm90 dQ, dK, dV
// against FA2's (relative L2 error at most 1e-2, the bf16 tolerance of
// TestFlashAttentionGPU): the correctness test stops at S = 520.
func TestFlashSM90BwdSpeed(t *testing.T) {
	d := sm90GPU(t)
	const tokens, width, s, iters = 16384, 2048, 4096, 5
	for _, dim := range []int{64, 128} {
		p := newFlashSpeedProblem(t, d, tokens, width, s, dim, 4, uint32(7*dim))
		bh, n, o, lse, scale := p.bh, p.n, p.o, p.lse, p.scale
		q, k, v, dO := p.in[0], p.in[1], p.in[2], p.in[3]
		grads := [3]DevicePtr{flashAlloc(t, d, n, 2), flashAlloc(t, d, n, 2), flashAlloc(t, d, n, 2)}
		ws := flashAlloc(t, d, FlashBackwardWorkspaceBytes(GemmBF16, bh, 1, s, s, dim, p.scale), 1)
		for _, causal := range []bool{false, true} {
			if err := FlashForward(d, GemmBF16, q, k, v, o, lse, bh, s, s, dim, scale, causal); err != nil {
				t.Fatal(err)
			}
			flops := 2.5 * 4 * float64(bh) * s * s * float64(dim)
			if causal {
				flops /= 2
			}
			line := fmt.Sprintf("backward bf16 D=%d S=%d B·H=%d causal=%v TFLOP/s:", dim, s, bh, causal)
			var fa2 [3][]float64
			for _, env := range []string{"0", "baseline", "pipelined", "pingpong", "alternating"} {
				if env != "0" && !flashSM90BwdHasDim(env, dim) {
					continue
				}
				t.Setenv(FlashSM90BwdEnv, env)
				label := map[string]string{"0": "fa2", "baseline": "sm90-baseline", "pipelined": "sm90-pipelined", "pingpong": "sm90-pingpong", "alternating": "sm90-alternating"}[env]
				ms, err := timeFlash(d, func() error {
					return FlashBackward(d, GemmBF16, q, k, v, o, dO, lse, grads[0], grads[1], grads[2], ws, bh, s, s, dim, scale, causal)
				}, iters)
				if err != nil {
					t.Errorf("%s D=%d causal=%v: %v", label, dim, causal, err)
					continue
				}
				line += fmt.Sprintf(" %s %.1f", label, flops/(ms*1e-3)/1e12)
				for i, name := range []string{"dQ", "dK", "dV"} {
					got := flashDownload(t, d, GemmBF16, grads[i], n)
					if env == "0" {
						fa2[i] = got
					} else if fa2[i] != nil {
						if err := flashCheck(name+" vs FA2", got, fa2[i], nil, 0, math.Inf(1), 0, 1e-2); err != nil {
							t.Errorf("%s D=%d causal=%v: %v", label, dim, causal, err)
						}
					}
				}
			}
			t.Log(line)
		}
	}
}

// TestFlashHeadChunks checks the split of the heads into launches of at
// most flashMaxGridY (grid y) each, each a whole number of groups (grouped
// K/V heads: a launch starts at a K/V head).
func TestFlashHeadChunks(t *testing.T) {
	const g8 = flashMaxGridY / 8 * 8 // 65528: the most heads of whole groups of 8
	for _, c := range []struct {
		bh, group int
		want      [][2]int
	}{
		{1, 1, [][2]int{{0, 1}}},
		{flashMaxGridY, 1, [][2]int{{0, flashMaxGridY}}},
		{flashMaxGridY + 1, 1, [][2]int{{0, flashMaxGridY}, {flashMaxGridY, 1}}},
		{2*flashMaxGridY + 5, 1, [][2]int{{0, flashMaxGridY}, {flashMaxGridY, flashMaxGridY}, {2 * flashMaxGridY, 5}}},
		{g8 + 16, 8, [][2]int{{0, g8}, {g8, 16}}},
		{2 * flashMaxGridY, 3, [][2]int{{0, flashMaxGridY}, {flashMaxGridY, flashMaxGridY}}},
	} {
		var got [][2]int
		if err := flashHeadChunks(c.bh, c.group, func(h0, n int) error { got = append(got, [2]int{h0, n}); return nil }); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("bh %d group %d: launches %v, want %v", c.bh, c.group, got, c.want)
		}
	}
	stop := errors.New("launch failed")
	calls := 0
	if err := flashHeadChunks(3*flashMaxGridY, 1, func(h0, n int) error { calls++; return stop }); err != stop || calls != 1 {
		t.Errorf("a failed launch: got %v after %d calls, want the error after 1", err, calls)
	}
}

// TestFlashSM90ManyHeads runs the Hopper forward and backward with more
// heads than one launch's grid y holds (they are split into two launches,
// flashHeadChunks) and compares O, LSE, dQ, dK and dV with FA2's on the same
// inputs: a head offset gone wrong in the second launch shows in its heads.
func TestFlashSM90ManyHeads(t *testing.T) {
	d := sm90GPU(t)
	const bh, s, dim = flashMaxGridY + 7, 3, 64
	rng := rand.New(rand.NewPCG(65, 535))
	gen := flashNormals(rng)
	n := bh * s * dim
	q, _ := flashUpload(t, d, GemmBF16, gen(n))
	k, _ := flashUpload(t, d, GemmBF16, gen(n))
	v, _ := flashUpload(t, d, GemmBF16, gen(n))
	dO, _ := flashUpload(t, d, GemmBF16, gen(n))
	scale := float32(0.125)
	run := func(fwdEnv, bwdEnv string) (out [5][]float64) {
		t.Setenv(FlashSM90Env, fwdEnv)
		t.Setenv(FlashSM90BwdEnv, bwdEnv)
		o, lse := flashAlloc(t, d, n, 2), flashAlloc(t, d, bh*s, 4)
		gq, gk, gv := flashAlloc(t, d, n, 2), flashAlloc(t, d, n, 2), flashAlloc(t, d, n, 2)
		if err := FlashForward(d, GemmBF16, q, k, v, o, lse, bh, s, s, dim, scale, true); err != nil {
			t.Fatal(err)
		}
		if err := FlashBackward(d, GemmBF16, q, k, v, o, dO, lse, gq, gk, gv, 0, bh, s, s, dim, scale, true); err != nil {
			t.Fatal(err)
		}
		out[0] = flashDownload(t, d, GemmBF16, o, n)
		out[1] = flashDownload(t, d, GemmF32, lse, bh*s)
		out[2] = flashDownload(t, d, GemmBF16, gq, n)
		out[3] = flashDownload(t, d, GemmBF16, gk, n)
		out[4] = flashDownload(t, d, GemmBF16, gv, n)
		return out
	}
	fa2 := run("0", "0")
	sm90 := run("", "")
	for i, name := range []string{"O", "LSE", "dQ", "dK", "dV"} {
		if err := flashCheck(name+" vs FA2", sm90[i], fa2[i], nil, 0, math.Inf(1), 0, 1e-2); err != nil {
			t.Error(err)
		}
	}
}
