package train

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

// accum is the number of micro-batches of a step (1: none).
func (h Hyper) accum() int { return max(1, h.Accum) }

// stepAccum is Step with gradient accumulation: the step's batch (Accum
// times the config's rows, the batch a run without accumulation at that
// size would draw) runs through the step graph one micro-batch of
// Config.Batch rows at a time; the last run applies the update. The loss is
// the mean of the micro-batches' losses, the loss of the whole batch.
func (t *Trainer) stepAccum() (float64, error) {
	n := t.Hyper.accum()
	tokens, targets := t.train.Batch(t.step)
	rows := t.Config.Batch * t.Config.Seq
	var sum float64
	for j := range n {
		tok := graph.NewTensor(graph.Int64, graph.Shape{t.Config.Batch, t.Config.Seq})
		tg := graph.NewTensor(graph.Int64, graph.Shape{t.Config.Batch, t.Config.Seq})
		copy(tok.I64, tokens.I64[j*rows:(j+1)*rows])
		copy(tg.I64, targets.I64[j*rows:(j+1)*rows])
		apply := graph.NewTensor(graph.Bool, graph.Shape{})
		apply.B[0] = j == n-1
		feeds := t.StepFeedsOf(tok, tg)
		feeds[t.Graphs.Step.Apply] = apply
		out, err := t.exec.Run(feeds)
		if err != nil {
			return 0, fmt.Errorf("train: step %d, micro-batch %d of %d: %w", t.step+1, j+1, n, err)
		}
		lt, ok := out[t.Graphs.Step.Loss]
		if !ok || lt.Len() != 1 {
			return 0, fmt.Errorf("train: step %d: the step returned no scalar loss", t.step+1)
		}
		l := lt.At(0)
		if math.IsNaN(l) || math.IsInf(l, 0) {
			return l, fmt.Errorf("train: step %d, micro-batch %d of %d: loss is %v (%w; try a lower -lr)", t.step+1, j+1, n, l, ErrDiverged)
		}
		sum += l
		if j == n-1 {
			if err := t.readGradNorm(out); err != nil {
				return l, err
			}
		}
	}
	loss := sum / float64(n)
	t.step++
	t.losses = append(t.losses, loss)
	return loss, nil
}

// StepFeedsOf are the next step's feeds for the given tokens and targets
// (named as the forward graph's batch inputs, batchFeeds): the learning rate
// and AdamW's 1-based step count besides.
func (t *Trainer) StepFeedsOf(tokens, targets *graph.Tensor) map[string]*graph.Tensor {
	lr := graph.NewTensor(t.lrDType, graph.Shape{})
	lr.Set(0, t.sched.LR(t.step))
	st := graph.NewTensor(t.stepDType, graph.Shape{})
	st.Set(0, float64(t.step+1)) // AdamW's t is 1-based
	feeds := t.batchFeeds(tokens, targets)
	feeds[t.Graphs.Step.LR], feeds[t.Graphs.Step.Step] = lr, st
	return feeds
}
