package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
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

	// Metrics, when set, receives a JSON line per step (step, loss, lr,
	// grad_norm with Hyper.ClipNorm, tok_s and mfu once measured, step_ms)
	// and one per validation (step, val_loss).
	Metrics io.Writer

	// Peak is the device's peak rate for the run's compute type (see
	// PeakFLOPS); with it the progress and the result give MFU. Zero: no
	// MFU (the CPU).
	Peak Peak

	// Ranks, for a data-parallel job (Hyper.World > 1), is this process's
	// rank and the job's collective. Every rank runs Run with the same
	// options; the ranks agree on each step's loss, on the validation loss
	// and on when to stop (a signal to any rank stops every rank after the
	// same step), and rank 0 alone writes the checkpoints, between two
	// barriers, into CkptDir, which every rank reads on Resume (one folder
	// on one host, a shared one across hosts).
	Ranks Ranks
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
	TrainTime    time.Duration // time inside training steps in this process (the first step included)
	Wall         time.Duration // whole run in this process: compile, steps, evals, checkpoints
	TotalElapsed time.Duration // training wall time over all resumed sessions
	Stats        backend.Stats // training executable: peak activation and initializer bytes
	Graphs       *Graphs

	// Compile is the time spent building and compiling the training step in
	// this process, FirstStep the first step's time (one-time work such as
	// CUDA kernel compilation and graph capture included). Neither counts in
	// the steady state.
	Compile   time.Duration
	FirstStep time.Duration
	// SteadyStep is the mean time inside a step over the last SteadySteps
	// (up to 32) steps of this process, the first excluded: the steady state
	// that throughput and MFU are reported for. SteadySteps is 0 when the
	// process ran one step or none.
	SteadyStep    time.Duration
	SteadySteps   int
	TokensPerStep int64
	// FLOPsPerToken is the training step's model FLOPs per token
	// (GraphFLOPs(step).Model over the tokens of a step).
	FLOPsPerToken float64
	Peak          Peak // Options.Peak
	// Recompute is what the step recomputes in the backward (Hyper.RecomputeMode).
	Recompute RecomputeMode
	// Unit is what one position of the data is, the unit losses are per:
	// "byte" for text, "token" for a token file.
	Unit string
	// World is the number of ranks that trained (1: one process); Tokens,
	// TokensPerStep and the throughput are the job's, over every rank.
	World int
	// OptimizerStateBytes is the AdamW state this process kept (with
	// Hyper.ShardOptimizer, its part only).
	OptimizerStateBytes int64
	ShardOptimizer      bool
}

// TokensPerSec is the mean training throughput of this process over all its
// steps, the first (with its one-time work) included.
func (r *Result) TokensPerSec() float64 {
	if r.TrainTime <= 0 {
		return 0
	}
	return float64(r.Tokens) / r.TrainTime.Seconds()
}

// SteadyTokensPerSec is the steady-state throughput: tokens per second
// inside the steps of the recent window, the first step excluded (0 when
// there is no such step).
func (r *Result) SteadyTokensPerSec() float64 {
	if r.SteadySteps == 0 || r.SteadyStep <= 0 {
		return 0
	}
	return float64(r.TokensPerStep) / r.SteadyStep.Seconds()
}

// ModelFLOPS is the steady state's rate of model FLOPs per second.
func (r *Result) ModelFLOPS() float64 { return r.FLOPsPerToken * r.SteadyTokensPerSec() }

// MFU is the steady state's model FLOPs utilisation (0 when the device's
// peak is not known).
func (r *Result) MFU() float64 {
	return MFU(r.FLOPsPerToken, r.SteadyTokensPerSec(), r.Peak.FLOPS)
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
// steps are done or ctx is cancelled. A cancellation is acknowledged on Log
// at once (naming context.Cause(ctx)); a step in flight finishes, a
// validation or a compilation is given up at once; a checkpoint of the
// steps since the last one is saved (when CkptDir is set), and Run returns
// the result with Interrupted set and no error. Cancelled before the first
// step (while compiling), Run returns an error wrapping the cause.
func Run(ctx context.Context, be backend.Backend, corpus *Corpus, opts Options) (*Result, error) {
	t0 := time.Now()
	log := opts.Log
	rs := &runState{phase: phaseCompiling, ckpt: opts.CkptDir != ""}
	if log != nil {
		rs.say = func(m string) { fmt.Fprintln(log, m) }
	}
	stopWatch := rs.watch(ctx)
	defer stopWatch()
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
	tc := time.Now()
	src := BuiltIn(opts.Config)
	if opts.Source != nil {
		src = *opts.Source
	}
	tr, err := untilDone(ctx, "compiling the training step", func() (*Trainer, error) {
		return NewRankTrainer(be, src, opts.Fuse, opts.Hyper, corpus, opts.Ranks)
	}, (*Trainer).Close)
	if err != nil {
		return nil, err
	}
	trOpen := true
	defer func() {
		if trOpen {
			tr.Close()
		}
	}()
	// A step runs the step graph once per micro-batch (Hyper.Accum).
	// The job's tokens: each rank's step graph runs 1/World of them.
	runTokens := int64(opts.Config.Batch * opts.Config.Seq)
	tokensPerStep := runTokens * int64(opts.Hyper.accum())
	world := opts.Hyper.world()
	res := &Result{Config: opts.Config, Fused: opts.Fuse, Backend: be.Name(), Graphs: tr.Graphs, Recompute: opts.Hyper.RecomputeMode(), Unit: strings.TrimSuffix(corpus.Unit(), "s"),
		Compile: time.Since(tc), TokensPerStep: tokensPerStep, Peak: opts.Peak,
		FLOPsPerToken: GraphFLOPs(tr.Graphs.Step.Graph).Model / float64(runTokens/int64(world)), World: world}
	if log != nil {
		fmt.Fprintf(log, "compile: %s\n", roundDuration(res.Compile))
	}

	if resumeFrom != "" {
		type loaded struct {
			ts   *checkpoint.Tensors
			step int64
		}
		l, err := untilDone(ctx, "reading the checkpoint", func() (loaded, error) {
			ts, step, err := checkpoint.LoadCheckpoint(resumeFrom)
			return loaded{ts, step}, err
		}, nil)
		ts, step := l.ts, l.step
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
	} else if opts.CkptDir != "" && tr.Rank() == 0 {
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

	met := &metrics{w: opts.Metrics}
	// The last complete checkpoint, which a diverged run goes back to.
	goodCkpt, goodStep := resumeFrom, tr.StepsDone()
	prog := newProgress(log, opts.Bar, tr.StepsDone(), total)
	rs.setSay(func(m string) { prog.note("%s", m) })
	rs.set(phaseBetween, tr.StepsDone())
	// sessionStart marks the start of the training time not yet added to
	// tr.elapsed (which checkpoints carry across resumed sessions).
	sessionStart := time.Now()
	// The ranks of a job validate together and stop together: a validation
	// that one rank gave up would leave the others waiting for its part.
	evalCtx := ctx
	if world > 1 {
		evalCtx = context.Background()
	}
	eval := func() error {
		if !tr.HasVal() {
			return nil
		}
		rs.set(phaseValidating, tr.StepsDone())
		defer rs.set(phaseBetween, tr.StepsDone())
		l, err := tr.EvalContext(evalCtx)
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: the loop stops and saves
			}
			return err
		}
		prog.note("step %d: validation loss %.4f", tr.StepsDone(), l)
		met.write(metricsLine{Step: tr.StepsDone(), ValLoss: some(l)})
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
		// Rank 0 writes the job's one checkpoint once every rank has
		// finished the step, and no rank goes on (or exits) before it is
		// complete: a rank lost meanwhile leaves the previous one intact.
		if err := tr.barrier("before the checkpoint of step %d", tr.StepsDone()); err != nil {
			return err
		}
		p := checkpoint.CheckpointPath(opts.CkptDir, tr.StepsDone())
		if tr.Rank() == 0 {
			if p, err = checkpoint.SaveCheckpoint(opts.CkptDir, tr.StepsDone(), ts, opts.KeepEvery); err != nil {
				return err
			}
		}
		if err := tr.barrier("after the checkpoint of step %d", tr.StepsDone()); err != nil {
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
		goodCkpt, goodStep = p, tr.StepsDone()
		rs.unsaved(false)
		return nil
	}
	if tr.StepsDone() == 0 {
		if err := eval(); err != nil {
			return nil, err
		}
	}
	lastSaved := tr.StepsDone()
	var win window
	prevEnd := time.Now()
	stopAll := false
	for tr.StepsDone() < total {
		if stopAll || (world == 1 && ctx.Err() != nil) {
			res.Interrupted = true
			break
		}
		ts := time.Now()
		lr := tr.LR()
		rs.set(phaseStep, tr.StepsDone())
		loss, stop, err := tr.stepAgreeing(ctx.Err() != nil)
		stopAll = stop
		if err != nil {
			if errors.Is(err, ErrDiverged) && world > 1 {
				// Every rank saw the same global loss: each stops here. A
				// re-run with every node checked is a one-process affair.
				return nil, fmt.Errorf("%w (re-run from that checkpoint on one rank to find the node)", divergedError(err, goodCkpt, goodStep))
			}
			if errors.Is(err, ErrDiverged) {
				bad := tr.StepsDone() + 1
				// Its weights are damaged: the re-run compiles its own, in
				// the memory this one held.
				trOpen = false
				tr.Close()
				prog.note("step %d diverged: re-running it from the last good state (step %d) with every node checked...", bad, goodStep)
				rs.set(phaseDiagnosing, tr.StepsDone())
				diag := diagnoseDivergence(ctx, be, src, opts.Fuse, opts.Hyper, corpus, goodCkpt, goodStep, bad)
				return nil, fmt.Errorf("%w\n%s", divergedError(err, goodCkpt, goodStep), diag)
			}
			return nil, err
		}
		rs.set(phaseBetween, tr.StepsDone())
		rs.unsaved(true)
		end := time.Now()
		d := end.Sub(ts)
		if res.Tokens == 0 {
			res.FirstStep = d
		} else {
			win.add(d, end.Sub(prevEnd))
			res.SteadyStep, res.SteadySteps = win.stepTime(), win.steps()
		}
		prevEnd = end
		res.TrainTime += d
		res.Tokens += tokensPerStep
		step := tr.StepsDone()
		prog.step(stepStatus{step: step, loss: loss, lr: lr, tokPerSec: res.SteadyTokensPerSec(), first: res.FirstStep,
			mfu: res.MFU(), eta: time.Duration(total-step) * win.wallTime()})
		line := metricsLine{Step: step, Loss: some(loss), LR: some(lr), TokS: positive(res.SteadyTokensPerSec()), MFU: positive(res.MFU()),
			StepMs: some(float64(d.Microseconds()) / 1e3)}
		if gn, ok := tr.GradNorm(); ok {
			line.GradNorm = some(gn)
		}
		met.write(line)
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
	if !res.Interrupted && ctx.Err() != nil && world == 1 {
		res.Interrupted = true // during the last validation
	}
	if world > 1 && stopAll {
		res.Interrupted = true // the last step's agreement said stop
	}
	if res.Interrupted {
		stopWatch()
		prog.note("interrupted: stopping after step %d", tr.StepsDone())
	} else if n := len(tr.vals); tr.StepsDone() > 0 && (n == 0 || tr.vals[n-1].Step != tr.StepsDone()) {
		if err := eval(); err != nil {
			return nil, err
		}
		// Interrupted during the final validation: every step is done,
		// but the run did not finish as asked.
		res.Interrupted = ctx.Err() != nil && world == 1
	}
	if tr.StepsDone() != lastSaved {
		if err := save(); err != nil {
			return nil, err
		}
	}
	prog.finish()
	if met.err != nil {
		return nil, met.err
	}
	res.Step = tr.StepsDone()
	res.Losses = tr.Losses()
	res.Val = tr.ValLosses()
	res.Stats = tr.Stats()
	res.OptimizerStateBytes, res.ShardOptimizer = tr.OptimizerStateBytes(), tr.sharded()
	res.Wall = time.Since(t0)
	res.TotalElapsed = time.Duration((tr.elapsed + time.Since(sessionStart).Seconds()) * float64(time.Second))
	return res, nil
}
