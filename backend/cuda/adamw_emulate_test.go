package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"
)

// TestAdamWMultiHostEmulation runs adamw_multi_f32 and adamw_f32 of ops.cu
// on the host (testdata/adamw_emulate.cpp: g++, every thread of the grid in
// turn; skipped where there is no g++) over segments of every kind the
// kernel tells apart (full blocks, a segment's partial last block, segments
// not aligned for 16-byte access, in place and not, float32 and bfloat16
// gradients, a step below 1), and wants their outputs bit for bit equal. It
// checks what the device tests check of the index math and of the order of
// the arithmetic, without a GPU. A doctored kernel that reads the wrong
// groups must fail it.
func TestAdamWMultiHostEmulation(t *testing.T) {
	gxx := cudatest.HostCXX(t)
	harness, err := filepath.Abs(filepath.Join("testdata", "adamw_emulate.cpp"))
	if err != nil {
		t.Fatal(err)
	}
	// emulate compiles the harness with src as ops.cu and runs it.
	emulate := func(name, src string) (string, error) {
		dir := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, opsKernelFile), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "adamw_emulate")
		// -ffp-contract=off: no fused multiply-adds, as NVRTC's --fmad=false.
		build := exec.Command(gxx, "-std=c++17", "-O1", "-ffp-contract=off", "-w", "-I", dir, "-o", bin, harness)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("g++ %s: %v\n%s", name, err, out)
		}
		out, err := exec.Command(bin).CombinedOutput()
		return string(out), err
	}
	src := opsSource(t)
	out, err := emulate("ops", src)
	if err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("adamw_multi_f32 and adamw_f32 differ on the host (%v):\n%s", err, out)
	}
	const load = "const i64 q = q0 + k * ADAMW_MULTI_BLOCK;"
	if !strings.Contains(src, load) {
		t.Fatalf("%s has no %q to doctor", opsKernelFile, load)
	}
	out, err = emulate("doctored", strings.Replace(src, load, "const i64 q = q0 + k;", 1))
	if err == nil || !strings.Contains(out, "differ") {
		t.Errorf("a kernel that loads the wrong groups passed (%v):\n%s", err, out)
	}
}
