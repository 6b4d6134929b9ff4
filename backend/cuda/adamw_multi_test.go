package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

// The grouped AdamW launch (adamw_multi.go): the table, the alignment
// choice, the grouping and its ordering run without a GPU; the tests after
// TestAdamWMultiMatchesPerNode need one.

// fakeMember is an AdamW node over n elements whose nine buffers lie one
// after another from base (each 256-byte aligned, like the memory plan's),
// the gradient of type gdt; lr and step are shared scalars.
func fakeMember(node int, base DevicePtr, n int, gdt graph.DType) *adamwMember {
	at := base
	next := func(dt graph.DType) buffer {
		b := buffer{ptr: at, dt: dt, n: n}
		at = at.Offset(int(alignUp(int64(b.bytes()))))
		return b
	}
	a := &adamwMember{node: node, hyper: adamwHyper{beta1: 0.9, beta2: 0.95, eps: 1e-8}}
	a.p, a.g, a.m, a.v = next(graph.Float32), next(gdt), next(graph.Float32), next(graph.Float32)
	a.po, a.mo, a.vo = next(graph.Float32), next(graph.Float32), next(graph.Float32)
	a.lr = buffer{ptr: 0x10, dt: graph.Float32, n: 1}
	a.step = buffer{ptr: 0x20, dt: graph.Float32, n: 1}
	return a
}

// membersOf lays out members of the given sizes one after another.
func membersOf(sizes []int, gdt graph.DType) []*adamwMember {
	var ms []*adamwMember
	base := DevicePtr(1 << 20)
	for i, n := range sizes {
		a := fakeMember(i, base, n, gdt)
		ms = append(ms, a)
		base = a.vo.ptr.Offset(int(alignUp(int64(a.vo.bytes())))).Offset(256)
	}
	return ms
}

// coverage runs the kernel's index math (adamw_multi_f32 in ops.cu: the
// binary search for the block's segment, then adamwMultiGroups groups of
// four elements per thread, group k of thread t at 4·(k·block + t) in the
// block) over every block, thread and group of the launch, and counts how
// often each element of each segment is updated. full counts the blocks
// that take the kernel's straight-line path (an aligned segment, every
// group whole).
func coverage(segs []adamwSeg, blocks int64) (counts [][]int, idle, full int64) {
	counts = make([][]int, len(segs))
	for s := range segs {
		counts[s] = make([]int, segs[s].n)
	}
	for b := range blocks {
		lo, hi := 0, len(segs)-1
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if segs[mid].block0 <= b {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		s := segs[lo]
		e0 := (b - s.block0) * adamwMultiElems
		if s.vec == 1 && e0+adamwMultiElems <= s.n {
			full++
		}
		busy := false
		for t := range int64(adamwMultiBlock) {
			for k := range int64(adamwMultiGroups) {
				i0 := e0 + (k*adamwMultiBlock+t)*adamwMultiPer
				if i0 >= s.n {
					break
				}
				busy = true
				for j := range min(adamwMultiPer, s.n-i0) {
					counts[lo][i0+j]++
				}
			}
		}
		if !busy {
			idle++
		}
	}
	return counts, idle, full
}

func TestAdamWTableCoversEveryElementOnce(t *testing.T) {
	const per = adamwMultiElems
	for _, c := range []struct {
		sizes []int
		full  int64 // blocks of whole aligned groups (all segments aligned here)
	}{
		{[]int{1, 3, 64, 768, 4097}, 1},
		{[]int{1}, 0},
		{[]int{1024, 1025, 1023, 4, 5, 2048, 768, 768, 768, 1}, 0},
		{[]int{3, 3, 3, 50000, 7}, 12},
		// Exactly one block, one block and one element, one element short
		// of a block (the last group partial), a block and one whole group.
		{[]int{per, per + 1, per - 1, per + 4, 2*per + 1020, 3 * per}, 1 + 1 + 0 + 1 + 2 + 3},
	} {
		ms := membersOf(c.sizes, graph.BFloat16)
		segs, blocks, err := adamwTable(ms)
		if err != nil {
			t.Fatal(err)
		}
		var want int64
		for _, n := range c.sizes {
			want += (int64(n) + per - 1) / per
		}
		if blocks != want {
			t.Errorf("sizes %v: %d blocks, want %d", c.sizes, blocks, want)
		}
		counts, idle, full := coverage(segs, blocks)
		if idle != 0 {
			t.Errorf("sizes %v: %d blocks update nothing", c.sizes, idle)
		}
		if full != c.full {
			t.Errorf("sizes %v: %d full blocks, want %d", c.sizes, full, c.full)
		}
		for s, cs := range counts {
			for i, k := range cs {
				if k != 1 {
					t.Fatalf("sizes %v: segment %d element %d updated %d times", c.sizes, s, i, k)
				}
			}
			if segs[s].p != ms[s].p.ptr || segs[s].g != ms[s].g.ptr || segs[s].vo != ms[s].vo.ptr || segs[s].n != int64(c.sizes[s]) {
				t.Errorf("sizes %v: segment %d does not describe its member: %+v", c.sizes, s, segs[s])
			}
		}
		// Unaligned, the same blocks cover the same elements, none of them
		// on the straight-line path.
		for _, a := range ms {
			a.p.ptr += 4
		}
		segs, blocks, err = adamwTable(ms)
		if err != nil {
			t.Fatal(err)
		}
		counts, idle, full = coverage(segs, blocks)
		if blocks != want || idle != 0 || full != 0 {
			t.Errorf("sizes %v unaligned: %d blocks (want %d), %d idle, %d full", c.sizes, blocks, want, idle, full)
		}
		for s, cs := range counts {
			if i := slices.IndexFunc(cs, func(k int) bool { return k != 1 }); i >= 0 {
				t.Fatalf("sizes %v unaligned: segment %d element %d updated %d times", c.sizes, s, i, cs[i])
			}
		}
	}
}

func TestAdamWVectorPathNeedsAlignment(t *testing.T) {
	for _, c := range []struct {
		name  string
		gdt   graph.DType
		shift func(a *adamwMember)
		vec   bool
	}{
		{"aligned float32 gradient", graph.Float32, func(*adamwMember) {}, true},
		{"aligned bfloat16 gradient", graph.BFloat16, func(*adamwMember) {}, true},
		{"bfloat16 gradient at 8 bytes", graph.BFloat16, func(a *adamwMember) { a.g.ptr += 8 }, true},
		{"bfloat16 gradient at 4 bytes", graph.BFloat16, func(a *adamwMember) { a.g.ptr += 4 }, false},
		{"float16 gradient at 2 bytes", graph.Float16, func(a *adamwMember) { a.g.ptr += 2 }, false},
		{"float32 gradient at 8 bytes", graph.Float32, func(a *adamwMember) { a.g.ptr += 8 }, false},
		{"param at 4 bytes", graph.Float32, func(a *adamwMember) { a.p.ptr += 4 }, false},
		{"second moment out at 12 bytes", graph.BFloat16, func(a *adamwMember) { a.vo.ptr += 12 }, false},
		{"first moment at 16 bytes", graph.Float32, func(a *adamwMember) { a.m.ptr += 16 }, true},
	} {
		a := fakeMember(0, 1<<20, 4097, c.gdt)
		c.shift(a)
		if got := a.vecAligned(); got != c.vec {
			t.Errorf("%s: vecAligned %v, want %v", c.name, got, c.vec)
		}
		segs, _, err := adamwTable([]*adamwMember{a})
		if err != nil {
			t.Fatal(err)
		}
		if (segs[0].vec == 1) != c.vec {
			t.Errorf("%s: table says vec=%d", c.name, segs[0].vec)
		}
	}
}

func TestAdamWRefusals(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(a *adamwMember)
		want string // "" : accepted
	}{
		{"plain", func(*adamwMember) {}, ""},
		{"in place", func(a *adamwMember) { a.po.ptr, a.mo.ptr, a.vo.ptr = a.p.ptr, a.m.ptr, a.v.ptr }, ""},
		{"moments read from the param", func(a *adamwMember) { a.m.ptr, a.v.ptr = a.p.ptr, a.p.ptr }, ""},
		{"float64", func(a *adamwMember) {
			for _, b := range []*buffer{&a.p, &a.m, &a.v, &a.po, &a.mo, &a.vo, &a.g} {
				b.dt = graph.Float64
			}
		}, "float32"},
		{"empty", func(a *adamwMember) { a.p.n, a.g.n, a.m.n, a.v.n, a.po.n, a.mo.n, a.vo.n = 0, 0, 0, 0, 0, 0, 0 }, "no elements"},
		{"int64 gradient", func(a *adamwMember) { a.g.dt = graph.Int64 }, "gradient is"},
		{"output one element past its input", func(a *adamwMember) { a.po.ptr = a.p.ptr + 4 }, "partly overlaps"},
		{"two outputs in one buffer", func(a *adamwMember) { a.mo.ptr = a.po.ptr }, "two outputs"},
		{"output over lr", func(a *adamwMember) { a.lr.ptr = a.vo.ptr }, "lr or step"},
	} {
		a := fakeMember(0, 1<<20, 100, graph.BFloat16)
		c.edit(a)
		got := a.refusal()
		if (got == "") != (c.want == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: refusal %q, want %q", c.name, got, c.want)
		}
	}
}

// checkLaunches verifies a grouping of run: every member in exactly one
// launch; within a launch one key and no two members whose order matters;
// and of two members whose order matters, the earlier one in an earlier
// launch.
func checkLaunches(t *testing.T, run []*adamwMember, launches [][]int) {
	t.Helper()
	where := make([]int, len(run))
	for i := range where {
		where[i] = -1
	}
	for l, ms := range launches {
		if !slices.IsSorted(ms) {
			t.Errorf("launch %d lists members out of node order: %v", l, ms)
		}
		for _, i := range ms {
			if where[i] >= 0 {
				t.Fatalf("member %d is in launches %d and %d", i, where[i], l)
			}
			where[i] = l
			if run[i].key() != run[ms[0]].key() {
				t.Errorf("launch %d mixes keys", l)
			}
		}
	}
	for i := range run {
		if where[i] < 0 {
			t.Fatalf("member %d is in no launch", i)
		}
		for j := range i {
			if adamwConflict(run[j], run[i]) && where[j] >= where[i] {
				t.Fatalf("members %d and %d conflict but launch %d, %d", j, i, where[j], where[i])
			}
		}
	}
}

func TestGroupAdamWOneLaunchWithoutConflicts(t *testing.T) {
	run := membersOf([]int{1, 3, 64, 768, 4097, 768, 64}, graph.BFloat16)
	for i, a := range run {
		a.hyper.wd = float64(i%2) * 0.1 // weight decay is per segment
	}
	launches := groupAdamW(run)
	checkLaunches(t, run, launches)
	if len(launches) != 1 {
		t.Errorf("%d launches for disjoint members of one key, want 1", len(launches))
	}
	run[2].hyper.beta1 = 0.8
	run[5].hyper.beta1 = 0.8
	launches = groupAdamW(run)
	checkLaunches(t, run, launches)
	if want := [][]int{{0, 1, 3, 4, 6}, {2, 5}}; !slices.EqualFunc(launches, want, slices.Equal) {
		t.Errorf("two beta1 values: launches %v, want %v", launches, want)
	}
}

func TestGroupAdamWOrdersOverlaps(t *testing.T) {
	// The memory plan may put a later node's output where an earlier node's
	// gradient was: the later node must launch after it.
	run := membersOf([]int{64, 768, 64, 3}, graph.Float32)
	run[2].mo.ptr = run[0].g.ptr
	launches := groupAdamW(run)
	checkLaunches(t, run, launches)
	if want := [][]int{{0, 1, 3}, {2}}; !slices.EqualFunc(launches, want, slices.Equal) {
		t.Errorf("launches %v, want %v", launches, want)
	}

	// Random overlaps: buffers drawn from a few slots of one small space.
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		nm := 2 + rng.IntN(12)
		run := make([]*adamwMember, nm)
		for i := range run {
			a := fakeMember(i, 1<<20, 1+rng.IntN(300), graph.BFloat16)
			for _, b := range []*buffer{&a.p, &a.g, &a.m, &a.v, &a.po, &a.mo, &a.vo} {
				b.ptr = DevicePtr(1<<20 + rng.IntN(40)*1024)
			}
			if rng.IntN(4) == 0 {
				a.hyper.eps = 1e-6
			}
			run[i] = a
		}
		launches := groupAdamW(run)
		checkLaunches(t, run, launches)
		if t.Failed() {
			t.Fatalf("trial %d", trial)
		}
	}
}

// TestAdamWSegLayoutMatchesKernel: the table Go writes is the struct the
// kernel reads: the same fields in the same order, 8 bytes each.
func TestAdamWSegLayoutMatchesKernel(t *testing.T) {
	src := opsSource(t)
	m := regexp.MustCompile(`(?s)struct adamw_seg \{(.*?)\};`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("ops.cu has no struct adamw_seg")
	}
	field := regexp.MustCompile(`(?m)^\s*(const float\*|const void\*|float\*|i64|double)\s+(\w+);`)
	var names []string
	for _, f := range field.FindAllStringSubmatch(m[1], -1) {
		names = append(names, f[2])
	}
	if lines := strings.Count(m[1], ";"); lines != len(names) {
		t.Errorf("adamw_seg has %d fields, %d of them 8-byte pointers, i64 or double", lines, len(names))
	}
	if !slices.Equal(names, adamwSegFields) {
		t.Errorf("adamw_seg fields %v, Go writes %v", names, adamwSegFields)
	}
	s := adamwSeg{p: 1, g: 2, m: 3, v: 4, po: 5, mo: 6, vo: 7, n: 8, block0: 9, wd: 0.5, vec: 1}
	raw := encodeAdamwTable([]adamwSeg{s, s})
	if len(raw) != 2*8*len(adamwSegFields) {
		t.Fatalf("two segments encode to %d bytes", len(raw))
	}
	want := map[string]uint64{"p": 1, "g": 2, "m": 3, "v": 4, "po": 5, "mo": 6, "vo": 7, "n": 8, "block0": 9,
		"wd": math.Float64bits(0.5), "vec": 1}
	for k, name := range adamwSegFields {
		if got := binary.LittleEndian.Uint64(raw[8*len(adamwSegFields)+8*k:]); got != want[name] {
			t.Errorf("field %s holds %#x, want %#x", name, got, want[name])
		}
	}
}

// TestAdamWGroupsGPT2Step: the gpt2 training step as train builds it for
// CUDA, planned in mixed precision with its updates: every AdamW node
// qualifies and they form one run. Without recompute the arena's peak is in
// the backward, the plan keeps the run's inputs live to its end for free
// (groupReadEnds), and the run is one launch. With recompute the optimizer's
// outputs are the peak: the plan keeps its smaller arena and the launches
// are layered around the memory it reuses.
func TestAdamWGroupsGPT2Step(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and plans the gpt2 step")
	}
	cfg, err := model.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	for _, recompute := range []bool{false, true} {
		gs, err := train.BuildGraphs(cfg, true, train.Hyper{WeightDecay: 0.1, Recompute: recompute})
		if err != nil {
			t.Fatal(err)
		}
		g := gs.Step.Graph
		opts := PlanOptions{Compute: graph.BFloat16, Updates: gs.Step.Updates}
		plan, err := PlanMemoryWith(g, opts)
		if err != nil {
			t.Fatal(err)
		}
		facts, err := planFactsOf(g, opts)
		if err != nil {
			t.Fatal(err)
		}
		plain := assignBuffers(g, facts, nil)
		if plan.PeakBytes > plain.PeakBytes {
			t.Errorf("recompute=%v: arena %d bytes, %d without keeping AdamW inputs live", recompute, plan.PeakBytes, plain.PeakBytes)
		}
		x := &executable{g: g, plan: plan, bufs: fakeBuffers(g, plan)}
		adam := 0
		for _, n := range g.Nodes {
			x.steps = append(x.steps, step{node: n, dev: nop})
			if n.Op == "AdamW" {
				adam++
				if why := x.adamwMemberOf(len(x.steps) - 1).refusal(); why != "" {
					t.Fatalf("node %s does not qualify: %s", n.Name, why)
				}
			}
		}
		runs, err := x.adamwRuns()
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) != 1 || len(runs[0].members) != adam {
			t.Fatalf("recompute=%v: %d runs for %d AdamW nodes, want one with all", recompute, len(runs), adam)
		}
		r := runs[0]
		checkLaunches(t, r.members, r.launches)
		var sizes []int
		for _, l := range r.launches {
			sizes = append(sizes, len(l))
		}
		t.Logf("recompute=%v: %d AdamW nodes in %d launches of %v; arena %s", recompute, adam, len(r.launches), sizes, FormatBytes(plan.PeakBytes))
		if !recompute && len(r.launches) != 1 {
			t.Errorf("%d launches for %d AdamW nodes, want 1", len(r.launches), adam)
		}
	}
}

// TestAdamWRunEnds: the runs of consecutive AdamW nodes (a grouped op, see
// loweringPlans), and the plan that keeps their inputs live to the run's end
// unless that grows the arena.
func TestAdamWRunEnds(t *testing.T) {
	b := graph.NewBuilder("runs")
	lr := b.Input("lr", graph.Float32)
	step := b.Input("step", graph.Float32)
	x := b.Input("x", graph.Float32, 8)
	adam := func(name string) {
		p := b.Param(name, graph.Float32, graph.Shape{8}, graph.Ones())
		b.Output(b.OpN("AdamW", nil, p, b.Neg(x), p, p, lr, step)...)
	}
	adam("a") // Neg, AdamW
	adam("b") // Neg, AdamW
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if got := groupReadEnds(g); got != nil {
		t.Errorf("Neg AdamW Neg AdamW: ends %v, want nil (no run of two)", got)
	}
	// Move the second Neg before the first AdamW: Neg Neg AdamW AdamW.
	g.Nodes[1], g.Nodes[2] = g.Nodes[2], g.Nodes[1]
	ends := groupReadEnds(g)
	if want := []int{0, 1, 3, 3}; !slices.Equal(ends, want) {
		t.Fatalf("Neg Neg AdamW AdamW: ends %v, want %v", ends, want)
	}
	facts, err := planFactsOf(g, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(facts.readUntil, ends) {
		t.Fatalf("planning facts read until %v, want %v", facts.readUntil, ends)
	}
	grouped := assignBuffers(g, facts, ends)
	for _, pt := range grouped.Tensors {
		if pt.Op == "Neg" && pt.Last != 3 {
			t.Errorf("gradient %s is live until node %d, want 3 (the run's last AdamW)", pt.Name, pt.Last)
		}
	}
	plain := assignBuffers(g, facts, nil)
	chosen, err := PlanMemoryWith(g, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := grouped
	if plain.PeakBytes < grouped.PeakBytes {
		want = plain
	}
	lasts := func(p *Plan) []int {
		var l []int
		for _, pt := range p.Tensors {
			l = append(l, pt.Last)
		}
		return l
	}
	if chosen.PeakBytes != want.PeakBytes || !slices.Equal(lasts(chosen), lasts(want)) {
		t.Errorf("PlanMemoryWith chose an arena of %d bytes; grouped %d, plain %d", chosen.PeakBytes, grouped.PeakBytes, plain.PeakBytes)
	}
}

// fakeBuffers places g's values as Compile does (build in exec.go), with
// made-up device addresses: inputs and initializers in 256-byte aligned
// allocations of their own, arena values at their planned offsets.
func fakeBuffers(g *graph.Graph, plan *Plan) map[*graph.Value]buffer {
	bufs := map[*graph.Value]buffer{}
	next := DevicePtr(1 << 40)
	own := func(v *graph.Value) {
		b := buffer{ptr: next, dt: v.Type.DType, n: v.Type.Shape.Numel()}
		next = next.Offset(int(alignUp(int64(b.bytes())) + arenaAlign))
		bufs[v] = b
	}
	for _, v := range g.Inputs {
		own(v)
	}
	for _, v := range g.Initializers() {
		own(v)
	}
	arena := DevicePtr(1 << 36)
	for _, n := range g.Nodes {
		for _, v := range n.Outputs {
			vp := plan.values[v]
			b := buffer{dt: vp.storage, n: v.Type.Shape.Numel()}
			switch vp.kind {
			case placeArena:
				b.ptr = arena.Offset(int(plan.Tensors[vp.tensor].Offset))
			case placeAlias, placeFolded:
				b.ptr = bufs[vp.root].ptr
			}
			bufs[v] = b
		}
	}
	return bufs
}

// ---------------------------------------------------------------- on the device

// adamwCase is a graph of AdamW nodes over float32 params of odd sizes, each
// gradient computed on the device (Neg of an input, so stored in the
// compute type), weight decay alternating, the nodes after the float64 one
// with another beta1; the float64 node in the middle launches on its own
// and splits the run in two.
//
// A roomy case first squares a large input: the arena's peak is there, the
// plan keeps the gradients live through each run for free, and each run is
// one launch. In a tight case the optimizer's outputs are the peak, the plan
// reuses early gradients' memory for later outputs, and the runs' launches
// are layered around that reuse (the order the device tests check).
type adamwCase struct {
	g       *graph.Graph
	updates map[string]string
	sizes   []int
	f64At   int      // index of the float64 node among the AdamW nodes
	params  []string // each node's param, in node order
	roomy   bool
}

// The roomy case's grouping: the two float32 runs, one launch each.
const adamwRoomyGrouped, adamwRoomyLaunches = 10, 2

func newAdamWCase(t *testing.T, roomy bool) *adamwCase {
	t.Helper()
	c := &adamwCase{sizes: []int{1, 3, 64, 768, 4097, 5, 4096, 768, 2, 64, 1027}, f64At: 5, updates: map[string]string{}, roomy: roomy}
	b := graph.NewBuilder("adamw_multi")
	if roomy {
		big := b.Input("big", graph.Float32, 1<<18)
		b.Output(b.Rename(b.ReduceSum(b.Mul(big, big), false, 0), "bigsum"))
	}
	lr := b.Input("lr", graph.Float32)
	step := b.Input("step", graph.Float32)
	dtOf := func(i int) graph.DType {
		if i == c.f64At {
			return graph.Float64
		}
		return graph.Float32
	}
	name := func(s string, i int) string { return s + string(rune('a'+i)) }
	// The gradients first, then the AdamW nodes one after another, as
	// autodiff.TrainingGraph orders them.
	var grads []*graph.Value
	for i, n := range c.sizes {
		grads = append(grads, b.Neg(b.Input(name("x", i), dtOf(i), n)))
	}
	for i, n := range c.sizes {
		dt := dtOf(i)
		p := b.Param(name("p", i), dt, graph.Shape{n}, graph.Normal(0.5, i+1))
		m := b.Const(name("m", i), dt, graph.Shape{n}, graph.Normal(0.1, 100+i))
		v := b.Const(name("v", i), dt, graph.Shape{n}, graph.Fill(1e-3))
		attrs := graph.Attrs{"weight_decay": graph.Float(float64(i%2) * 0.1)}
		if i > c.f64At {
			attrs["beta1"] = graph.Float(0.8)
		}
		outs := b.OpN("AdamW", attrs, p, grads[i], m, v, lr, step)
		for k, target := range []string{p.Name, m.Name, v.Name} {
			b.Output(b.Rename(outs[k], target+".next"))
			c.updates[target+".next"] = target
		}
		c.params = append(c.params, p.Name)
	}
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	c.g = g
	return c
}

// feeds are run k's gradients (bfloat16 values, so that every compute type
// holds them exactly and the CPU sees the same gradient), lr and step.
func (c *adamwCase) feeds(k int, step float32) map[string]*graph.Tensor {
	rng := rand.New(rand.NewPCG(uint64(k), 5))
	f := map[string]*graph.Tensor{}
	for _, v := range c.g.Inputs {
		tt := graph.NewTensor(v.Type.DType, v.Type.Shape)
		for i := range tt.Len() {
			tt.Set(i, float64(BF16ToFloat32(BF16FromFloat32(float32(rng.NormFloat64())))))
		}
		f[v.Name] = tt
	}
	f["lr"].Set(0, 1e-2)
	f["step"].Set(0, float64(step))
	return f
}

// TestAdamWCaseOnCPU runs the device tests' graph on the CPU reference, so
// that the graph and its feeds are known good before device time is spent.
func TestAdamWCaseOnCPU(t *testing.T) {
	c := newAdamWCase(t, true)
	ref := compileOn(t, cpu.New(), c.g, backend.Options{Updates: c.updates})
	for k := 1; k <= 2; k++ {
		out, err := ref.Run(c.feeds(k, float32(k)))
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 || out["bigsum"] == nil {
			t.Errorf("run %d returned %d outputs; want bigsum alone (the rest are updates)", k, len(out))
		}
	}
	for _, p := range c.params {
		now, err := ref.Initializer(p)
		if err != nil {
			t.Fatal(err)
		}
		init := c.g.Values()[p].Init
		was, err := init.Materialize(c.g.Values()[p].Type)
		if err != nil {
			t.Fatal(err)
		}
		if sameData(now, was) {
			t.Errorf("param %s did not change in two AdamW steps", p)
		}
	}
}

// TestAdamWCaseGroups: how the executor will group the device tests'
// graphs, worked out on their memory plans without a GPU.
func TestAdamWCaseGroups(t *testing.T) {
	for _, roomy := range []bool{true, false} {
		c := newAdamWCase(t, roomy)
		for _, compute := range []graph.DType{graph.Float32, graph.BFloat16} {
			// The tight case copies its updates: written in place they take
			// no arena, and nothing would need ordering.
			plan, err := PlanMemoryWith(c.g, PlanOptions{Compute: compute, Updates: c.updates, CopyUpdates: !roomy})
			if err != nil {
				t.Fatal(err)
			}
			if roomy && plan.InPlace != len(c.updates) {
				t.Errorf("roomy %v: %d of %d updates in place", compute, plan.InPlace, len(c.updates))
			}
			x := &executable{g: c.g, plan: plan, bufs: fakeBuffers(c.g, plan)}
			for _, n := range c.g.Nodes {
				x.steps = append(x.steps, step{node: n, dev: nop})
			}
			runs, err := x.adamwRuns()
			if err != nil {
				t.Fatal(err)
			}
			grouped, launches, layered := 0, 0, false
			for _, r := range runs {
				checkLaunches(t, r.members, r.launches)
				for _, l := range r.launches {
					if len(l) > 1 {
						grouped += len(l)
						launches++
					}
				}
				if len(r.launches) > 1 && r.members[0].key() == r.members[len(r.members)-1].key() {
					layered = true // one key, yet more than one launch: ordered around reuse
				}
				if r.members[0].g.dt != compute {
					t.Errorf("%v: gradients stored as %v", compute, r.members[0].g.dt)
				}
			}
			t.Logf("roomy=%v %v: %d runs, %d nodes in %d grouped launches, arena %s", roomy, compute, len(runs), grouped, launches, FormatBytes(plan.PeakBytes))
			switch {
			case roomy && (grouped != adamwRoomyGrouped || launches != adamwRoomyLaunches):
				t.Errorf("roomy %v: %d nodes in %d grouped launches, want %d in %d", compute, grouped, launches, adamwRoomyGrouped, adamwRoomyLaunches)
			case !roomy && (!layered || launches == 0):
				t.Errorf("tight %v: %d grouped launches, layered %v; the case should exercise the ordering", compute, launches, layered)
			}
		}
	}
}

// stateOf downloads every param and moment of an executable.
func stateOf(t *testing.T, exe backend.Executable, c *adamwCase) map[string]*graph.Tensor {
	t.Helper()
	st := map[string]*graph.Tensor{}
	for _, target := range c.updates {
		v, err := exe.Initializer(target)
		if err != nil {
			t.Fatal(err)
		}
		st[target] = v
	}
	return st
}

// TestAdamWMultiMatchesPerNode: the grouped launches give the per-node
// kernels' bits, run after run (the first run plain, then captured and
// replayed as a CUDA graph), in float32 and in mixed precision (bfloat16
// gradients), and the CPU reference's values to float32 rounding; the
// profiler still sees every AdamW node.
func TestAdamWMultiMatchesPerNode(t *testing.T) {
	for _, tc := range []struct {
		compute graph.DType
		roomy   bool
	}{{graph.Float32, true}, {graph.BFloat16, true}, {graph.Float32, false}, {graph.BFloat16, false}} {
		compute := tc.compute
		t.Run(fmt.Sprintf("%v/roomy=%v", compute, tc.roomy), func(t *testing.T) {
			be := newTestBackend(t, Options{Compute: compute})
			defer be.Close()
			c := newAdamWCase(t, tc.roomy)
			if !tc.roomy {
				// Copied updates: in place they would take no arena, and the
				// tight case is there for the launches ordered around reuse.
				t.Setenv("FLASHGRAPH_CUDA_INPLACE_UPDATES", "0")
			}
			// Outputs poisoned (NaN) before the kernels that write them: a
			// grouped launch must poison each layer's outputs only once the
			// layers before it have read what lies there.
			opts := backend.Options{Updates: c.updates, PoisonOutputs: true}
			t.Setenv("FLASHGRAPH_CUDA_MULTI_ADAMW", "0")
			single := compileOn(t, be, c.g, opts)
			t.Setenv("FLASHGRAPH_CUDA_MULTI_ADAMW", "1")
			grouped := compileOn(t, be, c.g, opts)
			opts.PoisonOutputs = false
			ref := compileOn(t, cpu.New(), c.g, opts)
			gx, sx := grouped.(*executable), single.(*executable)
			if c.roomy && (gx.adamwGrouped != adamwRoomyGrouped || gx.adamwLaunches != adamwRoomyLaunches) ||
				gx.adamwLaunches == 0 {
				t.Fatalf("grouped %d nodes in %d launches (roomy %v: want %d in %d)", gx.adamwGrouped, gx.adamwLaunches,
					c.roomy, adamwRoomyGrouped, adamwRoomyLaunches)
			}
			if sx.adamwGrouped != 0 {
				t.Fatalf("FLASHGRAPH_CUDA_MULTI_ADAMW=0 still grouped %d nodes", sx.adamwGrouped)
			}
			for k := 1; k <= 4; k++ {
				feeds := c.feeds(k, float32(k))
				before := stateOf(t, ref, c)
				for _, exe := range []backend.Executable{grouped, single, ref} {
					if _, err := exe.Run(feeds); err != nil {
						t.Fatalf("run %d: %v", k, err)
					}
				}
				got, want, cpuNow := stateOf(t, grouped, c), stateOf(t, single, c), stateOf(t, ref, c)
				for name, w := range want {
					for i := range w.Len() {
						a, b := got[name].At(i), w.At(i)
						if math.Float64bits(a) != math.Float64bits(b) {
							t.Fatalf("run %d: %s[%d] grouped %v, per node %v", k, name, i, a, b)
						}
					}
					if k > 1 {
						continue // the CPU's state may differ in last bits from here on
					}
					// Float32 rounding: a few units in the last place of the
					// result and of the value it updates.
					u := 4 * math.Pow(2, -24)
					if w.DType == graph.Float64 {
						u = 4 * math.Pow(2, -53)
					}
					for i := range w.Len() {
						a, r, old := w.At(i), cpuNow[name].At(i), before[name].At(i)
						if math.Abs(a-r) > u*(math.Abs(r)+math.Abs(old)) {
							t.Fatalf("run 1: %s[%d] = %v on the device, %v on the CPU (was %v)", name, i, a, r, old)
						}
					}
				}
			}
			if be.dev.GraphsEnabled() && (gx.stepsGraph.Off() != nil || !gx.stepsGraph.Replaying()) {
				t.Errorf("the grouped steps are not replayed as a CUDA graph: %v", gx.stepsGraph.Off())
			}
			times, err := gx.Profile(c.feeds(9, 9))
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(ByOp(times), func(o OpTime) bool { return o.Op == "AdamW" })
			if i < 0 {
				t.Fatal("the profile has no AdamW")
			}
			o := ByOp(times)[i]
			if o.Nodes != len(c.sizes) || !(o.Ms > 0) {
				t.Errorf("profile: %d AdamW nodes taking %v ms, want %d nodes and some time", o.Nodes, o.Ms, len(c.sizes))
			}
			t.Logf("profile: %d AdamW nodes, %.3f ms", o.Nodes, o.Ms)
		})
	}
}

// TestAdamWMultiStepFlag: a step below 1 is still reported, naming the
// first AdamW node (as the per-node kernels did), and the executable keeps
// working.
func TestAdamWMultiStepFlag(t *testing.T) {
	be := newTestBackend(t, Options{})
	defer be.Close()
	c := newAdamWCase(t, true)
	t.Setenv("FLASHGRAPH_CUDA_MULTI_ADAMW", "1")
	exe := compileOn(t, be, c.g, backend.Options{Updates: c.updates})
	if exe.(*executable).adamwLaunches == 0 {
		t.Fatal("nothing was grouped")
	}
	var first string
	for _, n := range c.g.Nodes {
		if n.Op == "AdamW" {
			first = n.Name
			break
		}
	}
	if x := exe.(*executable); x.plan.InPlace != len(c.updates) || len(x.updates) != 0 {
		t.Fatalf("%d of %d updates in place, %d copied", x.plan.InPlace, len(c.updates), len(x.updates))
	}
	before := stateOf(t, exe, c)
	for k := 1; k <= 3; k++ { // the third run replays a CUDA graph
		_, err := exe.Run(c.feeds(k, 0))
		if err == nil || !strings.Contains(err.Error(), "step must be >= 1") || !strings.Contains(err.Error(), "node "+first+" (AdamW)") {
			t.Errorf("run %d at step 0: %v; want the step error naming node %s", k, err, first)
		}
	}
	// Updated in place, yet a failed run wrote nothing.
	after := stateOf(t, exe, c)
	for name, was := range before {
		if !sameData(after[name], was) {
			t.Errorf("%s changed in runs that failed", name)
		}
	}
	if _, err := exe.Run(c.feeds(4, 1)); err != nil {
		t.Errorf("step 1 after bad steps: %v", err)
	}
}

// TestAdamWMultiKernelUnaligned: the plan aligns every buffer, so the
// scalar path of adamw_multi_f32 (segments not aligned for 16-byte access)
// is launched here by hand, next to aligned segments with tails, against
// adamw_f32 on the same buffers, bit for bit.
func TestAdamWMultiKernelUnaligned(t *testing.T) {
	be := newTestBackend(t, Options{})
	defer be.Close()
	d := be.dev
	multi, err := be.fn("adamw_multi_f32")
	if err != nil {
		t.Fatal(err)
	}
	single, err := be.fn("adamw_f32")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var frees []DevicePtr
	defer func() {
		for _, p := range frees {
			d.Free(p)
		}
	}()
	alloc := func(bytes int) DevicePtr {
		p, err := d.Alloc(bytes + 64)
		if err != nil {
			t.Fatal(err)
		}
		frees = append(frees, p)
		return p
	}
	// put stores vals as dt at byte offset off of a fresh allocation.
	put := func(vals []float32, dt graph.DType, off int) DevicePtr {
		tt := graph.NewTensor(graph.Float32, graph.Shape{len(vals)})
		copy(tt.F32, vals)
		p := alloc(len(vals) * dt.Size()).Offset(off)
		if err := upload(d, buffer{ptr: p, dt: dt, n: len(vals)}, tt); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lr := put([]float32{3e-3}, graph.Float32, 0)
	step := put([]float32{5}, graph.Float32, 0)
	flag := alloc(4)
	if err := d.Memset(flag, 0, 4); err != nil {
		t.Fatal(err)
	}
	for _, gdt := range []graph.DType{graph.Float32, graph.BFloat16} {
		var ms []*adamwMember
		var refs [][3]DevicePtr
		// Segments 0, 4, 8, 12 and 16 are aligned, the others are not:
		// 4097 is one full block (the straight-line path) and one element,
		// 2048 less than a block of whole groups, 3·4096+6 three full
		// blocks and a last one of a whole group and a partial one, 8192
		// two full blocks; 9000 and 9212 span blocks element by element.
		for i, n := range []int{1, 3, 64, 768, 4097, 4096, 5, 7, 2048, 9000, 9212, 5, 3*4096 + 6, 6, 7, 1, 8192} {
			off, goff := 4*(i%4), gdt.Size()*(i%4)
			rnd := func(scale float64, pos bool) []float32 {
				v := make([]float32, n)
				for k := range v {
					v[k] = float32(rng.NormFloat64() * scale)
					if pos {
						v[k] = float32(math.Abs(float64(v[k])))
					}
				}
				return v
			}
			a := &adamwMember{node: i, hyper: adamwHyper{beta1: 0.9, beta2: 0.95, eps: 1e-8, wd: float64(i%2) * 0.1}}
			a.p = buffer{ptr: put(rnd(0.5, false), graph.Float32, off), dt: graph.Float32, n: n}
			a.g = buffer{ptr: put(rnd(1, false), gdt, goff), dt: gdt, n: n}
			a.m = buffer{ptr: put(rnd(0.1, false), graph.Float32, off), dt: graph.Float32, n: n}
			a.v = buffer{ptr: put(rnd(0.01, true), graph.Float32, 0), dt: graph.Float32, n: n}
			a.po = buffer{ptr: alloc(4 * n).Offset(off), dt: graph.Float32, n: n}
			a.mo = buffer{ptr: alloc(4 * n), dt: graph.Float32, n: n}
			a.vo = buffer{ptr: alloc(4 * n).Offset(off), dt: graph.Float32, n: n}
			a.lr = buffer{ptr: lr, dt: graph.Float32, n: 1}
			a.step = buffer{ptr: step, dt: graph.Float32, n: 1}
			ms = append(ms, a)
			refs = append(refs, [3]DevicePtr{alloc(4 * n), alloc(4 * n), alloc(4 * n)})
		}
		segs, blocks, err := adamwTable(ms)
		if err != nil {
			t.Fatal(err)
		}
		var vec int
		for _, s := range segs {
			vec += int(s.vec)
		}
		if vec == 0 || vec == len(segs) {
			t.Fatalf("%v: %d of %d segments take the vector path; the test wants both paths", gdt, vec, len(segs))
		}
		raw := encodeAdamwTable(segs)
		table := alloc(len(raw))
		if err := d.CopyToDevice(table, unsafe.Pointer(&raw[0]), len(raw)); err != nil {
			t.Fatal(err)
		}
		err = d.Launch(multi, [3]uint32{uint32(blocks), 1, 1}, [3]uint32{adamwMultiBlock, 1, 1}, 0,
			table, int32(len(segs)), dtCode(gdt), lr, dtCode(graph.Float32), step, dtCode(graph.Float32),
			0.9, 0.95, 1e-8, flag, int32(7))
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range ms {
			err := d.Launch(single, [3]uint32{3, 1, 1}, [3]uint32{128, 1, 1}, 0, int64(a.p.n),
				a.p.ptr, dtCode(graph.Float32), a.g.ptr, dtCode(gdt), a.m.ptr, dtCode(graph.Float32), a.v.ptr, dtCode(graph.Float32),
				lr, dtCode(graph.Float32), step, dtCode(graph.Float32),
				refs[i][0], dtCode(graph.Float32), refs[i][1], dtCode(graph.Float32), refs[i][2], dtCode(graph.Float32),
				0.9, 0.95, 1e-8, a.hyper.wd, flag, int32(8))
			if err != nil {
				t.Fatal(err)
			}
		}
		tt := graph.TensorType{DType: graph.Float32}
		for i, a := range ms {
			tt.Shape = graph.Shape{a.p.n}
			for k, out := range []buffer{a.po, a.mo, a.vo} {
				got, err := download(d, out, tt)
				if err != nil {
					t.Fatal(err)
				}
				want, err := download(d, buffer{ptr: refs[i][k], dt: graph.Float32, n: a.p.n}, tt)
				if err != nil {
					t.Fatal(err)
				}
				for e := range got.F32 {
					if math.Float32bits(got.F32[e]) != math.Float32bits(want.F32[e]) {
						t.Fatalf("%v segment %d (n=%d, vec=%d) output %d element %d: %v, adamw_f32 %v",
							gdt, i, a.p.n, segs[i].vec, k, e, got.F32[e], want.F32[e])
					}
				}
			}
		}
	}
	var code int32
	if err := d.CopyToHost(unsafe.Pointer(&code), flag, 4); err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Errorf("flag %d at step 5", code)
	}
}

// TestAdamWMultiBandwidth times adamw_multi_f32 on a model-sized update
// (about 200M float32 params in segments of a transformer's sizes, bfloat16
// gradients, in place as the executor runs it) and a device-to-device copy
// on the same card, and logs both rates: the update moves 26 bytes an
// element (p, m, v read and written, the gradient read). It checks that the
// timed launches updated the first and the last element.
func TestAdamWMultiBandwidth(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates about 3.6 GB of device memory")
	}
	be := newTestBackend(t, Options{})
	defer be.Close()
	d := be.dev
	multi, err := be.fn("adamw_multi_f32")
	if err != nil {
		t.Fatal(err)
	}
	var frees []DevicePtr
	defer func() {
		for _, p := range frees {
			d.Free(p)
		}
	}()
	alloc := func(bytes int) DevicePtr {
		p, err := d.Alloc(bytes)
		if err != nil {
			t.Fatal(err)
		}
		frees = append(frees, p)
		return p
	}
	// A 1.3B-shaped model scaled down: an embedding, then per layer two
	// norms, attention and MLP weights with their biases.
	const d1 = 2048
	sizes := []int{50257 * d1}
	for range 3 {
		sizes = append(sizes, d1, d1, 3*d1*d1, 3*d1, d1*d1, d1, d1, d1, 4*d1*d1, 4*d1, 4*d1*d1, d1)
	}
	var total int
	for _, n := range sizes {
		total += n
	}
	lr, step, flag := alloc(4), alloc(4), alloc(4)
	one := float32(1e-3)
	if err := d.CopyToDevice(lr, unsafe.Pointer(&one), 4); err != nil {
		t.Fatal(err)
	}
	one = 1
	if err := d.CopyToDevice(step, unsafe.Pointer(&one), 4); err != nil {
		t.Fatal(err)
	}
	if err := d.Memset(flag, 0, 4); err != nil {
		t.Fatal(err)
	}
	// p and g hold 0x3f3f...: about 0.75 as float32 and as bfloat16.
	p, g, m, v := alloc(4*total), alloc(2*total), alloc(4*total), alloc(4*total)
	for _, f := range []struct {
		ptr   DevicePtr
		bytes int
		val   byte
	}{{p, 4 * total, 0x3f}, {g, 2 * total, 0x3f}, {m, 4 * total, 0}, {v, 4 * total, 0}} {
		if err := d.Memset(f.ptr, f.val, f.bytes); err != nil {
			t.Fatal(err)
		}
	}
	var ms []*adamwMember
	at := 0
	for i, n := range sizes {
		f32 := func(base DevicePtr) buffer { return buffer{ptr: base.Offset(4 * at), dt: graph.Float32, n: n} }
		a := &adamwMember{node: i, hyper: adamwHyper{beta1: 0.9, beta2: 0.95, eps: 1e-8, wd: 0.1}}
		a.p, a.m, a.v = f32(p), f32(m), f32(v)
		a.po, a.mo, a.vo = a.p, a.m, a.v
		a.g = buffer{ptr: g.Offset(2 * at), dt: graph.BFloat16, n: n}
		a.lr = buffer{ptr: lr, dt: graph.Float32, n: 1}
		a.step = buffer{ptr: step, dt: graph.Float32, n: 1}
		ms = append(ms, a)
		at += n
	}
	segs, blocks, err := adamwTable(ms)
	if err != nil {
		t.Fatal(err)
	}
	raw := encodeAdamwTable(segs)
	table := alloc(len(raw))
	if err := d.CopyToDevice(table, unsafe.Pointer(&raw[0]), len(raw)); err != nil {
		t.Fatal(err)
	}
	launch := func() error {
		return d.Launch(multi, [3]uint32{uint32(blocks), 1, 1}, [3]uint32{adamwMultiBlock, 1, 1}, 0,
			table, int32(len(segs)), dtCode(graph.BFloat16), lr, dtCode(graph.Float32), step, dtCode(graph.Float32),
			0.9, 0.95, 1e-8, flag, int32(7))
	}
	copyP := func() error { return d.CopyDeviceToDevice(m, p, 4*total) }
	// rate runs f a few times, then times reps runs of it, in bytes/s.
	rate := func(f func() error, bytes float64) float64 {
		for range 3 {
			if err := f(); err != nil {
				t.Fatal(err)
			}
		}
		start, err := d.NewEvent()
		if err != nil {
			t.Fatal(err)
		}
		defer start.Destroy()
		end, err := d.NewEvent()
		if err != nil {
			t.Fatal(err)
		}
		defer end.Destroy()
		const reps = 20
		if err := d.Record(start); err != nil {
			t.Fatal(err)
		}
		for range reps {
			if err := f(); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Record(end); err != nil {
			t.Fatal(err)
		}
		msec, err := d.ElapsedMs(start, end)
		if err != nil {
			t.Fatal(err)
		}
		return bytes * reps / (float64(msec) / 1e3)
	}
	copyRate := rate(copyP, 8*float64(total))
	if err := d.Memset(m, 0, 4*total); err != nil {
		t.Fatal(err)
	}
	adamRate := rate(launch, 26*float64(total))
	var code int32
	if err := d.CopyToHost(unsafe.Pointer(&code), flag, 4); err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("flag %d after the timed launches", code)
	}
	for _, i := range []int{0, total - 1} {
		var got float32
		if err := d.CopyToHost(unsafe.Pointer(&got), p.Offset(4*i), 4); err != nil {
			t.Fatal(err)
		}
		if was := math.Float32frombits(0x3f3f3f3f); !(got < was) || math.IsNaN(float64(got)) {
			t.Errorf("param element %d is %v after 23 updates from %v", i, got, was)
		}
	}
	t.Logf("adamw_multi_f32: %d params in %d segments, %d blocks of %d threads × %d elements: %.2f TB/s (%.3f ms a launch); device copy %.2f TB/s",
		total, len(segs), blocks, adamwMultiBlock, adamwMultiElems/adamwMultiBlock, adamRate/1e12, 26*float64(total)/adamRate*1e3, copyRate/1e12)
}
