package passes

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// tinyFeeds returns random tokens and targets for cfg.
func tinyFeeds(cfg model.Config, seed uint64) map[string]*graph.Tensor {
	rng := rand.New(rand.NewPCG(seed, 5))
	feeds := map[string]*graph.Tensor{}
	for _, name := range []string{"tokens", "targets"} {
		t := graph.NewTensor(graph.Int64, graph.Shape{cfg.Batch, cfg.Seq})
		for i := range t.I64 {
			t.I64[i] = rng.Int64N(int64(cfg.Vocab))
		}
		feeds[name] = t
	}
	return feeds
}

// TestGradTinyModelFiniteDifference: the whole tiny model in float64, every
// parameter's gradient from the autodiff graph against central differences
// of the forward graph's loss on a sample of entries.
func TestGradTinyModelFiniteDifference(t *testing.T) {
	cfg := tinyConfig(t, graph.Float64)
	g := buildModel(t, cfg)
	gg, grads, err := Gradients(g, "loss", paramNames(g))
	if err != nil {
		t.Fatal(err)
	}
	feeds := tinyFeeds(cfg, 1)
	out := run(t, compile(t, gg, backend.Options{PoisonOutputs: true}), feeds)
	fwd := compile(t, g, backend.Options{})
	lossAt := func() float64 { return run(t, fwd, feeds)["loss"].At(0) }
	if l := lossAt(); l != out["loss"].At(0) {
		t.Fatalf("loss %v, forward graph says %v", out["loss"].At(0), l)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	worst := 0.0
	for _, p := range g.Params {
		x, err := fwd.Initializer(p.Name)
		if err != nil {
			t.Fatal(err)
		}
		// The executable holds its own copy: perturb it through SetInitializer.
		set := func() {
			if err := fwd.SetInitializer(p.Name, x); err != nil {
				t.Fatal(err)
			}
		}
		r := checkFD(t, rng, p.Name, x, out[grads[p.Name]], 6, func() float64 { set(); return lossAt() })
		set()
		worst = math.Max(worst, r.worst)
	}
	t.Logf("%d params, worst relative error against finite differences %.2g", len(g.Params), worst)
}
