package generate

import (
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// Grouped-query attention decodes like the model it was trained as: the
// cache holds the repeated keys and values, and the cached greedy output is
// the full-recompute one.
func TestCachedGreedyEqualsFullRecomputeGQA(t *testing.T) {
	for _, kv := range []int{1, 2} {
		cfg := testConfig(t, graph.Float64)
		cfg.KVHeads = kv
		prompt := []int64{'g', 'q', 'a'}
		got, _, err := Generate(cpu.New(), cfg, nil, prompt, 10, Sampling{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := fullRecompute(t, cfg, prompt, 10); !slices.Equal(got, want) {
			t.Errorf("kv heads %d: cached %v\nfull     %v", kv, got, want)
		}
	}
}
