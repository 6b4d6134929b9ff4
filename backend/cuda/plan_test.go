package cuda

// Memory-plan tests: pure Go, they run without a GPU.

import (
	"bytes"
	"go/scanner"
	"go/token"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend/cuda/codegen"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

func build(t *testing.T, b *graph.Builder) *graph.Graph {
	t.Helper()
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func plan(t *testing.T, g *graph.Graph, opts PlanOptions) *Plan {
	t.Helper()
	p, err := PlanMemoryWith(g, opts)
	if err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, p)
	return p
}

// checkPlacement: two buffers whose live ranges overlap never share bytes,
// every buffer fits in the arena, and the arena is at least the live peak.
func checkPlacement(t *testing.T, p *Plan) {
	t.Helper()
	for i, a := range p.Tensors {
		if a.Offset%arenaAlign != 0 || a.Offset < 0 || a.Offset+a.Bytes > p.PeakBytes {
			t.Fatalf("%s: offset %d + %d bytes outside the %d-byte arena or misaligned", a.Name, a.Offset, a.Bytes, p.PeakBytes)
		}
		for _, b := range p.Tensors[i+1:] {
			if a.First > b.Last || b.First > a.Last || a.Bytes == 0 || b.Bytes == 0 {
				continue
			}
			if a.Offset < b.Offset+b.Bytes && b.Offset < a.Offset+a.Bytes {
				t.Fatalf("%s [%d..%d] at %d+%d overlaps %s [%d..%d] at %d+%d", a.Name, a.First, a.Last, a.Offset, a.Bytes,
					b.Name, b.First, b.Last, b.Offset, b.Bytes)
			}
		}
	}
	if p.PeakBytes < p.LiveBytes {
		t.Fatalf("arena %d bytes is below the live peak %d", p.PeakBytes, p.LiveBytes)
	}
}

// A chain x → Exp → Exp → ... → y: each value dies at the next node, so two
// buffers (reused in turn) hold the whole run.
func TestPlanChainReusesMemory(t *testing.T) {
	b := graph.NewBuilder("chain")
	v := b.Input("x", graph.Float32, 64, 32)
	for range 10 {
		v = b.Op("Exp", nil, v)
	}
	b.Output(v)
	p := plan(t, build(t, b), PlanOptions{})
	const one = 64 * 32 * 4
	if p.LiveBytes != 2*one || p.PeakBytes != 2*one {
		t.Errorf("live %d, arena %d; want both %d (two buffers in turn)", p.LiveBytes, p.PeakBytes, 2*one)
	}
	if p.InputBytes != one || p.InitializerBytes != 0 {
		t.Errorf("inputs %d, initializers %d", p.InputBytes, p.InitializerBytes)
	}
	if last := p.Tensors[len(p.Tensors)-1]; last.Last != 10 {
		t.Errorf("the graph output lives until %d, want the end (10)", last.Last)
	}
}

// Reshape and friends are aliases: no buffer of their own, and the buffer
// they alias lives as long as the alias is read.
func TestPlanAliasExtendsLife(t *testing.T) {
	b := graph.NewBuilder("alias")
	x := b.Input("x", graph.Float32, 8, 16)
	e := b.Op("Exp", nil, x)                  // node 0
	r := b.Reshape(e, 2, 64)                  // node 1: alias of e
	n := b.Neg(x)                             // node 2
	s := b.Add(b.Reshape(n, 2, 64), b.Neg(r)) // nodes 3 (alias), 4, 5
	b.Output(b.Op("Identity", nil, s))        // node 6: alias of s, a graph output
	g := build(t, b)
	p := plan(t, g, PlanOptions{})
	vals := g.Values()
	if vp := p.values[vals[r.Name]]; vp.kind != placeAlias || vp.root != vals[e.Name] {
		t.Fatalf("reshape of e: kind %v root %v", vp.kind, vp.root)
	}
	et := p.Tensors[p.values[vals[e.Name]].tensor]
	if et.First != 0 || et.Last != 4 {
		t.Errorf("e lives %d..%d, want 0..4 (read through the alias by node 4)", et.First, et.Last)
	}
	st := p.Tensors[p.values[vals[s.Name]].tensor]
	if st.Last != len(g.Nodes) {
		t.Errorf("s lives until %d, want the end: its alias is a graph output", st.Last)
	}
	for _, tt := range p.Tensors {
		if tt.Op == "Reshape" || tt.Op == "Identity" {
			t.Errorf("alias %s has a buffer", tt.Name)
		}
	}
}

// An update source gets its own buffer even behind an alias op, so that
// copying it over its initializer cannot clobber a buffer still needed.
func TestPlanUpdateSourceIsNotAnAlias(t *testing.T) {
	b := graph.NewBuilder("upd")
	w := b.Param("w", graph.Float32, graph.Shape{4}, graph.Ones())
	x := b.Input("x", graph.Float32, 4)
	next := b.Rename(b.Op("Identity", nil, b.Add(w, x)), "w.next")
	b.Output(next)
	g := build(t, b)
	p := plan(t, g, PlanOptions{Updates: map[string]string{"w.next": "w"}})
	if vp := p.values[g.Values()["w.next"]]; vp.kind != placeArena {
		t.Errorf("update source placed as %v, want its own arena buffer", vp.kind)
	}
	if _, err := PlanMemoryWith(g, PlanOptions{Updates: map[string]string{"nope": "w"}}); err == nil {
		t.Error("an update from a missing output was accepted")
	}
}

// The whole tiny model and its training step: a valid placement, and the
// arena close to the live peak (greedy-by-size is near optimal here).
func TestPlanModel(t *testing.T) {
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fwd := plan(t, g, PlanOptions{})
	ts, err := autodiff.TrainingGraph(g, autodiff.TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr := plan(t, ts.Graph, PlanOptions{Updates: ts.Updates})
	for name, p := range map[string]*Plan{"forward": fwd, "training": tr} {
		t.Logf("%s: arena %s, live peak %s at %s, %d buffers", name, FormatBytes(p.PeakBytes), FormatBytes(p.LiveBytes), p.PeakNode, len(p.Tensors))
		if float64(p.PeakBytes) > 1.25*float64(p.LiveBytes) {
			t.Errorf("%s: arena %d is more than 1.25x the live peak %d", name, p.PeakBytes, p.LiveBytes)
		}
	}
	if tr.LiveBytes <= fwd.LiveBytes {
		t.Errorf("training live peak %d is not above the forward's %d", tr.LiveBytes, fwd.LiveBytes)
	}
	// The attention probabilities [B, H, S, S] are among the largest forward buffers.
	sxs := int64(cfg.Batch * cfg.Heads * cfg.Seq * cfg.Seq * 4)
	if fwd.Largest[0].Bytes < sxs {
		t.Errorf("largest buffer %s is %d bytes, below one S×S score tensor (%d)", fwd.Largest[0].Name, fwd.Largest[0].Bytes, sxs)
	}
	var buf bytes.Buffer
	if err := tr.Report(&buf, 5); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "activation arena") || strings.Count(out, "\n") != 8 { // totals, in-place updates, header, 5 rows
		t.Errorf("report:\n%s", out)
	}
}

// A Transpose of the last two axes read only by MatMuls has no buffer (the
// GEMM reads its input transposed); other transposes and other readers keep
// the copy.
func TestPlanFoldsTransposeIntoMatMul(t *testing.T) {
	b := graph.NewBuilder("fold")
	x := b.Input("x", graph.Float32, 2, 8, 4)
	w := b.Param("w", graph.Float32, graph.Shape{6, 4}, graph.Normal(0.1, 1))
	xt := b.Transpose(x, 0, 2, 1)       // read by MatMul only: folded
	wt := b.Transpose(w, 1, 0)          // folded, an initializer's
	both := b.Transpose(x, 0, 2, 1)     // also read by Neg: a copy
	heads := b.Transpose(x, 1, 0, 2)    // not the last two axes: a copy
	y1 := b.MatMul(xt, b.MatMul(x, wt)) // [2,4,8]@([2,8,4]@[4,6]) = [2,4,6]
	b.Output(y1, b.Neg(both), b.MatMul(both, x), heads)
	g := build(t, b)
	p := plan(t, g, PlanOptions{})
	vals := g.Values()
	for v, want := range map[*graph.Value]placeKind{vals[xt.Name]: placeFolded, vals[wt.Name]: placeFolded,
		vals[both.Name]: placeArena, vals[heads.Name]: placeArena} {
		if got := p.values[v].kind; got != want {
			t.Errorf("%s placed as %v, want %v", v.Name, got, want)
		}
	}
	if r := p.values[vals[wt.Name]].root; r != vals["w"] {
		t.Errorf("folded transpose of w has root %v", r)
	}
	// Autodiff writes weight gradients as MatMul(Transpose(x), dy): in the
	// tiny model's training step none of those transposes gets a buffer.
	cfg, _ := model.Lookup("tiny")
	mg, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := autodiff.TrainingGraph(mg, autodiff.TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tp := plan(t, ts.Graph, PlanOptions{Updates: ts.Updates})
	var folded int
	for _, n := range ts.Graph.Nodes {
		if tp.values[n.Outputs[0]].kind == placeFolded {
			folded++
		}
	}
	if folded < 2*cfg.Layers*7 {
		t.Errorf("%d folded transposes in the training step, want at least one per weight matrix (%d)", folded, 2*cfg.Layers*7)
	}
}

// Mixed precision: activations in bfloat16, GEMM weights cast into scratch,
// optimizer outputs, the loss and update sources in float32.
func TestPlanBF16Storage(t *testing.T) {
	cfg, _ := model.Lookup("tiny")
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := autodiff.TrainingGraph(g, autodiff.TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := plan(t, ts.Graph, PlanOptions{Compute: graph.BFloat16, Updates: ts.Updates})
	f32 := plan(t, ts.Graph, PlanOptions{Updates: ts.Updates})
	var bf, casts int
	for _, n := range ts.Graph.Nodes {
		for k, v := range n.Outputs {
			st := p.values[v].storage
			switch {
			case n.Op == "AdamW" || v.Name == ts.Loss:
				if st != graph.Float32 {
					t.Errorf("%s output %d stored as %v", n.Op, k, st)
				}
			case st == graph.BFloat16:
				bf++
			}
		}
	}
	for _, tt := range p.Tensors {
		if tt.Scratch && tt.Op == "MatMul" {
			casts++
		}
	}
	if bf == 0 || casts == 0 {
		t.Errorf("%d bfloat16 values, %d GEMM operand casts; want some of each", bf, casts)
	}
	if p.LiveBytes >= f32.LiveBytes {
		t.Errorf("bf16 live peak %d is not below float32's %d", p.LiveBytes, f32.LiveBytes)
	}
}

// The composed attention lowering shows its [BH, Sq, Sk] scores as scratch
// (float32 forward, float64 backward);
// the fused one has none (the forward) or only its O(BH·Sq·D) workspace.
func TestPlanAttentionScratch(t *testing.T) {
	b := graph.NewBuilder("attn")
	q := b.Input("q", graph.Float32, 2, 3, 16, 8)
	k := b.Input("k", graph.Float32, 2, 3, 16, 8)
	v := b.Input("v", graph.Float32, 2, 3, 16, 8)
	attrs := graph.Attrs{"causal": graph.Int(1), "scale": graph.Float(0.35)}
	outs := b.OpN("FlashAttention", attrs, q, k, v)
	dy := b.Input("dy", graph.Float32, 2, 3, 16, 8)
	grads := b.OpN("FlashAttentionGrad", attrs, q, k, v, outs[0], outs[1], dy)
	b.Output(grads...)
	g := build(t, b)
	composed := plan(t, g, PlanOptions{ComposedAttention: true})
	var scores int
	for _, tt := range composed.Tensors {
		if tt.Scratch && (strings.HasSuffix(tt.Name, "/scores") || strings.HasSuffix(tt.Name, "/dscores")) {
			scores++
			want := int64(6 * 16 * 16 * 4) // float32 forward
			if tt.Op == "FlashAttentionGrad" {
				want *= 2 // the composed backward computes in float64
			}
			if tt.Bytes != want {
				t.Errorf("%s is %d bytes, want %d", tt.Name, tt.Bytes, want)
			}
		}
	}
	if scores != 3 {
		t.Errorf("%d S×S scratch buffers in the composed plan, want 3", scores)
	}
	fused := plan(t, g, PlanOptions{})
	for _, tt := range fused.Tensors {
		if tt.Scratch && tt.Op == "FlashAttention" {
			t.Errorf("fused forward has scratch %s", tt.Name)
		}
		if tt.Scratch && tt.Op == "FlashAttentionGrad" && tt.Bytes != int64(FlashBackwardWorkspaceBytes(GemmF32, 6, 1, 16, 16, 8, 0.35)) {
			t.Errorf("fused backward scratch %s is %d bytes", tt.Name, tt.Bytes)
		}
	}
	if fused.PeakBytes >= composed.PeakBytes {
		t.Errorf("fused arena %d is not below the composed %d", fused.PeakBytes, composed.PeakBytes)
	}
	// float64 has no fused kernel.
	b64 := graph.NewBuilder("attn64")
	q64 := b64.Input("q", graph.Float64, 1, 4, 8)
	b64.Output(b64.OpN("FlashAttention", attrs, q64, q64, q64)[0])
	g64 := build(t, b64)
	if fusedAttention(g64.Nodes[0], func(v *graph.Value) graph.DType { return v.Type.DType }) {
		t.Error("float64 attention claims the fused kernels")
	}
}

// The fused backward of grouped-query attention plans the workspace its
// launch will use: with H_kv = 1 (the grouped grid far too small to fill a
// GPU) four [BH, Sk, D] bf16 tensors more than multi-head attention's, for
// the repeated K and V and the per-query-head dK and dV; with
// FLASHGRAPH_FLASH_GQA_BWD=grouped none.
func TestPlanGroupedAttentionWorkspace(t *testing.T) {
	const h, s, d = 8, 256, 64
	for _, c := range []struct {
		hkv   int
		env   string
		extra int64 // bytes over multi-head attention's workspace
	}{
		{h, "", 0},
		{1, "", 4 * h * s * d * 2},
		{2, "", 4 * h * s * d * 2},
		{1, "grouped", 0},
		{h, "repeat", 0}, // multi-head attention has nothing to repeat
	} {
		t.Setenv(FlashGQABwdEnv, c.env)
		b := graph.NewBuilder("gqa")
		q := b.Input("q", graph.BFloat16, 1, h, s, d)
		k := b.Input("k", graph.BFloat16, 1, c.hkv, s, d)
		v := b.Input("v", graph.BFloat16, 1, c.hkv, s, d)
		attrs := graph.Attrs{"causal": graph.Int(1), "scale": graph.Float(0.125)}
		outs := b.OpN("FlashAttention", attrs, q, k, v)
		dy := b.Input("dy", graph.BFloat16, 1, h, s, d)
		b.Output(b.OpN("FlashAttentionGrad", attrs, q, k, v, outs[0], outs[1], dy)...)
		p := plan(t, build(t, b), PlanOptions{})
		mha := int64(FlashBackwardWorkspaceBytes(GemmBF16, h, 1, s, s, d, 0.125))
		found := 0
		for _, tt := range p.Tensors {
			if tt.Scratch && tt.Op == "FlashAttentionGrad" && strings.HasSuffix(tt.Name, "workspace") {
				found++
				if tt.Bytes != mha+c.extra {
					t.Errorf("H_kv %d %s=%q: backward workspace %d bytes, want %d + %d", c.hkv, FlashGQABwdEnv, c.env, tt.Bytes, mha, c.extra)
				}
			}
		}
		if found != 1 {
			t.Errorf("H_kv %d: %d backward workspaces in the plan, want 1", c.hkv, found)
		}
	}
}

// The mixed-precision plan of a fused training step with grouped-query
// attention (gqaTraining: head dim 64, 4 query heads on 1 and 2 K/V heads)
// gives each layer's backward the workspace its launch uses: with the
// repeat of K/V (the rule's choice for so small a grid), without it under
// FLASHGRAPH_FLASH_GQA_BWD=grouped.
func TestPlanGQATrainingWorkspace(t *testing.T) {
	for _, kv := range []int{1, 2} {
		ts, cfg := gqaTraining(t, kv)
		group, bh := cfg.Heads/kv, cfg.Batch*cfg.Heads
		repeat := int64(4 * bh * cfg.Seq * cfg.HeadDim * 2)
		for _, env := range []string{"", "grouped"} {
			t.Setenv(FlashGQABwdEnv, env)
			want := int64(FlashBackwardWorkspaceBytes(GemmBF16, bh, group, cfg.Seq, cfg.Seq, cfg.HeadDim, 0.125))
			if hasRepeat := want > repeat; hasRepeat != (env == "") {
				t.Fatalf("H_kv %d %s=%q: FlashBackwardWorkspaceBytes %d, repeat %d bytes: want it %v", kv, FlashGQABwdEnv, env, want, repeat, env == "")
			}
			p := plan(t, ts.Graph, PlanOptions{Compute: graph.BFloat16, Updates: ts.Updates})
			n := 0
			for _, tt := range p.Tensors {
				if tt.Scratch && tt.Op == "FlashAttentionGrad" && strings.HasSuffix(tt.Name, "workspace") {
					n++
					if tt.Bytes != want {
						t.Errorf("H_kv %d %s=%q: %s is %d bytes, want %d", kv, FlashGQABwdEnv, env, tt.Name, tt.Bytes, want)
					}
				}
			}
			if n != cfg.Layers {
				t.Errorf("H_kv %d: %d backward workspaces in the plan, want %d", kv, n, cfg.Layers)
			}
		}
	}
}

func TestPlanRejects(t *testing.T) {
	if _, err := PlanMemory(nil); err == nil {
		t.Error("nil graph planned")
	}
	b := graph.NewBuilder("x")
	b.Output(b.Neg(b.Input("x", graph.Float32, 2)))
	if _, err := PlanMemoryWith(build(t, b), PlanOptions{Compute: graph.Float64}); err == nil {
		t.Error("float64 compute type accepted")
	}
}

// Every op of the op table has a CUDA lowering.
func TestEveryOpHasLowering(t *testing.T) {
	for _, s := range graph.Ops() {
		if l, ok := lowerings[s.Name]; !ok || l.lower == nil {
			t.Errorf("op %s (%s) has no CUDA lowering", s.QualifiedName(), s.Doc)
		}
	}
	for name := range lowerings {
		if _, ok := graph.LookupOp(name); !ok {
			t.Errorf("lowering %s is for an op the op table does not have", name)
		}
	}
}

// The planner knows no op: plan.go holds no string literal that looks like
// an op name (what `grep -nE '"[A-Z][A-Za-z]+"' plan.go` looks for), and
// names no op of the op table in a literal. Ops reach it only as planning
// facts (planfacts.go).
func TestPlanNamesNoOp(t *testing.T) {
	src, err := os.ReadFile("plan.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var s scanner.Scanner
	s.Init(fset.AddFile("plan.go", -1, len(src)), src, nil, 0)
	capitalized := regexp.MustCompile(`^[A-Z][A-Za-z]+$`)
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok != token.STRING {
			continue
		}
		v, err := strconv.Unquote(lit)
		if err != nil {
			continue
		}
		if _, isOp := graph.LookupOp(v); isOp || capitalized.MatchString(v) {
			t.Errorf("%s: plan.go names %q; op knowledge belongs in the planning facts", fset.Position(pos), v)
		}
	}
}

// The lowering's planning columns are for ops that have a lowering, and the
// op table's are where the planner used to hard-code them.
func TestPlanningFactsColumns(t *testing.T) {
	for op, lp := range loweringPlans {
		spec, ok := graph.LookupOp(op)
		if _, lowered := lowerings[op]; !ok || !lowered {
			t.Errorf("loweringPlans has %s, which has no lowering", op)
			continue
		}
		for _, i := range lp.transposed {
			if i < 0 || i >= len(spec.Inputs) {
				t.Errorf("%s: transposed input %d out of range", op, i)
			}
		}
	}
	var views []string
	for _, s := range graph.Ops() {
		if s.View {
			views = append(views, s.Name)
		}
	}
	if want := []string{"Identity", "Reshape", "Squeeze", "Unsqueeze"}; !slices.Equal(views, want) {
		t.Errorf("view ops %v, want %v", views, want)
	}
	adamw, _ := graph.LookupOp("AdamW")
	for k, want := range []int{0, 2, 3} {
		if got := adamw.InPlaceInput(k); got != want {
			t.Errorf("AdamW output %d updates input %d, want %d", k, got, want)
		}
	}
}

func TestCoalesce(t *testing.T) {
	for _, c := range []struct {
		dims    []int64
		strides [][]int64
		want    []int64
		wantS   [][]int64
	}{
		// Same shape: one run.
		{[]int64{2, 3, 4}, [][]int64{{12, 4, 1}, {12, 4, 1}}, []int64{24}, [][]int64{{1}, {1}}},
		// Row broadcast [3,4] + [4].
		{[]int64{3, 4}, [][]int64{{4, 1}, {0, 1}}, []int64{3, 4}, [][]int64{{4, 1}, {0, 1}}},
		// Size-1 dims drop; a scalar broadcast still merges.
		{[]int64{1, 5, 1, 6}, [][]int64{{30, 6, 6, 1}, {0, 0, 0, 0}}, []int64{30}, [][]int64{{1}, {0}}},
		// A transpose stays rank 2.
		{[]int64{4, 3}, [][]int64{{1, 4}}, []int64{4, 3}, [][]int64{{1, 4}}},
		// All ones: one element.
		{[]int64{1, 1}, [][]int64{{1, 1}}, []int64{1}, [][]int64{{0}}},
	} {
		d, s := codegen.Coalesce(c.dims, c.strides)
		if !equalInts(d, c.want) || len(s) != len(c.wantS) {
			t.Errorf("coalesce(%v, %v) = %v, %v; want %v, %v", c.dims, c.strides, d, s, c.want, c.wantS)
			continue
		}
		for k := range s {
			if !equalInts(s[k], c.wantS[k]) {
				t.Errorf("coalesce(%v, %v) strides %v, want %v", c.dims, c.strides, s, c.wantS)
			}
		}
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPlanReduce(t *testing.T) {
	for _, c := range []struct {
		shape      []int
		axes       []int
		rows       bool
		nout       int64
		count      int64
		multiChunk bool
	}{
		{[]int{8, 64}, []int{-1}, true, 8, 64, false},      // rmsnorm mean: a block per row
		{[]int{512, 64}, []int{0}, false, 64, 512, true},   // a norm gain's gradient: columns, chunked
		{[]int{4, 5, 6}, []int{0, 2}, true, 5, 24, false},  // innermost reduced
		{[]int{4, 5, 6}, []int{0, 1}, false, 6, 20, false}, // short columns: one pass
		{[]int{3, 7}, nil, true, 1, 21, false},             // everything
		{[]int{2, 1, 3}, []int{1}, false, 6, 1, false},     // a size-1 axis
	} {
		b := graph.NewBuilder("r")
		x := b.Input("x", graph.Float32, c.shape...)
		b.Output(b.ReduceSum(x, true, c.axes...))
		g := build(t, b)
		rp, err := planReduce(g.Nodes[0])
		if err != nil {
			t.Fatal(err)
		}
		if rp.rows != c.rows || rp.nout != c.nout || rp.count != c.count || (rp.chunks > 1) != c.multiChunk {
			t.Errorf("%v over %v: rows %v nout %d count %d chunks %d", c.shape, c.axes, rp.rows, rp.nout, rp.count, rp.chunks)
		}
		if rp.chunks*rp.clen < rp.count || (rp.chunks-1)*rp.clen >= max(rp.count, 1) && rp.chunks > 1 {
			t.Errorf("%v over %v: %d chunks of %d do not tile %d", c.shape, c.axes, rp.chunks, rp.clen, rp.count)
		}
	}
}

// encode/decode are the host side of every upload and download.
func TestEncodeDecode(t *testing.T) {
	for _, c := range []struct {
		dt, storage graph.DType
		vals        []float64
	}{
		{graph.Float32, graph.Float32, []float64{1.5, -2, float64(float32(math.Pi)), math.Inf(-1)}},
		{graph.Float32, graph.BFloat16, []float64{1.5, -2, 3.140625, math.Inf(-1)}},
		{graph.BFloat16, graph.BFloat16, []float64{0.5, 3.140625, -1e30}},
		{graph.Float16, graph.Float16, []float64{0.5, 3.140625, 65504}},
		{graph.Float64, graph.Float64, []float64{math.Pi, -1e300}},
		{graph.Int64, graph.Int64, []float64{-3, 1 << 40}},
		{graph.Bool, graph.Bool, []float64{1, 0, 1}},
	} {
		src := graph.NewTensor(c.dt, graph.Shape{len(c.vals)})
		for i, v := range c.vals {
			src.Set(i, v)
		}
		got := graph.NewTensor(c.dt, src.Shape)
		decode(encode(src, c.storage), c.storage, got)
		for i := range c.vals {
			if got.At(i) != src.At(i) {
				t.Errorf("%v as %v: element %d = %v, want %v", c.dt, c.storage, i, got.At(i), src.At(i))
			}
		}
	}
	big := graph.NewTensor(graph.Int64, graph.Shape{1})
	big.I64[0] = 1<<62 + 1
	got := graph.NewTensor(graph.Int64, graph.Shape{1})
	decode(encode(big, graph.Int64), graph.Int64, got)
	if got.I64[0] != big.I64[0] {
		t.Errorf("int64 %d came back as %d", big.I64[0], got.I64[0])
	}
}

func TestParseCompute(t *testing.T) {
	for s, want := range map[string]graph.DType{"": graph.Float32, "f32": graph.Float32, "bf16": graph.BFloat16, "BFloat16": graph.BFloat16} {
		if got, err := ParseCompute(s); err != nil || got != want {
			t.Errorf("ParseCompute(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseCompute("fp8"); err == nil {
		t.Error("fp8 accepted")
	}
}

// No two arena buffers whose lives overlap share bytes, in the plans the
// trainer asks for: the gpt2 step (two layers) with fused attention, its
// elementwise chains fused (recomputation on, as on CUDA), in bfloat16 and
// float32, with its parameter updates. A node's inputs and outputs are live
// at the node together, so a kernel never writes over what it reads.
func TestPlanLivesNeverShareBytes(t *testing.T) {
	cfg, err := model.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Layers, cfg.Batch, cfg.Seq = 2, 2, 128
	fwd, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fwd, err = passes.Default(true).Run(fwd, nil); err != nil {
		t.Fatal(err)
	}
	ts, err := autodiff.TrainingGraph(fwd, autodiff.TrainOptions{Loss: "loss"})
	if err != nil {
		t.Fatal(err)
	}
	step, err := (passes.FuseElementwise{}).Run(ts.Graph, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, compute := range []graph.DType{graph.BFloat16, graph.Float32} {
		p := plan(t, step, PlanOptions{Compute: compute, Updates: ts.Updates})
		for i, a := range p.Tensors {
			for _, b := range p.Tensors[i+1:] {
				if a.Last < b.First || b.Last < a.First {
					continue // lives apart
				}
				if a.Offset+a.Bytes <= b.Offset || b.Offset+b.Bytes <= a.Offset {
					continue // bytes apart
				}
				t.Fatalf("%v: %s (nodes %d..%d, bytes %d..%d) and %s (nodes %d..%d, bytes %d..%d) are live together in the same bytes",
					compute, a.Name, a.First, a.Last, a.Offset, a.Offset+a.Bytes, b.Name, b.First, b.Last, b.Offset, b.Offset+b.Bytes)
			}
		}
		t.Logf("%v: %d arena buffers, arena %s", compute, len(p.Tensors), FormatBytes(p.PeakBytes))
	}
}

// A training step's AdamW outputs lie on the params and moments they
// replace (no arena buffers, no copies after the run) unless something
// could tell: a later reader of the old value, the old value as a graph
// output, or a node after the update that could still fail the run.
func TestPlanUpdatesInPlace(t *testing.T) {
	ts, _ := tinyTraining(t, true)
	inPlace := plan(t, ts.Graph, PlanOptions{Updates: ts.Updates})
	copied := plan(t, ts.Graph, PlanOptions{Updates: ts.Updates, CopyUpdates: true})
	if want := 3 * len(ts.Params); inPlace.InPlace != want || len(ts.Updates) != want {
		t.Fatalf("%d of %d updates in place, want all %d (3 per param)", inPlace.InPlace, len(ts.Updates), want)
	}
	if copied.InPlace != 0 || copied.InPlaceBytes != 0 {
		t.Errorf("CopyUpdates: %d updates in place", copied.InPlace)
	}
	// Each param, m and v is float32: the arena loses what the three
	// copies of every param took.
	var paramBytes int64
	for _, v := range ts.Graph.Initializers() {
		if v.Kind == graph.Param {
			paramBytes += bytesOf(v.Type.DType, v.Type.Shape)
		}
	}
	if inPlace.InPlaceBytes != 3*paramBytes {
		t.Errorf("in-place bytes %d, want 3 x %d", inPlace.InPlaceBytes, paramBytes)
	}
	// The arena's peak is in the backward, before the updates, so it need
	// not shrink; it must not grow.
	if inPlace.PeakBytes > copied.PeakBytes {
		t.Errorf("arena %d in place, %d with copies", inPlace.PeakBytes, copied.PeakBytes)
	}
	t.Logf("arena %s in place, %s with copies (%d outputs, %s in place)", FormatBytes(inPlace.PeakBytes),
		FormatBytes(copied.PeakBytes), inPlace.InPlace, FormatBytes(inPlace.InPlaceBytes))
	for _, tp := range inPlace.Tensors {
		if tp.Op == "AdamW" {
			t.Fatalf("AdamW output %s has an arena buffer", tp.Name)
		}
	}
	var buf bytes.Buffer
	if err := inPlace.Report(&buf, 1); err != nil || !strings.Contains(buf.String(), "updates in place: ") {
		t.Errorf("report does not say what is in place (%v):\n%s", err, buf.String())
	}

	// adamGraph: AdamW of one param, then what extra adds.
	adamGraph := func(extra func(b *graph.Builder, p *graph.Value, outs []*graph.Value)) (*graph.Graph, map[string]string) {
		b := graph.NewBuilder("adam")
		p := b.Param("p", graph.Float32, graph.Shape{4}, graph.Ones())
		m := b.Const("m", graph.Float32, graph.Shape{4}, graph.Zeros())
		v := b.Const("v", graph.Float32, graph.Shape{4}, graph.Zeros())
		gr := b.Input("g", graph.Float32, 4)
		lr := b.Input("lr", graph.Float32)
		step := b.Input("step", graph.Float32)
		outs := b.OpN("AdamW", nil, p, gr, m, v, lr, step)
		b.Output(outs...)
		if extra != nil {
			extra(b, p, outs)
		}
		g := build(t, b)
		return g, map[string]string{outs[0].Name: "p", outs[1].Name: "m", outs[2].Name: "v"}
	}
	for _, c := range []struct {
		name  string
		extra func(b *graph.Builder, p *graph.Value, outs []*graph.Value)
		want  int
	}{
		{"alone", nil, 3},
		{"the old param read after the update", func(b *graph.Builder, p *graph.Value, outs []*graph.Value) {
			b.Output(b.Rename(b.ReduceSum(b.Reshape(p, 2, 2), false, -1), "sum"))
		}, 0}, // and the Reduce after AdamW could fail the run: nothing in place
		{"the old param as a graph output", func(b *graph.Builder, p *graph.Value, outs []*graph.Value) {
			b.Output(b.Rename(b.Reshape(p, 2, 2), "view"))
		}, 2},
		{"a kernel after the update", func(b *graph.Builder, p *graph.Value, outs []*graph.Value) {
			b.Output(b.Rename(b.Add(outs[0], outs[0]), "twice"))
		}, 0},
	} {
		g, updates := adamGraph(c.extra)
		if got := plan(t, g, PlanOptions{Updates: updates}).InPlace; got != c.want {
			t.Errorf("%s: %d updates in place, want %d", c.name, got, c.want)
		}
	}
}
