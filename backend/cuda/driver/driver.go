package driver

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// driverAPI holds the libcuda entry points. Versioned names (_v2) are the ones the
// CUDA 12/13 headers map the plain names to; calling the unversioned symbol would
// reach the legacy 32-bit-size ABI.
type driverAPI struct {
	lib *library

	cuInit, cuDriverGetVersion                       uintptr
	cuGetErrorName, cuGetErrorString                 uintptr
	cuDeviceGetCount, cuDeviceGet, cuDeviceGetName   uintptr
	cuDeviceGetAttribute                             uintptr
	cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRel  uintptr
	cuCtxSetCurrent, cuCtxSynchronize                uintptr
	cuStreamCreate, cuStreamDestroy, cuStreamSync    uintptr
	cuMemAlloc, cuMemFree, cuMemGetInfo              uintptr
	cuMemsetD8Async                                  uintptr
	cuMemcpyHtoDAsync, cuMemcpyDtoHAsync             uintptr
	cuMemcpyDtoDAsync                                uintptr
	cuModuleLoadData, cuModuleUnload, cuModuleGetFun uintptr
	cuFuncSetAttribute, cuFuncGetAttribute           uintptr
	cuLaunchKernel                                   uintptr
	cuEventCreate, cuEventDestroy, cuEventRecord     uintptr
	cuEventSynchronize, cuEventElapsedTime           uintptr
	// CUDA graphs (optional: without them every run launches kernel by kernel).
	cuStreamBeginCapture, cuStreamEndCapture uintptr
	cuGraphInstantiate, cuGraphLaunch        uintptr
	cuGraphExecDestroy, cuGraphDestroy       uintptr
	// TMA tensor maps (optional: CUDA 12 drivers on; flash_sm90.go).
	cuTensorMapEncodeTiled uintptr

	driverVersion int32
}

var driverLoad loadOnce[*driverAPI]

// loadDriver dlopens libcuda, resolves the entry points and runs cuInit. It is done
// once per process; its error is the one Available reports.
func loadDriver() (*driverAPI, error) {
	return driverLoad.get(func() (*driverAPI, error) {
		lib, err := openLibrary("CUDA driver", "libcuda.so.1", "libcuda.so")
		if err != nil {
			return nil, fmt.Errorf("cuda: %w (is the NVIDIA driver installed?)", err)
		}
		api := &driverAPI{lib: lib}
		// Error strings first, so that every later failure can be named.
		api.cuGetErrorName = lib.optionalSymbol("cuGetErrorName")
		api.cuGetErrorString = lib.optionalSymbol("cuGetErrorString")
		err = lib.symbols(map[string]*uintptr{
			"cuInit":                       &api.cuInit,
			"cuDriverGetVersion":           &api.cuDriverGetVersion,
			"cuDeviceGetCount":             &api.cuDeviceGetCount,
			"cuDeviceGet":                  &api.cuDeviceGet,
			"cuDeviceGetName":              &api.cuDeviceGetName,
			"cuDeviceGetAttribute":         &api.cuDeviceGetAttribute,
			"cuDevicePrimaryCtxRetain":     &api.cuDevicePrimaryCtxRetain,
			"cuDevicePrimaryCtxRelease_v2": &api.cuDevicePrimaryCtxRel,
			"cuCtxSetCurrent":              &api.cuCtxSetCurrent,
			"cuCtxSynchronize":             &api.cuCtxSynchronize,
			"cuStreamCreate":               &api.cuStreamCreate,
			"cuStreamDestroy_v2":           &api.cuStreamDestroy,
			"cuStreamSynchronize":          &api.cuStreamSync,
			"cuMemAlloc_v2":                &api.cuMemAlloc,
			"cuMemFree_v2":                 &api.cuMemFree,
			"cuMemGetInfo_v2":              &api.cuMemGetInfo,
			"cuMemsetD8Async":              &api.cuMemsetD8Async,
			"cuMemcpyHtoDAsync_v2":         &api.cuMemcpyHtoDAsync,
			"cuMemcpyDtoHAsync_v2":         &api.cuMemcpyDtoHAsync,
			"cuMemcpyDtoDAsync_v2":         &api.cuMemcpyDtoDAsync,
			"cuModuleLoadData":             &api.cuModuleLoadData,
			"cuModuleUnload":               &api.cuModuleUnload,
			"cuModuleGetFunction":          &api.cuModuleGetFun,
			"cuFuncSetAttribute":           &api.cuFuncSetAttribute,
			"cuFuncGetAttribute":           &api.cuFuncGetAttribute,
			"cuLaunchKernel":               &api.cuLaunchKernel,
			"cuEventCreate":                &api.cuEventCreate,
			"cuEventDestroy_v2":            &api.cuEventDestroy,
			"cuEventRecord":                &api.cuEventRecord,
			"cuEventSynchronize":           &api.cuEventSynchronize,
		})
		if err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		// CUDA 12.8 added cuEventElapsedTime_v2 and CUDA 13 headers map the plain
		// name to it; older drivers only have the plain one. Both take the same
		// arguments.
		if api.cuEventElapsedTime = lib.optionalSymbol("cuEventElapsedTime_v2"); api.cuEventElapsedTime == 0 {
			if api.cuEventElapsedTime = lib.optionalSymbol("cuEventElapsedTime"); api.cuEventElapsedTime == 0 {
				return nil, fmt.Errorf("cuda: %s: symbol cuEventElapsedTime_v2 not found", lib.name)
			}
		}
		api.cuStreamBeginCapture = lib.optionalSymbol("cuStreamBeginCapture_v2")
		api.cuStreamEndCapture = lib.optionalSymbol("cuStreamEndCapture")
		api.cuGraphInstantiate = lib.optionalSymbol("cuGraphInstantiateWithFlags")
		api.cuGraphLaunch = lib.optionalSymbol("cuGraphLaunch")
		api.cuGraphExecDestroy = lib.optionalSymbol("cuGraphExecDestroy")
		api.cuGraphDestroy = lib.optionalSymbol("cuGraphDestroy")
		api.cuTensorMapEncodeTiled = lib.optionalSymbol("cuTensorMapEncodeTiled")
		if err := api.check("cuInit", ccall(api.cuInit, 0)); err != nil {
			return nil, fmt.Errorf("cuda: %s loaded but the driver could not start: %w", lib.name, err)
		}
		if err := api.check("cuDriverGetVersion", ccall(api.cuDriverGetVersion, uintptr(unsafe.Pointer(&api.driverVersion)))); err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		return api, nil
	})
}

// deviceCount returns how many CUDA devices the driver sees.
func (api *driverAPI) deviceCount() (int, error) {
	var n int32
	if err := api.check("cuDeviceGetCount", ccall(api.cuDeviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	return int(n), nil
}

var availableOnce loadOnce[struct{}]

// Available returns nil when a CUDA device, NVRTC and cuBLAS can all be used, and
// otherwise one error that says what is missing (which library, tried under which
// names, or which call failed). Tests call it to decide whether to skip.
func Available() error {
	_, err := availableOnce.get(func() (struct{}, error) {
		api, err := loadDriver()
		if err != nil {
			return struct{}{}, err
		}
		n, err := api.deviceCount()
		if err != nil {
			return struct{}{}, fmt.Errorf("cuda: %w", err)
		}
		if n == 0 {
			return struct{}{}, errors.New("cuda: the driver sees no CUDA device")
		}
		if _, err := loadNVRTC(); err != nil {
			return struct{}{}, err
		}
		if _, err := loadCublas(); err != nil {
			return struct{}{}, err
		}
		return struct{}{}, nil
	})
	return err
}

// DevicePtr is a device memory address (CUdeviceptr). Zero is the null pointer; it
// is what Alloc returns for a zero-byte request.
type DevicePtr uintptr

// Offset returns p advanced by bytes, for addressing into a buffer.
func (p DevicePtr) Offset(bytes int) DevicePtr { return p + DevicePtr(bytes) }

// Device is one GPU with its primary context, one stream and one OS thread that
// makes every CUDA call (see the package comment for why).
type Device struct {
	api     *driverAPI
	ordinal int
	dev     int32

	name      string
	ccMajor   int
	ccMinor   int
	smCount   int
	smemOptin int
	reqs      chan func()
	done      chan struct{}
	// RunMu serialises executables' runs: a run being captured into a CUDA
	// graph must be the only work queued on the stream meanwhile.
	RunMu        sync.Mutex
	closed       atomic.Bool
	closeOnce    sync.Once
	closeErr     error
	cacheMu      sync.Mutex
	cacheDir     string // "" disables the cubin cache
	cacheDirSet  bool
	moduleMu     sync.Mutex
	modules      map[*Module]struct{}
	ctx, stream  uintptr // touched only on the device goroutine
	stopping     bool    // set by Close's last request, on the device goroutine
	cublasHandle uintptr // created lazily on the device goroutine
	// cublasWorkspace is the handle's workspace (setCublasWorkspace).
	cublasWorkspace DevicePtr
	// flashSched is the persistent sm90 forward's dynamic schedule
	// (flashSM90Sched), allocated on first use.
	flashSchedMu sync.Mutex
	flashSched   DevicePtr
	// allocs counts every cuMemAlloc of this device not yet freed, and its
	// peak (AllocatedBytes, PeakAllocatedBytes).
	allocs allocLedger
}

// Open retains the primary context of the device with this ordinal, creates the
// stream that all of the device's work runs on, and starts the device goroutine.
// The primary context (rather than a private one) is the one the CUDA runtime, and
// hence cuBLAS, uses, so cuBLAS shares our context without further setup.
func Open(ordinal int) (*Device, error) {
	api, err := loadDriver()
	if err != nil {
		return nil, err
	}
	n, err := api.deviceCount()
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: device %d does not exist (%d devices)", ordinal, n)
	}
	d := &Device{
		api:     api,
		ordinal: ordinal,
		reqs:    make(chan func()),
		done:    make(chan struct{}),
		modules: map[*Module]struct{}{},
	}
	started := make(chan error, 1)
	go d.loop(started)
	if err := <-started; err != nil {
		return nil, err
	}
	return d, nil
}

// loop is the device goroutine. It never unlocks its thread: when it returns, the
// runtime ends the thread, and the context stops being current anywhere.
func (d *Device) loop(started chan<- error) {
	runtime.LockOSThread()
	if err := d.setup(); err != nil {
		d.teardown()
		close(d.done)
		started <- err
		return
	}
	started <- nil
	for {
		f := <-d.reqs
		f()
		if d.stopping {
			// Only now do blocked callers learn that the device is gone; no request
			// can run after the context is released.
			close(d.done)
			return
		}
	}
}

// setup runs on the device goroutine.
func (d *Device) setup() error {
	api := d.api
	if err := api.check("cuDeviceGet", ccall(api.cuDeviceGet, uintptr(unsafe.Pointer(&d.dev)), uintptr(d.ordinal))); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	var name [256]byte
	if err := api.check("cuDeviceGetName", ccall(api.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(d.dev))); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	d.name = goString(&name[0])
	for _, a := range []struct {
		attr int32
		dst  *int
	}{
		{attrComputeCapabilityMajor, &d.ccMajor},
		{attrComputeCapabilityMinor, &d.ccMinor},
		{attrMultiprocessorCount, &d.smCount},
		{attrMaxSharedMemoryPerBlockOptin, &d.smemOptin},
	} {
		var v int32
		if err := api.check("cuDeviceGetAttribute", ccall(api.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a.attr), uintptr(d.dev))); err != nil {
			return fmt.Errorf("cuda: %w", err)
		}
		*a.dst = int(v)
	}
	if err := api.check("cuDevicePrimaryCtxRetain", ccall(api.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&d.ctx)), uintptr(d.dev))); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if err := api.check("cuCtxSetCurrent", ccall(api.cuCtxSetCurrent, d.ctx)); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	// CU_STREAM_DEFAULT (0): the stream also orders against the legacy default
	// stream, so work that a library puts on stream 0 cannot overtake ours.
	if err := api.check("cuStreamCreate", ccall(api.cuStreamCreate, uintptr(unsafe.Pointer(&d.stream)), 0)); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return nil
}

// teardown runs on the device goroutine; it releases what setup and later calls
// created and returns the first error.
func (d *Device) teardown() error {
	api := d.api
	var errs []error
	if d.cublasHandle != 0 {
		if cb, err := loadCublas(); err == nil {
			errs = append(errs, cb.check("cublasDestroy_v2", ccall(cb.cublasDestroy, d.cublasHandle)))
		}
		d.cublasHandle = 0
	}
	if d.cublasWorkspace != 0 {
		errs = append(errs, d.free(d.cublasWorkspace))
		d.cublasWorkspace = 0
	}
	if d.flashSched != 0 {
		errs = append(errs, d.free(d.flashSched))
		d.flashSched = 0
	}
	if d.stream != 0 {
		errs = append(errs, api.check("cuStreamSynchronize", ccall(api.cuStreamSync, d.stream)))
		errs = append(errs, api.check("cuStreamDestroy_v2", ccall(api.cuStreamDestroy, d.stream)))
		d.stream = 0
	}
	if d.ctx != 0 {
		errs = append(errs, api.check("cuDevicePrimaryCtxRelease_v2", ccall(api.cuDevicePrimaryCtxRel, uintptr(d.dev))))
		d.ctx = 0
	}
	return errors.Join(errs...)
}

// do runs f on the device goroutine and waits for it. A panic in f is returned as
// an error rather than killing the goroutine that every later call depends on.
// f must not call do (the device goroutine would wait for itself).
func (d *Device) do(f func() error) error {
	if d.closed.Load() {
		return errClosed
	}
	errc := make(chan error, 1)
	req := func() {
		defer func() {
			if r := recover(); r != nil {
				errc <- fmt.Errorf("cuda: panic on the device goroutine: %v", r)
			}
		}()
		errc <- f()
	}
	select {
	case d.reqs <- req:
		return <-errc
	case <-d.done:
		return errClosed
	}
}

// Close unloads the modules compiled on this device, destroys the cuBLAS handle and
// the stream, releases the primary context and stops the device goroutine.
// Allocations still live are freed with the context when no other Device holds it.
// Later calls return an error; Close itself may be called more than once.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		d.moduleMu.Lock()
		mods := make([]*Module, 0, len(d.modules))
		for m := range d.modules {
			mods = append(mods, m)
		}
		d.moduleMu.Unlock()
		var errs []error
		for _, m := range mods {
			errs = append(errs, m.Unload())
		}
		errs = append(errs, d.do(func() error {
			d.stopping = true
			return d.teardown()
		}))
		d.closed.Store(true)
		d.closeErr = errors.Join(errs...)
	})
	return d.closeErr
}

// Device attributes (CUdevice_attribute).
const (
	attrMultiprocessorCount          = 16
	attrComputeCapabilityMajor       = 75
	attrComputeCapabilityMinor       = 76
	attrMaxSharedMemoryPerBlockOptin = 97
)

// Name is the device's marketing name, e.g. "NVIDIA H200".
func (d *Device) Name() string { return d.name }

// Ordinal is the index given to Open.
func (d *Device) Ordinal() int { return d.ordinal }

// ComputeCapability returns the major and minor compute capability (9, 0 on Hopper).
func (d *Device) ComputeCapability() (major, minor int) { return d.ccMajor, d.ccMinor }

// Arch is the NVRTC target for this device, e.g. "sm_90a"; see archFor.
func (d *Device) Arch() string { return archFor(d.ccMajor, d.ccMinor) }

// SMCount is the number of streaming multiprocessors (132 on an H200).
func (d *Device) SMCount() int { return d.smCount }

// MaxSharedMemoryPerBlockOptin is the most dynamic shared memory one block can get
// after SetMaxDynamicSharedMemory (227 KiB on Hopper).
func (d *Device) MaxSharedMemoryPerBlockOptin() int { return d.smemOptin }

// DriverVersion is the CUDA version the driver implements, e.g. 13000.
func (d *Device) DriverVersion() int { return int(d.api.driverVersion) }

// archFor picks the NVRTC --gpu-architecture for a compute capability. From
// Hopper on, the "a" variant (sm_90a, sm_100a, ...) unlocks the
// architecture-specific instructions (wgmma, setmaxnreg); code built for it runs
// only on that exact capability, which is fine because we compile for the device
// in hand.
func archFor(major, minor int) string {
	if major >= 9 {
		return fmt.Sprintf("sm_%d%da", major, minor)
	}
	return fmt.Sprintf("sm_%d%d", major, minor)
}

// MemInfo returns the free and total device memory in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	err = d.do(func() error {
		return d.api.check("cuMemGetInfo_v2", ccall(d.api.cuMemGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total))))
	})
	return free, total, err
}

// Alloc allocates bytes of device memory (256-byte aligned). Zero bytes gives the
// null pointer and no error, so that empty tensors need no special case.
func (d *Device) Alloc(bytes int) (DevicePtr, error) {
	if bytes < 0 {
		return 0, fmt.Errorf("cuda: Alloc of %d bytes", bytes)
	}
	if bytes == 0 {
		return 0, nil
	}
	var p DevicePtr
	err := d.do(func() (err error) {
		p, err = d.alloc(bytes)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("cuda: Alloc(%d): %w", bytes, err)
	}
	return p, nil
}

// alloc is cuMemAlloc on the device goroutine, counted in the ledger. Every
// allocation of the device goes through it (and every free through free),
// so that AllocatedBytes sees them in the order the driver made them.
func (d *Device) alloc(bytes int) (DevicePtr, error) {
	var p DevicePtr
	if err := d.api.check("cuMemAlloc_v2", ccall(d.api.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(bytes))); err != nil {
		return 0, err
	}
	d.allocs.add(p, int64(bytes))
	return p, nil
}

// free is cuMemFree on the device goroutine, taken off the ledger when it
// succeeds. A pointer the ledger does not know is freed all the same.
func (d *Device) free(p DevicePtr) error {
	if err := d.api.check("cuMemFree_v2", ccall(d.api.cuMemFree, uintptr(p))); err != nil {
		return err
	}
	d.allocs.remove(p)
	return nil
}

// AllocatedBytes is the device memory this Device has allocated and not yet
// freed: every Alloc, the cuBLAS workspace and the sm90 schedule, counted
// in the bytes asked for. It sees no other process's memory, nor what the
// libraries allocate on their own (module code, NCCL's buffers). Safe to
// call from any goroutine, also after Close.
func (d *Device) AllocatedBytes() int64 {
	live, _ := d.allocs.stats()
	return live
}

// PeakAllocatedBytes is the most AllocatedBytes has been since Open or the
// last ResetPeakAllocated: the figure torch.cuda.max_memory_allocated gives
// for PyTorch's allocations.
func (d *Device) PeakAllocatedBytes() int64 {
	_, peak := d.allocs.stats()
	return peak
}

// ResetPeakAllocated starts a new peak at the bytes allocated now and
// returns them, so that PeakAllocatedBytes minus it is what the work done
// after the call took at most.
func (d *Device) ResetPeakAllocated() int64 { return d.allocs.resetPeak() }

// Free releases memory from Alloc; freeing the null pointer does nothing.
// cuMemFree waits for work that may still use the memory, so a buffer can be freed
// right after the launch that last read it.
func (d *Device) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	return d.do(func() error { return d.free(p) })
}

// Memset sets bytes bytes at p to byteVal. It is queued on the device's stream, so
// it is ordered after earlier launches and copies and before later ones.
func (d *Device) Memset(p DevicePtr, byteVal byte, bytes int) error {
	if bytes <= 0 {
		return checkSize("Memset", bytes)
	}
	return d.do(func() error {
		return d.api.check("cuMemsetD8Async", ccall(d.api.cuMemsetD8Async, uintptr(p), uintptr(byteVal), uintptr(bytes), d.stream))
	})
}

// CopyToDevice copies bytes bytes from host memory at src to dst, in stream order.
// src may be reused as soon as it returns: from pageable (ordinary Go) memory the
// driver stages the data before the call returns.
func (d *Device) CopyToDevice(dst DevicePtr, src unsafe.Pointer, bytes int) error {
	if bytes <= 0 {
		return checkSize("CopyToDevice", bytes)
	}
	return d.do(func() error {
		return d.api.check("cuMemcpyHtoDAsync_v2", ccall(d.api.cuMemcpyHtoDAsync, uintptr(dst), uintptr(src), uintptr(bytes), d.stream))
	})
}

// CopyToHost copies bytes bytes from src to host memory at dst after all earlier
// work on the stream, and returns when the data is in dst.
func (d *Device) CopyToHost(dst unsafe.Pointer, src DevicePtr, bytes int) error {
	if bytes <= 0 {
		return checkSize("CopyToHost", bytes)
	}
	return d.do(func() error {
		if err := d.api.check("cuMemcpyDtoHAsync_v2", ccall(d.api.cuMemcpyDtoHAsync, uintptr(dst), uintptr(src), uintptr(bytes), d.stream)); err != nil {
			return err
		}
		return d.api.check("cuStreamSynchronize", ccall(d.api.cuStreamSync, d.stream))
	})
}

// CopyDeviceToDevice copies bytes bytes from src to dst in stream order.
func (d *Device) CopyDeviceToDevice(dst, src DevicePtr, bytes int) error {
	if bytes <= 0 {
		return checkSize("CopyDeviceToDevice", bytes)
	}
	return d.do(func() error {
		return d.api.check("cuMemcpyDtoDAsync_v2", ccall(d.api.cuMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(bytes), d.stream))
	})
}

// Synchronize waits for all work queued on the device's stream and returns the
// first error any of it raised (a kernel fault surfaces here).
func (d *Device) Synchronize() error {
	return d.do(func() error {
		return d.api.check("cuStreamSynchronize", ccall(d.api.cuStreamSync, d.stream))
	})
}

// checkSize lets zero-byte transfers succeed as no-ops and rejects negative sizes.
func checkSize(op string, bytes int) error {
	if bytes < 0 {
		return fmt.Errorf("cuda: %s of %d bytes", op, bytes)
	}
	return nil
}

// Element is a plain numeric type that can be copied to and from the device byte
// for byte; bf16 and f16 data travel as uint16.
type Element interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

// Upload allocates device memory for src and copies it there.
func Upload[T Element](d *Device, src []T) (DevicePtr, error) {
	bytes := len(src) * int(unsafe.Sizeof(*new(T)))
	p, err := d.Alloc(bytes)
	if err != nil || bytes == 0 {
		return p, err
	}
	if err := d.CopyToDevice(p, unsafe.Pointer(&src[0]), bytes); err != nil {
		d.Free(p)
		return 0, err
	}
	return p, nil
}

// Download copies len(dst) elements from src into dst.
func Download[T Element](d *Device, src DevicePtr, dst []T) error {
	if len(dst) == 0 {
		return nil
	}
	return d.CopyToHost(unsafe.Pointer(&dst[0]), src, len(dst)*int(unsafe.Sizeof(dst[0])))
}
