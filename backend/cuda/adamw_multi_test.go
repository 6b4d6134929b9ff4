package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

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
// binary search for the block's segment, then four elements per thread)
// over every block and thread of the launch, and counts how often each
// element of each segment is updated.
func coverage(segs []adamwSeg, blocks int64) (counts [][]int, idle int64) {
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
		busy := false
		for t := range int64(adamwMultiBlock) {
			i0 := ((b-s.block0)*adamwMultiBlock + t) * adamwMultiPer
			if i0 >= s.n {
				continue
			}
			busy = true
			for k := range min(adamwMultiPer, s.n-i0) {
				counts[lo][i0+k]++
			}
		}
		if !busy {
			idle++
		}
	}
	return counts, idle
}

func TestAdamWTableCoversEveryElementOnce(t *testing.T) {
	for _, sizes := range [][]int{
		{1, 3, 64, 768, 4097},
		{1},
		{1024, 1025, 1023, 4, 5, 2048, 768, 768, 768, 1},
		{3, 3, 3, 50000, 7},
	} {
		ms := membersOf(sizes, graph.BFloat16)
		segs, blocks, err := adamwTable(ms)
		if err != nil {
			t.Fatal(err)
		}
		var want int64
		for _, n := range sizes {
			want += (int64(n) + adamwMultiBlock*adamwMultiPer - 1) / (adamwMultiBlock * adamwMultiPer)
		}
		if blocks != want {
			t.Errorf("sizes %v: %d blocks, want %d", sizes, blocks, want)
		}
		counts, idle := coverage(segs, blocks)
		if idle != 0 {
			t.Errorf("sizes %v: %d blocks update nothing", sizes, idle)
		}
		for s, c := range counts {
			for i, k := range c {
				if k != 1 {
					t.Fatalf("sizes %v: segment %d element %d updated %d times", sizes, s, i, k)
				}
			}
			if segs[s].p != ms[s].p.ptr || segs[s].g != ms[s].g.ptr || segs[s].vo != ms[s].vo.ptr || segs[s].n != int64(sizes[s]) {
				t.Errorf("sizes %v: segment %d does not describe its member: %+v", sizes, s, segs[s])
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
// qualifies, they form one run, and since the plan keeps the run's inputs
// live to its end (adamwRunEnds), no output lies over another node's input
// and the run is one launch.
func TestAdamWGroupsGPT2Step(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and plans the gpt2 step")
	}
	cfg, err := model.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	gs, err := train.BuildGraphs(cfg, true, train.Hyper{WeightDecay: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	g := gs.Step.Graph
	plan, err := PlanMemoryWith(g, PlanOptions{Compute: graph.BFloat16, Updates: gs.Step.Updates})
	if err != nil {
		t.Fatal(err)
	}
	x := &executable{g: g, plan: plan, bufs: fakeBuffers(g, plan)}
	var run []*adamwMember
	first := -1
	for i, n := range g.Nodes {
		if n.Op != "AdamW" {
			continue
		}
		if first < 0 {
			first = i
		}
		if i != first+len(run) {
			t.Fatalf("AdamW node %s at %d is not next to the others (first at %d)", n.Name, i, first)
		}
		a := x.adamwMemberOf(i)
		if why := a.refusal(); why != "" {
			t.Fatalf("node %s does not qualify: %s", n.Name, why)
		}
		run = append(run, a)
	}
	launches := groupAdamW(run)
	checkLaunches(t, run, launches)
	var sizes []int
	for _, l := range launches {
		sizes = append(sizes, len(l))
	}
	t.Logf("%d AdamW nodes in %d launches of %v nodes; arena %s", len(run), len(launches), sizes, FormatBytes(plan.PeakBytes))
	if len(launches) != 1 {
		t.Errorf("%d launches for %d AdamW nodes, want 1", len(launches), len(run))
	}
}

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
	// Move the second Neg before the first AdamW: Neg Neg AdamW AdamW.
	g.Nodes[1], g.Nodes[2] = g.Nodes[2], g.Nodes[1]
	if got, want := adamwRunEnds(g), []int{0, 1, 3, 3}; !slices.Equal(got, want) {
		t.Errorf("Neg Neg AdamW AdamW: ends %v, want %v", got, want)
	}
	plan, err := PlanMemoryWith(g, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pt := range plan.Tensors {
		if pt.Op == "Neg" && pt.Last != 3 {
			t.Errorf("gradient %s is live until node %d, want 3 (the run's last AdamW)", pt.Name, pt.Last)
		}
	}
	g.Nodes[1], g.Nodes[2] = g.Nodes[2], g.Nodes[1] // Neg AdamW Neg AdamW
	if got, want := adamwRunEnds(g), []int{0, 1, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("Neg AdamW Neg AdamW: ends %v, want %v", got, want)
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
