package train

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

func TestScheduleShape(t *testing.T) {
	s := Schedule{Peak: 1e-3, Min: 1e-4, Warmup: 10, Total: 110}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		i    int64
		want float64
	}{{0, 1e-4}, {4, 5e-4}, {9, 1e-3}, {10, 1e-3}, {60, 5.5e-4}, {110, 1e-4}, {500, 1e-4}} {
		if got := s.LR(c.i); math.Abs(got-c.want) > 1e-15 {
			t.Errorf("LR(%d) = %v, want %v", c.i, got, c.want)
		}
	}
	for i := int64(10); i < 110; i++ {
		if s.LR(i+1) > s.LR(i) {
			t.Fatalf("LR rises after warmup at step %d", i)
		}
	}
	for _, bad := range []Schedule{{Peak: 0, Total: 1}, {Peak: 1, Min: 2, Total: 1}, {Peak: 1, Total: 0}, {Peak: 1, Warmup: -1, Total: 1}, {Peak: math.NaN(), Total: 1}} {
		if bad.Validate() == nil {
			t.Errorf("schedule %+v accepted", bad)
		}
	}
}

// testCorpus is a few kilobytes of text: enough windows for tiny batches.
func testCorpus(t *testing.T) *Corpus {
	t.Helper()
	var b strings.Builder
	for i := range 200 {
		b.WriteString("func add(a, b int) int { return a + b } // line ")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString("\n")
	}
	c, err := NewCorpus("test", []byte(b.String()), 0.1)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testConfig is the tiny model with a short sequence, to keep tests fast.
func testConfig(t *testing.T, dt graph.DType) model.Config {
	t.Helper()
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Seq, cfg.Batch, cfg.DType = 16, 2, dt
	return cfg
}

func testHyper(steps int64) Hyper {
	return Hyper{LR: 3e-3, MinLR: 3e-4, Warmup: 5, Steps: steps, WeightDecay: 0.1, DataSeed: 11}
}

// TestTrainResumeBitExact: 2N steps in one run give the same weights, moments
// and losses, bit for bit, as N steps, an interrupt (the Ctrl-C path: the
// step finishes and a checkpoint is saved), and a resumed run in a fresh
// executable for the other N.
func TestTrainResumeBitExact(t *testing.T) {
	const N = 6
	cfg := testConfig(t, graph.Float32)
	corpus := testCorpus(t)
	be := cpu.New()

	straightDir := t.TempDir()
	straight, err := Run(context.Background(), be, corpus, Options{Config: cfg, Hyper: testHyper(2 * N), EvalEvery: 4, CkptDir: straightDir})
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	first, err := Run(ctx, be, corpus, Options{Config: cfg, Hyper: testHyper(2 * N), EvalEvery: 4, CkptDir: dir,
		OnStep: func(step int64, _ float64) {
			if step == N {
				cancel()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Interrupted || first.Step != N || first.Checkpoint != checkpoint.CheckpointPath(dir, N) {
		t.Fatalf("interrupted run: interrupted %v at step %d, checkpoint %q", first.Interrupted, first.Step, first.Checkpoint)
	}
	second, err := Run(context.Background(), be, corpus, Options{Config: cfg, Hyper: testHyper(2 * N), EvalEvery: 4, CkptDir: dir, Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	if second.StartStep != N || second.Step != 2*N {
		t.Fatalf("resumed run went from step %d to %d", second.StartStep, second.Step)
	}
	if len(second.Losses) != 2*N {
		t.Fatalf("resumed run has %d losses, want the whole history of %d", len(second.Losses), 2*N)
	}
	for i := range straight.Losses {
		if math.Float64bits(straight.Losses[i]) != math.Float64bits(second.Losses[i]) {
			t.Errorf("step %d loss: straight %v, resumed %v", i+1, straight.Losses[i], second.Losses[i])
		}
	}
	if !slices.Equal(straight.Val, second.Val) {
		t.Errorf("validation points: straight %v, resumed %v", straight.Val, second.Val)
	}
	a, _, err := checkpoint.LoadCheckpoint(straight.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := checkpoint.LoadCheckpoint(second.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Tensors) != len(b.Tensors) || len(a.Tensors) != 3*len(cfg.Params()) {
		t.Fatalf("checkpoints hold %d and %d tensors, want params and two moments each (%d)", len(a.Tensors), len(b.Tensors), 3*len(cfg.Params()))
	}
	for n, x := range a.Tensors {
		if !sameBits(x, b.Tensors[n]) {
			t.Errorf("%s differs between the straight and the resumed run", n)
		}
	}
	if _, ok := a.Tensors["opt.m.lm_head"]; !ok {
		t.Error("checkpoint has no opt.m.lm_head")
	}
	// The moments did move: the checkpoint is not just the weights.
	if v := a.Tensors["opt.v.tok_emb"]; v == nil || maxAbs(v) == 0 {
		t.Error("opt.v.tok_emb is zero after training")
	}
}

func maxAbs(t *graph.Tensor) float64 {
	var m float64
	for i := range t.Len() {
		m = max(m, math.Abs(t.At(i)))
	}
	return m
}

// TestTrainResumeErrors: a damaged checkpoint or one of another model is a
// clear error, not a panic or a silent restart.
func TestTrainResumeErrors(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	corpus := testCorpus(t)
	be := cpu.New()
	dir := t.TempDir()
	if _, err := Run(context.Background(), be, corpus, Options{Config: cfg, Hyper: testHyper(2), CkptDir: dir}); err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Layers = 1
	_, err := Run(context.Background(), be, corpus, Options{Config: other, Hyper: testHyper(4), CkptDir: dir, Resume: true})
	if err == nil || !strings.Contains(err.Error(), "-config") || !strings.Contains(err.Error(), "Layers: 2 in the checkpoint, 1 now") {
		t.Errorf("resume with another config: err %v; want the differing field named", err)
	}
	// A checkpoint that already reaches -steps has nothing to continue: an
	// error saying so and how to go on, before anything is compiled (Ready
	// is not called), not a quiet run that trains nothing.
	for _, steps := range []int64{1, 2} {
		ready := false
		_, err = Run(context.Background(), be, corpus, Options{Config: cfg, Hyper: testHyper(steps), CkptDir: dir, Resume: true,
			Ready: func(*Trainer) error { ready = true; return nil }})
		if err == nil || !strings.Contains(err.Error(), "nothing to train") || !strings.Contains(err.Error(), "raise -steps") || ready {
			t.Errorf("resume at -steps %d from step 2: err %v, ready called %v", steps, err, ready)
		}
	}
	p, _, _ := checkpoint.LatestCheckpoint(dir)
	data, _ := os.ReadFile(p)
	os.WriteFile(p, data[:len(data)/2], 0o644)
	_, err = Run(context.Background(), be, corpus, Options{Config: cfg, Hyper: testHyper(4), CkptDir: dir, Resume: true})
	if err == nil || !strings.Contains(err.Error(), filepath.Base(p)) {
		t.Errorf("resume from a truncated checkpoint: err %v", err)
	}
	_, err = Run(context.Background(), be, corpus, Options{Config: cfg, Hyper: testHyper(4), CkptDir: t.TempDir(), Resume: true})
	if err == nil || !strings.Contains(err.Error(), "no checkpoint") {
		t.Errorf("resume from an empty folder: err %v", err)
	}
}

// TestTrainOverfitsFixedBatch: the data holds exactly one window, so every
// batch is the same; the model must learn it almost perfectly.
func TestTrainOverfitsFixedBatch(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	text := []byte("The quick brown fox jumps over!!")[:cfg.Seq+1]
	corpus := &Corpus{Source: "one window", Train: text}
	h := Hyper{LR: 1e-2, MinLR: 1e-3, Warmup: 10, Steps: 150, DataSeed: 1}
	res, err := Run(context.Background(), cpu.New(), corpus, Options{Config: cfg, Hyper: h})
	if err != nil {
		t.Fatal(err)
	}
	last := res.Losses[len(res.Losses)-1]
	t.Logf("fixed batch: loss %.4f at step 1, %.5f at step %d", res.Losses[0], last, len(res.Losses))
	if !(last < 0.1) {
		t.Errorf("final loss %v on one fixed batch, want < 0.1", last)
	}
	if len(res.Val) != 0 {
		t.Errorf("validation points %v without validation data", res.Val)
	}
}

// TestTrainFusedMatchesUnfused: training with the attention fused (forward
// FlashAttention, backward FlashAttentionGrad) follows the same loss curve as
// training the graph as built, step for step: to 1e-9 relative in float64,
// where only rounding separates them, and to 1e-4 in float32.
func TestTrainFusedMatchesUnfused(t *testing.T) {
	const steps = 50
	for _, c := range []struct {
		dt  graph.DType
		tol float64
	}{{graph.Float64, 1e-9}, {graph.Float32, 1e-4}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			cfg := testConfig(t, c.dt)
			corpus := testCorpus(t)
			curves := map[bool][]float64{}
			for _, fuse := range []bool{false, true} {
				tr, err := NewTrainer(cpu.New(), cfg, fuse, testHyper(steps), corpus)
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				fops, tops := tr.Graphs.Forward.CountOps(), tr.Graphs.Step.Graph.CountOps()
				if fuse && (fops["FlashAttention"] != cfg.Layers || fops["Softmax"] != 0 || tops["FlashAttentionGrad"] != cfg.Layers) {
					t.Fatalf("fused graphs: forward %d FlashAttention, %d Softmax; step %d FlashAttentionGrad (want %d, 0, %d)",
						fops["FlashAttention"], fops["Softmax"], tops["FlashAttentionGrad"], cfg.Layers, cfg.Layers)
				}
				if !fuse && (fops["FlashAttention"] != 0 || fops["Softmax"] != cfg.Layers) {
					t.Fatalf("unfused forward graph has %d FlashAttention, %d Softmax", fops["FlashAttention"], fops["Softmax"])
				}
				for range steps {
					if _, err := tr.Step(); err != nil {
						t.Fatal(err)
					}
				}
				curves[fuse] = tr.Losses()
			}
			var worst float64
			for i := range steps {
				a, b := curves[false][i], curves[true][i]
				rel := math.Abs(a-b) / math.Abs(a)
				worst = max(worst, rel)
				if !(rel <= c.tol) {
					t.Errorf("step %d: unfused loss %v, fused %v (relative difference %.3g > %g)", i+1, a, b, rel, c.tol)
				}
			}
			t.Logf("%v: loss %.4f -> %.4f over %d steps; largest relative fused/unfused difference %.3g",
				c.dt, curves[true][0], curves[true][steps-1], steps, worst)
			if !(curves[true][steps-1] < curves[true][0]-0.5) {
				t.Errorf("loss went from %v to %v: not training", curves[true][0], curves[true][steps-1])
			}
		})
	}
}

// TestTrainFreshRunReplacesOldCheckpoints: a run without -resume must not
// leave an earlier run's (later) checkpoints to be picked up by a later
// -resume, but it only removes them once it has saved its own.
func TestTrainFreshRunReplacesOldCheckpoints(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	corpus := testCorpus(t)
	be := cpu.New()
	dir := t.TempDir()
	if _, err := Run(context.Background(), be, corpus, Options{Config: cfg, Hyper: testHyper(5), CkptDir: dir, CkptEvery: 2, KeepEvery: 2}); err != nil {
		t.Fatal(err)
	}
	if steps, _ := checkpoint.ListCheckpoints(dir); len(steps) != 3 {
		t.Fatalf("first run left checkpoints %v, want [2 4 5]", steps)
	}
	// A fresh run cancelled before its first step (while compiling) saves
	// nothing, removes nothing, and says it was cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, be, corpus, Options{Config: cfg, Hyper: testHyper(3), CkptDir: dir}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a run cancelled before it started: err %v, want the cancellation", err)
	}
	if steps, _ := checkpoint.ListCheckpoints(dir); len(steps) != 3 {
		t.Fatalf("a run that did nothing changed the checkpoints to %v", steps)
	}
	res, err := Run(context.Background(), be, corpus, Options{Config: cfg, Hyper: testHyper(3), CkptDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	steps, _ := checkpoint.ListCheckpoints(dir)
	if len(steps) != 1 || steps[0] != 3 || res.Checkpoint != checkpoint.CheckpointPath(dir, 3) {
		t.Errorf("after a fresh 3-step run the folder holds %v, want only [3]", steps)
	}
}
