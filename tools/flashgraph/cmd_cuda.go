package main

import (
	"os"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda"
)

// cudaOptions configures the CUDA backend that -device cuda (and auto) get.
// A command flag may set Compute; without one, FLASHGRAPH_CUDA_DTYPE=bf16
// selects mixed precision (float32 master weights and optimizer state,
// bfloat16 activations and GEMMs).
var cudaOptions cuda.Options

func init() {
	newCUDABackend = func() (backend.Backend, error) {
		opts := cudaOptions
		if v := os.Getenv("FLASHGRAPH_CUDA_DTYPE"); v != "" && opts.Compute == 0 {
			dt, err := cuda.ParseCompute(v)
			if err != nil {
				return nil, err
			}
			opts.Compute = dt
		}
		// NewBackend returns cuda.Available's error (which library or device is
		// missing) on machines without a usable GPU.
		return cuda.NewBackend(opts)
	}
}
