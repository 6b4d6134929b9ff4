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
	tokens, targets := t.train.Batch(t.step)
	return t.StepFeedsOf(tokens, targets)
}
