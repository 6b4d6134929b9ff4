package cuda

import (
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"
)

// The shared test device of this package's GPU tests (cudatest.Device, as
// packages driver and attention have theirs). Without a GPU the tests skip
// with the reason Available gives.
var testGPU cudatest.Device[*Device]

func TestMain(m *testing.M) { testGPU.Main(m, Available, Open) }

// gpu returns the shared test device or skips the test with the reason.
func gpu(t testing.TB) *Device {
	t.Helper()
	return testGPU.Get(t)
}

// nvrtc is NVRTC as the tests that compile with no GPU and no cache use it
// (package driver's NVRTCVersion and NVRTCCompile).
type nvrtc struct{ version string }

func loadNVRTC() (*nvrtc, error) {
	v, err := driver.NVRTCVersion()
	if err != nil {
		return nil, err
	}
	return &nvrtc{version: v}, nil
}

func (*nvrtc) compile(name, source string, opts []string) ([]byte, string, error) {
	return driver.NVRTCCompile(name, source, opts)
}

func compileOptions(arch string, extra []string) []string { return driver.CompileOptions(arch, extra) }

func toolkitDirs() []string { return driver.ToolkitDirs() }
