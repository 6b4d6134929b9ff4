package generate

import (
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

// fullRecompute is greedy decoding without a cache: every step runs the
// training model's forward graph (model.Build, batch 1) over the whole
// sequence so far and takes the argmax of the last position's logits.
func fullRecompute(t *testing.T, cfg model.Config, prompt []int64, maxNew int) []int64 {
	t.Helper()
	seq := slices.Clone(prompt)
	var out []int64
	for range maxNew {
		c := cfg
		c.Batch, c.Seq = 1, len(seq)
		g, err := model.Build(c)
		if err != nil {
			t.Fatal(err)
		}
		exe, err := cpu.New().Compile(g, backend.Options{})
		if err != nil {
			t.Fatal(err)
		}
		tokens := graph.NewTensor(graph.Int64, graph.Shape{1, len(seq)})
		copy(tokens.I64, seq)
		res, err := exe.Run(map[string]*graph.Tensor{"tokens": tokens, "targets": graph.NewTensor(graph.Int64, graph.Shape{1, len(seq)})})
		exe.Close()
		if err != nil {
			t.Fatal(err)
		}
		logits := res["logits"]
		V := cfg.Vocab
		best := 0
		for v := 1; v < V; v++ {
			if logits.At((len(seq)-1)*V+v) > logits.At((len(seq)-1)*V+best) {
				best = v
			}
		}
		seq = append(seq, int64(best))
		out = append(out, int64(best))
	}
	return out
}

func testConfig(t *testing.T, dt graph.DType) model.Config {
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.DType, cfg.Seed = dt, 5
	return cfg
}

// The KV-cached greedy output is the full-recompute greedy output of the
// same model, token for token.
func TestCachedGreedyEqualsFullRecompute(t *testing.T) {
	prompt := []int64{'f', 'u', 'n', 'c', ' '}
	for _, dt := range []graph.DType{graph.Float64, graph.Float32} {
		cfg := testConfig(t, dt)
		maxNew := cfg.Seq - len(prompt) + 1 // fills the context
		got, st, err := Generate(cpu.New(), cfg, nil, prompt, maxNew, Sampling{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := fullRecompute(t, cfg, prompt, maxNew)
		if !slices.Equal(got, want) {
			t.Errorf("%v: cached %v\nfull     %v", dt, got, want)
		}
		if st.NewTokens != maxNew || st.TokensPerSec() <= 0 {
			t.Errorf("stats %+v", st)
		}
		// Distinct tokens: the check is not passing on a constant output.
		if len(slices.Compact(slices.Sorted(slices.Values(got)))) < 2 {
			t.Logf("%v: output is one repeated token %v", dt, got)
		}
	}
}

func TestSampling(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	prompt := []int64{'a'}
	greedy, _, err := Generate(cpu.New(), cfg, nil, prompt, 8, Sampling{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// top-k 1 is greedy whatever the temperature.
	top1, _, err := Generate(cpu.New(), cfg, nil, prompt, 8, Sampling{Temperature: 2, TopK: 1, Seed: 9}, nil)
	if err != nil || !slices.Equal(top1, greedy) {
		t.Errorf("top-k 1: %v, greedy %v (%v)", top1, greedy, err)
	}
	// A seed gives the same sample twice, another seed another one.
	var seen [][]int64
	for _, seed := range []uint64{1, 1, 2} {
		var streamed []int64
		out, _, err := Generate(cpu.New(), cfg, nil, prompt, 16, Sampling{Temperature: 1, Seed: seed}, func(tok int64) { streamed = append(streamed, tok) })
		if err != nil || !slices.Equal(out, streamed) {
			t.Fatalf("seed %d: %v, streamed %v (%v)", seed, out, streamed, err)
		}
		seen = append(seen, out)
	}
	if !slices.Equal(seen[0], seen[1]) || slices.Equal(seen[0], seen[2]) {
		t.Errorf("samples by seed 1, 1, 2: %v", seen)
	}
}

func TestGenerateRefuses(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	for _, c := range []struct {
		prompt []int64
		maxNew int
		s      Sampling
		want   string
	}{
		{nil, 4, Sampling{}, "empty prompt"},
		{make([]int64, 30), 4, Sampling{}, "the model's context (-seq it was trained with) is 32"},
		{[]int64{256}, 4, Sampling{}, "outside the vocabulary"},
		{[]int64{1}, 0, Sampling{}, "at least 1 new token"},
		{[]int64{1}, 4, Sampling{Temperature: -1}, "temperature"},
	} {
		_, _, err := Generate(cpu.New(), cfg, nil, c.prompt, c.maxNew, c.s, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("prompt %d tokens, %d new: err %v, want %q", len(c.prompt), c.maxNew, err, c.want)
		}
	}
}

// The prefill graph's attention is fused; the decode graph's reads the cache.
func TestPrefillIsFused(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	g, err := model.BuildPrefill(cfg, 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := passes.RequireFused(g); err != nil {
		t.Error(err)
	}
	d, err := model.BuildDecode(cfg, cfg.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if c := d.CountOps(); c["Concat"] < 2*cfg.Layers || c["Softmax"] != cfg.Layers {
		t.Errorf("decode graph ops %v", c)
	}
}
