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
	lr := graph.NewTensor(t.lrDType, graph.Shape{})
	lr.Set(0, t.sched.LR(t.step))
	st := graph.NewTensor(t.stepDType, graph.Shape{})
	st.Set(0, float64(t.step+1)) // AdamW's t is 1-based
	return map[string]*graph.Tensor{
		"tokens": tokens, "targets": targets, t.Graphs.Step.LR: lr, t.Graphs.Step.Step: st,
	}
}
