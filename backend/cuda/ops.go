package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda/codegen"
	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/graph"
)

// Lowering: each op of the op table becomes, at Compile, a closure that
// launches its kernels (kernels/ops.cu) and GEMMs (cuBLAS) with every shape,
// stride and pointer already worked out, so a run does no planning.

// lowerFn lowers one node; the closure it returns runs the node. The closure
// runs on the device goroutine (inside Device.do, so it queues work with
// rawLaunch and gemmRaw), unless the lowering set c.host: then it runs on the
// caller's goroutine and goes through the public Device API.
type lowerFn func(c *lowerCtx) (func() error, error)

// scratchFn lists the per-node scratch buffers a lowering takes (with
// takeScratch), in the order it takes them. It sees only the node's shapes,
// the storage types the plan chose and the plan's options, so the memory plan
// (which places the buffers) and the lowering (which takes them) agree.
type scratchFn func(n *graph.Node, storage func(*graph.Value) graph.DType, opts PlanOptions) []scratchReq

// scratchReq is a per-node scratch buffer, live only while the node runs.
type scratchReq struct {
	what  string // the buffer's purpose: the plan names it "<node>/<what>"
	dt    graph.DType
	shape graph.Shape
}

// lowering is everything the CUDA backend knows about one op: how to lower a
// node of it, and the scratch buffers that lowering takes (nil: none).
type lowering struct {
	lower   lowerFn
	scratch scratchFn
}

// lowerings is the one table of CUDA lowerings, keyed by op name; a test
// checks that every op of the op table has one.
var lowerings map[string]lowering

func init() {
	lowerings = map[string]lowering{
		"FusedElementwise": {lower: lowerFusedElementwise},
		"AllReduce":        {lower: lowerAllReduce},
		"ReduceScatter":    {lower: lowerReduceScatter},
		"AllGather":        {lower: lowerAllGather},
		"Identity":         {lower: lowerAlias}, "Reshape": {lower: lowerAlias}, "Squeeze": {lower: lowerAlias}, "Unsqueeze": {lower: lowerAlias},
		"Cast":      {lower: lowerCast},
		"Transpose": {lower: lowerTranspose}, "Slice": {lower: lowerSlice}, "Expand": {lower: lowerExpand}, "Concat": {lower: lowerConcat},
		"Gather": {lower: lowerGather}, "GatherGrad": {lower: lowerGatherGrad}, "Trilu": {lower: lowerTrilu},
		"ReduceSum":  {lower: lowerReduce, scratch: reduceScratch},
		"ReduceMean": {lower: lowerReduce, scratch: reduceScratch},
		"ReduceMax":  {lower: lowerReduce, scratch: reduceScratch},
		"Softmax":    {lower: lowerSoftmax(0)}, "LogSoftmax": {lower: lowerSoftmax(1)}, "SoftmaxGrad": {lower: lowerSoftmaxGrad},
		"SoftmaxCrossEntropyLoss":     {lower: lowerSCELoss, scratch: sceLossScratch},
		"SoftmaxCrossEntropyLossGrad": {lower: lowerSCELossGrad},
		"MatMul":                      {lower: lowerMatMul, scratch: gemmScratch},
		"Gemm":                        {lower: lowerGemm, scratch: gemmScratch},
		"FlashAttention":              {lower: lowerFlashAttention, scratch: attentionScratch},
		"FlashAttentionGrad":          {lower: lowerFlashAttentionGrad, scratch: attentionScratch},
		"AdamW":                       {lower: lowerAdamW},
	}
	// Every op the op table defines by an expression runs as a generated
	// kernel rendered from that expression (codegen/fused.go).
	for _, s := range graph.Ops() {
		if s.Expr != nil {
			lowerings[s.Name] = lowering{lower: lowerGenerated(s.Name)}
		}
	}
}

// scratchFor lists the scratch buffers the lowering of n takes, in order
// (none for an op without a lowering: the executor reports that).
func scratchFor(n *graph.Node, storage func(*graph.Value) graph.DType, opts PlanOptions) []scratchReq {
	if l, ok := lowerings[n.Op]; ok && l.scratch != nil {
		return l.scratch(n, storage, opts)
	}
	return nil
}

// scratchList collects a scratchFn's buffers.
type scratchList struct {
	storage func(*graph.Value) graph.DType
	reqs    []scratchReq
}

func (l *scratchList) add(what string, dt graph.DType, shape graph.Shape) {
	l.reqs = append(l.reqs, scratchReq{what, dt, shape})
}

// cast adds the buffer "<what>.<gt>" holding value v converted to gt, when
// the plan stores v in another type (mixed precision: a float32 weight
// multiplied in bfloat16). gemmOperand and gemmResult take these.
func (l *scratchList) cast(what string, v *graph.Value, gt graph.DType) {
	if v != nil && l.storage(v) != gt {
		l.add(what+"."+gt.String(), gt, v.Type.Shape)
	}
}

// lowerCtx is what a lowering sees of the executable.
type lowerCtx struct {
	x       *executable
	n       *graph.Node
	index   int      // the node's position: error codes are index+1
	scratch []buffer // in the order the op's scratchFn lists them
	host    bool     // the run closure calls the public Device API (see lowerFn)
}

func (c *lowerCtx) in(i int) buffer  { return c.x.bufs[c.n.Inputs[i]] }
func (c *lowerCtx) out(i int) buffer { return c.x.bufs[c.n.Outputs[i]] }
func (c *lowerCtx) code() int32      { return int32(c.index + 1) }
func (c *lowerCtx) flag() DevicePtr  { return c.x.flag }
func (c *lowerCtx) dev() *Device     { return c.x.b.dev }

// hasIn reports whether optional input i is given.
func (c *lowerCtx) hasIn(i int) bool { return i < len(c.n.Inputs) && c.n.Inputs[i] != nil }

// takeScratch hands out the node's scratch buffers in the order its
// scratchFn lists them.
func (c *lowerCtx) takeScratch() (buffer, error) {
	if len(c.scratch) == 0 {
		return buffer{}, errors.New("internal error: lowering wants more scratch than the plan gave")
	}
	s := c.scratch[0]
	c.scratch = c.scratch[1:]
	return s, nil
}

// constInts reads constant input i (a shape operand) and marks it as compiled in.
func (c *lowerCtx) constInts(i int, what string) ([]int, error) {
	v := c.n.Inputs[i]
	if v.Kind != graph.Const || v.Init == nil {
		return nil, fmt.Errorf("%s must be a constant", what)
	}
	t, err := v.Init.Materialize(v.Type)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if t.DType != graph.Int64 {
		return nil, fmt.Errorf("%s must be int64, got %v", what, t.DType)
	}
	c.x.shapeOperands[v] = true
	out := make([]int, len(t.I64))
	for k, x := range t.I64 {
		out[k] = int(x)
	}
	return out, nil
}

// upload copies data into device memory the executable owns (freed by
// Close): a table a kernel reads, fixed at Compile.
func (c *lowerCtx) upload(data []byte) (DevicePtr, error) {
	if len(data) == 0 {
		return 0, errors.New("internal error: an empty table")
	}
	if b := c.x.b; b.render != nil {
		if b.uploaded == nil {
			return 0, errors.New("rendering without a device: nowhere to upload a table")
		}
		return b.uploaded(data), nil
	}
	p, err := c.x.alloc(len(data))
	if err != nil {
		return 0, err
	}
	if err := c.dev().CopyToDevice(p, unsafe.Pointer(&data[0]), len(data)); err != nil {
		return 0, err
	}
	return p, nil
}

// kernel returns a device-goroutine closure launching an ops.cu kernel with
// arguments fixed at Compile.
func (c *lowerCtx) kernel(name string, grid, block [3]uint32, args ...any) (func() error, error) {
	f, err := c.x.b.fn(name)
	if err != nil {
		return nil, err
	}
	if c.x.b.render != nil && c.x.b.launched != nil {
		c.x.b.launched(name, args)
	}
	l, err := driver.NewRawLaunch(f, grid, block, 0, args...)
	if err != nil {
		return nil, err
	}
	d := c.dev()
	return func() error { return l.Run(d) }, nil
}

// gridFor sizes a grid-stride launch: enough blocks to fill the GPU, never
// more than the work needs.
func (c *lowerCtx) gridFor(n int64, block int) [3]uint32 {
	sms := 132 // rendering without a device (Backend.render): an H200's
	if d := c.dev(); d != nil {
		sms = d.SMCount()
	}
	most := int64(max(1, sms) * 32)
	return [3]uint32{uint32(max(1, min((n+int64(block)-1)/int64(block), most))), 1, 1}
}

// rowGrid is one block per row, capped (the kernels loop over the rest).
func rowGrid(rows int64) [3]uint32 { return [3]uint32{uint32(max(1, min(rows, 1<<20))), 1, 1} }

// rowBlock is the block size for block-per-row kernels over m elements: a
// power of two from 32 to 256.
func rowBlock(m int64) [3]uint32 {
	b := int64(32)
	for b < m && b < 256 {
		b *= 2
	}
	return [3]uint32{uint32(b), 1, 1}
}

// seq runs closures in order; nil entries are skipped.
func seq(fns ...func() error) func() error {
	var list []func() error
	for _, f := range fns {
		if f != nil {
			list = append(list, f)
		}
	}
	return func() error {
		for _, f := range list {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
}

func nop() error { return nil }

// kernelDTypes are the storage type codes of ops.cu: a type's code is its
// index, and define names the #define holding it there (a test checks that
// the two files agree, without a GPU).
var kernelDTypes = [...]struct {
	dt     graph.DType
	define string
}{
	{graph.Float32, "DT_F32"}, {graph.Float64, "DT_F64"}, {graph.BFloat16, "DT_BF16"},
	{graph.Float16, "DT_F16"}, {graph.Int64, "DT_I64"}, {graph.Bool, "DT_BOOL"},
}

// dtCodes maps each type of kernelDTypes to its code.
var dtCodes = func() map[graph.DType]int32 {
	m := map[graph.DType]int32{}
	for i, k := range kernelDTypes {
		m[k.dt] = int32(i)
	}
	return m
}()

// dtCode is a storage type's code in ops.cu (DT_*). Every graph dtype has
// one (a test checks); anything else reads as bool.
func dtCode(dt graph.DType) int32 {
	if c, ok := dtCodes[dt]; ok {
		return c
	}
	return dtCodes[graph.Bool]
}

// reduceSuffix picks a reduction's accumulator: double for 32- and 64-bit
// data (as the CPU reference sums), float when any operand is 16-bit.
func reduceSuffix(dts ...graph.DType) string {
	for _, dt := range dts {
		if codegen.Is16(dt) {
			return "_f32"
		}
	}
	return "_f64"
}

// ---------------------------------------------------------------- elementwise

// maxRank matches MAXR in ops.cu: the most kept and the most reduced dims a
// reduction kernel indexes (ops_reduce.go). Elementwise kernels, generated
// per node (codegen/fused.go), index the node's own dims.
const maxRank = 6

// convert copies src into dst (same element count), converting the type.
func (c *lowerCtx) convert(dst, src buffer) (func() error, error) {
	return c.copyTo(dst, graph.Shape{dst.n}, codegen.Operand{Buf: src.gen(), Strides: []int64{1}})
}

// lowerAlias: Reshape, Squeeze, Unsqueeze and Identity move no data when the
// plan made their output an alias of the input; otherwise (an update source,
// or a storage type change in mixed precision) they copy.
func lowerAlias(c *lowerCtx) (func() error, error) {
	if c.x.plan.values[c.n.Outputs[0]].kind == placeAlias {
		return nop, nil
	}
	return c.convert(c.out(0), c.in(0))
}

// lowerAllReduce lowers AllReduce: on one rank the identity on each input
// of the bucket; over several, NCCL's all-reduce (ncclAvg for reduce=mean)
// of each of the bucket's buffers through the backend's communicator
// (SetComm), queued on the device's stream after the kernels that made the
// gradients. Without a communicator the graph is refused at compile time.
//
// Not measured yet (no multi-GPU machine): the reduction runs on the main
// stream where the node stands, so it does not yet overlap the rest of the
// backward (a second stream joined before the first reader is the next
// step), and the buffers of a bucket are reduced one call each rather than
// packed into one.
func lowerAllReduce(c *lowerCtx) (func() error, error) {
	if w := c.n.Attrs.Int("world", 1); w > 1 {
		return lowerAllReduceNCCL(c, int(w))
	}
	if len(c.n.Inputs) == 1 {
		return lowerAlias(c)
	}
	copies := make([]func() error, len(c.n.Inputs))
	for i := range c.n.Inputs {
		f, err := c.convert(c.out(i), c.in(i))
		if err != nil {
			return nil, err
		}
		copies[i] = f
	}
	return func() error {
		for _, f := range copies {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

func lowerAllReduceNCCL(c *lowerCtx, world int) (func() error, error) {
	comm := c.x.b.comm
	if comm == nil {
		return nil, fmt.Errorf("AllReduce over %d ranks needs the job's NCCL communicator (Backend.SetComm; train -gpus N sets it up when NCCL loads): %w", world, backend.ErrUnsupported)
	}
	if comm.World() != world {
		return nil, fmt.Errorf("AllReduce over %d ranks, but the NCCL communicator has %d", world, comm.World())
	}
	mean := c.n.Attrs.String("reduce", "mean") == "mean"
	dev := c.dev()
	c.host = true // the communicator queues through the public Device API
	var calls []func() error
	for i := range c.n.Inputs {
		out := c.out(i)
		if c.x.plan.values[c.n.Outputs[i]].kind != placeAlias {
			conv, err := c.convert(out, c.in(i))
			if err != nil {
				return nil, err
			}
			calls = append(calls, func() error { return dev.Do(conv) })
		}
		gt, err := gemmTypeOf(out.dt)
		if err != nil {
			return nil, fmt.Errorf("AllReduce of %v: %w", out.dt, err)
		}
		calls = append(calls, func() error {
			if mean {
				return comm.AllReduceMean(gt, out.ptr, out.ptr, out.n)
			}
			return comm.AllReduceSum(gt, out.ptr, out.ptr, out.n)
		})
	}
	return seq(calls...), nil
}

// lowerReduceScatter lowers ReduceScatter on one rank: the concatenation of
// the bucket's inputs, copied into place. Several ranks are refused like
// AllReduce's (ncclReduceScatter is not wired in yet).
func lowerReduceScatter(c *lowerCtx) (func() error, error) {
	if w := c.n.Attrs.Int("world", 1); w > 1 {
		return nil, fmt.Errorf("ReduceScatter over %d ranks: the NCCL reduce-scatter is not wired into the CUDA executor yet", w)
	}
	out := c.out(0)
	var copies []func() error
	off := 0
	for i := range c.n.Inputs {
		src := c.in(i)
		dst := buffer{ptr: out.ptr + DevicePtr(off*out.dt.Size()), dt: out.dt, n: src.n}
		f, err := c.convert(dst, src)
		if err != nil {
			return nil, err
		}
		copies = append(copies, f)
		off += src.n
	}
	return func() error {
		for _, f := range copies {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// lowerAllGather lowers AllGather on one rank, the identity. Several ranks
// are refused like AllReduce's (ncclAllGather is not wired in yet).
func lowerAllGather(c *lowerCtx) (func() error, error) {
	if w := c.n.Attrs.Int("world", 1); w > 1 {
		return nil, fmt.Errorf("AllGather over %d ranks: the NCCL all-gather is not wired into the CUDA executor yet", w)
	}
	return c.convert(c.out(0), c.in(0))
}

func lowerCast(c *lowerCtx) (func() error, error) { return c.convert(c.out(0), c.in(0)) }

// ---------------------------------------------------------------- data movement

func lowerTranspose(c *lowerCtx) (func() error, error) {
	if c.x.plan.values[c.n.Outputs[0]].kind == placeFolded {
		return nop, nil // its MatMuls read the input transposed
	}
	x := c.n.Inputs[0].Type.Shape
	perm, err := graph.TransposePerm(c.n.Attrs, x.Rank())
	if err != nil {
		return nil, err
	}
	in := codegen.ContiguousStrides(x)
	st := make([]int64, len(perm))
	for i, p := range perm {
		st[i] = in[p]
	}
	return c.copyTo(c.out(0), c.n.Outputs[0].Type.Shape, codegen.Operand{Buf: c.inGen(0), Strides: st})
}

func lowerSlice(c *lowerCtx) (func() error, error) {
	x := c.n.Inputs[0].Type.Shape
	var ops [4][]int
	for i, what := range []string{"starts", "ends", "axes", "steps"} {
		if !c.hasIn(i + 1) {
			continue
		}
		v, err := c.constInts(i+1, what)
		if err != nil {
			return nil, err
		}
		ops[i] = v
	}
	sp, shape, err := graph.ResolveSlice(x, ops[0], ops[1], ops[2], ops[3])
	if err != nil {
		return nil, err
	}
	in := codegen.ContiguousStrides(x)
	st := make([]int64, len(in))
	var off int64
	for i := range in {
		if shape[i] > 0 {
			off += int64(sp.Start[i]) * in[i]
		}
		st[i] = in[i] * int64(sp.Step[i])
	}
	return c.copyTo(c.out(0), shape, codegen.Operand{Buf: c.inGen(0), Off: off, Strides: st})
}

func lowerExpand(c *lowerCtx) (func() error, error) {
	y := c.n.Outputs[0].Type.Shape
	if _, err := c.constInts(1, "shape"); err != nil {
		return nil, err
	}
	return c.copyTo(c.out(0), y, codegen.BroadcastOperand(c.inGen(0), c.n.Inputs[0].Type.Shape, y))
}

func lowerConcat(c *lowerCtx) (func() error, error) {
	y := c.n.Outputs[0].Type.Shape
	ax, err := graph.NormAxis(int(c.n.Attrs.Int("axis", 0)), y.Rank())
	if err != nil {
		return nil, err
	}
	outer, inner := int64(y[:ax].Numel()), int64(y[ax+1:].Numel())
	row := int64(y[ax]) * inner
	out := c.out(0)
	var fns []func() error
	var at int64
	for i, v := range c.n.Inputs {
		cols := int64(v.Type.Shape[ax]) * inner
		if cols > 0 && outer > 0 && out.dt.IsFloat() && c.in(i).dt.IsFloat() {
			// Float data: a generated copy into the output's slice.
			p := &codegen.Elementwise{Shape: graph.Shape{int(outer), int(cols)},
				Ins:   []codegen.Operand{{Buf: c.inGen(i), Strides: []int64{cols, 1}}},
				Steps: []graph.FusedStep{{Op: "Identity", Args: []graph.FusedOperand{{Index: 0}}}},
				Outs:  []int{0}, OutBufs: []codegen.Buffer{out.gen()}, OutStrides: [][]int64{{row, 1}}, OutOffs: []int64{at}}
			f, err := c.lowerEwProgram(p)
			if err != nil {
				return nil, err
			}
			fns = append(fns, f)
		} else if cols > 0 && outer > 0 {
			f, err := c.kernel("copy2d", c.gridFor(outer*cols, 256), [3]uint32{256, 1, 1},
				outer, cols, out.ptr.Offset(int(at)*out.dt.Size()), dtCode(out.dt), row, c.in(i).ptr, dtCode(c.in(i).dt), cols)
			if err != nil {
				return nil, err
			}
			fns = append(fns, f)
		}
		at += cols
	}
	return seq(fns...), nil
}

func lowerTrilu(c *lowerCtx) (func() error, error) {
	x := c.n.Inputs[0].Type.Shape
	k := 0
	if c.hasIn(1) {
		ks, err := c.constInts(1, "k")
		if err != nil {
			return nil, err
		}
		if len(ks) != 1 {
			return nil, fmt.Errorf("k must hold one value, got %d", len(ks))
		}
		k = ks[0]
	}
	n := int64(x.Numel())
	if n == 0 {
		return nop, nil
	}
	upper := int32(c.n.Attrs.Int("upper", 1))
	r := x.Rank()
	return c.kernel("trilu", c.gridFor(n, 256), [3]uint32{256, 1, 1},
		n, int64(x[r-2]), int64(x[r-1]), int64(k), upper, c.in(0).ptr, dtCode(c.in(0).dt), c.out(0).ptr, dtCode(c.out(0).dt))
}

// ---------------------------------------------------------------- gather

// gatherDims views data around axis as [outer, dim, inner].
func gatherDims(shape graph.Shape, axis int64) (outer, dim, inner int64, err error) {
	ax, err := graph.NormAxis(int(axis), shape.Rank())
	if err != nil {
		return 0, 0, 0, err
	}
	return int64(shape[:ax].Numel()), int64(shape[ax]), int64(shape[ax+1:].Numel()), nil
}

func lowerGather(c *lowerCtx) (func() error, error) {
	outer, dim, inner, err := gatherDims(c.n.Inputs[0].Type.Shape, c.n.Attrs.Int("axis", 0))
	if err != nil {
		return nil, err
	}
	nidx := int64(c.n.Inputs[1].Type.Shape.Numel())
	total := outer * nidx * inner
	if total == 0 {
		return nop, nil
	}
	x, y := c.in(0), c.out(0)
	return c.kernel("gather", c.gridFor(total, 256), [3]uint32{256, 1, 1},
		outer, dim, inner, nidx, x.ptr, dtCode(x.dt), c.in(1).ptr, y.ptr, dtCode(y.dt), c.flag(), c.code())
}

// ggPer matches GG_PER in ops.cu: outputs per thread of gather_grad.
const ggPer = 8

func lowerGatherGrad(c *lowerCtx) (func() error, error) {
	outer, dim, inner, err := gatherDims(c.n.Outputs[0].Type.Shape, c.n.Attrs.Int("axis", 0))
	if err != nil {
		return nil, err
	}
	if outer*dim*inner == 0 {
		return nop, nil
	}
	if dim > 1<<31-1 {
		return nil, fmt.Errorf("axis of %d rows is too long for one grid dimension", dim)
	}
	nidx := int64(c.n.Inputs[1].Type.Shape.Numel())
	dy, dx := c.in(0), c.out(0)
	k := "gather_grad_f32"
	if dx.dt == graph.Float64 {
		k = "gather_grad_f64"
	}
	grid := [3]uint32{uint32(dim), uint32(min(outer, 65535)), uint32((inner + 256*ggPer - 1) / (256 * ggPer))}
	if grid[2] > 65535 {
		return nil, fmt.Errorf("rows of %d elements are too long", inner)
	}
	return c.kernel(k, grid, [3]uint32{256, 1, 1},
		outer, dim, inner, nidx, dy.ptr, dtCode(dy.dt), c.in(1).ptr, dx.ptr, dtCode(dx.dt), c.flag(), c.code())
}

// ---------------------------------------------------------------- AdamW

// adamwVec4Args are adamw_vec4_f32's arguments when the update qualifies:
// float32 parameter and state, n a multiple of 4, every buffer aligned for
// its vector loads.
func adamwVec4Args(c *lowerCtx, n int64) ([]any, bool) {
	if n%4 != 0 {
		return nil, false
	}
	aligned := func(b buffer, bytes int64) bool { return int64(b.ptr)%bytes == 0 }
	for _, b := range []buffer{c.in(0), c.in(2), c.in(3), c.out(0), c.out(1), c.out(2)} {
		if b.dt != graph.Float32 || !aligned(b, 16) {
			return nil, false
		}
	}
	g := c.in(1)
	switch {
	case g.dt == graph.Float32 && aligned(g, 16):
	case codegen.Is16(g.dt) && aligned(g, 8):
	default:
		return nil, false
	}
	h := adamwHyperOf(c.n.Attrs)
	return []any{n, c.in(0).ptr, g.ptr, dtCode(g.dt), c.in(2).ptr, c.in(3).ptr, c.in(4).ptr, dtCode(c.in(4).dt),
		c.in(5).ptr, dtCode(c.in(5).dt), c.out(0).ptr, c.out(1).ptr, c.out(2).ptr,
		h.beta1, h.beta2, h.eps, h.wd, c.flag(), c.code()}, true
}

// adamwHyper are an AdamW node's attributes, defaults filled in as the op
// table has them. The per-node and the grouped kernels (adamw_multi.go)
// read them from here.
type adamwHyper struct{ beta1, beta2, eps, wd float64 }

func adamwHyperOf(a graph.Attrs) adamwHyper {
	return adamwHyper{beta1: a.Float("beta1", 0.9), beta2: a.Float("beta2", 0.95), eps: a.Float("eps", 1e-8),
		wd: a.Float("weight_decay", 0)}
}

func lowerAdamW(c *lowerCtx) (func() error, error) {
	n := int64(c.n.Inputs[0].Type.Shape.Numel())
	if n == 0 {
		return nop, nil
	}
	p := c.in(0)
	if args, ok := adamwVec4Args(c, n); ok {
		return c.kernel("adamw_vec4_f32", c.gridFor(n/4, 256), [3]uint32{256, 1, 1}, args...)
	}
	k := "adamw_f32"
	if p.dt == graph.Float64 {
		k = "adamw_f64"
	}
	h := adamwHyperOf(c.n.Attrs)
	args := []any{n}
	for i := range 6 {
		args = append(args, c.in(i).ptr, dtCode(c.in(i).dt))
	}
	for i := range 3 {
		args = append(args, c.out(i).ptr, dtCode(c.out(i).dt))
	}
	args = append(args, h.beta1, h.beta2, h.eps, h.wd, c.flag(), c.code())
	return c.kernel(k, c.gridFor(n, 256), [3]uint32{256, 1, 1}, args...)
}
