package attention

import "github.com/flashgraph/flashgraph/backend/cuda/driver"

// The driver's names as the launchers use them (package cuda gives its
// importers the same ones).
type (
	Device    = driver.Device
	DevicePtr = driver.DevicePtr
	Function  = driver.Function
	GemmType  = driver.GemmType
)

const (
	GemmF32  = driver.GemmF32
	GemmBF16 = driver.GemmBF16
	GemmF16  = driver.GemmF16
)
