package main

import (
	"fmt"
	"os"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/train"
)

// devicePeak is be's peak rate for a model of type dt from train's table
// (zero for the CPU and for GPUs the table does not list).
func devicePeak(be backend.Backend, dt graph.DType) train.Peak {
	cb, ok := be.(*cuda.Backend)
	if !ok {
		return train.Peak{}
	}
	p, _ := train.PeakFLOPS(cb.Device().Name(), train.ComputeDType(be, dt))
	return p
}

// formatRate writes a FLOP/s figure with a unit.
func formatRate(f float64) string {
	switch {
	case f >= 1e12:
		return fmt.Sprintf("%.1f TFLOP/s", f/1e12)
	case f >= 1e9:
		return fmt.Sprintf("%.2f GFLOP/s", f/1e9)
	}
	return fmt.Sprintf("%.1f MFLOP/s", f/1e6)
}

// printThroughput writes the summary's throughput rows: the steady state
// (first step excluded), compile and first step apart, and MFU where the
// device's peak is known.
func printThroughput(row func(k, format string, args ...any), r *train.Result) {
	if tps := r.SteadyTokensPerSec(); tps > 0 {
		row("throughput", "%s tokens/s (steady state: mean of the last %d steps, the first excluded; %d tokens in %v of training steps in all)",
			trainCount(int64(tps)), r.SteadySteps, r.Tokens, r.TrainTime.Round(time.Millisecond))
	} else if r.Tokens > 0 {
		row("throughput", "not measured: this run took one step, whose time includes one-time work (run 2 or more steps)")
	}
	first := "no step"
	if r.Tokens > 0 {
		first = "first step " + r.FirstStep.Round(time.Millisecond).String()
	}
	row("compile", "%v; %s (one-time work: not in tokens/s)", r.Compile.Round(time.Millisecond), first)
	if r.SteadyTokensPerSec() <= 0 {
		return
	}
	flops := r.ModelFLOPS()
	perTok := formatFLOP(r.FLOPsPerToken)
	if r.Peak.FLOPS > 0 {
		row("MFU", "%.1f%% (%s/token × %s tokens/s = %s of the %s's %s %s peak)",
			100*r.MFU(), perTok, trainCount(int64(r.SteadyTokensPerSec())), formatRate(flops), r.Peak.Device, formatRate(r.Peak.FLOPS), r.Peak.DType)
		return
	}
	row("model FLOP/s", "%s (%s/token; no MFU: no peak rate is known for %s)", formatRate(flops), perTok, r.Backend)
}

// openMetrics opens -metrics FILE: appended to by a resumed run (its lines
// continue the history), replaced by a fresh one.
func openMetrics(path string, resume bool, made *createdFiles) (*os.File, error) {
	if err := train.CheckOutputFile("-metrics", path); err != nil {
		return nil, err
	}
	made.file(path)
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if resume {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("-metrics: %w", err)
	}
	return f, nil
}

// metricsWriter writes to the -metrics file once Ready has opened it
// (nothing before: a run that fails to start creates no file).
type metricsWriter struct{ f **os.File }

func (m metricsWriter) Write(b []byte) (int, error) {
	if *m.f == nil {
		return len(b), nil
	}
	return (*m.f).Write(b)
}
