package cuda

import (
	"fmt"
	"os"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// NewMixedBackend makes the CUDA backend; bf16 selects mixed precision
// (float32 master weights and optimizer state, bfloat16 activations and
// GEMMs). Without -dtype bf16, FLASHGRAPH_CUDA_DTYPE=bf16 selects it too.
// On machines without a usable GPU it returns Available's error, which
// says which library or device is missing.
func NewMixedBackend(bf16 bool) (backend.Backend, error) {
	return NewMixedBackendOn(bf16, 0)
}

// NewMixedBackendOn is NewMixedBackend on the GPU of the given ordinal (a
// rank's LOCAL_RANK in a data-parallel job).
func NewMixedBackendOn(bf16 bool, ordinal int) (backend.Backend, error) {
	opts := Options{Ordinal: ordinal}
	if bf16 {
		opts.Compute = graph.BFloat16
	} else if v := os.Getenv("FLASHGRAPH_CUDA_DTYPE"); v != "" {
		dt, err := ParseCompute(v)
		if err != nil {
			return nil, fmt.Errorf("FLASHGRAPH_CUDA_DTYPE: %w", err)
		}
		opts.Compute = dt
	}
	return NewBackend(opts)
}
