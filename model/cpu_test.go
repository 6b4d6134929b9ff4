package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// These tests run the built graph on the CPU reference backend. They check
// properties of the model that do not depend on how the graph is written, so
// they hold for tools/reference/torch_model.py too: that is the contract.

// runModel compiles g on the CPU backend and runs it on tokens and targets.
func runModel(t *testing.T, g *graph.Graph, tokens, targets *graph.Tensor) map[string]*graph.Tensor {
	t.Helper()
	exe, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	out, err := exe.Run(map[string]*graph.Tensor{"tokens": tokens, "targets": targets})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// randomTokens returns a [B, S] int64 tensor of bytes.
func randomTokens(cfg Config, rng *rand.Rand) *graph.Tensor {
	t := graph.NewTensor(graph.Int64, graph.Shape{cfg.Batch, cfg.Seq})
	for i := range t.I64 {
		t.I64[i] = rng.Int64N(int64(cfg.Vocab))
	}
	return t
}

// TestModelTinyLossCPU: with weights of std 0.02 the logits are near zero, so
// an untrained model predicts about uniformly and its loss is about ln(V).
func TestModelTinyLossCPU(t *testing.T) {
	cfg, _ := Lookup("tiny")
	rng := rand.New(rand.NewPCG(1, 2))
	out := runModel(t, mustBuild(t, cfg), randomTokens(cfg, rng), randomTokens(cfg, rng))
	loss := out["loss"].At(0)
	if want := math.Log(float64(cfg.Vocab)); math.IsNaN(loss) || math.Abs(loss-want) > 0.1 {
		t.Errorf("untrained tiny loss %v, want ln(%d) = %v ± 0.1", loss, cfg.Vocab, want)
	}
	if s := out["logits"].Shape; !s.Equal(graph.Shape{cfg.Batch, cfg.Seq, cfg.Vocab}) {
		t.Errorf("logits shape %v", s)
	}
}

// TestModelFloat64Properties checks, in float64, two things any correct
// implementation of MODEL.md satisfies, computed here independently of the
// graph: causality (changing token p changes no logits before p, in any
// batch row, and does change the logits at p) and the loss being the mean
// cross-entropy of the returned logits against the targets, row-major over
// [B, S].
func TestModelFloat64Properties(t *testing.T) {
	cfg, _ := Lookup("tiny")
	cfg.DType = graph.Float64
	cfg.Batch, cfg.Seq = 2, 16
	g := mustBuild(t, cfg)
	rng := rand.New(rand.NewPCG(3, 4))
	tokens, targets := randomTokens(cfg, rng), randomTokens(cfg, rng)
	base := runModel(t, g, tokens, targets)
	logits := base["logits"]
	S, V := cfg.Seq, cfg.Vocab

	// Loss: -mean over rows of log softmax(logits)[target].
	var sum float64
	for r := range cfg.Batch * S {
		row := logits.F64[r*V : (r+1)*V]
		m := math.Inf(-1)
		for _, x := range row {
			m = max(m, x)
		}
		var z float64
		for _, x := range row {
			z += math.Exp(x - m)
		}
		sum += m + math.Log(z) - row[targets.I64[r]]
	}
	if want, got := sum/float64(cfg.Batch*S), base["loss"].At(0); math.Abs(got-want) > 1e-12 {
		t.Errorf("loss %v, cross-entropy of the logits %v", got, want)
	}

	const p = 9 // a position in the middle of the sequence, batch row 0
	changed := tokens.Clone()
	changed.I64[p] = (changed.I64[p] + 1) % int64(V)
	after := runModel(t, g, changed, targets)["logits"]
	for b := range cfg.Batch {
		for s := range S {
			var diff float64
			for v := range V {
				i := (b*S+s)*V + v
				diff = max(diff, math.Abs(after.F64[i]-logits.F64[i]))
			}
			affected := b == 0 && s >= p
			switch {
			case !affected && diff > 1e-12:
				t.Errorf("changing token %d of row 0 changed the logits of row %d position %d by %g", p, b, s, diff)
			case b == 0 && s == p && diff < 1e-6:
				t.Errorf("changing token %d did not change its own logits (diff %g)", p, diff)
			}
		}
	}
}
