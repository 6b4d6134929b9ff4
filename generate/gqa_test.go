package generate

import (
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// Grouped-query attention decodes like the model it was trained as: the
// cache holds the KV key/value heads (not repeated to the query heads), and
// the cached greedy output is the full-recompute one.
func TestCachedGreedyEqualsFullRecomputeGQA(t *testing.T) {
	for _, kv := range []int{1, 2} {
		for _, dt := range []graph.DType{graph.Float64, graph.Float32} {
			cfg := testConfig(t, dt)
			cfg.KVHeads = kv
			prompt := []int64{'g', 'q', 'a'}
			got, st, err := Generate(cpu.New(), cfg, nil, prompt, 10, Sampling{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := fullRecompute(t, cfg, prompt, 10); !slices.Equal(got, want) {
				t.Errorf("kv heads %d, %v: cached %v\nfull     %v", kv, dt, got, want)
			}
			// K and V of every layer, kv heads, the whole context.
			want := int64(2*cfg.Layers*kv*cfg.Seq*cfg.HeadDim) * int64(dt.Size())
			if st.CacheBytes != want || model.CacheBytes(cfg, cfg.Seq) != want {
				t.Errorf("kv heads %d, %v: the cache held %d bytes (model.CacheBytes %d), want %d", kv, dt, st.CacheBytes, model.CacheBytes(cfg, cfg.Seq), want)
			}
		}
	}
}

// The decode graph Generate plans (Graphs) takes the cache at KV heads.
func TestGraphsCacheInputsGQA(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	cfg.KVHeads = 2
	gs, err := Graphs(cfg, 4, 8)
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 2 {
		t.Fatalf("%d graphs, want prefill and decode", len(gs))
	}
	n := 0
	for _, in := range gs[1].Inputs {
		if in.Name == model.CacheKey(0) || in.Name == model.CacheValue(1) {
			n++
			if want := (graph.Shape{1, 2, cfg.Seq, cfg.HeadDim}); !in.Type.Shape.Equal(want) {
				t.Errorf("%s is %v, want %v", in.Name, in.Type.Shape, want)
			}
		}
	}
	if n != 2 {
		t.Errorf("decode graph lacks the cache inputs %s, %s", model.CacheKey(0), model.CacheValue(1))
	}
	if c := gs[1].CountOps(); c["Expand"] != 0 {
		t.Errorf("decode graph repeats K/V: ops %v", c)
	}
}
