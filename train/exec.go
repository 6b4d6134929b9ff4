package train

import (
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// Executable is the compiled training step (for benchmarks and profilers
// that time it without going through Step).
func (t *Trainer) Executable() backend.Executable { return t.exec }

// StepFeeds are the inputs Step would feed for the next step: the batch, the
// learning rate and AdamW's 1-based step count.
func (t *Trainer) StepFeeds() map[string]*graph.Tensor {
	return t.StepFeedsOf(t.train.Batch(t.step))
}

// batchFeeds names a batch's tokens and targets as the forward graph's
// inputs (a graph whose loss reads no targets gets the tokens only).
func (t *Trainer) batchFeeds(tokens, targets *graph.Tensor) map[string]*graph.Tensor {
	feeds := map[string]*graph.Tensor{t.tokensName: tokens}
	if t.targetsName != "" {
		feeds[t.targetsName] = targets
	}
	return feeds
}
