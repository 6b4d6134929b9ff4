package attention

import (
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"
	"github.com/flashgraph/flashgraph/graph"
)

// The shared test device of this package's GPU tests (cudatest.Device, as
// packages driver and cuda have theirs). Without a GPU the tests skip with
// the reason Available gives.
var testGPU cudatest.Device[*Device]

func TestMain(m *testing.M) { testGPU.Main(m, Available, Open) }

// gpu returns the shared test device or skips the test with the reason.
func gpu(t testing.TB) *Device {
	t.Helper()
	return testGPU.Get(t)
}

// The driver's names the tests use as package cuda's tests do.
type Event = driver.Event

func Available() error                  { return driver.Available() }
func Open(ordinal int) (*Device, error) { return driver.Open(ordinal) }

func Upload[T driver.Element](d *Device, src []T) (DevicePtr, error) { return driver.Upload(d, src) }

func Download[T driver.Element](d *Device, src DevicePtr, dst []T) error {
	return driver.Download(d, src, dst)
}

var (
	BF16FromFloat32 = graph.BF16FromFloat32
	BF16ToFloat32   = graph.BF16ToFloat32
	F16FromFloat32  = graph.F16FromFloat32
	F16ToFloat32    = graph.F16ToFloat32
)
