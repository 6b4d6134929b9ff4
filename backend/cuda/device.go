package cuda

import "github.com/flashgraph/flashgraph/backend/cuda/driver"

// The device, memory, kernel and library types of package driver under the
// names this package has always given them, so that the executor and its
// importers keep writing cuda.Device, cuda.DevicePtr, cuda.Open.
type (
	Device         = driver.Device
	DevicePtr      = driver.DevicePtr
	Module         = driver.Module
	Function       = driver.Function
	FuncAttributes = driver.FuncAttributes
	Event          = driver.Event
	Error          = driver.Error
	GemmType       = driver.GemmType
	Comm           = driver.Comm
	NCCLUniqueID   = driver.NCCLUniqueID
	Element        = driver.Element
)

// The GEMM element types (driver.GemmType).
const (
	GemmF32  = driver.GemmF32
	GemmBF16 = driver.GemmBF16
	GemmF16  = driver.GemmF16
)

// Available reports whether the CUDA driver, NVRTC and cuBLAS can be loaded
// and a device found; the error says what is missing (driver.Available).
func Available() error { return driver.Available() }

// Open opens the device with the given ordinal (driver.Open).
func Open(ordinal int) (*Device, error) { return driver.Open(ordinal) }

// DeviceCount is the number of CUDA devices (driver.DeviceCount).
func DeviceCount() (int, error) { return driver.DeviceCount() }

// NCCLVersion is the NCCL library's version (driver.NCCLVersion).
func NCCLVersion() (int, error) { return driver.NCCLVersion() }

// NewNCCLUniqueID makes the id the ranks of one NCCL communicator share
// (driver.NewNCCLUniqueID).
func NewNCCLUniqueID() (NCCLUniqueID, error) { return driver.NewNCCLUniqueID() }

// Upload copies src to fresh device memory (driver.Upload).
func Upload[T Element](d *Device, src []T) (DevicePtr, error) { return driver.Upload(d, src) }

// Download copies device memory into dst (driver.Download).
func Download[T Element](d *Device, src DevicePtr, dst []T) error {
	return driver.Download(d, src, dst)
}

// Grid1D is the number of blocks of blockSize that cover n (driver.Grid1D).
func Grid1D(n, blockSize int) uint32 { return driver.Grid1D(n, blockSize) }
