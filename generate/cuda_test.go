package generate

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// TestGenerateCUDA (needs a GPU): the same prefill and decode graphs on the
// CUDA backend write the CPU's greedy text, with the cache at the KV heads
// (kv 1 and 2) and for plain multi-head attention (0). float32 on both
// sides; the weights are random with std 0.3, so the logits are spread
// wide and a rounding difference does not decide the argmax.
func TestGenerateCUDA(t *testing.T) {
	if why := cuda.Available(); why != nil {
		t.Skipf("no CUDA: %v", why)
	}
	prompt := []int64{'g', 'q', 'a', ' '}
	for _, kv := range []int{0, 1, 2} {
		cfg := testConfig(t, graph.Float32)
		cfg.KVHeads = kv
		rng := rand.New(rand.NewPCG(21, uint64(kv)))
		w := map[string]*graph.Tensor{}
		for _, p := range cfg.Params() {
			x := graph.NewTensor(graph.Float32, p.Shape)
			for i := range x.Len() {
				if strings.HasSuffix(p.Name, "norm") {
					x.Set(i, 1+0.2*rng.NormFloat64())
				} else {
					x.Set(i, 0.3*rng.NormFloat64())
				}
			}
			w[p.Name] = x
		}
		want, _, err := Generate(cpu.New(), cfg, w, prompt, 16, Sampling{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		be, err := cuda.NewMixedBackend(false)
		if err != nil {
			t.Fatal(err)
		}
		got, st, err := Generate(be, cfg, w, prompt, 16, Sampling{}, nil)
		be.Close()
		if err != nil {
			t.Fatalf("kv %d: %v", kv, err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("kv %d: CUDA %v\nCPU  %v", kv, got, want)
		}
		if st.CacheBytes != model.CacheBytes(cfg, cfg.Seq) {
			t.Errorf("kv %d: cache %d bytes, want %d", kv, st.CacheBytes, model.CacheBytes(cfg, cfg.Seq))
		}
		t.Logf("kv %d: %q, cache %d bytes, %.0f tokens/s", kv, string(bytesOf(got)), st.CacheBytes, st.TokensPerSec())
	}
}

func bytesOf(ts []int64) []byte {
	b := make([]byte, len(ts))
	for i, t := range ts {
		b[i] = byte(t)
	}
	return b
}
