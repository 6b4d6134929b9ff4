package main

import (
	"errors"
	"fmt"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/backend/cuda"
)

// resolveDevice resolves -device. auto prefers CUDA and falls back to the CPU
// with a note saying why; cuda without a usable GPU is an error saying why.
// bf16 asks for mixed precision, which only the CUDA backend has: it never
// falls back silently to a float32 CPU run.
func resolveDevice(device string, bf16 bool) (backend.Backend, string, error) {
	return resolveDeviceOn(device, bf16, 0)
}

// resolveDeviceOn is resolveDevice on the GPU of the given ordinal (a rank's
// local rank); the CPU has one device.
func resolveDeviceOn(device string, bf16 bool, ordinal int) (backend.Backend, string, error) {
	switch device {
	case "cpu":
		if bf16 {
			return nil, "", errors.New("-dtype bf16 is mixed precision on CUDA; the CPU backend computes float32 or float64 (use -device cuda, or -dtype float32)")
		}
		return cpu.New(), "", nil
	case "cuda":
		be, err := cuda.NewMixedBackendOn(bf16, ordinal)
		if err != nil {
			return nil, "", fmt.Errorf("-device cuda: %w", err)
		}
		return be, "", nil
	case "auto":
		be, err := cuda.NewMixedBackendOn(bf16, ordinal)
		if err != nil {
			if bf16 {
				return nil, "", fmt.Errorf("-dtype bf16 needs CUDA, which is unavailable: %w", err)
			}
			return cpu.New(), fmt.Sprintf("device: CUDA unavailable (%v); running on the CPU", err), nil
		}
		return be, "", nil
	}
	return nil, "", fmt.Errorf("-device %q: want cpu, cuda or auto", device)
}
