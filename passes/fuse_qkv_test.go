package passes

import (
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// qkvPipeline is the forward pipeline train runs with Hyper.FuseQKV.
func qkvPipeline() Pipeline {
	p := Default(true)
	p.Passes = append(p.Passes, FuseQKV())
	return p
}

// On the built-in model fuse_qkv merges each layer's q, k and v projections
// into one MatMul sliced by heads, after the attention fusion, which still
// fires for every layer; the params are the same three weights; the fused
// graph computes the unfused one's outputs (float64, a new summation order
// only); the SwiGLU gate/up pair (two MatMuls) is left with its reason.
func TestFuseQKVOnModel(t *testing.T) {
	for _, name := range []string{"tiny", "tiny-gqa"} {
		cfg, err := model.Lookup("tiny")
		if err != nil {
			t.Fatal(err)
		}
		cfg.DType, cfg.Batch, cfg.Seq = graph.Float64, 2, 16
		if name == "tiny-gqa" {
			cfg.KVHeads = cfg.Heads / 2 // k and v narrower than q
		}
		g, err := model.Build(cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		attn, _ := fzRun(t, Default(true), g)
		out, log := fzRun(t, qkvPipeline(), g)
		if n := fzCount(out, "FlashAttention"); n != cfg.Layers {
			t.Errorf("%s: %d FlashAttention after fuse_qkv, want %d", name, n, cfg.Layers)
		}
		if got, want := fzCount(attn, "MatMul")-fzCount(out, "MatMul"), 2*cfg.Layers; got != want {
			t.Errorf("%s: fuse_qkv removed %d MatMuls, want %d (three become one per layer)", name, got, want)
		}
		if got := fzCount(out, "Concat") - fzCount(attn, "Concat"); got != cfg.Layers {
			t.Errorf("%s: %d new Concats of weights, want %d", name, got, cfg.Layers)
		}
		var pa, po []string
		for _, p := range attn.Params {
			pa = append(pa, p.Name)
		}
		for _, p := range out.Params {
			po = append(po, p.Name)
		}
		if !slices.Equal(pa, po) {
			t.Errorf("%s: params changed:\n%v\n%v", name, pa, po)
		}
		fired := log.Filter(PassFuseQKV, Fired)
		if len(fired) != cfg.Layers {
			t.Fatalf("%s: %d firings: %v", name, len(fired), fired)
		}
		if d := fired[0].Detail; !strings.Contains(d, "weights=layers.0.wq|layers.0.wk|layers.0.wv") || !strings.Contains(d, "sliced by heads of") {
			t.Errorf("%s: firing detail %q", name, d)
		}
		refused := log.Filter(PassFuseQKV, Refused)
		if len(refused) != cfg.Layers || !strings.Contains(refused[0].Reason, "left operand of 2 MatMuls with a weight initializer, fewer than 3") {
			t.Errorf("%s: refusals %v, want one per layer's gate/up pair", name, refused)
		}
		fzSameOutputs(t, attn, out, graph.Float64)
	}
}

// fuse_qkv on small graphs: the column slices when a product is not only
// split into heads, a refusal naming the MatMul whose weight is an
// activation, and a graph where nothing shares an input left as it is.
func TestFuseQKVForms(t *testing.T) {
	build := func(activationWeight, extraReader bool) *graph.Graph {
		b := graph.NewBuilder("qkv")
		x := b.Input("x", graph.Float64, 2, 3, 8)
		var outs []*graph.Value
		for i, n := range []int{8, 4, 4} {
			w := b.Param([]string{"wq", "wk", "wv"}[i], graph.Float64, graph.Shape{8, n}, graph.Normal(0.5, i+1))
			if activationWeight && i == 1 {
				w = b.Input("wk_act", graph.Float64, 8, n)
			}
			outs = append(outs, b.MatMul(x, w))
		}
		if extraReader {
			outs = append(outs, b.Reshape(outs[0], 2, 3, 2, 4))
		}
		for i, o := range outs {
			b.Output(b.Rename(b.Mul(o, o), []string{"q2", "k2", "v2", "qh"}[i]))
		}
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	one := Pipeline{Name: "qkv", Passes: []Pass{FuseQKV()}}

	g := build(false, true)
	out, log := fzRun(t, one, g)
	if fzCount(out, "MatMul") != 1 || fzCount(out, "Slice") != 3 {
		t.Fatalf("ops after fuse_qkv: %v\n%s", out.CountOps(), log)
	}
	if d := log.Filter(PassFuseQKV, Fired); len(d) != 1 || !strings.Contains(d[0].Detail, "N=16, sliced by columns") {
		t.Errorf("firings %v", d)
	}
	fzSameOutputs(t, g, out, graph.Float64)

	g = build(true, false)
	out, log = fzRun(t, one, g)
	if out != g {
		t.Errorf("a group of two with weight initializers was rewritten")
	}
	r := log.Filter(PassFuseQKV, Refused)
	if len(r) != 1 || !strings.Contains(r[0].Reason, "fewer than 3") || !strings.Contains(r[0].Reason, "weight input wk_act is not an initializer") {
		t.Errorf("refusals %v", r)
	}

	b := graph.NewBuilder("lone")
	x := b.Input("x", graph.Float64, 2, 8)
	b.Output(b.MatMul(x, b.Param("w", graph.Float64, graph.Shape{8, 8}, graph.Normal(1, 1))))
	lone, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if out, log := fzRun(t, one, lone); out != lone || len(log.Events()) != 0 {
		t.Errorf("a lone MatMul: rewritten %v, log %v", out != lone, log.Events())
	}
}

// disjoint_sums turns dq|0|0 + 0|dk|0 + 0|0|dv into dq|dk|dv (reusing a
// zero block where it fits, making one where it does not), computes the
// same values, and refuses overlapping blocks.
func TestDisjointSums(t *testing.T) {
	zeros := func(b *graph.Builder, name string, n int) *graph.Value {
		return b.Const(name, graph.Float64, graph.Shape{2, n}, graph.Zeros())
	}
	b := graph.NewBuilder("sums")
	dq, dk, dv := b.Input("dq", graph.Float64, 2, 4), b.Input("dk", graph.Float64, 2, 2), b.Input("dv", graph.Float64, 2, 2)
	cq := b.Concat(1, dq, zeros(b, "z4", 4))
	ck := b.Concat(1, zeros(b, "z4b", 4), dk, zeros(b, "z2", 2))
	cv := b.Concat(1, zeros(b, "z6", 6), dv)
	b.Output(b.Rename(b.Add(b.Add(cq, ck), cv), "d"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := fzRun(t, Pipeline{Name: "sums", Passes: []Pass{DisjointSums()}}, g)
	if fzCount(out, "Add") != 0 || fzCount(out, "Concat") != 1 {
		t.Fatalf("ops after disjoint_sums: %v\n%s", out.CountOps(), graph.Format(out))
	}
	c := fzNodes(out, "Concat")[0]
	if len(c.Inputs) != 3 || c.Inputs[0] != out.Values()["dq"] || c.Inputs[1] != out.Values()["dk"] || c.Inputs[2] != out.Values()["dv"] {
		t.Errorf("Concat of %v", c.Inputs)
	}
	fzSameOutputs(t, g, out, graph.Float64)

	b = graph.NewBuilder("overlap")
	p, q := b.Input("p", graph.Float64, 2, 4), b.Input("q", graph.Float64, 2, 4)
	b.Output(b.Rename(b.Add(b.Concat(1, p, zeros(b, "za", 2)), b.Concat(1, zeros(b, "zb", 2), q)), "d"))
	g, err = b.Build()
	if err != nil {
		t.Fatal(err)
	}
	log := &Log{}
	if out, err := DisjointSums().Run(g, log); err != nil || out != g {
		t.Fatalf("overlapping blocks: rewritten %v, %v", out != g, err)
	}
	if r := log.Filter(PassDisjointSums, Refused); len(r) != 1 || !strings.Contains(r[0].Reason, "p and q overlap") {
		t.Errorf("refusals %v", r)
	}
}
