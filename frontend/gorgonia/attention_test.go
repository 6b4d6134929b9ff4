package gorgonia

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// attnSpec is a causal self-attention block over one sequence x [S, Dm]
// with H heads, written in gorgonia.
type attnSpec struct {
	S, Dm, H int
	// perHead writes each head with its own weights and 2-D matmuls
	// (Mul(Q_h, Kᵀ_h)) and joins heads with Concat; otherwise Q, K, V are
	// split into [H, S, Dh] and multiplied with BatchedMatMul(transB).
	perHead bool
	seed    uint64
}

func causalMaskData(s int) []float64 {
	m := make([]float64, s*s)
	for i := range s {
		for j := i + 1; j < s; j++ {
			m[i*s+j] = math.Inf(-1)
		}
	}
	return m
}

// buildAttention returns the graph, its input x (no value bound) and the
// block's output.
func buildAttention(sp attnSpec) (g *G.ExprGraph, x, out *G.Node) {
	rng := rand.New(rand.NewPCG(sp.seed, 1))
	S, Dm, H := sp.S, sp.Dm, sp.H
	Dh := Dm / H
	g = G.NewGraph()
	x = G.NewMatrix(g, G.Float64, G.WithShape(S, Dm), G.WithName("x"))
	weight := func(name string, rows, cols int) *G.Node {
		return G.NewMatrix(g, G.Float64, G.WithShape(rows, cols), G.WithName(name),
			G.WithValue(dense([]int{rows, cols}, randData(rng, rows*cols, 1/math.Sqrt(float64(rows))))))
	}
	// g.Constant puts the constant in g (Reshape, in BroadcastAdd, needs a
	// node of a graph).
	mask := g.Constant(dense([]int{S, S}, causalMaskData(S)))
	scale := G.NewConstant(1 / math.Sqrt(float64(Dh)))
	wo := weight("wo", Dm, Dm)

	if sp.perHead {
		var ctx []*G.Node
		for h := range H {
			suffix := string(rune('0' + h))
			q := must(G.Mul(x, weight("wq"+suffix, Dm, Dh)))
			k := must(G.Mul(x, weight("wk"+suffix, Dm, Dh)))
			v := must(G.Mul(x, weight("wv"+suffix, Dm, Dh)))
			scores := must(G.Mul(q, must(G.Transpose(k))))
			scaled := must(G.Mul(scores, scale))
			masked := must(G.Add(scaled, mask))
			probs := must(G.SoftMax(masked))
			ctx = append(ctx, must(G.Mul(probs, v)))
		}
		merged := must(G.Concat(1, ctx...))
		return g, x, must(G.Mul(merged, wo))
	}

	wq, wk, wv := weight("wq", Dm, Dm), weight("wk", Dm, Dm), weight("wv", Dm, Dm)
	heads := func(m *G.Node) *G.Node { // [S, Dm] → [H, S, Dh]
		return must(G.Transpose(must(G.Reshape(m, tensor.Shape{S, H, Dh})), 1, 0, 2))
	}
	q := heads(must(G.Mul(x, wq)))
	k := heads(must(G.Mul(x, wk)))
	v := heads(must(G.Mul(x, wv)))
	scores := must(G.BatchedMatMul(q, k, false, true)) // Q·Kᵀ, [H, S, S]
	scaled := must(G.Mul(scores, scale))
	masked := must(G.BroadcastAdd(scaled, mask, nil, []byte{0}))
	probs := must(G.SoftMax(masked))
	ctx := must(G.BatchedMatMul(probs, v)) // [H, S, Dh]
	merged := must(G.Reshape(must(G.Transpose(ctx, 1, 0, 2)), tensor.Shape{S, Dm}))
	return g, x, must(G.Mul(merged, wo))
}

// attentionCase imports the block with x unbound (so it becomes the graph
// input), then binds x and checks the import, unfused and fused, against
// gorgonia's own outputs.
func attentionCase(t *testing.T, sp attnSpec) (unfused, fused *graph.Graph) {
	g, x, out := buildAttention(sp)
	fg, names, err := ImportWithNames(g, []*G.Node{out}, Options{Name: "attention"})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if err := graph.Verify(fg); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if len(fg.Inputs) != 1 || fg.Inputs[0].Name != "x" || names[x] != "x" {
		t.Fatalf("inputs %v, names[x] = %q: want the one input x", fg.Inputs, names[x])
	}
	if len(fg.Consts) == 0 || !hasCausalMask(fg) {
		t.Fatalf("the causal mask const is not recorded as causal_mask:\n%s", graph.Format(fg))
	}

	rng := rand.New(rand.NewPCG(sp.seed, 2))
	xv := dense([]int{sp.S, sp.Dm}, randData(rng, sp.S*sp.Dm, 1))
	if err := G.Let(x, xv); err != nil {
		t.Fatal(err)
	}
	want := runGorgonia(t, g, []*G.Node{out})[0]
	feeds, err := Feeds(fg, names)
	if err != nil {
		t.Fatal(err)
	}
	assertClose(t, "unfused", runCPU(t, fg, feeds)[0], want, rtol64)

	before := graph.Format(fg)
	log := &passes.Log{}
	p := passes.Default(true)
	p.Verify = true
	ff, err := p.Run(fg, log)
	if err != nil {
		t.Fatalf("fusion pipeline: %v", err)
	}
	if graph.Format(fg) != before {
		t.Fatal("the fusion pipeline changed the imported graph in place")
	}
	assertClose(t, "fused", runCPU(t, ff, feeds)[0], want, rtol64)
	for _, e := range passes.ExplainLog(fg, log) {
		t.Log(e)
	}
	return fg, ff
}

func hasCausalMask(g *graph.Graph) bool {
	for _, c := range g.Consts {
		if c.Init != nil && c.Init.Fn == "causal_mask" {
			return true
		}
	}
	return false
}

func TestAttentionBatchedMatMul(t *testing.T) {
	sp := attnSpec{S: 7, Dm: 12, H: 3, seed: 1}
	unfused, fused := attentionCase(t, sp)

	// The imported block is the canonical attention chain: scores =
	// MatMul(Q, Transpose(K)), Mul by the scale, Add of the [S, S] mask (the
	// Repeat of BroadcastAdd folded into broadcasting), Softmax over -1.
	c := unfused.CountOps()
	if c["Softmax"] != 1 || c["Expand"] != 0 || c["MatMul"] != 6 {
		t.Fatalf("unfused ops %v:\n%s", c, graph.Format(unfused))
	}
	var sm *graph.Node
	for _, n := range unfused.Nodes {
		if n.Op == "Softmax" {
			sm = n
		}
	}
	add := sm.Inputs[0].Producer
	if add == nil || add.Op != "Add" || !add.Inputs[1].Type.Shape.Equal(graph.Shape{sp.S, sp.S}) {
		t.Fatalf("softmax input is not Add(scores, mask[S,S]):\n%s", graph.Format(unfused))
	}
	if sm.Attrs.Int("axis", 0) != -1 {
		t.Fatalf("softmax axis %d, want -1", sm.Attrs.Int("axis", 0))
	}

	fc := fused.CountOps()
	if fc["FlashAttention"] != 1 || fc["Softmax"] != 0 {
		t.Fatalf("fused ops %v, want one FlashAttention and no Softmax:\n%s", fc, graph.Format(fused))
	}
	for _, n := range fused.Nodes {
		if n.Op == "FlashAttention" {
			if n.Attrs.Int("causal", 0) != 1 || math.Abs(n.Attrs.Float("scale", 0)-1/math.Sqrt(4)) > 1e-15 {
				t.Fatalf("FlashAttention attrs %v, want causal=1 scale=0.5", n.Attrs)
			}
		}
	}
	ex, err := passes.Explain(unfused)
	if err != nil {
		t.Fatal(err)
	}
	if len(ex) != 1 || !ex[0].Fused {
		t.Fatalf("explain: %v", ex)
	}
}

// Heads as separate 2-D matmuls: the import is exact; the fusion refuses
// (FlashAttention takes [B,H,S,D] or [BH,S,D] operands) and says why.
func TestAttentionPerHeadMatMul(t *testing.T) {
	sp := attnSpec{S: 6, Dm: 8, H: 2, perHead: true, seed: 2}
	unfused, fused := attentionCase(t, sp)
	if c := unfused.CountOps(); c["Softmax"] != 2 || c["Concat"] != 1 || c["Transpose"] != 2 {
		t.Fatalf("unfused ops %v", c)
	}
	if fused.CountOps()["FlashAttention"] != 0 {
		t.Fatal("2-D heads were fused")
	}
	ex, err := passes.Explain(unfused)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ex {
		if e.Fused || !strings.Contains(e.Reason, "rank 2") {
			t.Fatalf("explain: %v, want a refusal for rank-2 Q", e)
		}
	}
}

// Import is deterministic: the same ExprGraph imported twice, and the same
// model built twice, give identical text.
func TestImportDeterministic(t *testing.T) {
	for _, perHead := range []bool{false, true} {
		sp := attnSpec{S: 5, Dm: 8, H: 2, perHead: perHead, seed: 3}
		g1, _, o1 := buildAttention(sp)
		g2, _, o2 := buildAttention(sp)
		var texts []string
		for _, c := range []struct {
			g *G.ExprGraph
			o *G.Node
		}{{g1, o1}, {g1, o1}, {g2, o2}} {
			fg, err := Import(c.g, []*G.Node{c.o}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			texts = append(texts, graph.Format(fg))
		}
		for i := 1; i < len(texts); i++ {
			if texts[i] != texts[0] {
				t.Fatalf("perHead=%v: import %d differs:\n%s\n----\n%s", perHead, i, texts[0], texts[i])
			}
		}
		// The text is the graph's identity: it parses back to itself.
		back, err := graph.Parse(texts[0])
		if err != nil {
			t.Fatalf("parse: %v", err)
		}
		if graph.Format(back) != texts[0] {
			t.Fatal("Parse(Format(g)) differs")
		}
	}
}
