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
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "MemAvailable:   12345678 kB"
		if rest, found := strings.CutPrefix(sc.Text(), "MemAvailable:"); found {
			fields := strings.Fields(rest)
			if len(fields) == 2 && fields[1] == "kB" {
				if kb, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
					return kb << 10, "available on this machine", true
				}
			}
		}
	}
	return 0, "", false
}

// checkMemory refuses a run whose plan needs more memory than is available,
// unless force; what says what the memory is for ("training small").
func checkMemory(w io.Writer, be backend.Backend, need memoryNeed, what string, force bool) error {
	avail, where, ok := availableMemory(be)
	line := fmt.Sprintf("memory: %s needs about %s (%s activations, %s weights, optimizer state and inputs)",
		what, cuda.FormatBytes(need.Total), cuda.FormatBytes(need.Activations), cuda.FormatBytes(need.State))
	if !ok {
		fmt.Fprintln(w, line)
		return nil
	}
	line += fmt.Sprintf("; %s %s", cuda.FormatBytes(avail), where)
	if need.Total <= avail {
		fmt.Fprintln(w, line)
		return nil
	}
	if force {
		fmt.Fprintln(w, line+": more than there is; going ahead because of -force")
		return nil
	}
	return fmt.Errorf("%s: not enough memory. Use a smaller -batch or -seq (activations grow with both), fewer -layers, or -force to try anyway", line)
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
	feeds := map[string]*graph.Tensor{"x": graph.NewTensor(graph.Float32, graph.Shape{m, k}), "y": graph.NewTensor(graph.Float32, graph.Shape{k, n})}
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
// ops, the loss, allocation). Measured on a 2-core machine: training small
// ran at 9 GFLOP/s against a calibrated 138 (6.5%), a gpt2 forward pass at
// about 11%, tiny at 3% (too small to keep the cores busy). Estimates are
// therefore rough, and say so.
const cpuEfficiency = 0.07

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
