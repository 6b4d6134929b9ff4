package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"unsafe"

	"github.com/flashgraph/flashgraph/backend/cuda/codegen"
	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/graph"
)

// Grouped AdamW: a training step has one AdamW node per parameter (135 for
// gpt2), and launched one by one the many small ones (norm weights of 768
// elements) cost a launch each for almost no work. The executor instead
// updates the AdamW nodes of a run of consecutive AdamW steps that share
// what the kernel takes as scalars (gradient type, lr and step buffers,
// beta1, beta2, eps) with one launch of adamw_multi_f32, which reads a
// device table with one segment per node (weight decay is per segment).
// The graph keeps its nodes; only how they launch changes, and the results
// are bit-identical to the per-node kernels (same float32 arithmetic in the
// same order). Nodes that do not qualify (float64, empty, odd overlaps; see
// refusal) launch on their own and end a run.
//
// Nodes whose buffers overlap (one writes what another reads or writes, as
// when the memory plan puts a later node's output where an earlier node's
// gradient was) must keep their order: each node goes into a later launch
// than every earlier node it conflicts with, so the launches of a run are
// layers, and a launch never holds two nodes whose order matters. The memory
// plan avoids such overlaps where it costs no arena: the planning facts mark
// AdamW as grouped (loweringPlans in planfacts.go), and the plan keeps a
// run's inputs live to its end where that is free (PlanMemoryWith): gpt2's
// step is one launch, with -recompute a few.
//
// FLASHGRAPH_CUDA_MULTI_ADAMW=0 launches every AdamW node on its own (to
// compare, and for per-node profiles).

// The layout of an adamw_multi_f32 launch (ops.cu's ADAMW_MULTI_BLOCK and
// ADAMW_MULTI_GROUPS; a test compares). A block of adamwMultiBlock threads
// covers adamwMultiElems consecutive elements of one segment: thread t
// updates adamwMultiGroups groups of adamwMultiPer elements, group k
// starting at element adamwMultiPer·(k·adamwMultiBlock + t) of the block, so
// that every warp access is 512 contiguous bytes. The update is a stream of
// 26 bytes an element (bfloat16 gradients), bound by how many bytes each SM
// keeps in flight. With one group a thread (blocks of 1024 elements) a block
// found its segment, read lr and step and computed the bias corrections (two
// double pows) before its first load, and a branch on the gradient's type
// stood between a thread's gradient load and its other loads: the 1.3B
// model's update ran at 2.6 TB/s on an H200
// (2026-12-03), of 4.8. Now a full block (an aligned segment, every group
// whole) issues all its loads before it uses any, the scalars and the pows
// come after, behind those loads, and the block's fixed costs are paid once
// per 4096 elements. TestAdamWMultiBandwidth measures the rate on a GPU.
const (
	// adamwMultiBlock is the block size of adamw_multi_f32 launches.
	adamwMultiBlock = 256
	// adamwMultiPer is how many consecutive elements a group holds (one
	// 16-byte vector of float32).
	adamwMultiPer = 4
	// adamwMultiGroups is how many groups one thread updates.
	adamwMultiGroups = 4
	// adamwMultiElems is how many elements one block covers: every block
	// of a segment but its last updates that many.
	adamwMultiElems = adamwMultiBlock * adamwMultiPer * adamwMultiGroups
)

// adamwSegFields are the fields of ops.cu's struct adamw_seg, in order,
// each 8 bytes; adamwSeg and encodeAdamwTable follow it (a test compares).
var adamwSegFields = []string{"p", "g", "m", "v", "po", "mo", "vo", "n", "block0", "wd", "vec"}

// adamwSeg is one node's entry of the device table.
type adamwSeg struct {
	p, g, m, v, po, mo, vo DevicePtr
	n                      int64   // elements
	block0                 int64   // the segment's first block in the launch
	wd                     float64 // the node's weight_decay
	vec                    int64   // 1: 16-byte access (adamwMember.vecAligned)
}

// words lays the segment out as adamw_seg's 8-byte fields.
func (s adamwSeg) words() []uint64 {
	return []uint64{uint64(s.p), uint64(s.g), uint64(s.m), uint64(s.v), uint64(s.po), uint64(s.mo), uint64(s.vo),
		uint64(s.n), uint64(s.block0), math.Float64bits(s.wd), uint64(s.vec)}
}

// encodeAdamwTable is the table's bytes as the kernel reads them.
func encodeAdamwTable(segs []adamwSeg) []byte {
	raw := make([]byte, 0, len(segs)*8*len(adamwSegFields))
	for _, s := range segs {
		for _, w := range s.words() {
			raw = binary.LittleEndian.AppendUint64(raw, w)
		}
	}
	return raw
}

// adamwMember is one AdamW node as the grouping sees it: its buffers and
// hyperparameters.
type adamwMember struct {
	node                 int // index in the graph's nodes: its error code is node+1
	p, g, m, v, lr, step buffer
	po, mo, vo           buffer
	hyper                adamwHyper
}

// adamwKey is what the members of one launch share: the kernel's scalar
// arguments.
type adamwKey struct {
	gdt          graph.DType
	lr, step     DevicePtr
	lrdt, stepdt graph.DType
	b1, b2, eps  float64
}

func (a *adamwMember) key() adamwKey {
	return adamwKey{gdt: a.g.dt, lr: a.lr.ptr, step: a.step.ptr, lrdt: a.lr.dt, stepdt: a.step.dt,
		b1: a.hyper.beta1, b2: a.hyper.beta2, eps: a.hyper.eps}
}

func (a *adamwMember) reads() []buffer  { return []buffer{a.p, a.g, a.m, a.v, a.lr, a.step} }
func (a *adamwMember) writes() []buffer { return []buffer{a.po, a.mo, a.vo} }

// overlaps reports whether two buffers share a byte.
func overlaps(a, b buffer) bool {
	if a.bytes() == 0 || b.bytes() == 0 {
		return false
	}
	return a.ptr < b.ptr.Offset(b.bytes()) && b.ptr < a.ptr.Offset(a.bytes())
}

// refusal says why the node cannot go into a grouped launch ("" when it can).
func (a *adamwMember) refusal() string {
	n := a.p.n
	if n == 0 {
		return "no elements"
	}
	for _, b := range []buffer{a.p, a.m, a.v, a.po, a.mo, a.vo} {
		if b.dt != graph.Float32 {
			return fmt.Sprintf("param, moments and outputs must be float32 (one is %v)", b.dt)
		}
		if b.n != n {
			return "param, moments and outputs differ in length"
		}
	}
	if a.g.n != n {
		return "gradient and param differ in length"
	}
	if a.g.dt != graph.Float32 && !codegen.Is16(a.g.dt) {
		return fmt.Sprintf("gradient is %v (want float32, bfloat16 or float16)", a.g.dt)
	}
	if a.lr.n != 1 || a.step.n != 1 {
		return "lr and step must be scalars"
	}
	// Within a node, a thread reads its elements before it writes them, so
	// an output may be its own input exactly (in place), but no partial overlap.
	ws := a.writes()
	for i, w := range ws {
		for _, o := range ws[i+1:] {
			if overlaps(w, o) {
				return "two outputs share memory"
			}
		}
		for _, r := range []buffer{a.p, a.g, a.m, a.v} {
			if overlaps(w, r) && (w.ptr != r.ptr || w.bytes() != r.bytes()) {
				return "an output partly overlaps an input"
			}
		}
		if overlaps(w, a.lr) || overlaps(w, a.step) {
			return "an output overlaps lr or step"
		}
	}
	return ""
}

// vecAligned reports whether the 16-byte path applies: every float32
// buffer 16-byte aligned and the gradient aligned for four of its elements.
func (a *adamwMember) vecAligned() bool {
	for _, b := range []buffer{a.p, a.m, a.v, a.po, a.mo, a.vo} {
		if uint64(b.ptr)%16 != 0 {
			return false
		}
	}
	return uint64(a.g.ptr)%uint64(adamwMultiPer*a.g.dt.Size()) == 0
}

// adamwConflict reports whether the order of a and b matters: one writes
// memory the other reads or writes.
func adamwConflict(a, b *adamwMember) bool {
	for _, w := range a.writes() {
		for _, o := range append(b.reads(), b.writes()...) {
			if overlaps(w, o) {
				return true
			}
		}
	}
	for _, w := range b.writes() {
		for _, r := range a.reads() {
			if overlaps(w, r) {
				return true
			}
		}
	}
	return false
}

// groupAdamW splits a run of consecutive AdamW nodes (in node order, each
// qualifying) into launches, in the order they must run: a member goes into
// the first layer after every earlier member it conflicts with, and a layer
// into one launch per key, launches ordered by layer and then by their first
// member. Each launch lists member indices in node order.
func groupAdamW(run []*adamwMember) [][]int {
	layer := make([]int, len(run))
	layers := 0
	for i, a := range run {
		for j := range i {
			if layer[j] >= layer[i] && adamwConflict(run[j], a) {
				layer[i] = layer[j] + 1
			}
		}
		layers = max(layers, layer[i]+1)
	}
	var launches [][]int
	for l := range layers {
		at := map[adamwKey]int{}
		for i, a := range run {
			if layer[i] != l {
				continue
			}
			k, ok := at[a.key()]
			if !ok {
				k = len(launches)
				at[a.key()] = k
				launches = append(launches, nil)
			}
			launches[k] = append(launches[k], i)
		}
	}
	return launches
}

// adamwTable lays out one launch: a segment per member, each owning
// ceil(n/adamwMultiElems) consecutive blocks (the last one partial unless
// adamwMultiElems divides n); it returns the segments and the launch's
// block count.
func adamwTable(members []*adamwMember) ([]adamwSeg, int64, error) {
	segs := make([]adamwSeg, 0, len(members))
	var blocks int64
	perBlock := int64(adamwMultiElems)
	for _, a := range members {
		n := int64(a.p.n)
		s := adamwSeg{p: a.p.ptr, g: a.g.ptr, m: a.m.ptr, v: a.v.ptr, po: a.po.ptr, mo: a.mo.ptr, vo: a.vo.ptr,
			n: n, block0: blocks, wd: a.hyper.wd}
		if a.vecAligned() {
			s.vec = 1
		}
		segs = append(segs, s)
		blocks += (n + perBlock - 1) / perBlock
	}
	if blocks > math.MaxInt32 {
		return nil, 0, fmt.Errorf("%d blocks are more than one grid dimension holds", blocks)
	}
	return segs, blocks, nil
}

// multiAdamWEnabled reports whether the user left grouped AdamW on.
func multiAdamWEnabled() bool {
	v := os.Getenv("FLASHGRAPH_CUDA_MULTI_ADAMW")
	return v != "0" && v != "off" && v != "false"
}

// adamwMemberOf reads node i's buffers and hyperparameters.
func (x *executable) adamwMemberOf(i int) *adamwMember {
	n := x.g.Nodes[i]
	in := func(k int) buffer { return x.bufs[n.Inputs[k]] }
	out := func(k int) buffer { return x.bufs[n.Outputs[k]] }
	return &adamwMember{node: i, p: in(0), g: in(1), m: in(2), v: in(3), lr: in(4), step: in(5),
		po: out(0), mo: out(1), vo: out(2), hyper: adamwHyperOf(n.Attrs)}
}

// groupAdamWSteps replaces the launches of each run of consecutive
// qualifying AdamW steps by grouped launches. It runs right after lowering,
// while x.steps holds one step per node, in node order.
//
// The profiler times steps: a run's first step carries all of the run's
// launches (each with its poisoning, in order) and the run's other steps
// queue nothing, so a profile attributes the whole run's AdamW time to the
// run's first AdamW node and about nothing to the others; per op (ByOp) the
// AdamW total is the true one.
func (x *executable) groupAdamWSteps() error {
	if !multiAdamWEnabled() {
		return nil
	}
	runs, err := x.adamwRuns()
	if err != nil {
		return err
	}
	for _, r := range runs {
		if err := x.groupAdamWRun(r); err != nil {
			return err
		}
	}
	return nil
}

// adamwRun is a run of consecutive qualifying AdamW steps, [from, to), and
// its launches (groupAdamW).
type adamwRun struct {
	from, to int
	members  []*adamwMember
	launches [][]int
}

// adamwRuns finds the runs whose nodes share launches.
func (x *executable) adamwRuns() ([]adamwRun, error) {
	if len(x.steps) != len(x.g.Nodes) {
		return nil, errors.New("internal error: AdamW grouping needs one step per node")
	}
	qualifies := func(i int) bool {
		st := &x.steps[i]
		return st.node == x.g.Nodes[i] && st.node.Op == "AdamW" && st.dev != nil && x.adamwMemberOf(i).refusal() == ""
	}
	var runs []adamwRun
	for i := 0; i < len(x.steps); {
		if !qualifies(i) {
			i++
			continue
		}
		r := adamwRun{from: i, to: i + 1}
		for r.to < len(x.steps) && qualifies(r.to) {
			r.to++
		}
		i = r.to
		for k := r.from; k < r.to; k++ {
			r.members = append(r.members, x.adamwMemberOf(k))
		}
		r.launches = groupAdamW(r.members)
		if len(r.launches) < len(r.members) { // else nothing shares a launch
			runs = append(runs, r)
		}
	}
	return runs, nil
}

// groupAdamWRun replaces the launches of one run's steps.
func (x *executable) groupAdamWRun(r adamwRun) error {
	from, to, run, launches := r.from, r.to, r.members, r.launches
	d := x.b.dev
	var queued []func() error
	for _, members := range launches {
		var poison []buffer
		for _, k := range members {
			poison = append(poison, x.steps[from+k].poison...)
		}
		var launch func() error
		if len(members) == 1 {
			launch = x.steps[from+members[0]].dev
		} else {
			ms := make([]*adamwMember, len(members))
			for k, m := range members {
				ms[k] = run[m]
			}
			var err error
			if launch, err = x.adamwMultiLaunch(ms); err != nil {
				return fmt.Errorf("cuda: node %s (AdamW): grouped update of %d nodes: %w", x.g.Nodes[ms[0].node].Name, len(ms), err)
			}
			x.adamwGrouped += len(ms)
			x.adamwLaunches++
		}
		queued = append(queued, func() error {
			for _, p := range poison {
				if err := d.MemsetRaw(p.ptr, 0xff, p.bytes()); err != nil {
					return err
				}
			}
			return launch()
		})
	}
	dev := func() error {
		for _, q := range queued {
			if err := q(); err != nil {
				return err
			}
		}
		return nil
	}
	for i := from; i < to; i++ {
		st := &x.steps[i]
		st.poison = nil
		st.dev, st.run = nop, nop
	}
	first := &x.steps[from]
	first.dev, first.run = dev, func() error { return d.Do(dev) }
	return nil
}

// adamwMultiLaunch uploads the table of one grouped launch and returns the
// device-goroutine closure that launches it. The error flag gets the code
// of the first member: the node the per-node launches would have named.
func (x *executable) adamwMultiLaunch(ms []*adamwMember) (func() error, error) {
	segs, blocks, err := adamwTable(ms)
	if err != nil {
		return nil, err
	}
	raw := encodeAdamwTable(segs)
	table, err := x.alloc(len(raw))
	if err != nil {
		return nil, err
	}
	if err := x.b.dev.CopyToDevice(table, unsafe.Pointer(&raw[0]), len(raw)); err != nil {
		return nil, err
	}
	f, err := x.b.fn("adamw_multi_f32")
	if err != nil {
		return nil, err
	}
	a := ms[0]
	l, err := driver.NewRawLaunch(f, [3]uint32{uint32(blocks), 1, 1}, [3]uint32{adamwMultiBlock, 1, 1}, 0,
		table, int32(len(segs)), dtCode(a.g.dt), a.lr.ptr, dtCode(a.lr.dt), a.step.ptr, dtCode(a.step.dt),
		a.hyper.beta1, a.hyper.beta2, a.hyper.eps, x.flag, int32(a.node+1))
	if err != nil {
		return nil, err
	}
	d := x.b.dev
	return func() error { return l.Run(d) }, nil
}
