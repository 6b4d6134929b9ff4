package train

import (
	"errors"
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

// ErrDiverged marks a step whose loss or gradient norm is not finite: the
// run has diverged, and the step's update has damaged the weights.
var ErrDiverged = errors.New("diverged")

// GradNorm is the global gradient norm (before clipping) of the last step,
// and whether the step reports one (it does with Hyper.ClipNorm).
func (t *Trainer) GradNorm() (float64, bool) {
	if t.Graphs.Step.GradNorm == "" || t.step == 0 {
		return 0, false
	}
	return t.gradNorm, true
}

// readGradNorm records the step's gradient norm; a non-finite one is a
// diverged step (its update is already damaged: the weights must come from
// a checkpoint).
func (t *Trainer) readGradNorm(out map[string]*graph.Tensor) error {
	name := t.Graphs.Step.GradNorm
	if name == "" {
		return nil
	}
	n, ok := out[name]
	if !ok || n.Len() != 1 {
		return fmt.Errorf("train: step %d: the step returned no gradient norm", t.step+1)
	}
	t.gradNorm = n.At(0)
	if math.IsNaN(t.gradNorm) || math.IsInf(t.gradNorm, 0) {
		return fmt.Errorf("train: step %d: the gradient norm is %v (%w; try a lower -lr)", t.step+1, t.gradNorm, ErrDiverged)
	}
	return nil
}
