package cuda

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/graph"
)

// Options configure the CUDA backend.
type Options struct {
	// Ordinal is the device to use (0: the first GPU).
	Ordinal int
	// Compute is the storage and GEMM type of float32 activations: Float32
	// (the zero value) or BFloat16 for mixed precision (float32 master weights,
	// optimizer state, loss and logsumexps; bfloat16 activations and GEMMs
	// with float32 accumulation). See PlanOptions.
	Compute graph.DType
	// ComposedAttention lowers FlashAttention(Grad) without the fused kernels
	// (see PlanOptions.ComposedAttention).
	ComposedAttention bool
	// CubinCacheDir overrides the on-disk cubin cache directory ("" keeps the
	// device's default, see Device.SetCubinCacheDir).
	CubinCacheDir string
}

// ParseCompute reads a compute type as the CLI spells it: "f32"/"float32"
// or "bf16"/"bfloat16".
func ParseCompute(s string) (graph.DType, error) {
	switch strings.ToLower(s) {
	case "", "f32", "fp32", "float32":
		return graph.Float32, nil
	case "bf16", "bfloat16":
		return graph.BFloat16, nil
	}
	return graph.InvalidDType, fmt.Errorf("cuda: compute type %q: want f32 or bf16", s)
}

// The kernels of kernels/ops.cu and how they are compiled. --fmad=false keeps
// a*b+c two rounded operations, as Go computes it on the CPU reference.
const opsKernelFile = "ops.cu"

var opsCompileOptions = []string{"-std=c++17", "--fmad=false"}

// opsKernelNames lists every entry point of ops.cu the backend launches (a
// test checks the cubin has each).
var opsKernelNames = []string{
	"copy2d", "trilu",
	"reduce_rows_f32", "reduce_rows_f64", "reduce_rows_warp_f32", "reduce_rows_warp_f64", "reduce_cols_f32", "reduce_cols_f64",
	"softmax_f64", "softmax_grad_f64", "sce_rows_f64", "sum_scalar", "sce_grad_f64",
	"gather", "gather_grad_f32", "gather_grad_f64", "adamw_f32", "adamw_vec4_f32", "adamw_f64", "adamw_multi_f32",
	"attn_softmax_f64", "attn_probs_f64", "attn_dscores_f64", "gemm_f64",
	"gather_elements", "scatter_elements", "argmax", "one_hot", "cumsum", "gather_nd", "scatter_nd_updates", "pad",
	"reverse_sequence", "zero_fill", "max_unpool_scatter",
	"conv", "conv_transpose", "max_pool", "avg_pool", "interpolate", "topk", "lrn", "det", "grid_sample", "roi_align",
	"einsum", "tfidf",
}

// Backend is the CUDA implementation of backend.Backend: one device, the
// compiled kernels, and executables that keep their buffers on the device.
type Backend struct {
	dev  *Device
	opts Options
	ops  *driver.KernelSet // ops.cu

	// generated are the code generator's kernels (codegen/fused.go), by source.
	genMu     sync.Mutex
	generated map[string]*Function

	// render, when set, receives every kernel the lowerings would compile
	// instead of compiling it (a Backend without a device: the kernel-source
	// golden test renders the generated CUDA C of whole graphs on the CPU).
	render func(entry, src string)
	// launched, when set with render, receives every ops.cu launch the
	// lowerings build: the entry point and its arguments (a test checks
	// them against the kernel's parameters, without a GPU).
	launched func(entry string, args []any)
	// uploaded, when set with render, places the tables lowerings upload
	// (lowerCtx.upload) and gives their made-up addresses.
	uploaded func(data []byte) DevicePtr

	// comm is this rank's NCCL communicator in a data-parallel job
	// (SetComm): AllReduce nodes of several ranks reduce through it.
	comm *Comm
}

// SetComm makes b one rank of a data-parallel job: executables compiled
// afterwards lower the AllReduce nodes of c.World() ranks to NCCL through c,
// which must be bound to b's device. b does not own c: the caller closes it
// after b's executables.
func (b *Backend) SetComm(c *Comm) error {
	if c == nil {
		b.comm = nil
		return nil
	}
	if c.Device() != b.dev {
		return fmt.Errorf("cuda: the NCCL communicator is bound to another device than the backend's")
	}
	b.comm = c
	return nil
}

// NewBackend opens the GPU and compiles the op kernels. On a machine without
// a usable GPU it returns Available's error, which says what is missing.
func NewBackend(opts Options) (backend.Backend, error) {
	b, err := newBackend(opts)
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return b, nil
}

func newBackend(opts Options) (*Backend, error) {
	if opts.Compute == graph.InvalidDType {
		opts.Compute = graph.Float32
	}
	if opts.Compute != graph.Float32 && opts.Compute != graph.BFloat16 {
		return nil, fmt.Errorf("cuda: compute type %v: want float32 or bfloat16", opts.Compute)
	}
	if err := Available(); err != nil {
		return nil, err
	}
	dev, err := Open(opts.Ordinal)
	if err != nil {
		return nil, err
	}
	if opts.CubinCacheDir != "" {
		dev.SetCubinCacheDir(opts.CubinCacheDir)
	}
	ops, err := driver.CompileKernelSet(dev, opsKernelFile, opsCompileOptions...)
	if err != nil {
		dev.Close()
		return nil, err
	}
	return &Backend{dev: dev, opts: opts, ops: ops}, nil
}

// Name is "cuda" (with the compute type when it is not float32).
func (b *Backend) Name() string {
	if b.opts.Compute == graph.BFloat16 {
		return "cuda-bf16"
	}
	return "cuda"
}

// Device is the GPU the backend runs on.
func (b *Backend) Device() *Device { return b.dev }

// Close releases the device; executables of this backend stop working.
func (b *Backend) Close() error { return b.dev.Close() }

// fn returns a kernel of ops.cu, looked up once.
func (b *Backend) fn(name string) (*Function, error) {
	if b.render != nil {
		return &Function{}, nil
	}
	return b.ops.Fn(name, 0)
}

// buffer is a tensor on the device: where, in which element type, how many.
type buffer struct {
	ptr DevicePtr
	dt  graph.DType
	n   int
}

func (b buffer) bytes() int { return b.n * b.dt.Size() }

// step is one node's lowering: the kernels and GEMMs that compute it.
type step struct {
	node   *graph.Node
	poison []buffer // outputs to fill with NaN first (PoisonOutputs)
	// dev queues the step's work from the device goroutine (nil for a step
	// that uses the public Device API); Run hands consecutive dev steps to
	// the device goroutine in one request.
	dev func() error
	// run does the same from any goroutine (poisoning not included).
	run func() error
}

type update struct {
	name     string
	from, to buffer
	convert  func() error // device-goroutine conversion; nil when the bytes copy as they are
}

// executable is a compiled graph on the device.
type executable struct {
	mu     sync.Mutex
	b      *Backend
	g      *graph.Graph
	opts   backend.Options
	plan   *Plan
	arena  DevicePtr
	allocs []DevicePtr // everything allocated for this executable, freed by Close
	bufs   map[*graph.Value]buffer
	inits  map[string]*graph.Value
	// shapeOperands are consts whose data Compile read (Reshape's shape,
	// Slice's starts, ...): changing them would not change the compiled code.
	shapeOperands map[*graph.Value]bool
	// sharedZeros are zero consts reading another's buffer (see build).
	sharedZeros map[*graph.Value]bool
	steps       []step
	outputs     []*graph.Value
	updates     []update
	flag        DevicePtr // int32 error code kernels set (see ops.cu)
	initBytes   int64
	closed      bool
	// Steps and updates replay as CUDA graphs after their first runs.
	stepsGraph, updatesGraph driver.Replayer
	// adamwGrouped AdamW nodes run in adamwLaunches grouped launches
	// (adamw_multi.go).
	adamwGrouped, adamwLaunches int
}

// Compile plans memory, uploads the initializers and lowers every node.
func (b *Backend) Compile(g *graph.Graph, opts backend.Options) (backend.Executable, error) {
	if err := graph.Verify(g); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	g = g.Clone() // later edits of the caller's graph must not change the executable
	plan, err := PlanMemoryWith(g, PlanOptions{Compute: b.opts.Compute, ComposedAttention: b.opts.ComposedAttention, Updates: opts.Updates,
		CopyUpdates: !inPlaceUpdatesEnabled()})
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	x := &executable{b: b, g: g, opts: opts, plan: plan, bufs: map[*graph.Value]buffer{},
		inits: map[string]*graph.Value{}, shapeOperands: map[*graph.Value]bool{}, sharedZeros: map[*graph.Value]bool{}}
	if err := x.build(); err != nil {
		x.free()
		return nil, err
	}
	return x, nil
}

func (x *executable) alloc(bytes int) (DevicePtr, error) {
	p, err := x.b.dev.Alloc(bytes)
	if err != nil {
		return 0, err
	}
	if p != 0 {
		x.allocs = append(x.allocs, p)
	}
	return p, nil
}

func (x *executable) build() error {
	d := x.b.dev
	var err error
	if x.flag, err = x.alloc(4); err != nil {
		return err
	}
	if x.arena, err = x.alloc(int(x.plan.PeakBytes)); err != nil {
		return fmt.Errorf("cuda: activation arena of %s: %w", FormatBytes(x.plan.PeakBytes), err)
	}
	for _, v := range x.g.Inputs {
		buf := buffer{dt: v.Type.DType, n: v.Type.Shape.Numel()}
		if buf.ptr, err = x.alloc(buf.bytes()); err != nil {
			return err
		}
		x.bufs[v] = buf
	}
	// Zero constants of one type share one buffer: autodiff pads slice
	// gradients with them (48 of 12 MiB each in the gpt2 step). An update or
	// SetInitializer gives a const its own buffer first.
	updated := map[string]bool{}
	for _, to := range x.opts.Updates {
		updated[to] = true
	}
	zeros := map[string]buffer{}
	for _, v := range x.g.Initializers() {
		shareable := v.Kind == graph.Const && v.Init != nil && v.Init.Fn == "zeros" && !updated[v.Name]
		key := v.Type.String()
		if buf, ok := zeros[key]; ok && shareable {
			x.bufs[v] = buf
			x.inits[v.Name] = v
			x.sharedZeros[v] = true
			continue
		}
		buf := buffer{dt: v.Type.DType, n: v.Type.Shape.Numel()}
		if buf.ptr, err = x.alloc(buf.bytes()); err != nil {
			return err
		}
		if v.Init != nil && v.Init.Fn == "zeros" {
			// Zeros (AdamW's moments: two values a parameter) are all-zero
			// bits in every storage type: set on the device rather than
			// made and copied from the host.
			if buf.bytes() > 0 {
				if err := d.Memset(buf.ptr, 0, buf.bytes()); err != nil {
					return fmt.Errorf("cuda: initializer %s: %w", v.Name, err)
				}
			}
		} else {
			t, err := v.Init.Materialize(v.Type)
			if err != nil {
				return fmt.Errorf("cuda: initializer %s: %w", v.Name, err)
			}
			if err := upload(d, buf, t); err != nil {
				return fmt.Errorf("cuda: initializer %s: %w", v.Name, err)
			}
		}
		x.bufs[v] = buf
		x.inits[v.Name] = v
		x.initBytes += int64(buf.bytes())
		if shareable {
			zeros[key] = buf
		}
	}
	for _, n := range x.g.Nodes {
		for _, v := range n.Outputs {
			vp := x.plan.values[v]
			buf := buffer{dt: vp.storage, n: v.Type.Shape.Numel()}
			switch vp.kind {
			case placeArena:
				buf.ptr = x.arena.Offset(int(x.plan.Tensors[vp.tensor].Offset))
			case placeAlias, placeFolded:
				buf.ptr = x.bufs[vp.root].ptr
			}
			x.bufs[v] = buf
		}
	}
	for i, n := range x.g.Nodes {
		lower, ok := lowerings[n.Op]
		if !ok {
			return fmt.Errorf("cuda: node %s: op %s has no CUDA lowering", n.Name, n.Op)
		}
		c := &lowerCtx{x: x, n: n, index: i}
		for _, t := range x.plan.scratch[i] {
			pt := x.plan.Tensors[t]
			c.scratch = append(c.scratch, buffer{ptr: x.arena.Offset(int(pt.Offset)), dt: pt.DType, n: pt.Shape.Numel()})
		}
		st := step{node: n}
		if x.opts.PoisonOutputs {
			for _, v := range n.Outputs {
				if x.plan.values[v].kind == placeArena {
					st.poison = append(st.poison, x.bufs[v])
				}
			}
		}
		run, err := lower.lower(c)
		if err != nil {
			return fmt.Errorf("cuda: node %s (%s): %w", n.Name, n.Op, err)
		}
		if c.host {
			st.run = run
		} else {
			st.dev, st.run = run, func() error { return d.Do(run) }
		}
		x.steps = append(x.steps, st)
	}
	if err := x.groupAdamWSteps(); err != nil {
		return err
	}
	return x.planOutputs()
}

// planOutputs orders the outputs Run returns and the updates it applies.
func (x *executable) planOutputs() error {
	byName := map[string]*graph.Value{}
	for _, v := range x.g.Outputs {
		byName[v.Name] = v
	}
	isUpdate := map[string]bool{}
	for from, to := range x.opts.Updates {
		src, ok := byName[from]
		if !ok {
			return fmt.Errorf("cuda: update source %s is not a graph output", from)
		}
		dst, ok := x.inits[to]
		if !ok {
			return fmt.Errorf("cuda: update target %s is not a param or const", to)
		}
		if !src.Type.Equal(dst.Type) {
			return fmt.Errorf("cuda: update %s -> %s: output is %v, initializer is %v", from, to, src.Type, dst.Type)
		}
		if x.shapeOperands[dst] {
			return fmt.Errorf("cuda: update target %s is a shape operand compiled into the executable", to)
		}
		u := update{name: to, from: x.bufs[src], to: x.bufs[dst]}
		if src.Kind != graph.Intermediate {
			// An input or initializer copied over an initializer: stage it, so
			// that no update reads a buffer an earlier update already wrote.
			stage := buffer{dt: u.from.dt, n: u.from.n}
			var err error
			if stage.ptr, err = x.alloc(stage.bytes()); err != nil {
				return err
			}
			from := u.from
			x.steps = append(x.steps, step{node: nil, run: func() error {
				return x.b.dev.CopyDeviceToDevice(stage.ptr, from.ptr, from.bytes())
			}})
			u.from = stage
		}
		if u.from.ptr == u.to.ptr && u.from.dt == u.to.dt {
			// Written in place by its node (inplace.go): nothing to copy.
			isUpdate[from] = true
			continue
		}
		if u.from.dt != u.to.dt {
			c := &lowerCtx{x: x}
			conv, err := c.convert(u.to, u.from)
			if err != nil {
				return err
			}
			u.convert = conv
		}
		x.updates = append(x.updates, u)
		isUpdate[from] = true
	}
	sort.Slice(x.updates, func(i, j int) bool { return x.updates[i].name < x.updates[j].name })
	seen := map[*graph.Value]bool{}
	for _, v := range x.g.Outputs {
		if !isUpdate[v.Name] && !seen[v] {
			x.outputs = append(x.outputs, v)
			seen[v] = true
		}
	}
	return nil
}

// Run uploads the feeds, runs every node's kernels in order on the device's
// stream, downloads the outputs and applies the updates. Nothing is
// allocated on the device.
func (x *executable) Run(feeds map[string]*graph.Tensor) (map[string]*graph.Tensor, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	d := x.b.dev
	d.RunMu.Lock()
	defer d.RunMu.Unlock()
	if err := x.start("run", feeds); err != nil {
		return nil, err
	}
	run := func() error { return x.stepsGraph.Run(d, x.runSteps) }
	if x.opts.CheckFinite {
		run = x.runCheckedSteps
	}
	if err := run(); err != nil {
		return nil, err
	}
	if err := x.kernelFlag(); err != nil {
		return nil, err
	}
	res := make(map[string]*graph.Tensor, len(x.outputs))
	for _, v := range x.outputs {
		t, err := download(d, x.bufs[v], v.Type)
		if err != nil {
			return nil, fmt.Errorf("cuda: output %s: %w", v.Name, err)
		}
		res[v.Name] = t
	}
	if err := x.updatesGraph.Run(d, x.applyUpdates); err != nil {
		return nil, err
	}
	return res, nil
}

// start checks and uploads the feeds of a run and clears the kernels' error
// flag. The caller holds x.mu and the device's runMu: the uploads go on the
// stream, which another executable may be capturing.
func (x *executable) start(what string, feeds map[string]*graph.Tensor) error {
	if x.closed {
		return fmt.Errorf("cuda: %s of a closed executable", what)
	}
	if err := backend.CheckFeeds(x.g, feeds); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	d := x.b.dev
	for _, v := range x.g.Inputs {
		if err := upload(d, x.bufs[v], feeds[v.Name]); err != nil {
			return fmt.Errorf("cuda: input %s: %w", v.Name, err)
		}
	}
	return d.Memset(x.flag, 0, 4)
}

// kernelFlag waits for the queued work and returns the error a kernel
// reported through the flag, if any.
func (x *executable) kernelFlag() error {
	var code int32
	if err := x.b.dev.CopyToHost(unsafe.Pointer(&code), x.flag, 4); err != nil {
		return fmt.Errorf("cuda: running graph %s: %w", x.g.Name, err)
	}
	if code != 0 {
		return x.kernelError(code)
	}
	return nil
}

// applyUpdates copies (converting where the types differ) every update
// source over its initializer.
func (x *executable) applyUpdates() error {
	d := x.b.dev
	for _, u := range x.updates {
		var err error
		if u.convert != nil {
			err = d.Do(u.convert)
		} else if u.to.bytes() > 0 {
			err = d.CopyDeviceToDevice(u.to.ptr, u.from.ptr, u.to.bytes())
		}
		if err != nil {
			return fmt.Errorf("cuda: update of %s: %w", u.name, err)
		}
	}
	return nil
}

// runSteps queues every step on the device's stream: consecutive device
// steps in one request to the device goroutine, the others one by one.
func (x *executable) runSteps() error {
	d := x.b.dev
	for i := 0; i < len(x.steps); {
		if x.steps[i].dev == nil {
			st := &x.steps[i]
			if err := x.runAlone(st); err != nil {
				return stepError(st, err)
			}
			i++
			continue
		}
		j := i
		for j < len(x.steps) && x.steps[j].dev != nil {
			j++
		}
		var failed *step
		err := d.Do(func() error {
			for k := i; k < j; k++ {
				st := &x.steps[k]
				failed = st
				if err := x.poisonRaw(st); err != nil {
					return err
				}
				if err := st.dev(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			if failed == nil {
				return err
			}
			return stepError(failed, err)
		}
		i = j
	}
	return nil
}

// stepError names the step that failed: its node, or the staging of updates.
func stepError(st *step, err error) error {
	if st.node == nil {
		return fmt.Errorf("cuda: staging updates: %w", err)
	}
	return fmt.Errorf("cuda: node %s (%s): %w", st.node.Name, st.node.Op, err)
}

// poisonRaw fills the step's poisoned outputs (PoisonOutputs) with NaN,
// from the device goroutine.
func (x *executable) poisonRaw(st *step) error {
	for _, p := range st.poison {
		// All-ones bytes are NaN in every float type.
		if err := x.b.dev.MemsetRaw(p.ptr, 0xff, p.bytes()); err != nil {
			return err
		}
	}
	return nil
}

// runAlone queues one step by itself: its poisoning, then its work.
func (x *executable) runAlone(st *step) error {
	d := x.b.dev
	if st.dev != nil {
		return d.Do(func() error {
			if err := x.poisonRaw(st); err != nil {
				return err
			}
			return st.dev()
		})
	}
	for _, p := range st.poison {
		if err := d.Memset(p.ptr, 0xff, p.bytes()); err != nil {
			return err
		}
	}
	return st.run()
}

// kernelError explains an error code a kernel wrote (the node's index + 1).
func (x *executable) kernelError(code int32) error {
	i := int(code) - 1
	if i < 0 || i >= len(x.g.Nodes) {
		return fmt.Errorf("cuda: a kernel reported error code %d", code)
	}
	n := x.g.Nodes[i]
	why := "invalid input"
	switch n.Op {
	case "Gather", "GatherGrad":
		why = "an index is out of range for the gathered axis"
	case "SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad":
		why = "a label is out of range [0, classes)"
	case "AdamW":
		why = "step must be >= 1 for bias correction"
	case "Div":
		why = "integer division by zero"
	}
	return fmt.Errorf("cuda: node %s (%s): %s", n.Name, n.Op, why)
}

func (x *executable) SetInitializer(name string, t *graph.Tensor) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return errors.New("cuda: executable is closed")
	}
	v, ok := x.inits[name]
	if !ok {
		return fmt.Errorf("cuda: %s is not a param or const of graph %s", name, x.g.Name)
	}
	if t == nil {
		return fmt.Errorf("cuda: initializer %s: nil tensor", name)
	}
	if !t.Type().Equal(v.Type) {
		return fmt.Errorf("cuda: initializer %s: got %v, graph wants %v", name, t.Type(), v.Type)
	}
	if err := t.Check(); err != nil {
		return fmt.Errorf("cuda: initializer %s: %w", name, err)
	}
	if x.sharedZeros[v] || v.Kind == graph.Const && v.Init != nil && v.Init.Fn == "zeros" && x.zerosShared(v) {
		if err := t.Check(); err == nil && allZero(t) {
			return nil // it holds that already
		}
		return fmt.Errorf("cuda: initializer %s is a zeros constant sharing its buffer with others of its type in the executable; recompile to change it", name)
	}
	if x.shapeOperands[v] {
		old, err := v.Init.Materialize(v.Type)
		if err != nil || !sameData(old, t) {
			return fmt.Errorf("cuda: initializer %s is a shape operand compiled into the executable; recompile to change it", name)
		}
	}
	return upload(x.b.dev, x.bufs[v], t)
}

func (x *executable) Initializer(name string) (*graph.Tensor, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil, errors.New("cuda: executable is closed")
	}
	v, ok := x.inits[name]
	if !ok {
		return nil, fmt.Errorf("cuda: %s is not a param or const of graph %s", name, x.g.Name)
	}
	return download(x.b.dev, x.bufs[v], v.Type)
}

func (x *executable) Stats() backend.Stats {
	return backend.Stats{PeakActivationBytes: x.plan.PeakBytes, InitializerBytes: x.initBytes}
}

// Plan is the memory plan the executable runs with.
func (x *executable) Plan() *Plan { return x.plan }

func (x *executable) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	x.closed = true
	return x.free()
}

func (x *executable) free() error {
	errs := []error{x.stepsGraph.Release(x.b.dev), x.updatesGraph.Release(x.b.dev)}
	for _, p := range x.allocs {
		errs = append(errs, x.b.dev.Free(p))
	}
	x.allocs = nil
	return errors.Join(errs...)
}

// ---------------------------------------------------------------- host data

// upload converts t to buf's storage type and copies it to the device.
func upload(d *Device, buf buffer, t *graph.Tensor) error {
	if t.Len() != buf.n {
		return fmt.Errorf("tensor has %d elements, buffer %d", t.Len(), buf.n)
	}
	if buf.n == 0 {
		return nil
	}
	if buf.dt == graph.Float32 && t.F32 != nil {
		// Already in storage layout: no host copy (a 1.3B model's weights
		// are 6.4 GB). The copy has read the host memory when it returns.
		return d.CopyToDevice(buf.ptr, unsafe.Pointer(&t.F32[0]), 4*buf.n)
	}
	raw := encode(t, buf.dt)
	return d.CopyToDevice(buf.ptr, unsafe.Pointer(&raw[0]), len(raw))
}

// download copies buf to the host as a tensor of type tt.
func download(d *Device, buf buffer, tt graph.TensorType) (*graph.Tensor, error) {
	t := graph.NewTensor(tt.DType, tt.Shape)
	if buf.n != t.Len() {
		return nil, fmt.Errorf("buffer has %d elements, %v needs %d", buf.n, tt, t.Len())
	}
	if buf.n == 0 {
		return t, nil
	}
	raw := make([]byte, buf.bytes())
	if err := d.CopyToHost(unsafe.Pointer(&raw[0]), buf.ptr, len(raw)); err != nil {
		return nil, err
	}
	decode(raw, buf.dt, t)
	return t, nil
}

// encode lays t's elements out as storage type dt (rounding to nearest even
// for the 16-bit types, as the device does).
func encode(t *graph.Tensor, dt graph.DType) []byte {
	n := t.Len()
	raw := make([]byte, n*dt.Size())
	switch dt {
	case graph.Float32:
		out := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), n)
		if t.F32 != nil {
			copy(out, t.F32)
		} else {
			for i := range out {
				out[i] = float32(t.At(i))
			}
		}
	case graph.Float64:
		out := unsafe.Slice((*float64)(unsafe.Pointer(&raw[0])), n)
		for i := range out {
			out[i] = t.At(i)
		}
	case graph.BFloat16, graph.Float16:
		out := unsafe.Slice((*uint16)(unsafe.Pointer(&raw[0])), n)
		conv := BF16FromFloat32
		if dt == graph.Float16 {
			conv = F16FromFloat32
		}
		for i := range out {
			out[i] = conv(float32(t.At(i)))
		}
	case graph.Int64:
		out := unsafe.Slice((*int64)(unsafe.Pointer(&raw[0])), n)
		if t.I64 != nil {
			copy(out, t.I64)
		} else {
			for i := range out {
				out[i] = int64(t.At(i))
			}
		}
	case graph.Bool:
		for i := range raw {
			if t.At(i) != 0 {
				raw[i] = 1
			}
		}
	}
	return raw
}

// decode reads storage-type-dt elements into t (which rounds to its own type).
func decode(raw []byte, dt graph.DType, t *graph.Tensor) {
	n := t.Len()
	var at func(i int) float64
	switch dt {
	case graph.Float32:
		src := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), n)
		if t.F32 != nil {
			copy(t.F32, src)
			return
		}
		at = func(i int) float64 { return float64(src[i]) }
	case graph.Float64:
		src := unsafe.Slice((*float64)(unsafe.Pointer(&raw[0])), n)
		if t.F64 != nil {
			copy(t.F64, src)
			return
		}
		at = func(i int) float64 { return src[i] }
	case graph.BFloat16, graph.Float16:
		src := unsafe.Slice((*uint16)(unsafe.Pointer(&raw[0])), n)
		conv := BF16ToFloat32
		if dt == graph.Float16 {
			conv = F16ToFloat32
		}
		if t.F32 != nil {
			for i := range t.F32 {
				t.F32[i] = conv(src[i]) // exact: already a 16-bit value
			}
			return
		}
		at = func(i int) float64 { return float64(conv(src[i])) }
	case graph.Int64:
		src := unsafe.Slice((*int64)(unsafe.Pointer(&raw[0])), n)
		if t.I64 != nil {
			copy(t.I64, src)
			return
		}
		at = func(i int) float64 { return float64(src[i]) }
	case graph.Bool:
		at = func(i int) float64 {
			if raw[i] != 0 {
				return 1
			}
			return 0
		}
	}
	for i := range n {
		t.Set(i, at(i))
	}
}

// sameData reports whether two tensors of one type hold the same elements.
func sameData(a, b *graph.Tensor) bool {
	if a.Len() != b.Len() {
		return false
	}
	for i := range a.Len() {
		x, y := a.At(i), b.At(i)
		if x != y && !(math.IsNaN(x) && math.IsNaN(y)) {
			return false
		}
	}
	return slices.Equal(a.I64, b.I64) // int64 beyond 2^53 compare exactly
}

// zerosShared reports whether another const reads v's buffer.
func (x *executable) zerosShared(v *graph.Value) bool {
	for o := range x.sharedZeros {
		if x.bufs[o].ptr == x.bufs[v].ptr {
			return true
		}
	}
	return false
}

func allZero(t *graph.Tensor) bool {
	for i := range t.Len() {
		if v := t.At(i); v != 0 || math.Signbit(v) {
			return false
		}
	}
	return true
}
