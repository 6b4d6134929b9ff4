package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/train"
)

// This file says, before long or large work starts, how much memory and time
// it will take: a run that cannot fit is refused up front (instead of being
// killed by the kernel minutes later), and a run that takes minutes says so.

// memoryNeed is the memory the executables of a run take, from the static
// memory plan (the one `compile -plan` prints): every graph's initializers,
// inputs and activation arena.
type memoryNeed struct {
	Total       int64
	Activations int64 // the arenas
	State       int64 // params, optimizer moments, consts and inputs
}

// planNeed adds up the memory plans of gs (with updates[i] the update map of
// gs[i], nil for a forward graph).
func planNeed(compute graph.DType, gs []*graph.Graph, updates []map[string]string) (memoryNeed, error) {
	var m memoryNeed
	for i, g := range gs {
		p, err := cuda.PlanMemoryWith(g, cuda.PlanOptions{Compute: compute, Updates: updates[i]})
		if err != nil {
			return m, fmt.Errorf("memory plan of %s: %w", g.Name, err)
		}
		m.Activations += p.PeakBytes
		m.State += p.InitializerBytes + p.InputBytes
	}
	m.Total = m.Activations + m.State
	return m, nil
}

// availableMemory is the memory a run on be can use: the device's free
// memory on CUDA, MemAvailable of /proc/meminfo on the CPU. ok is false when
// it cannot be known (then nothing is refused).
func availableMemory(be backend.Backend) (bytes int64, where string, ok bool) {
	if cb, isCUDA := be.(*cuda.Backend); isCUDA {
		free, _, err := cb.Device().MemInfo()
		if err != nil {
			return 0, "", false
		}
		return int64(free), "free on " + be.Name(), true
	}
	if b, ok := hostAvailable(); ok {
		return b, "available on this machine", true
	}
	return 0, "", false
}

// hostAvailable is MemAvailable of /proc/meminfo: what this machine can give
// a process without swapping. ok is false when it cannot be known.
func hostAvailable() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "MemAvailable:   12345678 kB"
		if rest, found := strings.CutPrefix(sc.Text(), "MemAvailable:"); found {
			fields := strings.Fields(rest)
			if len(fields) == 2 && fields[1] == "kB" {
				if kb, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
					return kb << 10, true
				}
			}
		}
	}
	return 0, false
}

// compileMemory is the memory that work done while loading or writing a
// graph may take (constant folding on ONNX import, computing initializers
// for an ONNX export): half of what the machine has available, the rest
// being for what the command does with the graph. 0 (no bound) when it
// cannot be known. Such work past it is refused before it allocates, naming
// the node or initializer and the size, instead of ending in the Go
// runtime's out-of-memory crash.
func compileMemory() int64 {
	if b, ok := hostAvailable(); ok {
		return b / 2
	}
	return 0
}

// checkMemory refuses a run whose plan needs more memory than is available,
// unless force; what says what the memory is for ("training small").
func checkMemory(w io.Writer, be backend.Backend, need memoryNeed, what string, force bool) error {
	return checkMemoryHint(w, be, need, 1, what, "weights, optimizer state and inputs", force,
		"Use a smaller -batch or -seq (activations grow with both), fewer -layers, or -force to try anyway")
}

// cpuHeapFactor is how much more memory than the static plan a forward
// pass on the CPU backend takes: the host executor frees intermediates to
// Go's garbage collector, whose heap grows to twice the live data before it
// collects (GOGC=100). Measured: run -batch 2000 of tiny peaks at 272 MiB
// resident for a plan of 126 MiB (2.2×).
const cpuHeapFactor = 2.5

// guardMemory refuses, before anything is allocated, to run gs (forward
// graphs) on be when their memory plan (the one train and compile -plan
// use) does not fit in the memory available; what names the work. A graph
// the planner cannot plan is let through with a note: the run then reports
// its own errors. With force a plan that does not fit is only reported.
func guardMemory(w io.Writer, be backend.Backend, bf16 bool, what, hint string, force bool, gs ...*graph.Graph) error {
	compute := graph.Float32
	if bf16 {
		compute = graph.BFloat16
	}
	need, err := planNeed(compute, gs, make([]map[string]string, len(gs)))
	if err != nil {
		fmt.Fprintf(w, "memory: %s: not checked (%v)\n", what, err)
		return nil
	}
	factor := 1.0
	if be.Name() == "cpu" {
		factor = cpuHeapFactor
	}
	return checkMemoryHint(w, be, need, factor, what, "weights and inputs", force, hint)
}

// checkMemoryHint is checkMemory with the way out of a refusal given, and
// the plan scaled by factor (the host executor's overhead over the plan);
// state says what the memory besides the activations holds.
func checkMemoryHint(w io.Writer, be backend.Backend, need memoryNeed, factor float64, what, state string, force bool, hint string) error {
	avail, where, ok := availableMemory(be)
	line := fmt.Sprintf("memory: %s needs about %s (%s activations, %s %s)",
		what, cuda.FormatBytes(need.Total), cuda.FormatBytes(need.Activations), cuda.FormatBytes(need.State), state)
	if !ok {
		fmt.Fprintln(w, line)
		return nil
	}
	line += fmt.Sprintf("; %s %s", cuda.FormatBytes(avail), where)
	if factor != 1 {
		line += fmt.Sprintf(" (the CPU executor takes up to %.1f× its plan)", factor)
	}
	if float64(need.Total)*factor <= float64(avail) {
		fmt.Fprintln(w, line)
		return nil
	}
	if force {
		fmt.Fprintln(w, line+": more than there is; going ahead because of -force")
		return nil
	}
	return fmt.Errorf("%s: not enough memory. %s", line, hint)
}

// matmulFLOPs counts the FLOPs the device executes for g's matrix products
// and attention (train.GraphFLOPs, recomputation included): the work that
// dominates a transformer's time, and so the basis of time estimates.
func matmulFLOPs(g *graph.Graph) float64 { return train.GraphFLOPs(g).Hardware }

// cpuRate measures this machine's CPU backend on a matrix product of about
// the size a small model multiplies, in FLOP/s: the basis of time estimates.
// It takes a few tens of milliseconds.
func cpuRate() (float64, error) {
	const m, k, n = 512, 256, 256
	b := graph.NewBuilder("calibrate")
	x := b.Input("x", graph.Float32, m, k)
	y := b.Input("y", graph.Float32, k, n)
	b.Output(b.MatMul(x, y))
	g, err := b.Build()
	if err != nil {
		return 0, err
	}
	be := cpu.New()
	exe, err := be.Compile(g, backend.Options{})
	if err != nil {
		return 0, err
	}
	defer exe.Close()
	// Operands of ones: the CPU's products skip a zero term of A (gonum's
	// Sgemm does, and package sgemm gives its bits), so zeros would time
	// almost no arithmetic.
	feeds := map[string]*graph.Tensor{"x": graph.NewTensor(graph.Float32, graph.Shape{m, k}), "y": graph.NewTensor(graph.Float32, graph.Shape{k, n})}
	for _, t := range feeds {
		for i := range t.F32 {
			t.F32[i] = 1
		}
	}
	best := time.Duration(1 << 62)
	for range 5 {
		t0 := time.Now()
		if _, err := exe.Run(feeds); err != nil {
			return 0, err
		}
		best = min(best, time.Since(t0))
	}
	return 2 * m * k * n / best.Seconds(), nil
}

// cpuEfficiency is the fraction of the calibrated matmul rate a whole model
// reaches on the CPU backend (smaller and transposed products, elementwise
// ops, the loss, allocation). Measured on a 2-core AVX-512 machine: training
// small ran at 46 GFLOP/s against a calibrated 143 (33%), and at 57 GFLOP/s
// against 140 (41%) once shape-only ops became views and buffers were reused
// (300 steps in 4m24s, estimated 6 min at 0.3). (Until the calibration
// multiplied ones instead of zeros, which the products skip, it read ~138
// GFLOP/s of nothing, and this was 0.07.) Estimates are rough, and say so.
const cpuEfficiency = 0.4

// estimateCPUTime estimates how long flops of model work take on this CPU.
func estimateCPUTime(flops float64) (time.Duration, float64, error) {
	rate, err := cpuRate()
	if err != nil {
		return 0, 0, err
	}
	return time.Duration(flops / (rate * cpuEfficiency) * float64(time.Second)), rate, nil
}

// formatFLOP writes a count of floating-point operations with a unit.
func formatFLOP(f float64) string {
	switch {
	case f >= 1e12:
		return fmt.Sprintf("%.1f TFLOP", f/1e12)
	case f >= 1e9:
		return fmt.Sprintf("%.1f GFLOP", f/1e9)
	}
	return fmt.Sprintf("%.1f MFLOP", f/1e6)
}

// roughDuration writes an estimate with the precision it has.
func roughDuration(d time.Duration) string {
	switch {
	case d < 2*time.Second:
		return "a second or two"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()+0.5))
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d.Minutes()+0.5))
	}
	return fmt.Sprintf("%.1f h", d.Hours())
}

// runMemoryHint is the way out of a refused forward pass: of a graph file,
// or of the model built from -config.
func runMemoryHint(file bool) string {
	if file {
		return "The graph's inputs and activations (its static shapes) need more memory than there is: make its shapes smaller"
	}
	return "Use a smaller -batch or -seq (activations grow with both; -fuse keeps attention from growing with -seq squared) or fewer -layers"
}
