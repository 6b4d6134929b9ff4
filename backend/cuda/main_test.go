package cuda

import (
	"testing"

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
