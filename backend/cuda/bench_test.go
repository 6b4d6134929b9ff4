package cuda

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// notCUDA is an executable of some other backend.
type notCUDA struct{ backend.Executable }

func TestStepsOfRejectsOtherExecutables(t *testing.T) {
	if _, err := StepsOf(notCUDA{}); err == nil || !strings.Contains(err.Error(), "not a CUDA executable") {
		t.Errorf("StepsOf(another backend's executable) = %v, want an error saying it is not a CUDA executable", err)
	}
}

// The bench hooks check their arguments before touching the device.
func TestStepsBounds(t *testing.T) {
	n := &graph.Node{Name: "n", Op: "Neg"}
	ran := 0
	s := &Steps{x: &executable{g: &graph.Graph{}, steps: []step{{node: n, run: func() error { ran++; return nil }}}}}
	for _, r := range [][2]int{{-1, 1}, {0, 2}, {1, 0}} {
		if err := s.Run(r[0], r[1]); err == nil {
			t.Errorf("Run(%d, %d) of 1 step accepted", r[0], r[1])
		}
	}
	if err := s.Run(0, 1); err != nil || ran != 1 {
		t.Errorf("Run(0, 1) = %v, ran %d steps", err, ran)
	}
	if got := s.Nodes(); len(got) != 1 || got[0] != n {
		t.Errorf("Nodes() = %v", got)
	}
	if _, _, _, err := s.Buffer("missing"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Buffer(missing) = %v", err)
	}
}

func TestIsOutOfMemory(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("compile: %w", &Error{Call: "cuMemAlloc_v2", Name: "CUDA_ERROR_OUT_OF_MEMORY"}), true},
		{&Error{Call: "cublasCreate_v2", Name: "CUBLAS_STATUS_ALLOC_FAILED"}, true},
		{&Error{Call: "cuLaunchKernel", Name: "CUDA_ERROR_INVALID_VALUE"}, false},
		{errors.New("out of memory"), false}, // only the driver's status counts
		{nil, false},
	} {
		if got := IsOutOfMemory(c.err); got != c.want {
			t.Errorf("IsOutOfMemory(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
