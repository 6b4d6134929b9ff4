package driver

import (
	"errors"
	"fmt"
	"os"
	"unsafe"
)

// CUDA graphs: a compiled step queues the same work on the same buffers
// every run (every pointer, shape and launch size is fixed at Compile), so
// after a first plain run the executor records the run once with stream
// capture and from then on replays it with one cuGraphLaunch. That removes
// the per-launch cost of a few microseconds from each of the thousands of
// kernels of a training step. FLASHGRAPH_CUDA_GRAPHS=0 turns it off.

// cuStreamCaptureModeThreadLocal: only this thread's calls may touch the
// capturing stream, and the device goroutine is the one thread that does.
const cuStreamCaptureModeThreadLocal = 1

// GraphsEnabled reports whether the driver has the graph API and the user
// did not turn it off.
func (d *Device) GraphsEnabled() bool {
	a := d.api
	if a.cuStreamBeginCapture == 0 || a.cuStreamEndCapture == 0 || a.cuGraphInstantiate == 0 ||
		a.cuGraphLaunch == 0 || a.cuGraphExecDestroy == 0 || a.cuGraphDestroy == 0 {
		return false
	}
	v := os.Getenv("FLASHGRAPH_CUDA_GRAPHS")
	return v != "0" && v != "off" && v != "false"
}

// capture records what run queues on the device's stream (nothing executes)
// and returns the instantiated graph.
func (d *Device) capture(run func() error) (exec uintptr, err error) {
	a := d.api
	if err := d.do(func() error {
		return a.check("cuStreamBeginCapture", ccall(a.cuStreamBeginCapture, d.stream, cuStreamCaptureModeThreadLocal))
	}); err != nil {
		return 0, err
	}
	runErr := run()
	var g uintptr
	endErr := d.do(func() error {
		return a.check("cuStreamEndCapture", ccall(a.cuStreamEndCapture, d.stream, uintptr(unsafe.Pointer(&g))))
	})
	defer func() {
		if g != 0 {
			_ = d.do(func() error { return a.check("cuGraphDestroy", ccall(a.cuGraphDestroy, g)) })
		}
	}()
	if runErr != nil || endErr != nil {
		return 0, errors.Join(runErr, endErr)
	}
	err = d.do(func() error {
		return a.check("cuGraphInstantiate", ccall(a.cuGraphInstantiate, uintptr(unsafe.Pointer(&exec)), g, 0))
	})
	return exec, err
}

// Replayer runs one fixed sequence of stream work: plainly the first time,
// then captured once, then by replaying the graph.
type Replayer struct {
	exec uintptr
	runs int
	off  error // why graphs are not used (nil: they are, or will be)
}

// Run queues the work of fn (which must queue the same work every call).
func (r *Replayer) Run(d *Device, fn func() error) error {
	if r.off != nil {
		return fn()
	}
	if r.exec != 0 {
		return d.do(func() error {
			return d.api.check("cuGraphLaunch", ccall(d.api.cuGraphLaunch, r.exec, d.stream))
		})
	}
	r.runs++
	if !d.GraphsEnabled() {
		r.off = errors.New("CUDA graphs are off (FLASHGRAPH_CUDA_GRAPHS, or the driver lacks them)")
		return fn()
	}
	if r.runs < 2 {
		// The first run is plain: it loads modules, sets kernel attributes
		// and lets cuBLAS pick its algorithms and workspace.
		return fn()
	}
	exec, err := d.capture(fn)
	if err != nil {
		// Something in the sequence cannot be captured: run it as it is,
		// from now on. The plain run reports any real error.
		r.off = fmt.Errorf("capture failed: %w", err)
		return fn()
	}
	r.exec = exec
	return r.Run(d, fn)
}

// Release destroys the graph.
func (r *Replayer) Release(d *Device) error {
	if r.exec == 0 {
		return nil
	}
	exec := r.exec
	r.exec = 0
	return d.do(func() error { return d.api.check("cuGraphExecDestroy", ccall(d.api.cuGraphExecDestroy, exec)) })
}

// Replaying reports whether r now replays a graph.
func (r *Replayer) Replaying() bool { return r.exec != 0 }

// Off is why r does not use graphs (nil: it does, or will).
func (r *Replayer) Off() error { return r.off }
