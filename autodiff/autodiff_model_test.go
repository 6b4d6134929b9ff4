package autodiff

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
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

// fuse runs the default fusing pipeline, verifying after every pass.
func fuse(t *testing.T, g *graph.Graph) *graph.Graph {
	t.Helper()
	pl := passes.Default(true)
	pl.Verify = true
	fg, err := pl.Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fg
}

// squareValues lists the values of g whose last two dims are both s: the
// [.., S, S] score and probability tensors that fusion must remove.
func squareValues(g *graph.Graph, s int) []string {
	var out []string
	for name, v := range g.Values() {
		sh := v.Type.Shape
		if r := sh.Rank(); r >= 2 && sh[r-1] == s && sh[r-2] == s {
			out = append(out, name+" "+v.Type.String())
		}
	}
	return out
}

// TestAutodiffFusedTrainingGraphHasNoSxS: with fusion on, the training
// graph attends with FlashAttention forward and FlashAttentionGrad backward
// and holds no S×S tensor anywhere; the unfused one does (so the scan is
// looking at the right thing).
func TestAutodiffFusedTrainingGraphHasNoSxS(t *testing.T) {
	cfg := tinyConfig(t, graph.Float32)
	g := buildModel(t, cfg)
	plain, err := TrainingGraph(g, TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sq := squareValues(plain.Graph, cfg.Seq); len(sq) == 0 {
		t.Fatal("the unfused training graph has no S×S value: the scan is broken")
	}
	ts, err := TrainingGraph(fuse(t, g), TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkStatic(t, ts.Graph)
	ops := ts.Graph.CountOps()
	if ops["FlashAttention"] != cfg.Layers || ops["FlashAttentionGrad"] != cfg.Layers {
		t.Errorf("FlashAttention %d, FlashAttentionGrad %d, want %d each", ops["FlashAttention"], ops["FlashAttentionGrad"], cfg.Layers)
	}
	if ops["Softmax"]+ops["SoftmaxGrad"] != 0 {
		t.Errorf("fused training graph still has Softmax %d, SoftmaxGrad %d", ops["Softmax"], ops["SoftmaxGrad"])
	}
	if sq := squareValues(ts.Graph, cfg.Seq); len(sq) != 0 {
		t.Errorf("fused training graph has S×S values: %v", sq)
	}
	t.Logf("training graph: %d nodes unfused, %d fused", len(plain.Graph.Nodes), len(ts.Graph.Nodes))
}

// TestGradFusedMatchesUnfused: the tiny model in float64, fused and
// unfused, on the same parameters and batch: the loss and every parameter
// gradient agree to 1e-10.
func TestGradFusedMatchesUnfused(t *testing.T) {
	const tol = 1e-10
	cfg := tinyConfig(t, graph.Float64)
	g := buildModel(t, cfg)
	feeds := tinyFeeds(cfg, 4)
	results := [2]map[string]*graph.Tensor{}
	names := [2]map[string]string{}
	for i, gi := range []*graph.Graph{g, fuse(t, g)} {
		gg, grads, err := Gradients(gi, "loss", paramNames(g))
		if err != nil {
			t.Fatal(err)
		}
		results[i] = run(t, compile(t, gg, backend.Options{PoisonOutputs: true}), feeds)
		names[i] = grads
	}
	l0, l1 := results[0]["loss"].At(0), results[1]["loss"].At(0)
	if math.Abs(l0-l1) > tol*math.Abs(l0) {
		t.Errorf("loss: unfused %.15g, fused %.15g", l0, l1)
	}
	worst := 0.0
	for _, p := range g.Params {
		a, b := results[0][names[0][p.Name]].F64, results[1][names[1][p.Name]].F64
		scale := 0.0
		for _, v := range a {
			scale = math.Max(scale, math.Abs(v))
		}
		bad := 0
		for i := range a {
			// Relative to the entry, or to 1e-3 of the tensor's largest for
			// entries that are sums cancelling to almost nothing.
			e := math.Abs(a[i]-b[i]) / math.Max(math.Abs(a[i]), 1e-3*scale)
			if scale == 0 {
				e = math.Abs(b[i])
			}
			worst = math.Max(worst, e)
			if !(e <= tol) {
				if bad++; bad <= 3 {
					t.Errorf("%s[%d]: unfused %.15g, fused %.15g (relative error %.2g)", p.Name, i, a[i], b[i], e)
				}
			}
		}
	}
	t.Logf("loss %.12f; %d parameter gradients, worst relative difference fused vs unfused %.2g", l0, len(g.Params), worst)
}
