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
	// root is, per slot, the slot whose buffer holds its data: itself, or
	// for the output of a view step the root of that step's input.
	root []int
	// made marks the slots whose buffer a step of this run allocates (not
	// a feed, an initializer or a view).
	made []bool
	// lastWant is, per buffer class, the last step whose kernel may take a
	// released buffer of that class; a buffer released later is dropped.
	lastWant map[bufClass]int
	peak     int64
	// hostPeak is the planned peak of live buffers in host bytes: the
	// bound the buffer pool keeps live plus pooled bytes under.
	hostPeak int64
	initB    int64
	// runPeak and runHeld are the peak measured by the last run and the
	// most host bytes it held (live and pooled); tests check them against
	// the plan.
	runPeak, runHeld int64
	closed           bool
}

type step struct {
	node *graph.Node
	k    kernel
	in   []int // slot per input, -1 for an omitted optional input
	out  []int
	// view: the step's one output is its input 0's data under the output's
	// shape (see viewStep); k does not run.
	view bool
	// overwrites: k writes every element of every output, so an output
	// may be a released buffer holding old data instead of zeros.
	overwrites bool
	// free lists the view slots whose last use is this step (or that
	// nobody reads), dropped after it.
	free []int
	// release lists the buffers (root slots) whose last reader, through
	// any view of them, is this step (or that nobody reads): after the
	// kernel runs they go back to the pool.
	release []int
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
		st := step{node: n, k: k, overwrites: overwrites(n.Op)}
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
	e.planViews()

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

// planViews marks the steps whose output is a view of their input (viewStep)
// and records every slot's root: the slot whose buffer holds its data.
func (e *executable) planViews() {
	e.root = make([]int, e.nslots)
	e.made = make([]bool, e.nslots)
	for s := range e.root {
		e.root[s] = s
	}
	for i := range e.steps {
		st := &e.steps[i]
		if e.viewStep(st) {
			st.view = true
			e.root[st.out[0]] = e.root[st.in[0]]
			continue
		}
		for _, s := range st.out {
			e.made[s] = true
		}
	}
}

// viewStep reports whether st's output may share its input's buffer instead
// of a copy: a shape-only op (Reshape, Squeeze, Unsqueeze, Identity; the op
// table's View), whose one output has its input's dtype and element count.
// This is safe because no kernel writes into its inputs; the buffer goes back
// to the pool only after the last reader of every view of it (planLiveness);
// and Run clones a returned or update tensor whose buffer is a feed's, an
// initializer's or one already handed out. The kernel copies instead for
//   - strings: the pool and its accounting know the numeric storages only;
//   - bfloat16 and float16 data of a feed or an initializer: the executor
//     rounds a copy to its type, and a feed's float32 values need not be
//     rounded already (a step's outputs are, so a view of them is too).
func (e *executable) viewStep(st *step) bool {
	spec, ok := graph.LookupOp(st.node.Op)
	if !ok || !spec.View || len(st.out) != 1 || len(st.in) == 0 || st.in[0] < 0 {
		return false
	}
	x, y := st.node.Inputs[0].Type, st.node.Outputs[0].Type
	if x.DType != y.DType || x.Shape.Numel() != y.Shape.Numel() || storageOf(y.DType) == stNone {
		return false
	}
	narrow := y.DType == graph.BFloat16 || y.DType == graph.Float16
	return !narrow || e.made[e.root[st.in[0]]]
}

// planLiveness records, for each step, the view slots and the buffers that
// die there, the peak of live intermediate bytes, and which buffer classes
// later steps can reuse. A buffer is live from its producer's kernel (it is
// allocated just before) through the last reader of it or of any view of
// it; a view holds no bytes of its own. Graph outputs, and the buffers they
// view, stay live to the end.
func (e *executable) planLiveness() {
	lastUse := make([]int, e.nslots)   // per step output: its last reader, or its producer
	produced := make([]bool, e.nslots) // made by a step, as a buffer or a view
	typ := make([]graph.TensorType, e.nslots)
	for i, st := range e.steps {
		for j, s := range st.out {
			lastUse[s], produced[s], typ[s] = i, true, st.node.Outputs[j].Type
		}
		for _, s := range st.in {
			if s >= 0 && produced[s] {
				lastUse[s] = i
			}
		}
	}
	kept := make([]bool, e.nslots)
	for _, v := range e.g.Outputs {
		s := e.slot[v]
		kept[s], kept[e.root[s]] = true, true
	}
	death := make([]int, e.nslots)
	for s := range e.nslots {
		if produced[s] && e.made[e.root[s]] {
			death[e.root[s]] = max(death[e.root[s]], lastUse[s])
		}
	}
	for s := range e.nslots {
		switch {
		case !produced[s] || kept[s]:
		case e.made[s]:
			e.steps[death[s]].release = append(e.steps[death[s]].release, s)
		default:
			e.steps[lastUse[s]].free = append(e.steps[lastUse[s]].free, s)
		}
	}
	var live, host int64
	for _, st := range e.steps {
		if !st.view {
			for _, s := range st.out {
				live += bytesOf(typ[s])
				host += hostBytes(typ[s])
			}
		}
		e.peak, e.hostPeak = max(e.peak, live), max(e.hostPeak, host)
		for _, s := range st.release {
			live -= bytesOf(typ[s])
			host -= hostBytes(typ[s])
		}
	}
	e.lastWant = map[bufClass]int{}
	for i, st := range e.steps {
		if st.view || !st.overwrites {
			continue
		}
		for _, s := range st.out {
			if c, ok := classOf(typ[s]); ok {
				e.lastWant[c] = i
			}
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
	pool := &bufferPool{limit: e.hostPeak}
	var live, peak int64
	for i, st := range e.steps {
		in := make([]*graph.Tensor, len(st.in))
		for i, s := range st.in {
			if s >= 0 {
				in[i] = vals[s]
			}
		}
		if st.view {
			// Neither poisoned (that would write into the input) nor rounded
			// nor checked for finiteness: the data is the input's, already
			// rounded, and a view cannot make a non-finite value.
			vals[st.out[0]] = viewOf(in[0], st.node.Outputs[0].Type)
		} else {
			out, err := runKernel(st, in, e.opts.PoisonOutputs, pool)
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
			for j, s := range st.out {
				roundNarrow(out[j])
				vals[s] = out[j]
				live += bytesOf(out[j].Type())
			}
		}
		peak = max(peak, live)
		for _, s := range st.free {
			vals[s] = nil
		}
		for _, s := range st.release {
			t := vals[s]
			vals[s] = nil
			live -= bytesOf(t.Type())
			c, ok := classOf(t.Type())
			pool.put(t, ok && e.lastWant[c] > i)
		}
	}
	e.runPeak, e.runHeld = peak, pool.peak
	// A buffer goes to the caller (or becomes an initializer) once; a feed's
	// or an initializer's, or one already given, is copied, so that no two
	// tensors the caller or the next run sees share data.
	given := make([]bool, e.nslots)
	hand := func(s int) *graph.Tensor {
		t, r := vals[s], e.root[s]
		if !e.made[r] || given[r] {
			t = t.Clone()
		}
		given[r] = true
		return t
	}
	res := make(map[string]*graph.Tensor, len(e.outputs))
	for _, v := range e.outputs {
		res[v.Name] = hand(e.slot[v])
	}
	for _, u := range e.updates {
		e.inits[u.to] = hand(u.from)
	}
	return res, nil
}

// viewOf is x's data under type t (of x's storage and element count).
func viewOf(x *graph.Tensor, t graph.TensorType) *graph.Tensor {
	return &graph.Tensor{DType: t.DType, Shape: t.Shape.Clone(), F32: x.F32, F64: x.F64, I64: x.I64, B: x.B}
}

// runKernel allocates one node's outputs from the pool (poisoned if asked)
// and runs its kernel, turning a panic into an error that names the node: a
// kernel bug, or an output too large to allocate, must not take the caller's
// process down.
func runKernel(st step, in []*graph.Tensor, poisonOutputs bool, pool *bufferPool) (out []*graph.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("cpu: node %s (%s): kernel panicked: %v", st.node.Name, st.node.Op, r)
		}
	}()
	out = make([]*graph.Tensor, len(st.out))
	for i, v := range st.node.Outputs {
		out[i], err = pool.get(v.Type, st.overwrites)
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
