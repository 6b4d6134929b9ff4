// Package backend defines what an executor of graphs provides. What each op
// computes is specified once, by the Eval of its op table row (graph/eval.go);
// the conformance suite (backend/backendtest) checks every backend, the CPU
// backend included, against it.
package backend

import (
	"context"
	"errors"
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// Backend compiles graphs into executables.
type Backend interface {
	// Name is "cpu", "cuda", ...
	Name() string
	// Compile prepares g for repeated runs: checks every op is supported,
	// plans memory, materialises initializers from their recipes.
	Compile(g *graph.Graph, opts Options) (Executable, error)
	Close() error
}

// Options tune compilation.
type Options struct {
	// Updates maps a graph output to the initializer (param or const) it
	// replaces after every run. A training step's new weights and optimizer
	// moments stay inside the executable (on the device) this way; Run does
	// not return update outputs.
	Updates map[string]string
	// PoisonOutputs fills every buffer with NaN before the kernel that writes
	// it, so that an element a kernel forgets to write shows up in tests.
	PoisonOutputs bool
	// CheckFinite is a diagnostic mode: Run checks the floating outputs of
	// every node, in topological order, and stops at the first node that
	// makes a NaN from inputs without one, or an infinity from finite
	// inputs, with a *NonFiniteError naming it. It reads every value, so it
	// is slow; a backend that cannot check its nodes one by one refuses it
	// at Compile, saying so.
	CheckFinite bool
	// Collective, for a graph of a data-parallel job (flashgraph.AllReduce
	// nodes with world > 1), is what the executor calls for those nodes;
	// package dist's TCP implements it on the CPU. Compile refuses such a
	// graph without one, or with one of another world size.
	Collective Collective
}

// Collective sums float32 buffers over the ranks of a data-parallel job.
type Collective interface {
	WorldSize() int
	// AllReduceSum replaces buf with the element-wise sum over every rank's
	// buf, the same bits on every rank.
	AllReduceSum(ctx context.Context, buf []float32) error
}

// Executable is a compiled graph. Initializers live inside it between runs.
type Executable interface {
	// Run executes the graph once with the graph inputs given by name and
	// returns every graph output that is not an update target, by name.
	Run(feeds map[string]*graph.Tensor) (map[string]*graph.Tensor, error)
	// SetInitializer replaces a param's or const's data (loading a checkpoint).
	SetInitializer(name string, t *graph.Tensor) error
	// Initializer returns a copy of a param's or const's current data.
	Initializer(name string) (*graph.Tensor, error)
	// Stats reports memory use (bytes) for plans and leak checks.
	Stats() Stats
	Close() error
}

// Stats is memory accounting of an executable.
type Stats struct {
	PeakActivationBytes int64 // largest live intermediate set during a run
	InitializerBytes    int64 // params, consts, optimizer state
}

// CheckFeeds validates feeds against the graph's inputs: every input present
// with its exact dtype and shape, nothing unknown.
func CheckFeeds(g *graph.Graph, feeds map[string]*graph.Tensor) error {
	for _, in := range g.Inputs {
		t, ok := feeds[in.Name]
		if !ok || t == nil {
			return fmt.Errorf("input %s (%v) was not given", in.Name, in.Type)
		}
		if !t.Type().Equal(in.Type) {
			return fmt.Errorf("input %s: got %v, graph wants %v", in.Name, t.Type(), in.Type)
		}
		if err := t.Check(); err != nil {
			return fmt.Errorf("input %s: %w", in.Name, err)
		}
	}
	if len(feeds) != len(g.Inputs) {
		known := map[string]bool{}
		for _, in := range g.Inputs {
			known[in.Name] = true
		}
		for name := range feeds {
			if !known[name] {
				return fmt.Errorf("feed %s is not a graph input", name)
			}
		}
	}
	return nil
}

// ErrUnsupported marks a Compile error for a graph with an op the backend
// has no implementation of yet (the CPU backend implements every op). The
// conformance suite skips such cases on other backends, naming the op.
var ErrUnsupported = errors.New("not supported by this backend")
