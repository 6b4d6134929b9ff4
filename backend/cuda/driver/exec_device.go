package driver

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Device-goroutine variants of Launch, the cuBLAS GEMM and Memset.
//
// Every public Device method is one request to the device goroutine (see
// Device.do): a channel handoff to a locked OS thread and back, about 20 µs,
// which is most of a small model's step when each of hundreds of kernels pays
// it. The executor instead hands the device goroutine whole runs of steps in
// one request; inside it, kernels are queued with these functions, which make
// the same driver and cuBLAS calls as Launch and GemmStridedBatched without
// the round trip. They must only be called from a function passed to d.do.

// RawLaunch is one kernel launch with its arguments packed at Compile.
type RawLaunch struct {
	f           *Function
	grid, block [3]uint32
	smem        uint32
	slots       []uint64
}

func NewRawLaunch(f *Function, grid, block [3]uint32, smem uint32, args ...any) (*RawLaunch, error) {
	for i := range 3 {
		if grid[i] == 0 || block[i] == 0 {
			return nil, fmt.Errorf("cuda: launch %s: grid %v and block %v must have no zero dimension", f.name, grid, block)
		}
	}
	slots, err := packArgs(args)
	if err != nil {
		return nil, fmt.Errorf("cuda: launch %s: %w", f.name, err)
	}
	return &RawLaunch{f: f, grid: grid, block: block, smem: smem, slots: slots}, nil
}

// Run queues the launch; it runs on the device goroutine.
func (l *RawLaunch) Run(d *Device) error {
	// As in Launch: the parameter array and the values it points at are read
	// by the driver during the call, so both stay pinned until it returns.
	var pin runtime.Pinner
	defer pin.Unpin()
	params := make([]uintptr, len(l.slots)+1)
	if len(l.slots) > 0 {
		pin.Pin(&l.slots[0])
		for i := range l.slots {
			params[i] = uintptr(unsafe.Pointer(&l.slots[i]))
		}
	}
	pin.Pin(&params[0])
	err := d.api.check("cuLaunchKernel", ccall(d.api.cuLaunchKernel, l.f.h,
		uintptr(l.grid[0]), uintptr(l.grid[1]), uintptr(l.grid[2]),
		uintptr(l.block[0]), uintptr(l.block[1]), uintptr(l.block[2]),
		uintptr(l.smem), d.stream, uintptr(unsafe.Pointer(&params[0])), 0))
	if err != nil {
		return fmt.Errorf("cuda: launch %s grid %v block %v: %w", l.f.name, l.grid, l.block, err)
	}
	return nil
}

// GemmRaw is RowMajorBatchedMatMul on the device goroutine.
func (d *Device) GemmRaw(t GemmType, transA, transB bool, m, n, k int, alpha float32, A DevicePtr, strideA int64,
	B DevicePtr, strideB int64, beta float32, C DevicePtr, strideC int64, batch int) error {
	if m == 0 || n == 0 || batch == 0 {
		return nil
	}
	dt, err := t.cudaDataType()
	if err != nil {
		return err
	}
	g := rowMajorAsColMajor(transA, transB, m, n, k, A, strideA, B, strideB, C, strideC)
	opA, opB := uintptr(0), uintptr(0) // CUBLAS_OP_N
	if g.transA {
		opA = 1 // CUBLAS_OP_T
	}
	if g.transB {
		opB = 1
	}
	api, h, err := d.cublas()
	if err != nil {
		return err
	}
	err = api.check("cublasGemmStridedBatchedEx", ccall(api.cublasGemmStridedBatchedEx, h, opA, opB,
		uintptr(g.m), uintptr(g.n), uintptr(g.k),
		uintptr(unsafe.Pointer(&alpha)),
		uintptr(g.A), dt, uintptr(g.lda), uintptr(g.strideA),
		uintptr(g.B), dt, uintptr(g.ldb), uintptr(g.strideB),
		uintptr(unsafe.Pointer(&beta)),
		uintptr(g.C), dt, uintptr(g.ldc), uintptr(g.strideC),
		uintptr(batch), cublasCompute32F, cublasGemmDefault))
	if err != nil {
		return fmt.Errorf("cuda: %s GEMM m=%d n=%d k=%d batch=%d transA=%v transB=%v: %w", t, m, n, k, batch, transA, transB, err)
	}
	return nil
}

// MemsetRaw is Memset on the device goroutine.
func (d *Device) MemsetRaw(p DevicePtr, byteVal byte, bytes int) error {
	if bytes <= 0 {
		return nil
	}
	return d.api.check("cuMemsetD8Async", ccall(d.api.cuMemsetD8Async, uintptr(p), uintptr(byteVal), uintptr(bytes), d.stream))
}

// Do runs f on the device goroutine, where the functions above may be
// called: the executor hands it whole runs of steps in one request.
func (d *Device) Do(f func() error) error { return d.do(f) }

// Events on the device goroutine, as plain handles: the executor's profiler
// records one before each step of a run queued inside one Do.

// EventCreateRaw creates an event into *e.
func (d *Device) EventCreateRaw(e *uintptr) error {
	return d.api.check("cuEventCreate", ccall(d.api.cuEventCreate, uintptr(unsafe.Pointer(e)), 0))
}

// EventRecordRaw records e on the device's stream.
func (d *Device) EventRecordRaw(e uintptr) error {
	return d.api.check("cuEventRecord", ccall(d.api.cuEventRecord, e, d.stream))
}

// EventSynchronizeRaw waits for e.
func (d *Device) EventSynchronizeRaw(e uintptr) error {
	return d.api.check("cuEventSynchronize", ccall(d.api.cuEventSynchronize, e))
}

// EventElapsedRaw writes into *ms the milliseconds from start to end.
func (d *Device) EventElapsedRaw(ms *float32, start, end uintptr) error {
	return d.api.check("cuEventElapsedTime", ccall(d.api.cuEventElapsedTime, uintptr(unsafe.Pointer(ms)), start, end))
}

// EventDestroyRaw destroys e, ignoring the result.
func (d *Device) EventDestroyRaw(e uintptr) { ccall(d.api.cuEventDestroy, e) }
