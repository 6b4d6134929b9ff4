package driver

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"
)

// Module is a loaded cubin (CUmodule).
type Module struct {
	d         *Device
	name      string
	h         uintptr
	fromCache bool
	mu        sync.Mutex
	unloaded  bool
}

// Name is the name given to Compile.
func (m *Module) Name() string { return m.name }

// FromCache reports whether the cubin came from the disk cache rather than NVRTC.
func (m *Module) FromCache() bool { return m.fromCache }

// loadModule loads a cubin into the device's context.
func (d *Device) loadModule(name string, cubin []byte) (*Module, error) {
	m := &Module{d: d, name: name}
	err := d.do(func() error {
		return d.api.check("cuModuleLoadData", ccall(d.api.cuModuleLoadData, uintptr(unsafe.Pointer(&m.h)), uintptr(unsafe.Pointer(&cubin[0]))))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: loading %s: %w", name, err)
	}
	d.moduleMu.Lock()
	d.modules[m] = struct{}{}
	d.moduleMu.Unlock()
	return m, nil
}

// Unload unloads the module; its Functions must not be launched afterwards.
// Close unloads every module still loaded, so calling Unload is optional.
func (m *Module) Unload() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.unloaded {
		return nil
	}
	m.unloaded = true
	m.d.moduleMu.Lock()
	delete(m.d.modules, m)
	m.d.moduleMu.Unlock()
	return m.d.do(func() error {
		return m.d.api.check("cuModuleUnload", ccall(m.d.api.cuModuleUnload, m.h))
	})
}

// Function is a kernel entry point of a Module (CUfunction).
type Function struct {
	m    *Module
	name string
	h    uintptr
}

// Name is the kernel's name.
func (f *Function) Name() string { return f.name }

// Function looks up an extern "C" kernel by name.
func (m *Module) Function(name string) (*Function, error) {
	f := &Function{m: m, name: name}
	cname := cString(name)
	err := m.d.do(func() error {
		return m.d.api.check("cuModuleGetFunction", ccall(m.d.api.cuModuleGetFun, uintptr(unsafe.Pointer(&f.h)), m.h, uintptr(unsafe.Pointer(&cname[0]))))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: kernel %q in %s (is it extern \"C\"?): %w", name, m.name, err)
	}
	return f, nil
}

// Function attributes (CUfunction_attribute).
const (
	funcAttrMaxThreadsPerBlock        = 0
	funcAttrSharedSizeBytes           = 1
	funcAttrLocalSizeBytes            = 3
	funcAttrNumRegs                   = 4
	funcAttrMaxDynamicSharedSizeBytes = 8
)

// SetMaxDynamicSharedMemory raises the dynamic shared memory a launch of f may ask
// for; above 48 KiB a launch fails without it. The limit is
// Device.MaxSharedMemoryPerBlockOptin minus f's static shared memory.
func (f *Function) SetMaxDynamicSharedMemory(bytes int) error {
	d := f.m.d
	return d.do(func() error {
		return d.api.check("cuFuncSetAttribute", ccall(d.api.cuFuncSetAttribute, f.h, funcAttrMaxDynamicSharedSizeBytes, uintptr(bytes)))
	})
}

// FuncAttributes are what the compiler gave a kernel; LocalBytes > 0 means
// registers spilled (or an array was indexed at run time).
type FuncAttributes struct {
	NumRegs            int
	StaticSharedBytes  int
	LocalBytes         int
	MaxThreadsPerBlock int
	MaxDynamicShared   int
}

// Attributes reads f's compile-time resource use.
func (f *Function) Attributes() (FuncAttributes, error) {
	d := f.m.d
	var a FuncAttributes
	err := d.do(func() error {
		for _, q := range []struct {
			attr int32
			dst  *int
		}{
			{funcAttrNumRegs, &a.NumRegs},
			{funcAttrSharedSizeBytes, &a.StaticSharedBytes},
			{funcAttrLocalSizeBytes, &a.LocalBytes},
			{funcAttrMaxThreadsPerBlock, &a.MaxThreadsPerBlock},
			{funcAttrMaxDynamicSharedSizeBytes, &a.MaxDynamicShared},
		} {
			var v int32
			if err := d.api.check("cuFuncGetAttribute", ccall(d.api.cuFuncGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(q.attr), f.h)); err != nil {
				return err
			}
			*q.dst = int(v)
		}
		return nil
	})
	return a, err
}

// packArgs lays kernel arguments out as cuLaunchKernel wants them: one slot per
// argument holding its value (8 bytes each, little-endian, so a 4-byte parameter
// reads the low half). Go's int is refused because its width would silently have to
// match the kernel's int or long long.
func packArgs(args []any) ([]uint64, error) {
	slots := make([]uint64, len(args)+1) // +1 keeps &slots[0] valid with no arguments
	for i, a := range args {
		switch v := a.(type) {
		case DevicePtr:
			slots[i] = uint64(v)
		case int32:
			slots[i] = uint64(uint32(v))
		case uint32:
			slots[i] = uint64(v)
		case int64:
			slots[i] = uint64(v)
		case uint64:
			slots[i] = v
		case float32:
			slots[i] = uint64(math.Float32bits(v))
		case float64:
			slots[i] = math.Float64bits(v)
		default:
			return nil, fmt.Errorf("cuda: kernel argument %d has type %T; use DevicePtr, int32, uint32, int64, uint64, float32 or float64", i, a)
		}
	}
	return slots[:len(args)], nil
}

// Launch queues f on the device's stream with the given grid and block (in
// blocks and threads per dimension) and dynamic shared memory. It returns once the
// launch is queued; errors raised while the kernel runs come back from the next
// synchronizing call (Synchronize, CopyToHost, ElapsedMs).
func (d *Device) Launch(f *Function, grid, block [3]uint32, sharedBytes uint32, args ...any) error {
	if f == nil {
		return fmt.Errorf("cuda: Launch of a nil Function")
	}
	if f.m.d != d {
		return fmt.Errorf("cuda: Launch of %s on a device other than its module's", f.name)
	}
	for i := range 3 {
		if grid[i] == 0 || block[i] == 0 {
			return fmt.Errorf("cuda: Launch %s: grid %v and block %v must have no zero dimension", f.name, grid, block)
		}
	}
	slots, err := packArgs(args)
	if err != nil {
		return fmt.Errorf("cuda: Launch %s: %w", f.name, err)
	}
	err = d.do(func() error {
		// kernelParams is an array of pointers into slots; C reads both, so both are
		// pinned for the call. cuLaunchKernel copies the values before returning.
		var pin runtime.Pinner
		defer pin.Unpin()
		params := make([]uintptr, len(slots)+1)
		if len(slots) > 0 {
			pin.Pin(&slots[0])
			for i := range slots {
				params[i] = uintptr(unsafe.Pointer(&slots[i]))
			}
		}
		pin.Pin(&params[0])
		return d.api.check("cuLaunchKernel", ccall(d.api.cuLaunchKernel, f.h,
			uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
			uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
			uintptr(sharedBytes), d.stream, uintptr(unsafe.Pointer(&params[0])), 0))
	})
	if err != nil {
		return fmt.Errorf("cuda: Launch %s grid %v block %v smem %d: %w", f.name, grid, block, sharedBytes, err)
	}
	return nil
}

// Grid1D returns the number of blocks of blockSize threads that cover n items.
func Grid1D(n, blockSize int) uint32 {
	if n <= 0 {
		return 1
	}
	return uint32((n + blockSize - 1) / blockSize)
}
