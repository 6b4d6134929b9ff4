package driver

// Device plumbing the Hopper (sm_90a) attention kernels need beyond Launch:
// TMA tensor maps, encoded on the device goroutine and passed by value
// (128 bytes each, which Launch's 8-byte argument slots cannot carry), and
// the persistent forward's schedule counters, which the device owns and
// frees on Close. The kernels and their launchers are package attention's.

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// CUtensorMap enums (cuda.h) used here.
const (
	tensorMapDataTypeUint16 = 1
	tensorMapSwizzle128B    = 3
	tensorMapL2Promote128B  = 2
)

// tensorMapArgs are cuTensorMapEncodeTiled's array arguments, kept on the heap
// so they can be pinned while the driver reads them.
type tensorMapArgs struct {
	dims    [3]uint64
	strides [2]uint64
	box     [3]uint32
	elem    [3]uint32
}

// encodeFlashTensorMap writes into dst (128 bytes, 64-byte aligned) the TMA
// map of a [bh, rows, dim] 16-bit tensor at ptr as the sm90 kernels
// reads it: 3-D (dim, rows, bh), innermost first, boxes of 64 × boxRows × 1
// elements with the 128-byte swizzle; reads past rows give zeros.
func encodeFlashTensorMap(api *driverAPI, dst unsafe.Pointer, ptr DevicePtr, bh, rows, dim, boxRows int) error {
	if api.cuTensorMapEncodeTiled == 0 {
		return fmt.Errorf("cuda: the driver has no cuTensorMapEncodeTiled (the sm90 TMA forward needs a CUDA 12 driver)")
	}
	if ptr%16 != 0 {
		return fmt.Errorf("cuda: sm90 TMA forward: tensor at %#x is not 16-byte aligned", uint64(ptr))
	}
	a := &tensorMapArgs{
		dims:    [3]uint64{uint64(dim), uint64(rows), uint64(bh)},
		strides: [2]uint64{uint64(dim * 2), uint64(rows * dim * 2)},
		box:     [3]uint32{64, uint32(boxRows), 1},
		elem:    [3]uint32{1, 1, 1},
	}
	var pin runtime.Pinner
	pin.Pin(a)
	defer pin.Unpin()
	return api.check("cuTensorMapEncodeTiled", ccall(api.cuTensorMapEncodeTiled, uintptr(dst), tensorMapDataTypeUint16, 3,
		uintptr(ptr), uintptr(unsafe.Pointer(&a.dims[0])), uintptr(unsafe.Pointer(&a.strides[0])),
		uintptr(unsafe.Pointer(&a.box[0])), uintptr(unsafe.Pointer(&a.elem[0])),
		0 /* no interleave */, tensorMapSwizzle128B, tensorMapL2Promote128B, 0 /* out of bounds: zeros */))
}

// HasTensorMaps reports whether the driver can encode TMA tensor maps
// (cuTensorMapEncodeTiled, CUDA 12 and newer).
func (d *Device) HasTensorMaps() bool { return d.api.cuTensorMapEncodeTiled != 0 }

// EncodeFlashTensorMap is encodeFlashTensorMap with the device's driver; it
// runs on the device goroutine (inside Do).
func (d *Device) EncodeFlashTensorMap(dst unsafe.Pointer, ptr DevicePtr, bh, rows, dim, boxRows int) error {
	return encodeFlashTensorMap(d.api, dst, ptr, bh, rows, dim, boxRows)
}

// PackArgs packs kernel arguments into 8-byte slots as Launch does.
func PackArgs(args []any) ([]uint64, error) { return packArgs(args) }

// LaunchParamsRaw launches f with params, the addresses of its arguments
// (pinned by the caller), on the device goroutine (inside Do).
func (d *Device) LaunchParamsRaw(f *Function, grid, block [3]uint32, smem uint32, params []uintptr) error {
	return d.api.check("cuLaunchKernel", ccall(d.api.cuLaunchKernel, f.h,
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]), uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
		uintptr(smem), d.stream, uintptr(unsafe.Pointer(&params[0])), 0))
}

// FlashSM90Sched is the device's dynamic schedule for the persistent
// forward (two int32: the tile counter and the CTAs done), allocated and
// zeroed on first use; each launch leaves it zeroed again for the next (the
// last CTA resets it). The device's one stream orders the launches that
// share it.
func (d *Device) FlashSM90Sched() (DevicePtr, error) {
	d.flashSchedMu.Lock()
	defer d.flashSchedMu.Unlock()
	if d.flashSched != 0 {
		return d.flashSched, nil
	}
	p, err := d.Alloc(8)
	if err != nil {
		return 0, err
	}
	if err := d.Memset(p, 0, 8); err != nil {
		return 0, errors.Join(err, d.Free(p))
	}
	d.flashSched = p
	return p, nil
}
