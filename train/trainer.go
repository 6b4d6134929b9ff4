// Package train trains the flashgraph transformer on bytes: a data loader
// over text files, the training loop that drives one compiled training-step
// graph (forward, backward and AdamW, autodiff.TrainingGraph) on any backend,
// validation, a loss plot, and safetensors checkpoints (package checkpoint)
// that resume a run bit for bit.
package train

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

// Hyper are the optimisation settings of a run: the schedule and AdamW's
// constants. They are recorded in checkpoints.
type Hyper struct {
	LR          float64 `json:"lr"`           // peak learning rate
	MinLR       float64 `json:"min_lr"`       // rate at the last step (cosine floor)
	Warmup      int64   `json:"warmup"`       // linear warmup steps
	Steps       int64   `json:"steps"`        // total steps of the run
	WeightDecay float64 `json:"weight_decay"` // AdamW decoupled decay (matrices only)
	Beta1       float64 `json:"beta1"`        // 0: autodiff.DefaultBeta1
	Beta2       float64 `json:"beta2"`        // 0: autodiff.DefaultBeta2
	DataSeed    uint64  `json:"data_seed"`    // batch sampling seed
	// NoFuseElementwise keeps the training step's elementwise ops as single
	// nodes when attention is fused (the fuse_elementwise pass off). It
	// changes how the step runs, and on narrow types its rounding.
	NoFuseElementwise bool `json:"no_fuse_elementwise,omitempty"`
	// Recompute recomputes in the backward what the step would otherwise
	// keep from the forward (passes.Recompute): each layer's whole forward,
	// or with RecomputeCheap only its norms and elementwise ops; less memory
	// for more arithmetic. On the CPU the step computes the same bits either
	// way, so a run may resume in another mode (Restore). Two bools rather
	// than a mode so that checkpoints from before the cheap mode, which hold
	// recompute: true for the whole forward, read back as they meant.
	Recompute      bool `json:"recompute,omitempty"`
	RecomputeCheap bool `json:"recompute_cheap,omitempty"`
	// FuseQKV merges the MatMuls that share an input, the q, k and v
	// projections, into one GEMM against their concatenated weights
	// (passes.FuseQKV) before differentiating. The params stay the three
	// weights; the sums round differently.
	FuseQKV bool `json:"fuse_qkv,omitempty"`
	// ClipNorm, when positive, clips the global gradient norm to it in the
	// step graph (autodiff.TrainOptions.ClipNorm); the step then reports the
	// norm (Trainer.GradNorm).
	ClipNorm float64 `json:"clip_norm,omitempty"`
	// Accum, above 1, makes a step of Accum micro-batches of the config's
	// batch size, their gradients accumulated in the step graph
	// (autodiff.TrainOptions.Accum): the same update as one step on a batch
	// Accum times larger, in the memory of one micro-batch.
	Accum int `json:"accum,omitempty"`
	// DataOrder is how batches are drawn ("": OrderRandom; see DataOrder).
	DataOrder DataOrder `json:"data_order,omitempty"`
	// World, above 1, trains data parallel over World ranks: each rank's
	// step graph computes its rows of the global batch (Config.Batch split
	// evenly) and averages the gradients over the ranks with AllReduce
	// nodes, bucketed by BucketBytes (0: autodiff.DefaultBucketBytes). The
	// state of the run (weights, moments) is the same on every rank and in
	// a checkpoint, whatever World is.
	World       int   `json:"world,omitempty"`
	BucketBytes int64 `json:"bucket_bytes,omitempty"`
	// ShardOptimizer, with World > 1, is ZeRO-1: each rank keeps the AdamW
	// moments of its part of every gradient bucket only (reduce-scatter,
	// update the part, all-gather the weights; autodiff's ShardOptimizer).
	// The steps compute the same bits as without it; checkpoints hold the
	// whole state, gathered.
	ShardOptimizer bool `json:"shard_optimizer,omitempty"`
	// Rank is this process's rank in the job, which picks its part with
	// ShardOptimizer. It is not recorded: a checkpoint is the job's.
	Rank int `json:"-"`
}

// Schedule returns the run's learning-rate schedule.
func (h Hyper) Schedule() Schedule {
	return Schedule{Peak: h.LR, Min: h.MinLR, Warmup: h.Warmup, Total: h.Steps}
}

// Graphs are the graphs of a run.
type Graphs struct {
	Forward *graph.Graph        // the model's forward graph, fused when asked
	Step    *autodiff.TrainStep // forward + backward + AdamW of Forward
	// Log holds what the passes on the step reported (recompute says per
	// layer what it recomputes); nil when none ran.
	Log *passes.Log
}

// BuildGraphs builds cfg's forward graph, fuses its attention when fuse is
// set, and derives the training step from it (with its elementwise chains
// fused too when fuse is set). Fusing before differentiating
// is what gives the backward pass FlashAttentionGrad (scores recomputed from
// the saved logsumexp) instead of the S×S softmax backward.
func BuildGraphs(cfg model.Config, fuse bool, h Hyper) (*Graphs, error) {
	return buildGraphs(cfg, fuse, h, true)
}

// BuildGraphsFor is BuildGraphs for training on be. Recomputing cheap
// elementwise values in the backward instead of keeping them (see
// passes.FuseElementwise) pays where memory traffic bounds elementwise work,
// a GPU; on the CPU, where arithmetic does, computing each exp twice made
// small's step 18% slower, so the CPU keeps them.
func BuildGraphsFor(be backend.Backend, cfg model.Config, fuse bool, h Hyper) (*Graphs, error) {
	return buildGraphs(cfg, fuse, h, be.Name() != "cpu")
}

func buildGraphs(cfg model.Config, fuse bool, h Hyper, remat bool) (*Graphs, error) {
	fwd, err := model.Build(cfg)
	if err != nil {
		return nil, err
	}
	return buildStep(fwd, "loss", nil, fuse, h, remat)
}

// buildStep compiles a forward graph and derives its training step: the
// gradient of loss with respect to params (nil: every param).
func buildStep(fwd *graph.Graph, loss string, params []string, fuse bool, h Hyper, remat bool) (*Graphs, error) {
	fwd, err := compileGraph(fwd, fuse, h.FuseQKV)
	if err != nil {
		return nil, err
	}
	ts, err := autodiff.TrainingGraph(fwd, autodiff.TrainOptions{
		Loss: loss, Params: params, Beta1: h.Beta1, Beta2: h.Beta2, WeightDecay: h.WeightDecay, ClipNorm: h.ClipNorm, Accum: h.Accum,
		World: h.World, BucketBytes: h.BucketBytes, ShardOptimizer: h.ShardOptimizer, Rank: h.Rank,
	})
	if err != nil {
		return nil, err
	}
	if h.FuseQKV {
		// The merged q/k/v product's gradient is the sum of its three
		// Slices' zero-padded cotangents: one Concat of them instead.
		if ts.Graph, err = passes.DisjointSums().Run(ts.Graph, nil); err != nil {
			return nil, err
		}
	}
	var log *passes.Log
	if h.Recompute {
		// Before the elementwise fusion: recompute reads the forward and
		// backward scopes of single ops, and the recomputed chains then fuse
		// like the rest of the backward.
		log = &passes.Log{}
		if ts.Graph, err = h.RecomputeMode().pass().Run(ts.Graph, log); err != nil {
			return nil, err
		}
		if len(log.Filter(passes.PassRecompute, passes.Info)) == 0 {
			// Asked for less memory, the step would quietly keep it all.
			return nil, fmt.Errorf("-recompute: no layer of %s can be recomputed: its forward has no nodes scoped layers.i/ and no attention (Softmax or FlashAttention) between two points where a single activation is live (a transformer's residual adds) whose values the backward reads; train without -recompute", fwd.Name)
		}
	}
	if fuse && !h.NoFuseElementwise {
		// Elementwise fusion runs on the finished step (it has no gradient
		// rules); it changes how the step runs, not what it computes.
		if ts.Graph, err = (passes.FuseElementwise{NoRemat: !remat}).Run(ts.Graph, nil); err != nil {
			return nil, err
		}
	}
	return &Graphs{Forward: fwd, Step: ts, Log: log}, nil
}

// Trainer holds a compiled training step and the run's position. It is the
// part of the loop a test can drive one step at a time; Run adds the
// schedule of evaluations, checkpoints, progress and signals.
type Trainer struct {
	Config model.Config
	// Source is what is trained: the built-in model of Config, or a graph
	// (then Config describes it, see Source.Config).
	Source Source
	Fused  bool
	Hyper  Hyper
	Graphs *Graphs

	be     backend.Backend
	exec   backend.Executable
	eval   backend.Executable // forward-only, compiled on first use
	train  batchSource
	val    batchSource // nil: no validation data
	ranks  Ranks       // the data-parallel job (nil: one process)
	sched  Schedule
	corpus *Corpus

	gradNorm float64 // the last step's global gradient norm (with Hyper.ClipNorm)

	step      int64      // completed steps
	losses    []float64  // train loss of every completed step
	vals      []ValPoint // validation losses so far
	elapsed   float64    // seconds of training before this process (from a checkpoint)
	lrDType   graph.DType
	stepDType graph.DType
	// The forward graph's batch inputs and loss (tokens, targets, loss for
	// the built-in model); targets is "" when the loss reads none.
	tokensName, targetsName, lossName string
}

// ValPoint is a validation loss after Step completed steps.
type ValPoint struct {
	Step int64   `json:"step"`
	Loss float64 `json:"loss"`
}

// EvalTokens is about how many tokens one evaluation averages over: enough
// that two points of the curve differ by more than their sampling noise,
// few enough that evaluating costs a fraction of the steps in between.
const EvalTokens = 4096

// EvalBatches is how many fixed validation batches one evaluation of cfg
// averages: EvalTokens' worth, at least 1 and at most 32 batches.
func EvalBatches(cfg model.Config) int {
	per := cfg.Batch * cfg.Seq
	return min(32, max(1, (EvalTokens+per-1)/per))
}

// NewTrainer builds and compiles the training step of cfg on be.
func NewTrainer(be backend.Backend, cfg model.Config, fuse bool, h Hyper, corpus *Corpus) (*Trainer, error) {
	return NewSourceTrainer(be, BuiltIn(cfg), fuse, h, corpus)
}

// NewSourceTrainer builds and compiles the training step of src on be.
func NewSourceTrainer(be backend.Backend, src Source, fuse bool, h Hyper, corpus *Corpus) (*Trainer, error) {
	return newSourceTrainer(be, src, fuse, h, corpus, false, nil)
}

// NewRankTrainer is NewSourceTrainer for one rank of a data-parallel job of
// h.World ranks, r: its step graph trains the rank's rows of each global
// batch of src.Config.Batch rows, and its AllReduce nodes average the
// gradients over the job through r. Its losses are the global batch's (the
// mean of the ranks'), and its state is the whole run's, as on one process.
func NewRankTrainer(be backend.Backend, src Source, fuse bool, h Hyper, corpus *Corpus, r Ranks) (*Trainer, error) {
	return newSourceTrainer(be, src, fuse, h, corpus, false, r)
}

// newSourceTrainer is NewRankTrainer; checkFinite compiles the step in the
// backend's diagnostic mode (backend.Options.CheckFinite).
func newSourceTrainer(be backend.Backend, src Source, fuse bool, h Hyper, corpus *Corpus, checkFinite bool, ranks Ranks) (*Trainer, error) {
	cfg := src.Config
	if err := h.Schedule().Validate(); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	if err := checkRanks(src, h, ranks); err != nil {
		return nil, err
	}
	local, err := rankConfig(cfg, h)
	if err != nil {
		return nil, fmt.Errorf("train: -batch: %w", err)
	}
	if cfg.Vocab > 0 {
		if err := corpus.CheckVocab(cfg.Vocab); err != nil {
			return nil, fmt.Errorf("train: %s: %w", src.Name(), err)
		}
	}
	rankSrc := src
	rankSrc.Config = local
	gs, err := BuildSourceGraphs(be, rankSrc, fuse, h)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	if h.Accum < 0 {
		return nil, fmt.Errorf("train: gradient accumulation over %d micro-batches: want at least 1", h.Accum)
	}
	// The validation set may be too short for a window; then there is
	// simply no validation (Eval says so).
	tb, vb, err := corpus.Batchers(cfg.Batch, cfg.Seq, h.DataSeed, h.DataOrder)
	if err == nil && h.accum() > 1 {
		// A step of Accum micro-batches trains on the batch a run at Accum
		// times the batch size draws (split in StepFeedsOf).
		tb, _, err = corpus.Batchers(cfg.Batch*h.accum(), cfg.Seq, h.DataSeed, h.DataOrder)
	}
	if err != nil {
		return nil, fmt.Errorf("train: training data %s: %w", corpus.Source, err)
	}
	t := &Trainer{Config: cfg, Source: src, Fused: fuse, Hyper: h, Graphs: gs, be: be, train: tb, sched: h.Schedule(), corpus: corpus, ranks: ranks}
	if vb != nil {
		t.val = vb
	}
	if h.world() > 1 {
		// Each rank draws the global batch and keeps its rows: the job
		// trains on exactly the batches of the one-process run.
		lo, hi := ranks.Rank()*local.Batch, (ranks.Rank()+1)*local.Batch
		if t.train, err = NewShardBatcher(tb, lo, hi); err != nil {
			return nil, fmt.Errorf("train: %w", err)
		}
		if vb != nil {
			if t.val, err = NewShardBatcher(vb, lo, hi); err != nil {
				return nil, fmt.Errorf("train: %w", err)
			}
		}
	}
	t.tokensName, t.targetsName, t.lossName = src.names()
	for _, in := range gs.Step.Graph.Inputs {
		switch in.Name {
		case gs.Step.LR:
			t.lrDType = in.Type.DType
		case gs.Step.Step:
			t.stepDType = in.Type.DType
		}
	}
	opts := backend.Options{Updates: gs.Step.Updates, CheckFinite: checkFinite}
	if h.world() > 1 {
		opts.Collective = ranks
	}
	t.exec, err = be.Compile(gs.Step.Graph, opts)
	if err != nil {
		return nil, fmt.Errorf("train: compiling the training step on %s: %w", be.Name(), err)
	}
	return t, nil
}

// Close releases the executables.
func (t *Trainer) Close() error {
	if t.eval != nil {
		t.eval.Close()
	}
	return t.exec.Close()
}

// StepsDone is the number of completed steps.
func (t *Trainer) StepsDone() int64 { return t.step }

// Losses returns the train loss of every completed step.
func (t *Trainer) Losses() []float64 { return append([]float64(nil), t.losses...) }

// ValLosses returns the validation points so far.
func (t *Trainer) ValLosses() []ValPoint { return append([]ValPoint(nil), t.vals...) }

// Stats is the training executable's memory accounting.
func (t *Trainer) Stats() backend.Stats { return t.exec.Stats() }

// LR is the learning rate of the next step.
func (t *Trainer) LR() float64 { return t.sched.LR(t.step) }

// Step runs one training step on the next batch and returns its loss. A
// non-finite loss is an error and does not count as a step; the executable's
// weights are then damaged and the run must restart from a checkpoint.
//
// On a rank of a data-parallel job the loss is the global batch's: the mean
// of the ranks' losses, agreed through the collective.
func (t *Trainer) Step() (float64, error) {
	loss, _, err := t.stepAgreeing(false)
	return loss, err
}

// stepAgreeing is Step; on a rank of a job, stop says that this rank was
// asked to stop (a signal), and stopAll that some rank was: the ranks agree
// on it with the loss, so that every rank stops after the same step.
func (t *Trainer) stepAgreeing(stop bool) (loss float64, stopAll bool, err error) {
	if t.Hyper.accum() > 1 {
		loss, err = t.stepAccum()
		return loss, stop, err
	}
	out, err := t.exec.Run(t.StepFeeds())
	if err != nil {
		return 0, false, fmt.Errorf("train: step %d: %w", t.step+1, err)
	}
	lt, ok := out[t.Graphs.Step.Loss]
	if !ok || lt.Len() != 1 {
		return 0, false, fmt.Errorf("train: step %d: the step returned no scalar loss", t.step+1)
	}
	loss = lt.At(0)
	stopAll = stop
	if t.ranks != nil && t.ranks.WorldSize() > 1 {
		flag := 0.0
		if stop {
			flag = 1
		}
		m, err := t.reduceMean(context.Background(), loss, flag)
		if err != nil {
			return 0, false, fmt.Errorf("train: step %d: agreeing on the loss: %w", t.step+1, err)
		}
		loss, stopAll = m[0], m[1] > 0
	}
	if err := t.finishStep(out, loss); err != nil {
		return loss, stopAll, err
	}
	return loss, stopAll, nil
}

// finishStep checks a step's loss and counts the step.
func (t *Trainer) finishStep(out map[string]*graph.Tensor, loss float64) error {
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return fmt.Errorf("train: step %d: loss is %v (%w; try a lower -lr)", t.step+1, loss, ErrDiverged)
	}
	if err := t.readGradNorm(out); err != nil {
		return err
	}
	t.step++
	t.losses = append(t.losses, loss)
	return nil
}

// HasVal reports whether there is validation data for at least one window.
func (t *Trainer) HasVal() bool { return t.val != nil }

// Eval returns the mean loss over EvalBatches(cfg) fixed validation batches (the
// same batches every time, so the points of a curve are comparable), with the
// current weights, and records it at the current step.
func (t *Trainer) Eval() (float64, error) { return t.EvalContext(context.Background()) }

// EvalContext is Eval, given up (with an error wrapping ctx's cause, and
// nothing recorded) as soon as ctx is done: between batches, and while the
// evaluation graph compiles.
func (t *Trainer) EvalContext(ctx context.Context) (float64, error) {
	if t.val == nil {
		return 0, fmt.Errorf("train: no validation data (%d %s, a window needs %d)", t.corpus.ValLen(), t.corpus.Unit(), t.Config.Seq+1)
	}
	if t.eval == nil {
		e, err := untilDone(ctx, "compiling the evaluation graph", func() (backend.Executable, error) {
			return t.be.Compile(t.Graphs.Forward, backend.Options{})
		}, backend.Executable.Close)
		if err != nil {
			return 0, fmt.Errorf("train: compiling the evaluation graph: %w", err)
		}
		t.eval = e
	}
	// The weights live in the training executable; copy them over.
	for _, p := range t.Graphs.Forward.Params {
		w, err := t.exec.Initializer(p.Name)
		if err != nil {
			return 0, fmt.Errorf("train: eval: %w", err)
		}
		if err := t.eval.SetInitializer(p.Name, w); err != nil {
			return 0, fmt.Errorf("train: eval: %w", err)
		}
	}
	var sum float64
	nb := EvalBatches(t.Config)
	for k := range nb {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("train: %w during the validation at step %d", context.Cause(ctx), t.step)
		}
		tokens, targets := t.val.Batch(int64(k))
		out, err := t.eval.Run(t.batchFeeds(tokens, targets))
		if err != nil {
			return 0, fmt.Errorf("train: eval: %w", err)
		}
		sum += out[t.lossName].At(0)
	}
	loss := sum / float64(nb)
	// A rank evaluated its rows of each validation batch: the batch's loss
	// is the mean over the ranks.
	m, err := t.reduceMean(context.Background(), loss)
	if err != nil {
		return 0, fmt.Errorf("train: eval: agreeing on the validation loss: %w", err)
	}
	loss = m[0]
	t.recordVal(loss)
	return loss, nil
}

func (t *Trainer) recordVal(loss float64) {
	if n := len(t.vals); n > 0 && t.vals[n-1].Step == t.step {
		t.vals[n-1].Loss = loss
		return
	}
	t.vals = append(t.vals, ValPoint{Step: t.step, Loss: loss})
}

// stateTypes is what a checkpoint must hold: every initializer the step
// updates (params and moments), by type.
func (t *Trainer) stateTypes() map[string]graph.TensorType {
	vals := t.Graphs.Step.Graph.Values()
	m := map[string]graph.TensorType{}
	for _, target := range t.Graphs.Step.Updates {
		m[target] = vals[target].Type
	}
	return m
}

func (t *Trainer) stateNames() []string {
	names := make([]string, 0, len(t.Graphs.Step.Updates))
	for _, target := range t.Graphs.Step.Updates {
		names = append(names, target)
	}
	sort.Strings(names)
	return names
}

// State returns the weights, the optimizer moments and the metadata that
// make up a checkpoint of the current step. With a sharded optimizer every
// rank of the job must call it (in the same order as the steps): the
// moments are gathered from the ranks that hold their parts.
func (t *Trainer) State() (*checkpoint.Tensors, error) {
	ts := &checkpoint.Tensors{Tensors: map[string]*graph.Tensor{}, Metadata: map[string]string{}}
	if t.sharded() {
		if err := t.gatherState(ts.Tensors); err != nil {
			return nil, err
		}
	} else {
		for _, n := range t.stateNames() {
			w, err := t.exec.Initializer(n)
			if err != nil {
				return nil, fmt.Errorf("train: state: %w", err)
			}
			ts.Tensors[n] = w
		}
	}
	cfg, _ := json.Marshal(t.Config)
	hyper, _ := json.Marshal(struct {
		Hyper
		Fused bool `json:"fused"`
	}{t.Hyper, t.Fused})
	losses, _ := json.Marshal(t.losses)
	vals, _ := json.Marshal(t.vals)
	m := ts.Metadata
	m[checkpoint.MetaFormat] = checkpoint.CheckpointFormat
	m[checkpoint.MetaStep] = strconv.FormatInt(t.step, 10)
	m[checkpoint.MetaConfig] = string(cfg)
	m[checkpoint.MetaOptions] = string(hyper)
	m[checkpoint.MetaDataSeed] = strconv.FormatUint(t.Hyper.DataSeed, 10)
	m[checkpoint.MetaDataNext] = strconv.FormatInt(t.step, 10) // step k trains on batch k
	m[checkpoint.MetaCorpus] = t.corpus.Fingerprint()
	m[checkpoint.MetaTrainTokens] = strconv.FormatInt(t.step*int64(t.Config.Batch*t.Config.Seq*t.Hyper.accum()), 10)
	m[checkpoint.MetaLosses] = string(losses)
	m[checkpoint.MetaValLosses] = string(vals)
	m[checkpoint.MetaElapsed] = strconv.FormatFloat(t.elapsed, 'g', -1, 64)
	if t.Source.Graph != nil {
		spec, _ := json.Marshal(t.Source.Graph.Spec)
		m[MetaSource] = string(spec)
	}
	return ts, nil
}

// Restore loads a checkpoint into the executable and moves the run to its
// step. The checkpoint must have been made for the same model config and
// hold exactly the step's state; the notes list settings that differ from
// the checkpoint's (another schedule, data seed or corpus), which are allowed
// but mean the run no longer continues the old one exactly.
func (t *Trainer) Restore(ts *checkpoint.Tensors, step int64) (notes []string, err error) {
	if err := t.checkSource(ts); err != nil {
		return nil, err
	}
	var cfg model.Config
	if err := json.Unmarshal([]byte(ts.Metadata[checkpoint.MetaConfig]), &cfg); err != nil {
		return nil, fmt.Errorf("train: checkpoint config: %w", err)
	}
	if cfg != t.Config {
		return nil, fmt.Errorf("train: the checkpoint is of another model (%s; pass the checkpoint's -config and overrides)", fieldDiffs(cfg, t.Config))
	}
	if err := checkpoint.CheckState(ts, t.fullStateTypes()); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	var old struct {
		Hyper
		Fused bool `json:"fused"`
	}
	if err := json.Unmarshal([]byte(ts.Metadata[checkpoint.MetaOptions]), &old); err != nil {
		return nil, fmt.Errorf("train: checkpoint options: %w", err)
	}
	// Recomputation changes what the step keeps, not what it computes: a
	// run may resume in another mode and still continue the old one.
	if was, now := old.RecomputeMode(), t.Hyper.RecomputeMode(); was != now {
		notes = append(notes, fmt.Sprintf("the checkpoint was trained with -recompute %s, this run uses %s (the same math; only memory and speed differ)", was, now))
		old.Recompute, old.RecomputeCheap = t.Hyper.Recompute, t.Hyper.RecomputeCheap
	}
	now := t.Hyper
	now.Rank = 0 // not recorded
	if now.ShardOptimizer != old.ShardOptimizer {
		// The same bits either way: not a difference worth a note.
		now.ShardOptimizer = old.ShardOptimizer
	}
	if old.Hyper != now {
		notes = append(notes, fmt.Sprintf("settings differ from the checkpoint's (%s): the run does not repeat the original exactly", fieldDiffs(old.Hyper, now)))
	}
	if old.Fused != t.Fused {
		notes = append(notes, fmt.Sprintf("the checkpoint was trained with fusion %v, this run uses %v (same math, rounding differs)", old.Fused, t.Fused))
	}
	if fp := ts.Metadata[checkpoint.MetaCorpus]; fp != t.corpus.Fingerprint() {
		notes = append(notes, fmt.Sprintf("the data differs from the checkpoint's (corpus %s there, %s now)", fp, t.corpus.Fingerprint()))
	}
	var losses []float64
	var vals []ValPoint
	if err := json.Unmarshal([]byte(ts.Metadata[checkpoint.MetaLosses]), &losses); err != nil || int64(len(losses)) != step {
		return nil, fmt.Errorf("train: checkpoint loss history is damaged (%d losses for step %d)", len(losses), step)
	}
	if err := json.Unmarshal([]byte(ts.Metadata[checkpoint.MetaValLosses]), &vals); err != nil {
		return nil, fmt.Errorf("train: checkpoint validation history: %w", err)
	}
	if next := ts.Metadata[checkpoint.MetaDataNext]; next != strconv.FormatInt(step, 10) {
		return nil, fmt.Errorf("train: checkpoint of step %d says the next batch is %q; this sampler needs %d", step, next, step)
	}
	elapsed, _ := strconv.ParseFloat(ts.Metadata[checkpoint.MetaElapsed], 64)
	for _, n := range t.stateNames() {
		v := ts.Tensors[n]
		if t.sharded() {
			v = t.partOf(n, v)
		}
		if err := t.exec.SetInitializer(n, v); err != nil {
			return nil, fmt.Errorf("train: restore: %w", err)
		}
	}
	t.step, t.losses, t.vals, t.elapsed = step, losses, vals, elapsed
	return notes, nil
}

// fieldDiffs lists the fields in which two values of one flat struct type
// differ, as "Name: A in the checkpoint, B now".
func fieldDiffs(ckpt, now any) string {
	a, b := reflect.ValueOf(ckpt), reflect.ValueOf(now)
	var out []string
	for i := range a.NumField() {
		if x, y := a.Field(i).Interface(), b.Field(i).Interface(); x != y {
			out = append(out, fmt.Sprintf("%s: %v in the checkpoint, %v now", a.Type().Field(i).Name, x, y))
		}
	}
	return strings.Join(out, "; ")
}
