package train

import (
	"context"
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// -accum 4 at batch 2 trains the batch-8 loss curve: the same batches, the
// mean gradient of the four micro-batches, one update per step (float32,
// 1e-5 relative; the sums are ordered differently, so not bit for bit).
func TestAccumulationMatchesTheLargerBatch(t *testing.T) {
	corpus := testCorpus(t)
	const steps = 8
	big := testConfig(t, graph.Float32)
	big.Batch = 8
	small := big
	small.Batch = 2
	h := testHyper(steps)
	h.Accum = 4
	for _, fuse := range []bool{false, true} {
		whole, err := Run(context.Background(), cpu.New(), corpus, Options{Config: big, Hyper: testHyper(steps), Fuse: fuse})
		if err != nil {
			t.Fatal(err)
		}
		acc, err := Run(context.Background(), cpu.New(), corpus, Options{Config: small, Hyper: h, Fuse: fuse})
		if err != nil {
			t.Fatal(err)
		}
		compareCurves(t, fuse, whole, acc)
	}

	checkStill(t, small, h, corpus)
}

func compareCurves(t *testing.T, fuse bool, whole, acc *Result) {
	t.Helper()
	steps := len(whole.Losses)
	if steps < 2 || len(acc.Losses) != steps {
		t.Fatalf("%d and %d losses", len(whole.Losses), len(acc.Losses))
	}
	worst := 0.0
	for i := range steps {
		rel := math.Abs(acc.Losses[i]-whole.Losses[i]) / math.Abs(whole.Losses[i])
		worst = max(worst, rel)
		if rel > 1e-5 {
			t.Errorf("fuse=%v, step %d: loss %v with -accum 4 at batch 2, %v at batch 8 (rel %.2g)", fuse, i+1, acc.Losses[i], whole.Losses[i], rel)
		}
	}
	// The curve must move, or the comparison says nothing.
	if !(whole.Losses[steps-1] < whole.Losses[0]-0.1) {
		t.Errorf("the batch-8 loss did not go down: %v", whole.Losses)
	}
	if acc.TokensPerStep != whole.TokensPerStep {
		t.Errorf("tokens per step: %d accumulated, %d whole", acc.TokensPerStep, whole.TokensPerStep)
	}
	t.Logf("fuse=%v: largest relative loss difference over %d steps: %.2g", fuse, steps, worst)
}

// checkStill: without the last micro-batch's apply, nothing moves.
func checkStill(t *testing.T, small model.Config, h Hyper, corpus *Corpus) {
	t.Helper()
	// Without the last micro-batch's apply, nothing moves: a step of one
	// micro-batch less than Accum leaves the weights as they were.
	tr, err := NewTrainer(cpu.New(), small, false, h, corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	before, _ := tr.exec.Initializer("tok_emb")
	tokens, targets := tr.train.Batch(0)
	feeds := tr.StepFeedsOf(nil, nil)
	rows := small.Batch * small.Seq
	tok, tg := graph.NewTensor(graph.Int64, graph.Shape{small.Batch, small.Seq}), graph.NewTensor(graph.Int64, graph.Shape{small.Batch, small.Seq})
	copy(tok.I64, tokens.I64[:rows])
	copy(tg.I64, targets.I64[:rows])
	apply := graph.NewTensor(graph.Bool, graph.Shape{})
	feeds["tokens"], feeds["targets"], feeds[tr.Graphs.Step.Apply] = tok, tg, apply
	if _, err := tr.exec.Run(feeds); err != nil {
		t.Fatal(err)
	}
	after, _ := tr.exec.Initializer("tok_emb")
	for i := range before.F32 {
		if math.Float32bits(before.F32[i]) != math.Float32bits(after.F32[i]) {
			t.Fatalf("tok_emb[%d] moved on a micro-batch that does not apply: %v → %v", i, before.F32[i], after.F32[i])
		}
	}
	acc0, err := tr.exec.Initializer("opt.acc.tok_emb")
	if err != nil {
		t.Fatal(err)
	}
	nonzero := false
	for _, v := range acc0.F32 {
		nonzero = nonzero || v != 0
	}
	if !nonzero {
		t.Error("the accumulator stayed zero after a micro-batch")
	}
}
