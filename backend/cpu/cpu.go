// Package cpu is the host executor: every op of the op table, on the
// host, in float32 and float64 (bfloat16 and float16 are held as float32
// values already rounded to the narrow type; kernels compute in float32 and
// the executor rounds their outputs). Its kernels are the fast executors of
// the ops, not their definition: that is each op's Eval in the op table
// (graph/eval.go), which the conformance suite checks these kernels against.
//
// Numerics, so that other backends know what to match:
//   - float32 elementwise arithmetic (+ − × ÷, Neg, Abs, Relu, Reciprocal) is
//     done in float32. Transcendentals (Exp, Log, Tanh, Erf, Sigmoid, Pow,
//     Sqrt) use Go's float64 math and are rounded once to float32, since Go
//     has no float32 libm; that is the correctly rounded result or within an
//     ulp of it.
//   - Reductions (ReduceSum/Mean, the softmax denominators, cross-entropy)
//     accumulate in float64 even for float32 data and round once at the end.
//   - MatMul and Gemm use gonum's Sgemm/Dgemm (float32 products and sums for
//     float32 data); the float32 products gonum computes as axpys (B not
//     transposed, alpha 1) run in package sgemm, which gives gonum's bits.
//
// All parallel work splits outputs into disjoint ranges, each computed in a
// fixed order, so results are bitwise identical for any GOMAXPROCS.
package cpu

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// New returns the CPU backend.
func New() backend.Backend { return cpuBackend{} }

type cpuBackend struct{}

func (cpuBackend) Name() string { return "cpu" }
func (cpuBackend) Close() error { return nil }

// executable is a compiled graph. Values are numbered (slots) at Compile so
// that a run indexes slices instead of maps.
type executable struct {
	mu     sync.Mutex
	g      *graph.Graph
	opts   backend.Options
	slot   map[*graph.Value]int
	nslots int
	// inits holds the current data of every param and const, by slot.
	inits map[int]*graph.Tensor
	// initByName maps an initializer name to its slot.
	initByName map[string]int
	steps      []step
	// outputs are the graph outputs Run returns (update sources excluded).
	outputs []*graph.Value
	// updates copies output slots into initializer slots after a run.
	updates []update
	peak    int64
	initB   int64
	// runPeak is the peak measured by the last run; tests check that it
	// equals the planned peak.
	runPeak int64
	closed  bool
}

type step struct {
	node *graph.Node
	k    kernel
	in   []int // slot per input, -1 for an omitted optional input
	out  []int
	// free lists the intermediate slots whose last use is this step (and
	// outputs nobody reads), released after the kernel runs.
	free []int
}

type update struct {
	from, to int
	name     string
}

// Compile checks the graph, materialises initializers and plans liveness.
func (cpuBackend) Compile(g *graph.Graph, opts backend.Options) (backend.Executable, error) {
	if err := graph.Verify(g); err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	// The executable keeps its own copy so that later edits of g (passes
	// rewrite clones, but callers may not) cannot change a compiled plan.
	g = g.Clone()
	e := &executable{g: g, opts: opts, slot: map[*graph.Value]int{}, inits: map[int]*graph.Tensor{}, initByName: map[string]int{}}
	add := func(v *graph.Value) int {
		s := e.nslots
		e.slot[v] = s
		e.nslots++
		return s
	}
	for _, v := range g.Inputs {
		add(v)
	}
	for _, v := range g.Initializers() {
		s := add(v)
		t, err := v.Init.Materialize(v.Type)
		if err != nil {
			return nil, fmt.Errorf("cpu: initializer %s: %w", v.Name, err)
		}
		e.inits[s] = t
		e.initByName[v.Name] = s
		e.initB += bytesOf(v.Type)
	}
	for _, n := range g.Nodes {
		k, ok := kernels[n.Op]
		if !ok {
			return nil, fmt.Errorf("cpu: node %s: op %s has no CPU kernel", n.Name, n.Op)
		}
		if collectives[n.Op] != nil && n.Attrs.Int("world", 1) > 1 {
			var err error
			if k, err = collectives[n.Op](n, opts.Collective); err != nil {
				return nil, fmt.Errorf("cpu: node %s: %w", n.Name, err)
			}
		}
		st := step{node: n, k: k}
		for _, v := range n.Inputs {
			if v == nil {
				st.in = append(st.in, -1)
				continue
			}
			st.in = append(st.in, e.slot[v])
		}
		for _, v := range n.Outputs {
			st.out = append(st.out, add(v))
		}
		e.steps = append(e.steps, st)
	}

	// Updates: output name -> initializer name.
	outByName := map[string]*graph.Value{}
	for _, v := range g.Outputs {
		outByName[v.Name] = v
	}
	isUpdate := map[string]bool{}
	for from, to := range opts.Updates {
		ov, ok := outByName[from]
		if !ok {
			return nil, fmt.Errorf("cpu: update source %s is not a graph output", from)
		}
		ts, ok := e.initByName[to]
		if !ok {
			return nil, fmt.Errorf("cpu: update target %s is not a param or const", to)
		}
		if tt := e.inits[ts].Type(); !ov.Type.Equal(tt) {
			return nil, fmt.Errorf("cpu: update %s -> %s: output is %v, initializer is %v", from, to, ov.Type, tt)
		}
		e.updates = append(e.updates, update{from: e.slot[ov], to: ts, name: to})
		isUpdate[from] = true
	}
	// Map iteration order is random; apply updates in a fixed order.
	slices.SortFunc(e.updates, func(a, b update) int { return strings.Compare(a.name, b.name) })
	seen := map[*graph.Value]bool{}
	for _, v := range g.Outputs {
		if !isUpdate[v.Name] && !seen[v] {
			e.outputs = append(e.outputs, v)
			seen[v] = true
		}
	}
	e.planLiveness()
	return e, nil
}

// planLiveness records, for each step, the intermediates that die there, and
// computes the peak of live intermediate bytes. Graph outputs stay live to
// the end. An intermediate is live from its producer's kernel (its buffer is
// allocated just before) through its last reader's kernel.
func (e *executable) planLiveness() {
	last := map[int]int{}
	for i, st := range e.steps {
		for _, s := range st.out {
			last[s] = i // unused outputs die right after their producer
		}
		for _, s := range st.in {
			if _, ok := last[s]; ok && s >= 0 {
				last[s] = i
			}
		}
	}
	for _, v := range e.g.Outputs {
		delete(last, e.slot[v])
	}
	for s, i := range last {
		e.steps[i].free = append(e.steps[i].free, s)
	}
	size := make([]int64, e.nslots)
	for _, st := range e.steps {
		for j, s := range st.out {
			size[s] = bytesOf(st.node.Outputs[j].Type)
		}
	}
	var live int64
	for _, st := range e.steps {
		for _, s := range st.out {
			live += size[s]
		}
		e.peak = max(e.peak, live)
		for _, s := range st.free {
			live -= size[s]
		}
	}
}

// bytesOf is a value's size in device bytes (DType.Size per element: 2 for
// bfloat16/float16 although the host holds them as float32), so that the
// CPU's accounting agrees with memory plans made for any backend.
func bytesOf(t graph.TensorType) int64 {
	return int64(t.Shape.Numel()) * int64(t.DType.Size())
}

// Run executes the graph once.
func (e *executable) Run(feeds map[string]*graph.Tensor) (map[string]*graph.Tensor, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("cpu: run of a closed executable")
	}
	if err := backend.CheckFeeds(e.g, feeds); err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	vals := make([]*graph.Tensor, e.nslots)
	for _, v := range e.g.Inputs {
		vals[e.slot[v]] = feeds[v.Name]
	}
	for s, t := range e.inits {
		vals[s] = t
	}
	fresh := make([]bool, e.nslots) // produced by this run (not a feed or initializer)
	var live, peak int64
	for _, st := range e.steps {
		in := make([]*graph.Tensor, len(st.in))
		for i, s := range st.in {
			if s >= 0 {
				in[i] = vals[s]
			}
		}
		out, err := runKernel(st, in, e.opts.PoisonOutputs)
		if err != nil {
			return nil, err
		}
		if e.opts.CheckFinite {
			for _, t := range out {
				roundNarrow(t)
			}
			if nf := backend.CheckNodeFinite(st.node, in, out); nf != nil {
				return nil, fmt.Errorf("cpu: %w", nf)
			}
		}
		for i, s := range st.out {
			roundNarrow(out[i])
			vals[s] = out[i]
			fresh[s] = true
			live += bytesOf(out[i].Type())
		}
		peak = max(peak, live)
		for _, s := range st.free {
			live -= bytesOf(vals[s].Type())
			vals[s] = nil
		}
	}
	e.runPeak = peak
	res := make(map[string]*graph.Tensor, len(e.outputs))
	for _, v := range e.outputs {
		s := e.slot[v]
		t := vals[s]
		if !fresh[s] {
			t = t.Clone() // a feed or an initializer: the caller must not alias ours
		}
		res[v.Name] = t
	}
	given := map[int]bool{}
	for _, v := range e.outputs {
		given[e.slot[v]] = true
	}
	for _, u := range e.updates {
		t := vals[u.from]
		if !fresh[u.from] || given[u.from] {
			t = t.Clone()
		}
		given[u.from] = true
		e.inits[u.to] = t
	}
	return res, nil
}

// runKernel allocates one node's outputs (poisoned if asked) and runs its
// kernel, turning a panic into an error that names the node: a kernel bug, or
// an output too large to allocate, must not take the caller's process down.
func runKernel(st step, in []*graph.Tensor, poisonOutputs bool) (out []*graph.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("cpu: node %s (%s): kernel panicked: %v", st.node.Name, st.node.Op, r)
		}
	}()
	out = make([]*graph.Tensor, len(st.out))
	for i, v := range st.node.Outputs {
		out[i], err = allocate(v.Type)
		if err != nil {
			return nil, fmt.Errorf("cpu: node %s (%s): output %s: %w", st.node.Name, st.node.Op, v.Name, err)
		}
		if poisonOutputs {
			poison(out[i])
		}
	}
	if err := st.k(st.node, in, out); err != nil {
		return nil, fmt.Errorf("cpu: node %s (%s): %w", st.node.Name, st.node.Op, err)
	}
	return out, nil
}

// allocate makes a zero tensor, or says why it cannot: the IR allows 2^48
// elements, more than any host holds, and a failed make is a panic.
func allocate(t graph.TensorType) (x *graph.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			x, err = nil, fmt.Errorf("cannot allocate %v (%d bytes): %v", t, bytesOf(t), r)
		}
	}()
	return graph.NewTensor(t.DType, t.Shape), nil
}

// poison fills a buffer with a value no kernel produces by accident: NaN for
// floats, MinInt64 for int64, true for bool.
func poison(t *graph.Tensor) {
	for i := range t.F32 {
		t.F32[i] = float32(math.NaN())
	}
	for i := range t.F64 {
		t.F64[i] = math.NaN()
	}
	for i := range t.I64 {
		t.I64[i] = math.MinInt64
	}
	for i := range t.B {
		t.B[i] = true
	}
}

// roundNarrow rounds a bfloat16/float16 kernel output (computed in float32)
// to its type.
func roundNarrow(t *graph.Tensor) {
	switch t.DType {
	case graph.BFloat16:
		for i, v := range t.F32 {
			t.F32[i] = graph.RoundBF16(v)
		}
	case graph.Float16:
		for i, v := range t.F32 {
			t.F32[i] = graph.RoundF16(v)
		}
	}
}

func (e *executable) SetInitializer(name string, t *graph.Tensor) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("cpu: SetInitializer on a closed executable")
	}
	s, ok := e.initByName[name]
	if !ok {
		return fmt.Errorf("cpu: %s is not a param or const of graph %s", name, e.g.Name)
	}
	if t == nil {
		return fmt.Errorf("cpu: initializer %s: nil tensor", name)
	}
	if want := e.inits[s].Type(); !t.Type().Equal(want) {
		return fmt.Errorf("cpu: initializer %s: got %v, graph wants %v", name, t.Type(), want)
	}
	if err := t.Check(); err != nil {
		return fmt.Errorf("cpu: initializer %s: %w", name, err)
	}
	e.inits[s] = t.Clone()
	return nil
}

func (e *executable) Initializer(name string) (*graph.Tensor, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("cpu: Initializer on a closed executable")
	}
	s, ok := e.initByName[name]
	if !ok {
		return nil, fmt.Errorf("cpu: %s is not a param or const of graph %s", name, e.g.Name)
	}
	return e.inits[s].Clone(), nil
}

func (e *executable) Stats() backend.Stats {
	return backend.Stats{PeakActivationBytes: e.peak, InitializerBytes: e.initB}
}

func (e *executable) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.inits = nil
	return nil
}
