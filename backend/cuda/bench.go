package cuda

// Hooks for benchmarks (package bench, `flashgraph bench`): they time an
// executable's steps on device-resident data, because Run uploads feeds and
// downloads outputs, and those host transfers (hundreds of MiB) would swamp
// the kernels being timed. The steps are the executor's own closures, so
// what is timed is what a run executes, op by op.

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda/attention"
	"github.com/flashgraph/flashgraph/graph"
)

// Steps is a compiled CUDA executable seen step by step: one step per graph
// node, in run order.
type Steps struct{ x *executable }

// StepsOf opens an executable compiled by a CUDA Backend.
func StepsOf(e backend.Executable) (*Steps, error) {
	x, ok := e.(*executable)
	if !ok {
		return nil, fmt.Errorf("cuda: steps of a %T: not a CUDA executable", e)
	}
	return &Steps{x: x}, nil
}

// Nodes are the steps' graph nodes, in run order.
func (s *Steps) Nodes() []*graph.Node {
	nodes := make([]*graph.Node, len(s.x.steps))
	for i, st := range s.x.steps {
		nodes[i] = st.node
	}
	return nodes
}

// Run queues steps [lo, hi) in order on the device's stream; it does not
// wait for them. A kernel that finds bad input sets the error flag (see
// ClearKernelError).
func (s *Steps) Run(lo, hi int) error {
	if lo < 0 || hi > len(s.x.steps) || lo > hi {
		return fmt.Errorf("cuda: steps [%d, %d) of %d", lo, hi, len(s.x.steps))
	}
	for _, st := range s.x.steps[lo:hi] {
		if err := st.run(); err != nil {
			return fmt.Errorf("node %s (%s): %w", st.node.Name, st.node.Op, err)
		}
	}
	return nil
}

// Buffer is the device buffer of the value called name: its address, its
// storage type and its element count.
func (s *Steps) Buffer(name string) (ptr DevicePtr, dt graph.DType, n int, err error) {
	v := s.x.g.Value(name)
	if v == nil {
		return 0, graph.InvalidDType, 0, fmt.Errorf("cuda: the executable has no value %s", name)
	}
	buf, ok := s.x.bufs[v]
	if !ok {
		return 0, graph.InvalidDType, 0, fmt.Errorf("cuda: value %s has no device buffer", name)
	}
	return buf.ptr, buf.dt, buf.n, nil
}

// ClearKernelError resets the flag kernels report bad input in.
func (s *Steps) ClearKernelError() error { return s.x.b.dev.Memset(s.x.flag, 0, 4) }

// KernelError waits for the queued work and explains the error a kernel
// reported since ClearKernelError (nil when none did).
func (s *Steps) KernelError() error {
	var code int32
	if err := s.x.b.dev.CopyToHost(unsafe.Pointer(&code), s.x.flag, 4); err != nil {
		return err
	}
	if code != 0 {
		return s.x.kernelError(code)
	}
	return nil
}

// IsOutOfMemory reports whether err is (or wraps) a CUDA or cuBLAS
// out-of-memory error.
func IsOutOfMemory(err error) bool {
	var ce *Error
	return errors.As(err, &ce) && (ce.Name == "CUDA_ERROR_OUT_OF_MEMORY" || ce.Name == "CUBLAS_STATUS_ALLOC_FAILED")
}

// BenchWarmUp loads the flash kernels and creates cuBLAS's handle (with its
// workspace), so that a device memory measurement taken afterwards counts
// neither.
func (b *Backend) BenchWarmUp() error {
	d := b.dev
	if err := attention.WarmUp(d); err != nil {
		return err
	}
	tmp, err := d.Alloc(3 * 64 * 64 * 2)
	if err != nil {
		return err
	}
	defer d.Free(tmp)
	if err := d.Memset(tmp, 0, 3*64*64*2); err != nil {
		return err
	}
	if err := d.RowMajorBatchedMatMul(GemmBF16, false, true, 64, 64, 64, 1, tmp, 0, tmp.Offset(64*64*2), 0, 0, tmp.Offset(2*64*64*2), 0, 1); err != nil {
		return err
	}
	return d.Synchronize()
}
