package model

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// gqaTiny is tiny with kv key/value heads for its 4 query heads.
func gqaTiny(t *testing.T, kv int) Config {
	t.Helper()
	c, err := Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	c.KVHeads, c.DType = kv, graph.Float64
	return c
}

func TestModelGQAParamsAndValidate(t *testing.T) {
	c := gqaTiny(t, 2)
	for _, p := range c.Params() {
		if strings.HasSuffix(p.Name, ".wk") || strings.HasSuffix(p.Name, ".wv") {
			if want := (graph.Shape{c.Dim, 2 * c.HeadDim}); !p.Shape.Equal(want) {
				t.Errorf("%s is %v, want %v", p.Name, p.Shape, want)
			}
		}
	}
	mha := c
	mha.KVHeads = 0
	if ParamCount(c) >= ParamCount(mha) || c.FLOPsPerToken() >= mha.FLOPsPerToken() {
		t.Errorf("2 kv heads: %d params, %d FLOPs/token; 4: %d, %d", ParamCount(c), c.FLOPsPerToken(), ParamCount(mha), mha.FLOPsPerToken())
	}
	// kv_heads == heads is plain attention, with the graph of KVHeads 0.
	same := c
	same.KVHeads = c.Heads
	if formatOf(t, same) != formatOf(t, mha) {
		t.Error("KVHeads == Heads builds another graph than KVHeads 0")
	}
	for _, kv := range []int{-1, 3, 8} {
		b := c
		b.KVHeads = kv
		if err := b.Validate(); err == nil || !strings.Contains(err.Error(), "kv_heads") {
			t.Errorf("kv_heads %d of 4 heads: Validate says %v", kv, err)
		}
	}
	v := c
	v.Vocab = 1
	if err := v.Validate(); err == nil || !strings.Contains(err.Error(), "vocab") {
		t.Errorf("vocab 1: Validate says %v", err)
	}
}

// TestModelGQAFusesEveryLayer: the repeated K/V of grouped-query attention
// (Reshape, Expand, Reshape) keep every layer's attention fusable; the fused
// FlashAttention reads the kv-headed K and V, the repeats are gone, and the
// fused graph computes what the unfused one does.
func TestModelGQAFusesEveryLayer(t *testing.T) {
	for _, kv := range []int{1, 2} {
		c := gqaTiny(t, kv)
		c.Layers = 3
		g := mustBuild(t, c)
		if n := g.CountOps()["Expand"]; n != 2*c.Layers {
			t.Errorf("kv %d: %d Expand nodes, want one for K and one for V per layer (%d)", kv, n, 2*c.Layers)
		}
		if err := passes.RequireFused(g); err != nil {
			t.Fatalf("kv %d: %v", kv, err)
		}
		fused, err := passes.Default(true).Run(g, nil)
		if err != nil {
			t.Fatal(err)
		}
		ops := fused.CountOps()
		if ops["FlashAttention"] != c.Layers || ops["Softmax"] != 0 || ops["Expand"] != 0 {
			t.Fatalf("kv %d: fused graph has %d FlashAttention, %d Softmax and %d Expand for %d layers; want no repeat left", kv, ops["FlashAttention"], ops["Softmax"], ops["Expand"], c.Layers)
		}
		rng := rand.New(rand.NewPCG(3, uint64(kv)))
		tokens, targets := randomTokens(c, rng), randomTokens(c, rng)
		a, b := runModel(t, g, tokens, targets), runModel(t, fused, tokens, targets)
		if d := maxDiff(a["logits"], b["logits"]); d > 1e-9 {
			t.Errorf("kv %d: fused and unfused logits differ by %g", kv, d)
		}
	}
}

// TestModelGQAIsRepeatedKV: a GQA model computes what the multi-head model
// does whose wk and wv repeat each key/value head's columns for the
// Heads/KVHeads query heads of its group (query head h reads kv head
// h/(Heads/KVHeads), as LLaMA's repeat_kv does).
func TestModelGQAIsRepeatedKV(t *testing.T) {
	c := gqaTiny(t, 2)
	mha := c
	mha.KVHeads = 0
	be := cpu.New()
	gqaExe, err := be.Compile(mustBuild(t, c), backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer gqaExe.Close()
	mhaExe, err := be.Compile(mustBuild(t, mha), backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mhaExe.Close()
	group, D := c.Heads/c.KV(), c.HeadDim
	for _, p := range mha.Params() {
		w, err := gqaExe.Initializer(p.Name)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(p.Name, ".wk") || strings.HasSuffix(p.Name, ".wv") {
			r := graph.NewTensor(w.DType, p.Shape)
			for i := range c.Dim {
				for h := range c.Heads {
					for d := range D {
						r.Set(i*c.Heads*D+h*D+d, w.At(i*c.KV()*D+(h/group)*D+d))
					}
				}
			}
			w = r
		}
		if err := mhaExe.SetInitializer(p.Name, w); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	feeds := map[string]*graph.Tensor{"tokens": randomTokens(c, rng), "targets": randomTokens(c, rng)}
	a, err := gqaExe.Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	b, err := mhaExe.Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	if d := maxDiff(a["logits"], b["logits"]); d > 1e-12 {
		t.Errorf("GQA logits differ from the repeated-KV multi-head model's by %g", d)
	}
}

func maxDiff(a, b *graph.Tensor) float64 {
	if a.Len() != b.Len() {
		return math.Inf(1)
	}
	var m float64
	for i := range a.Len() {
		m = max(m, math.Abs(a.At(i)-b.At(i)))
	}
	return m
}
