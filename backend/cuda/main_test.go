package cuda

import (
	"fmt"
	"os"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
)

// The shared test device of this package's GPU tests (as package driver's
// tests have theirs). Without a GPU the tests skip with the reason
// Available gives.
var (
	testDev    *Device
	testDevErr error
)

func TestMain(m *testing.M) {
	if testDevErr = Available(); testDevErr == nil {
		testDev, testDevErr = Open(0)
	}
	code := m.Run()
	if testDev != nil {
		if err := testDev.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "Close:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// gpu returns the shared test device or skips the test with the reason.
func gpu(t testing.TB) *Device {
	t.Helper()
	if testDev == nil {
		t.Skip(testDevErr)
	}
	return testDev
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
