package cuda

import (
	"bytes"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/kernels"
)

// TestOpsKernelsCompile compiles kernels/ops.cu with NVRTC where it is
// installed (NVRTC needs no GPU), so a syntax or type error in a kernel shows
// up on a machine without a GPU, before any device time is spent. Every entry
// point the backend looks up must be in the cubin.
func TestOpsKernelsCompile(t *testing.T) {
	version, err := driver.NVRTCVersion()
	if err != nil {
		t.Skip(err)
	}
	arch := "sm_80"
	if !strings.HasPrefix(version, "11.") {
		arch = "sm_90a"
	}
	src, err := kernels.Source(opsKernelFile)
	if err != nil {
		t.Fatal(err)
	}
	cubin, log, err := driver.NVRTCCompile(opsKernelFile, src, driver.CompileOptions(arch, opsCompileOptions))
	if err != nil {
		t.Fatal(err)
	}
	if log != "" {
		t.Logf("NVRTC %s log:\n%s", version, log)
	}
	for _, k := range opsKernelNames {
		if !bytes.Contains(cubin, []byte(k+"\x00")) {
			t.Errorf("cubin has no kernel %s", k)
		}
	}
}
