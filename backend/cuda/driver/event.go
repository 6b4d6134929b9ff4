package driver

import (
	"fmt"
	"unsafe"
)

// Event is a CUDA event for timing work on the device's stream.
type Event struct {
	d *Device
	h uintptr
}

// NewEvent creates an event with timing enabled (CU_EVENT_DEFAULT).
func (d *Device) NewEvent() (*Event, error) {
	e := &Event{d: d}
	err := d.do(func() error {
		return d.api.check("cuEventCreate", ccall(d.api.cuEventCreate, uintptr(unsafe.Pointer(&e.h)), 0))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	return e, nil
}

// Record queues e on the device's stream: it completes when the work before it does.
func (d *Device) Record(e *Event) error {
	return d.do(func() error {
		return d.api.check("cuEventRecord", ccall(d.api.cuEventRecord, e.h, d.stream))
	})
}

// ElapsedMs waits for end and returns the milliseconds between start and end
// (resolution about half a microsecond).
func (d *Device) ElapsedMs(start, end *Event) (float32, error) {
	var ms float32
	err := d.do(func() error {
		if err := d.api.check("cuEventSynchronize", ccall(d.api.cuEventSynchronize, end.h)); err != nil {
			return err
		}
		return d.api.check("cuEventElapsedTime", ccall(d.api.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), start.h, end.h))
	})
	return ms, err
}

// Destroy releases the event.
func (e *Event) Destroy() error {
	if e == nil || e.h == 0 {
		return nil
	}
	h := e.h
	e.h = 0
	return e.d.do(func() error {
		return e.d.api.check("cuEventDestroy_v2", ccall(e.d.api.cuEventDestroy, h))
	})
}
