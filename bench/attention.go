// Package bench is the attention benchmark of `flashgraph bench`: the fused
// flash kernels (cuda.FlashForward, cuda.FlashBackward) against the composed
// attention exactly as the CUDA executor lowers the unfused graph, timed on
// the same device-resident inputs with CUDA events. The composed path is
// timed by running the executable's own steps (cuda.Steps), so what is timed
// is what `flashgraph train` runs for unfused attention, op by op. The rest
// of `flashgraph bench` is here too (run_*.go): its tables and JSON rows,
// -memory, -train, -decode and -accuracy, and the PyTorch scripts they run;
// the CLI keeps only the flags.
package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/graph"
)

// AttnShape is one attention problem: [B, H, S, D] queries and [B, H_kv, S,
// D] keys and values (grouped-query attention when H_kv < H: query head h
// reads K/V head h/(H/H_kv)).
type AttnShape struct {
	B, H, S, D int
	// KVHeads is H_kv; 0 means H (multi-head attention).
	KVHeads int
	Causal  bool
}

// Elems is the element count of one of Q, O, dO (B·H·S·D).
func (s AttnShape) Elems() int { return s.B * s.H * s.S * s.D }

// KV is the number of K/V heads: KVHeads, or H when it is 0.
func (s AttnShape) KV() int {
	if s.KVHeads == 0 {
		return s.H
	}
	return s.KVHeads
}

// Grouped says whether K and V have fewer heads than Q.
func (s AttnShape) Grouped() bool { return s.KV() != s.H }

// Group is the number of query heads sharing one K/V head (1 for MHA).
func (s AttnShape) Group() int { return s.H / s.KV() }

// KVElems is the element count of one of K, V, dK, dV (B·H_kv·S·D).
func (s AttnShape) KVElems() int { return s.B * s.KV() * s.S * s.D }

// Check says why the shape cannot be benchmarked: a dim that is not
// positive, or H_kv not dividing H.
func (s AttnShape) Check() error {
	if s.B < 1 || s.H < 1 || s.S < 1 || s.D < 1 || s.KVHeads < 0 {
		return fmt.Errorf("attention: %v: every dim must be positive", s)
	}
	if s.H%s.KV() != 0 {
		return fmt.Errorf("attention: %v: H_kv %d must divide H %d", s, s.KV(), s.H)
	}
	return nil
}

func (s AttnShape) String() string {
	if s.Grouped() {
		return fmt.Sprintf("B=%d H=%d H_kv=%d S=%d D=%d causal=%v", s.B, s.H, s.KV(), s.S, s.D, s.Causal)
	}
	return fmt.Sprintf("B=%d H=%d S=%d D=%d causal=%v", s.B, s.H, s.S, s.D, s.Causal)
}

// composedSkipGQA is the composed path's "error" for a grouped shape: the
// unfused graph is multi-head attention only (a grouped model repeats K/V
// before it), so there is nothing of ours to compare the kernels with.
const composedSkipGQA = "skipped: grouped-query attention (the composed path is MHA only)"

// Names of the values of the composed benchmark graph.
const (
	attnLossScope = "loss" // nodes that turn O into a scalar loss (not timed)
	attnOut       = "o"
)

// attnInputs are the graph inputs, in AttnBench.in's order: dout is the
// cotangent of O (the loss is Σ O∘dout, so dL/dO = dout exactly).
var attnInputs = [4]string{"q", "k", "v", "dout"}

// UnfusedAttentionGraph is the benchmark's composed attention: the pattern
// model.Build writes (MatMul(Q, Kᵀ) → scale → + causal mask → Softmax →
// MatMul(·, V)) in bfloat16, followed by loss = ReduceSum(O∘dout) and its
// gradient with respect to q, k and v from autodiff.Gradients, i.e. the unfused
// backward the training graph runs (SoftmaxGrad and cuBLAS GEMMs over the
// saved S×S probabilities). grads maps q, k, v to their gradient values.
func UnfusedAttentionGraph(sh AttnShape) (g *graph.Graph, grads map[string]string, err error) {
	if sh.B < 1 || sh.H < 1 || sh.S < 1 || sh.D < 1 {
		return nil, nil, fmt.Errorf("attention graph: %v: every dim must be positive", sh)
	}
	if sh.Grouped() {
		return nil, nil, fmt.Errorf("attention graph: %v: the composed graph is multi-head attention only", sh)
	}
	dt := graph.BFloat16
	b := graph.NewBuilder(fmt.Sprintf("attention_b%d_h%d_s%d_d%d_c%d", sh.B, sh.H, sh.S, sh.D, boolInt(sh.Causal)))
	var in [4]*graph.Value
	for i, name := range attnInputs {
		in[i] = b.Input(name, dt, sh.B, sh.H, sh.S, sh.D)
	}
	var mask *graph.Value
	if sh.Causal {
		mask = b.Const("causal_mask", dt, graph.Shape{sh.S, sh.S}, graph.CausalMask())
	}
	o := b.Rename(b.Attention(in[0], in[1], in[2], 1/math.Sqrt(float64(sh.D)), mask).Out, attnOut)
	b.Push(attnLossScope)
	loss := b.Rename(b.ReduceSum(b.Mul(o, in[3]), false), "loss")
	b.Pop()
	b.Output(o, loss)
	fwd, err := b.Build()
	if err != nil {
		return nil, nil, fmt.Errorf("attention graph: %w", err)
	}
	return autodiff.Gradients(fwd, "loss", attnInputs[:3])
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// attnRanges splits the steps of the compiled benchmark graph into the
// forward attention [0, fwdEnd), the loss and its seed gradient [fwdEnd,
// bwdStart) (dL/dO = dout: not part of attention, so not timed) and the
// attention backward [bwdStart, len). It relies on Gradients appending the
// backward after every forward node, and naming each backward node
// "grad/<forward node>/...".
func attnRanges(nodes []*graph.Node) (fwdEnd, bwdStart int, err error) {
	fwdEnd, bwdStart = -1, -1
	lossPrefix := attnLossScope + "/"
	for i, n := range nodes {
		name := ""
		if n != nil {
			name = n.Name
		}
		switch {
		case fwdEnd < 0 && strings.HasPrefix(name, lossPrefix):
			fwdEnd = i
		case fwdEnd >= 0 && bwdStart < 0 && strings.HasPrefix(name, "grad/") && !strings.HasPrefix(name, "grad/"+lossPrefix):
			bwdStart = i
		}
	}
	if fwdEnd < 1 || bwdStart <= fwdEnd {
		return 0, 0, fmt.Errorf("attention graph: cannot find the forward/loss/backward split (%d, %d)", fwdEnd, bwdStart)
	}
	// Every node of the backward range must belong to the attention backward.
	for _, n := range nodes[bwdStart:] {
		if n == nil || !strings.HasPrefix(n.Name, "grad/") || strings.HasPrefix(n.Name, "grad/"+lossPrefix) {
			return 0, 0, fmt.Errorf("attention graph: node %v inside the backward range", n)
		}
	}
	return fwdEnd, bwdStart, nil
}

// AttnTiming is one implementation's numbers for one shape.
type AttnTiming struct {
	FwdMs, BwdMs float64 // medians over the timed iterations
	// PlannedBytes is the device memory the path needs for a forward and
	// backward by accounting: every buffer it uses, Q, K, V and dO included
	// (composed: the executor's inputs, initializers and activation arena).
	PlannedBytes int64
	// MeasuredBytes is the device memory the path took: the peak of our own
	// allocations (cuda.Device.PeakAllocatedBytes) from before it allocated
	// anything to after its last timed run, less what was allocated before
	// (plus the shared inputs for the fused path, which were allocated
	// earlier). Like PyTorch's max_memory_allocated, no other process on
	// the GPU moves it.
	MeasuredBytes int64
	// Err says why the path did not run ("" when it ran).
	Err string
}

// AttnResult is the benchmark of one shape.
type AttnResult struct {
	Shape           AttnShape
	Fused, Composed AttnTiming
	// Checked is set when both paths ran and their outputs were compared:
	// MaxAbsErr[i] is max |fused − composed| over O, dQ, dK, dV, and
	// MaxAbsRef[i] the largest |composed| (the error's scale). NaN anywhere
	// (an unwritten, poisoned element) makes the error +Inf.
	Checked   bool
	MaxAbsErr [4]float64
	MaxAbsRef [4]float64
}

// AttnBench holds the device, the executor's kernels and one set of random
// bfloat16 inputs (Q, K, V, dO) shared by every shape: with B·S and H·D fixed
// every shape has the same element count, so both paths read the same bytes.
type AttnBench struct {
	b      *cuda.Backend
	d      *cuda.Device
	n      int               // elements per input
	in     [4]cuda.DevicePtr // q, k, v, dout
	Warmup int               // untimed runs before timing (at least 1)
	Iters  int               // timed runs; the median is reported
	// Settle is how long the device idles before each timed loop's warm-up,
	// so that every loop starts from the same state: the card's clock drops
	// under minutes of load and recovers when idle.
	Settle time.Duration
}

// NewAttnBench opens the GPU, compiles the kernels and uploads random normal
// inputs of elems elements each.
func NewAttnBench(elems int, seed uint64) (*AttnBench, error) {
	if elems < 1 {
		return nil, fmt.Errorf("attention bench: %d elements", elems)
	}
	be, err := cuda.NewBackend(cuda.Options{Compute: graph.BFloat16})
	if err != nil {
		return nil, err
	}
	b, ok := be.(*cuda.Backend)
	if !ok {
		be.Close()
		return nil, fmt.Errorf("attention bench: cuda.NewBackend returned a %T", be)
	}
	ab := &AttnBench{b: b, d: b.Device(), n: elems, Warmup: 3, Iters: 20}
	if err := ab.setup(seed); err != nil {
		ab.Close()
		return nil, err
	}
	return ab, nil
}

func (ab *AttnBench) setup(seed uint64) error {
	d := ab.d
	for i := range ab.in {
		p, err := d.Alloc(ab.n * 2)
		if err != nil {
			return fmt.Errorf("attention bench inputs: %w", err)
		}
		ab.in[i] = p
		raw := randomBF16(ab.n, seed+uint64(i)*0x9e3779b9)
		if err := d.CopyToDevice(p, unsafe.Pointer(&raw[0]), len(raw)*2); err != nil {
			return err
		}
	}
	// Load the flash module and create cuBLAS's handle now, so that neither
	// lands in the first shape's memory measurement.
	return ab.b.BenchWarmUp()
}

// randomBF16 draws n standard normals as bfloat16, in parallel chunks with
// their own seeds (the values depend on seed and n only).
func randomBF16(n int, seed uint64) []uint16 {
	return randomNormal16(n, seed, cuda.BF16FromFloat32)
}

// Device is the GPU the bench runs on.
func (ab *AttnBench) Device() *cuda.Device { return ab.d }

// Close frees the inputs and releases the device.
func (ab *AttnBench) Close() error {
	var errs []error
	for i, p := range ab.in {
		errs = append(errs, ab.d.Free(p))
		ab.in[i] = 0
	}
	errs = append(errs, ab.b.Close())
	return errors.Join(errs...)
}

// Run benchmarks one shape: the fused kernels, then (with composed) the
// executor's unfused lowering, and compares their outputs. An error is
// returned only when the bench itself cannot go on; a path that fails (out
// of memory, say) is reported in its Err.
func (ab *AttnBench) Run(sh AttnShape, composed bool) (*AttnResult, error) {
	if err := sh.Check(); err != nil {
		return nil, err
	}
	if sh.Elems() != ab.n {
		return nil, fmt.Errorf("attention bench: %v has %d elements, the inputs %d", sh, sh.Elems(), ab.n)
	}
	res := &AttnResult{Shape: sh}
	fused, err := ab.runFused(sh, &res.Fused)
	if err != nil {
		return nil, err
	}
	if !composed {
		res.Composed.Err = "skipped"
		return res, nil
	}
	if sh.Grouped() {
		res.Composed.Err = composedSkipGQA
		return res, nil
	}
	comp, err := ab.runComposed(sh, &res.Composed)
	if err != nil {
		return nil, err
	}
	if fused != nil && comp != nil {
		res.Checked = true
		for i := range fused {
			res.MaxAbsErr[i], res.MaxAbsRef[i] = maxAbsDiff(fused[i], comp[i])
		}
	}
	return res, nil
}

// maxAbsDiff compares two bfloat16 arrays: max |a − b| and max |b|.
func maxAbsDiff(a, b []uint16) (diff, ref float64) {
	for i := range a {
		x, y := float64(cuda.BF16ToFloat32(a[i])), float64(cuda.BF16ToFloat32(b[i]))
		if math.IsNaN(x) || math.IsNaN(y) {
			return math.Inf(1), ref
		}
		diff = max(diff, math.Abs(x-y))
		ref = max(ref, math.Abs(y))
	}
	return diff, ref
}

// startMeasure starts a new peak of our device allocations and returns
// the bytes allocated now; tookSince is what was allocated at most on top
// of them since (MeasuredBytes).
func (ab *AttnBench) startMeasure() int64 { return ab.d.ResetPeakAllocated() }

func (ab *AttnBench) tookSince(base int64) int64 { return ab.d.PeakAllocatedBytes() - base }

// timeLoop times each phase in a loop of its own, as
// tools/reference/sdpa_bench.py times PyTorch's forward and backward: one
// untimed pass of all phases in order sets up every phase's inputs; then,
// phase by phase, a timed phase runs its warm-up and its iters timed runs
// back to back (an event after each, recorded without synchronizing, so the
// queue stays full and host launch latency stays out of the numbers) and an
// untimed one runs once; a last pass in order leaves the outputs of one
// plain pass (a phase run alone may read buffers a later phase reused).
// Each timed phase's median is returned (0 for the others).
//
// Timing the phases interleaved (fwd, bwd, fwd, ...) instead measured each
// kernel after the other's: on the H200 (run 62) our D=128 forward then read
// 1.63–1.74 ms at S=8192 where the same kernel alone (ncu) and PyTorch's,
// timed in its own loop, read 1.59–1.61, so the two sides were not timed
// alike.
func (ab *AttnBench) timeLoop(phases []func() error, timed []bool) ([]float64, error) {
	d := ab.d
	pass := func() error {
		for _, f := range phases {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := pass(); err != nil {
		return nil, err
	}
	iters := max(1, ab.Iters)
	evs := make([]*cuda.Event, iters+1)
	defer func() {
		for _, e := range evs {
			e.Destroy()
		}
	}()
	for i := range evs {
		e, err := d.NewEvent()
		if err != nil {
			return nil, err
		}
		evs[i] = e
	}
	med := make([]float64, len(phases))
	for p, f := range phases {
		if !timed[p] {
			if err := f(); err != nil {
				return nil, err
			}
			continue
		}
		if ab.Settle > 0 {
			if err := d.Synchronize(); err != nil {
				return nil, err
			}
			time.Sleep(ab.Settle)
		}
		for range max(1, ab.Warmup) {
			if err := f(); err != nil {
				return nil, err
			}
		}
		if err := d.Record(evs[0]); err != nil {
			return nil, err
		}
		for it := range iters {
			if err := f(); err != nil {
				return nil, err
			}
			if err := d.Record(evs[it+1]); err != nil {
				return nil, err
			}
		}
		// ElapsedMs waits for the later event, so the events are free for
		// the next phase once every interval is read.
		ms := make([]float64, iters)
		for it := range iters {
			t, err := d.ElapsedMs(evs[it], evs[it+1])
			if err != nil {
				return nil, err
			}
			ms[it] = float64(t)
		}
		med[p] = median(ms)
	}
	if err := pass(); err != nil {
		return nil, err
	}
	return med, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// download copies n bfloat16 elements to the host.
func (ab *AttnBench) download(p cuda.DevicePtr, n int) ([]uint16, error) {
	out := make([]uint16, n)
	return out, ab.d.CopyToHost(unsafe.Pointer(&out[0]), p, n*2)
}

// runFused times FlashForward and FlashBackward (their grouped forms when K
// and V have fewer heads than Q: K and V are the first B·H_kv·S·D elements
// of the shared inputs) and returns O, dQ, dK, dV (nil when the kernels
// failed; t.Err says why).
func (ab *AttnBench) runFused(sh AttnShape, t *AttnTiming) ([][]uint16, error) {
	d, n, nkv := ab.d, ab.n, sh.KVElems()
	bh, group := sh.B*sh.H, sh.Group()
	base := ab.startMeasure()
	inBytes := int64(2*n*2 + 2*nkv*2)
	scale := float32(1 / math.Sqrt(float64(sh.D)))
	sizes := []int{n * 2, bh * sh.S * 4, n * 2, nkv * 2, nkv * 2, cuda.FlashBackwardWorkspaceBytes(cuda.GemmBF16, bh, group, sh.S, sh.S, sh.D, scale)}
	bufs := make([]cuda.DevicePtr, len(sizes))
	defer func() {
		for _, p := range bufs {
			d.Free(p)
		}
	}()
	t.PlannedBytes = inBytes
	for i, sz := range sizes {
		p, err := d.Alloc(sz)
		if err != nil {
			if cuda.IsOutOfMemory(err) {
				t.Err = "out of memory: " + err.Error()
				return nil, nil
			}
			return nil, err
		}
		bufs[i] = p
		t.PlannedBytes += int64(sz)
	}
	o, lse, dq, dk, dv, ws := bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5]
	q, k, v, dout := ab.in[0], ab.in[1], ab.in[2], ab.in[3]
	// Poison the outputs: an element the kernels never write stays NaN and
	// shows up in the comparison.
	outElems := []int{n, n, nkv, nkv}
	for i, p := range []cuda.DevicePtr{o, dq, dk, dv} {
		if err := d.Memset(p, 0xff, outElems[i]*2); err != nil {
			return nil, err
		}
	}
	// group 1 runs FlashForward's and FlashBackward's own kernels.
	fwd := func() error {
		return cuda.FlashForwardGroupedWS(d, cuda.GemmBF16, q, k, v, o, lse, 0, bh, group, sh.S, sh.S, sh.D, scale, sh.Causal)
	}
	bwd := func() error {
		return cuda.FlashBackwardGrouped(d, cuda.GemmBF16, q, k, v, o, dout, lse, dq, dk, dv, ws, bh, group, sh.S, sh.S, sh.D, scale, sh.Causal)
	}
	med, err := ab.timeLoop([]func() error{fwd, bwd}, []bool{true, true})
	if err == nil {
		err = d.Synchronize()
	}
	if err != nil {
		t.Err = err.Error()
		return nil, nil
	}
	t.FwdMs, t.BwdMs = med[0], med[1]
	t.MeasuredBytes = ab.tookSince(base) + inBytes
	var outs [][]uint16
	for i, p := range []cuda.DevicePtr{o, dq, dk, dv} {
		h, err := ab.download(p, outElems[i])
		if err != nil {
			return nil, err
		}
		outs = append(outs, h)
	}
	return outs, nil
}

// runComposed compiles the unfused graph with the executor and times its
// steps: forward, then (after the untimed loss) backward. It returns O, dQ,
// dK, dV, or nil when the path could not run (t.Err says why).
func (ab *AttnBench) runComposed(sh AttnShape, t *AttnTiming) ([][]uint16, error) {
	d := ab.d
	g, grads, err := UnfusedAttentionGraph(sh)
	if err != nil {
		return nil, err
	}
	plan, err := cuda.PlanMemoryWith(g, cuda.PlanOptions{Compute: graph.BFloat16})
	if err != nil {
		return nil, err
	}
	t.PlannedBytes = plan.PeakBytes + plan.InputBytes + plan.InitializerBytes
	base := ab.startMeasure()
	exe, err := ab.b.Compile(g, backend.Options{})
	if err != nil {
		if cuda.IsOutOfMemory(err) {
			free, _, _ := d.MemInfo()
			t.Err = fmt.Sprintf("out of memory: needs %s by plan, %s free", cuda.FormatBytes(t.PlannedBytes), cuda.FormatBytes(int64(free)))
			return nil, nil
		}
		t.Err = err.Error()
		return nil, nil
	}
	defer exe.Close()
	steps, err := cuda.StepsOf(exe)
	if err != nil {
		return nil, err
	}
	bf16Buffer := func(name string) (cuda.DevicePtr, error) {
		p, dt, n, err := steps.Buffer(name)
		if err == nil && (dt != graph.BFloat16 || n != ab.n) {
			err = fmt.Errorf("attention bench: %s is %v×%d on the device, want bfloat16×%d", name, dt, n, ab.n)
		}
		return p, err
	}
	for i, name := range attnInputs {
		p, err := bf16Buffer(name)
		if err != nil {
			return nil, err
		}
		if err := d.CopyDeviceToDevice(p, ab.in[i], ab.n*2); err != nil {
			return nil, err
		}
	}
	nodes := steps.Nodes()
	fwdEnd, bwdStart, err := attnRanges(nodes)
	if err != nil {
		return nil, err
	}
	run := func(lo, hi int) func() error { return func() error { return steps.Run(lo, hi) } }
	outs := []string{attnOut}
	for _, name := range attnInputs[:3] {
		outs = append(outs, grads[name])
	}
	var outPtrs []cuda.DevicePtr
	for _, name := range outs {
		p, err := bf16Buffer(name)
		if err != nil {
			return nil, err
		}
		if err := d.Memset(p, 0xff, ab.n*2); err != nil {
			return nil, err
		}
		outPtrs = append(outPtrs, p)
	}
	if err := steps.ClearKernelError(); err != nil {
		return nil, err
	}
	med, err := ab.timeLoop([]func() error{run(0, fwdEnd), run(fwdEnd, bwdStart), run(bwdStart, len(nodes))},
		[]bool{true, false, true})
	if err == nil {
		err = steps.KernelError()
	}
	if err != nil {
		if cuda.IsOutOfMemory(err) {
			t.Err = "out of memory while running: " + err.Error()
		} else {
			t.Err = err.Error()
		}
		return nil, nil
	}
	t.FwdMs, t.BwdMs = med[0], med[2]
	t.MeasuredBytes = ab.tookSince(base)
	var res [][]uint16
	for _, p := range outPtrs {
		h, err := ab.download(p, ab.n)
		if err != nil {
			return nil, err
		}
		res = append(res, h)
	}
	return res, nil
}
