package generate

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

func logitsOf(vals ...float64) *graph.Tensor {
	t := graph.NewTensor(graph.Float64, graph.Shape{1, len(vals)})
	copy(t.F64, vals)
	return t
}

// Top-p keeps the smallest set of most likely tokens whose probability
// reaches p: with probabilities 0.5, 0.3, 0.15, 0.05, p = 0.75 keeps the
// first two, p = 0.85 the first three.
func TestTopPKeepsTheNucleus(t *testing.T) {
	lg := logitsOf(math.Log(0.5), math.Log(0.3), math.Log(0.15), math.Log(0.05))
	for _, c := range []struct {
		p    float64
		keep int
	}{{0.75, 2}, {0.85, 3}, {0.5, 1}, {1, 4}} {
		r := rand.New(rand.NewPCG(1, 2))
		seen := map[int64]int{}
		for range 4000 {
			seen[pick(lg, Sampling{Temperature: 1, TopP: c.p}, r)]++
		}
		if len(seen) != c.keep {
			t.Errorf("top-p %v: sampled %d distinct tokens %v, want %d", c.p, len(seen), seen, c.keep)
		}
		for id := range seen {
			if id >= int64(c.keep) {
				t.Errorf("top-p %v: sampled token %d, outside the nucleus", c.p, id)
			}
		}
	}
}

func TestSamplingValidate(t *testing.T) {
	for _, c := range []struct {
		s    Sampling
		want string
	}{
		{Sampling{Temperature: math.NaN()}, "-temperature"},
		{Sampling{Temperature: 1, TopK: -1}, "-top-k"},
		{Sampling{Temperature: 1, TopP: 1.5}, "-top-p"},
		{Sampling{TopK: 5}, "give a -temperature above 0"},
		{Sampling{TopP: 0.9}, "give a -temperature above 0"},
	} {
		if err := c.s.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.s, err, c.want)
		}
	}
	for _, s := range []Sampling{{}, {Temperature: 0.8, TopK: 40, TopP: 0.95}, {TopP: 1}} {
		if err := s.Validate(); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
}

// Weights with a NaN give non-finite logits: an error, and no token.
func TestNonFiniteLogitsAreRefused(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	weights := map[string]*graph.Tensor{}
	for _, p := range cfg.Params() {
		w := graph.NewTensor(graph.Float32, p.Shape)
		for i := range w.F32 {
			w.F32[i] = 0.01
		}
		weights[p.Name] = w
	}
	weights["layers.0.wo"].F32[0] = float32(math.NaN()) // every position reads it
	var got []int64
	_, _, err := Generate(cpu.New(), cfg, weights, []int64{0, 1}, 4, Sampling{}, func(t int64) { got = append(got, t) })
	if err == nil || !strings.Contains(err.Error(), "not finite") || len(got) != 0 {
		t.Fatalf("err %v, tokens %v", err, got)
	}
}

// GenerateUntil stops when the callback says so.
func TestGenerateUntilStops(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	var n int
	out, st, err := GenerateUntil(cpu.New(), cfg, nil, []int64{1, 2}, 10, Sampling{}, func(int64) bool { n++; return n < 3 })
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || st.NewTokens != 3 {
		t.Errorf("stopped after %d tokens (stats %d), want 3", len(out), st.NewTokens)
	}
}
