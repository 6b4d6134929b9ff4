package train

import (
	"context"
	"errors"
	"fmt"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/checkpoint"
)

// maxDiagnoseReplay bounds the steps the divergence diagnosis replays to go
// from the last good state to the diverged step: past it, the diagnosis
// would cost more than a short run, and is not made.
const maxDiagnoseReplay = 64

// diagnoseDivergence finds the first node that made a non-finite value on
// the way to diverged step bad: it compiles the step again in the backend's
// diagnostic mode (backend.Options.CheckFinite; elementwise fusion off, so
// that the node named is an op of the graph, not a fused chain), restores
// the last good state (checkpoint ckpt of step good, or the initial weights
// when ckpt is ""), and re-runs steps good+1 … bad on their own batches,
// every node's outputs checked in topological order. It returns one line for
// the user: the node, its op, and its inputs' finiteness, or why no node is
// named.
func diagnoseDivergence(ctx context.Context, be backend.Backend, src Source, fuse bool, h Hyper, corpus *Corpus, ckpt string, good, bad int64) string {
	const what = "first non-finite value"
	if n := bad - good; n > maxDiagnoseReplay {
		return fmt.Sprintf("%s: not looked for: the last good state (step %d) is %d steps back, and the re-run that checks every node replays at most %d (-ckpt-every keeps a nearer one)", what, good, n, maxDiagnoseReplay)
	}
	hd := h
	hd.NoFuseElementwise = true
	d, err := untilDone(ctx, "compiling the diagnostic step", func() (*Trainer, error) {
		return newSourceTrainer(be, src, fuse, hd, corpus, true, nil)
	}, (*Trainer).Close)
	if err != nil {
		return fmt.Sprintf("%s: not looked for: %v", what, err)
	}
	defer d.Close()
	from := "the initial weights"
	if ckpt != "" {
		ts, step, err := checkpoint.LoadCheckpoint(ckpt)
		if err == nil {
			_, err = d.Restore(ts, step)
		}
		if err != nil {
			return fmt.Sprintf("%s: not looked for: %v", what, err)
		}
		from = fmt.Sprintf("checkpoint %s", ckpt)
	}
	for d.StepsDone() < bad {
		if ctx.Err() != nil {
			return fmt.Sprintf("%s: not looked for: %v during the re-run", what, context.Cause(ctx))
		}
		step := d.StepsDone() + 1
		_, err := d.Step()
		var nf *backend.NonFiniteError
		switch {
		case errors.As(err, &nf):
			return fmt.Sprintf("%s (step %d re-run from %s on %s, every node checked): %v", what, step, from, be.Name(), nf)
		case errors.Is(err, ErrDiverged):
			return fmt.Sprintf("%s: step %d re-run from %s on %s diverged again (%v), but no node made a non-finite value from finite inputs", what, step, from, be.Name(), err)
		case err != nil:
			return fmt.Sprintf("%s: the re-run of step %d from %s failed: %v", what, step, from, err)
		}
	}
	return fmt.Sprintf("%s: none: re-run from %s on %s with every node checked, step %d stayed finite (the divergence did not reproduce without elementwise fusion)", what, from, be.Name(), bad)
}
