package train

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/model"
)

// Options configure Run.
type Options struct {
	Config model.Config
	// Source, when set, is what is trained (a graph: see PrepareGraph);
	// Config must then be Source.Config. Nil: the built-in model of Config.
	Source *Source
	Fuse   bool
	Hyper  Hyper

	// EvalEvery is the validation period in steps (0: only at the start
	// and the end). Validation also runs at step 0 of a fresh run, so the
	// curve starts at the untrained loss.
	EvalEvery int64

	// CkptDir holds the checkpoints ("" for none). A checkpoint is written
	// every CkptEvery steps (0: only at the end or on interrupt); the newest
	// is kept, and with KeepEvery > 0 also every step that is a multiple of
	// it.
	CkptDir   string
	CkptEvery int64
	KeepEvery int64
	// Resume continues from the newest checkpoint in CkptDir. Without it a
	// run starts at step 0, and its first checkpoint replaces those already
	// in CkptDir (they would otherwise be taken for this run's on a later
	// -resume).
	Resume bool

	// Log receives notes and progress (nil: silent). Bar draws a redrawn
	// progress bar instead of lines (for a terminal).
	Log io.Writer
	Bar bool

	// Ready, when set, is called once the run is set up (the step compiled,
	// the checkpoint restored) and before the first step. The CLI makes its
	// folders and writes its files there, so that a run that cannot start (a
	// mismatched or missing checkpoint, a model that does not compile)
	// leaves the output folder as it was.
	Ready func(t *Trainer) error

	// OnStep, when set, is called after every step; tests use it to stop a
	// run at a given step through the context.
	OnStep func(step int64, loss float64)
}

// Result is what a run did.
type Result struct {
	Config    model.Config
	Fused     bool
	Backend   string
	StartStep int64      // step the run started from (0, or the checkpoint's)
	Step      int64      // completed steps at the end
	Losses    []float64  // train loss of every step since step 0 (checkpoints carry the history)
	Val       []ValPoint // validation losses since step 0
	// Interrupted says the context was cancelled (Ctrl-C): the run stopped
	// after a whole step and saved a checkpoint.
	Interrupted bool
	Checkpoint  string // the last checkpoint written ("" if none)

	Tokens       int64         // tokens trained on in this process
	TrainTime    time.Duration // time inside training steps in this process
	Wall         time.Duration // whole run in this process: compile, steps, evals, checkpoints
	TotalElapsed time.Duration // training wall time over all resumed sessions
	Stats        backend.Stats // training executable: peak activation and initializer bytes
	Graphs       *Graphs
}

// TokensPerSec is the training throughput of this process.
func (r *Result) TokensPerSec() float64 {
	if r.TrainTime <= 0 {
		return 0
	}
	return float64(r.Tokens) / r.TrainTime.Seconds()
}

// FinalTrainLoss is the mean train loss of the last (up to) 10 steps: one
// batch's loss is too noisy to summarise a run with.
func (r *Result) FinalTrainLoss() float64 {
	n := min(10, len(r.Losses))
	if n == 0 {
		return 0
	}
	var s float64
	for _, l := range r.Losses[len(r.Losses)-n:] {
		s += l
	}
	return s / float64(n)
}

// FinalValLoss is the last validation loss (NaN if none).
func (r *Result) FinalValLoss() (float64, bool) {
	if len(r.Val) == 0 {
		return 0, false
	}
	return r.Val[len(r.Val)-1].Loss, true
}

// Run trains opts.Config on corpus with backend be until opts.Hyper.Steps
// steps are done or ctx is cancelled. Cancellation is honoured between
// steps: the step in flight finishes, a checkpoint is saved (when CkptDir is
// set), and Run returns the result with Interrupted set and no error.
func Run(ctx context.Context, be backend.Backend, corpus *Corpus, opts Options) (*Result, error) {
	t0 := time.Now()
	log := opts.Log
	var resumeFrom string
	var stale []int64 // an earlier run's checkpoints, removed at our first save
	if opts.Resume {
		if opts.CkptDir == "" {
			return nil, fmt.Errorf("train: -resume needs a checkpoint folder (-ckpt)")
		}
		p, step, err := checkpoint.LatestCheckpoint(opts.CkptDir)
		if err != nil {
			return nil, fmt.Errorf("train: %w", err)
		}
		if p == "" {
			return nil, fmt.Errorf("train: -resume: no checkpoint in %s", opts.CkptDir)
		}
		// A resumed run trains up to -steps in all; a checkpoint already
		// there has nothing left to do, and doing nothing quietly reads as
		// if -resume were broken.
		if step >= opts.Hyper.Steps {
			return nil, fmt.Errorf("train: -resume: the newest checkpoint (%s) is at step %d, which already reaches -steps %d: nothing to train. To continue, raise -steps (e.g. -resume -steps %d); the schedule then stretches to the new total", p, step, opts.Hyper.Steps, 2*step)
		}
		resumeFrom = p
	}

	if log != nil {
		fmt.Fprintf(log, "compiling the training step on %s...\n", be.Name())
	}
	src := BuiltIn(opts.Config)
	if opts.Source != nil {
		src = *opts.Source
	}
	tr, err := NewSourceTrainer(be, src, opts.Fuse, opts.Hyper, corpus)
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	res := &Result{Config: opts.Config, Fused: opts.Fuse, Backend: be.Name(), Graphs: tr.Graphs}

	if resumeFrom != "" {
		ts, step, err := checkpoint.LoadCheckpoint(resumeFrom)
		if err != nil {
			return nil, fmt.Errorf("train: %w", err)
		}
		notes, err := tr.Restore(ts, step)
		if err != nil {
			return nil, fmt.Errorf("%w (checkpoint %s)", err, resumeFrom)
		}
		if log != nil {
			fmt.Fprintf(log, "resumed from %s (step %d)\n", resumeFrom, step)
			for _, n := range notes {
				fmt.Fprintf(log, "note: %s\n", n)
			}
		}
	} else if opts.CkptDir != "" {
		// Checkpoints of an earlier run would be taken for this run's by a
		// later -resume, so this run replaces them; but only once it has a
		// checkpoint of its own, so that a run that fails to start (or a
		// forgotten -resume noticed at once) loses nothing.
		old, err := checkpoint.ListCheckpoints(opts.CkptDir)
		if err != nil {
			return nil, fmt.Errorf("train: checkpoint folder: %w", err)
		}
		stale = old
		if len(old) > 0 && log != nil {
			fmt.Fprintf(log, "note: %s holds checkpoints of an earlier run (up to step %d); this fresh run replaces them with its first checkpoint (-resume continues that run instead)\n", opts.CkptDir, old[len(old)-1])
		}
	}
	res.StartStep = tr.StepsDone()
	total := opts.Hyper.Steps
	if opts.Ready != nil {
		if err := opts.Ready(tr); err != nil {
			return nil, err
		}
	}
	if !tr.HasVal() && log != nil {
		fmt.Fprintf(log, "note: the validation split has %d %s, too few for a window of %d: no validation\n", corpus.ValLen(), corpus.Unit(), opts.Config.Seq+1)
	}

	prog := newProgress(log, opts.Bar, tr.StepsDone(), total)
	// sessionStart marks the start of the training time not yet added to
	// tr.elapsed (which checkpoints carry across resumed sessions).
	sessionStart := time.Now()
	eval := func() error {
		if !tr.HasVal() {
			return nil
		}
		l, err := tr.Eval()
		if err != nil {
			return err
		}
		prog.note("step %d: validation loss %.4f", tr.StepsDone(), l)
		return nil
	}
	save := func() error {
		if opts.CkptDir == "" {
			return nil
		}
		tr.elapsed += time.Since(sessionStart).Seconds()
		sessionStart = time.Now()
		ts, err := tr.State()
		if err != nil {
			return err
		}
		p, err := checkpoint.SaveCheckpoint(opts.CkptDir, tr.StepsDone(), ts, opts.KeepEvery)
		if err != nil {
			return err
		}
		res.Checkpoint = p
		for _, st := range stale {
			if st != tr.StepsDone() {
				if err := os.Remove(checkpoint.CheckpointPath(opts.CkptDir, st)); err != nil && !os.IsNotExist(err) {
					return fmt.Errorf("train: removing an earlier run's checkpoint: %w", err)
				}
			}
		}
		stale = nil
		return nil
	}
	if tr.StepsDone() == 0 {
		if err := eval(); err != nil {
			return nil, err
		}
	}
	tokensPerStep := int64(opts.Config.Batch * opts.Config.Seq)
	lastSaved := tr.StepsDone()
	for tr.StepsDone() < total {
		if ctx.Err() != nil {
			res.Interrupted = true
			break
		}
		ts := time.Now()
		lr := tr.LR()
		loss, err := tr.Step()
		if err != nil {
			return nil, err
		}
		res.TrainTime += time.Since(ts)
		res.Tokens += tokensPerStep
		step := tr.StepsDone()
		prog.step(step, loss, lr, res.TokensPerSec())
		if opts.OnStep != nil {
			opts.OnStep(step, loss)
		}
		if opts.EvalEvery > 0 && step%opts.EvalEvery == 0 && step != total {
			if err := eval(); err != nil {
				return nil, err
			}
		}
		if opts.CkptEvery > 0 && step%opts.CkptEvery == 0 && step != total {
			if err := save(); err != nil {
				return nil, err
			}
			lastSaved = step
		}
	}
	if res.Interrupted {
		prog.note("interrupted: stopping after step %d", tr.StepsDone())
	} else if n := len(tr.vals); tr.StepsDone() > 0 && (n == 0 || tr.vals[n-1].Step != tr.StepsDone()) {
		if err := eval(); err != nil {
			return nil, err
		}
	}
	if tr.StepsDone() != lastSaved {
		if err := save(); err != nil {
			return nil, err
		}
	}
	prog.finish()
	res.Step = tr.StepsDone()
	res.Losses = tr.Losses()
	res.Val = tr.ValLosses()
	res.Stats = tr.Stats()
	res.Wall = time.Since(t0)
	res.TotalElapsed = time.Duration((tr.elapsed + time.Since(sessionStart).Seconds()) * float64(time.Second))
	return res, nil
}
