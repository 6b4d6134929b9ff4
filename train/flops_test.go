package train

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// The count of a hand-built graph, product by product.
func TestGraphFLOPsCountsProducts(t *testing.T) {
	b := graph.NewBuilder("flops")
	x := b.Input("x", graph.Float32, 4, 8)
	w := b.Input("w", graph.Float32, 8, 16)
	b.Output(b.MatMul(x, w)) // 2·4·16·8
	q := b.Input("q", graph.Float32, 2, 3, 32, 16)
	k := b.Input("k", graph.Float32, 2, 3, 32, 16)
	v := b.Input("v", graph.Float32, 2, 3, 32, 16)
	b.Output(b.Attention(q, k, v, 0.25, nil).Out) // unfused: Q·Kᵀ and P·V as MatMuls
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	f := GraphFLOPs(g)
	want := 2.0*4*16*8 + 2*(2*6*32*32*16)
	if f.Model != want || f.Hardware != want {
		t.Fatalf("GraphFLOPs = %+v, want %v for both", f, want)
	}
}

// A training step does three times its forward's matrix work: each product
// has two products in the backward (the gradients of both operands), and
// FlashAttention's four backward products are twice its two forward ones.
// The attention scores the backward recomputes are hardware FLOPs only.
func TestStepModelFLOPsAreThreeForwards(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	for _, fuse := range []bool{false, true} {
		gs, err := BuildGraphs(cfg, fuse, testHyper(10))
		if err != nil {
			t.Fatal(err)
		}
		fwd, step := GraphFLOPs(gs.Forward), GraphFLOPs(gs.Step.Graph)
		if rel := math.Abs(step.Model-3*fwd.Model) / (3 * fwd.Model); rel > 1e-12 {
			t.Errorf("fuse=%v: step model FLOPs %g, 3× forward %g (rel %.3g)", fuse, step.Model, 3*fwd.Model, rel)
		}
		if fuse && !(step.Hardware > step.Model) {
			t.Errorf("fused step: hardware FLOPs %g should exceed model FLOPs %g (scores recomputed)", step.Hardware, step.Model)
		}
		if !fuse && step.Hardware != step.Model {
			t.Errorf("unfused step: hardware %g != model %g", step.Hardware, step.Model)
		}
	}
}

// -recompute adds hardware work, not model work: MFU does not rise because
// a run recomputes.
func TestModelFLOPsIgnoreRecompute(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	plain, err := BuildGraphs(cfg, true, testHyper(10))
	if err != nil {
		t.Fatal(err)
	}
	h := testHyper(10)
	h = h.WithRecompute(RecomputeFull)
	rec, err := BuildGraphs(cfg, true, h)
	if err != nil {
		t.Fatal(err)
	}
	clones := 0
	for _, n := range rec.Step.Graph.Nodes {
		if strings.HasPrefix(n.Name, recomputeClonePrefix) && (n.Op == "MatMul" || n.Op == "FlashAttention") {
			clones++
		}
	}
	if clones == 0 {
		t.Fatalf("no recomputed product is named %q*: the prefix passes.Recompute uses has changed", recomputeClonePrefix)
	}
	p, r := GraphFLOPs(plain.Step.Graph), GraphFLOPs(rec.Step.Graph)
	if p.Model != r.Model {
		t.Errorf("model FLOPs: %g plain, %g with -recompute", p.Model, r.Model)
	}
	if !(r.Hardware > p.Hardware) {
		t.Errorf("hardware FLOPs: %g plain, %g with -recompute (should grow)", p.Hardware, r.Hardware)
	}
}

func TestPeakTable(t *testing.T) {
	p, ok := PeakFLOPS("NVIDIA H200", graph.BFloat16)
	if !ok || p.FLOPS != 989e12 {
		t.Fatalf("H200 bf16: %+v %v", p, ok)
	}
	if _, ok := PeakFLOPS("cpu", graph.Float32); ok {
		t.Error("the CPU has a peak in the table")
	}
	if _, ok := PeakFLOPS("NVIDIA H200 NVL", graph.BFloat16); ok {
		t.Error("H200 NVL matched the SXM part")
	}
	if got := MFU(6e9, 100e3, 989e12); math.Abs(got-6e14/989e12) > 1e-15 {
		t.Errorf("MFU = %v", got)
	}
	if MFU(1, 1, 0) != 0 {
		t.Error("MFU with no peak")
	}
}

func TestWindowKeepsRecentSteps(t *testing.T) {
	var w window
	if w.steps() != 0 || w.stepTime() != 0 {
		t.Fatal("empty window")
	}
	w.add(time.Hour, time.Hour) // a slow step that leaves the window
	for range windowSteps {
		w.add(10*time.Millisecond, 20*time.Millisecond)
	}
	if w.steps() != windowSteps || w.stepTime() != 10*time.Millisecond || w.wallTime() != 20*time.Millisecond {
		t.Fatalf("window: %d steps, step %v, wall %v", w.steps(), w.stepTime(), w.wallTime())
	}
}

// The result's steady state leaves the first step out and reports compile
// and first step apart; the progress lines never print a rate from the
// first step.
func TestRunReportsSteadyState(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	var log strings.Builder
	res, err := Run(context.Background(), cpu.New(), testCorpus(t), Options{Config: cfg, Hyper: testHyper(5), Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if res.SteadySteps != 4 || res.Compile <= 0 || res.FirstStep <= 0 || res.SteadyStep <= 0 {
		t.Fatalf("steady %d steps of %v, compile %v, first step %v", res.SteadySteps, res.SteadyStep, res.Compile, res.FirstStep)
	}
	// TrainTime is the first step plus the others; the window holds the others.
	if got := res.FirstStep + time.Duration(res.SteadySteps)*res.SteadyStep; absDur(got-res.TrainTime) > time.Duration(res.SteadySteps) {
		t.Errorf("first %v + %d × %v != train time %v", res.FirstStep, res.SteadySteps, res.SteadyStep, res.TrainTime)
	}
	want := float64(cfg.Batch*cfg.Seq) / res.SteadyStep.Seconds()
	if got := res.SteadyTokensPerSec(); math.Abs(got-want) > 1e-9*want {
		t.Errorf("steady tokens/s %v, want %v", got, want)
	}
	if res.FLOPsPerToken <= 0 || res.MFU() != 0 {
		t.Errorf("FLOPs/token %v, MFU without a peak %v", res.FLOPsPerToken, res.MFU())
	}
	res.Peak = Peak{FLOPS: 1e12}
	if got, want := res.MFU(), res.FLOPsPerToken*res.SteadyTokensPerSec()/1e12; math.Abs(got-want) > 1e-12*want {
		t.Errorf("MFU %v, want %v", got, want)
	}
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.HasPrefix(l, "step 1/") && strings.Contains(l, "tok/s") {
			t.Errorf("step 1 reports a rate: %q", l)
		}
	}
	if !strings.Contains(log.String(), "compile: ") || !strings.Contains(log.String(), "first step ") {
		t.Errorf("compile and first step not reported:\n%s", log.String())
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
