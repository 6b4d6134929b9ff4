package train

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// Ranks is the data-parallel job a Trainer is one rank of: the collective its
// step graph's AllReduce nodes call (package dist's TCP transport on the CPU),
// which the loop also uses to agree on the loss, the validation loss and
// when to stop, and a barrier around rank 0's checkpoint writes.
type Ranks interface {
	Rank() int
	WorldSize() int
	// AllReduceSum replaces buf with the element-wise sum over every rank's
	// buf, the same bits on every rank.
	AllReduceSum(ctx context.Context, buf []float32) error
	// Barrier returns once every rank has called it.
	Barrier(ctx context.Context) error
}

// batchSource is what the trainer draws its batches from: a Batcher, or one
// rank's rows of a Batcher's batches (ShardBatcher).
type batchSource interface {
	Batch(k int64) (tokens, targets *graph.Tensor)
}

// world is the number of ranks of the job (1 without one).
func (h Hyper) world() int { return max(1, h.World) }

// rankConfig is the config of one rank's step graph: the global batch of cfg
// split evenly over h's ranks, each rank computing the mean loss of its rows.
// Equal shards make the mean of the ranks' mean gradients (AllReduce with
// reduce=mean) the gradient of the global batch's mean loss, which is why an
// uneven split is refused rather than rounded.
func rankConfig(cfg model.Config, h Hyper) (model.Config, error) {
	w := h.world()
	if w == 1 {
		return cfg, nil
	}
	if cfg.Batch%w != 0 {
		return cfg, fmt.Errorf("the global batch of %d rows does not split evenly over %d ranks: give a -batch that is a multiple of %d", cfg.Batch, w, w)
	}
	local := cfg
	local.Batch = cfg.Batch / w
	return local, nil
}

// checkRanks refuses what data-parallel training does not do yet, and a job
// whose collective disagrees with the hyperparameters' world size.
func checkRanks(src Source, h Hyper, r Ranks) error {
	w := h.world()
	if r == nil {
		if w > 1 {
			return fmt.Errorf("train: a step over %d ranks needs the job's collective (Options.Ranks)", w)
		}
		return nil
	}
	if r.WorldSize() != w {
		return fmt.Errorf("train: the job has %d ranks but the step is built for %d", r.WorldSize(), w)
	}
	if w == 1 {
		if h.ShardOptimizer {
			return fmt.Errorf("train: a sharded optimizer needs several ranks: there is nothing to shard over one")
		}
		return nil
	}
	if h.ShardOptimizer && h.ClipNorm != 0 {
		return fmt.Errorf("train: -clip with -shard-optimizer is not supported yet (each rank holds a part of the gradients; the global norm needs one more all-reduce)")
	}
	if h.Rank != r.Rank() {
		return fmt.Errorf("train: the step is built for rank %d, this process is rank %d", h.Rank, r.Rank())
	}
	if src.Graph != nil {
		return fmt.Errorf("train: training a graph FILE on several ranks is not supported yet (its batch size is fixed in the file): train the built-in -config models on several ranks, or the FILE on one")
	}
	if h.accum() > 1 {
		return fmt.Errorf("train: -accum with several ranks is not supported yet: raise -batch instead (the global batch is split over the ranks)")
	}
	return nil
}

// reduceMean returns the mean over the ranks of each value (in float32, the
// collective's type, summed in float64 in rank order: the same bits on
// every rank).
func (t *Trainer) reduceMean(ctx context.Context, vals ...float64) ([]float64, error) {
	if t.ranks == nil || t.ranks.WorldSize() == 1 {
		return vals, nil
	}
	buf := make([]float32, len(vals))
	for i, v := range vals {
		buf[i] = float32(v)
	}
	if err := t.ranks.AllReduceSum(ctx, buf); err != nil {
		return nil, err
	}
	out := make([]float64, len(vals))
	w := float64(t.ranks.WorldSize())
	for i, v := range buf {
		out[i] = float64(v) / w
	}
	return out, nil
}

// Rank is this trainer's rank in its job (0 without one).
func (t *Trainer) Rank() int {
	if t.ranks == nil {
		return 0
	}
	return t.ranks.Rank()
}

// barrier waits for every rank of the job (nothing without one); what says
// where, for the error.
func (t *Trainer) barrier(what string, args ...any) error {
	if t.ranks == nil || t.ranks.WorldSize() == 1 {
		return nil
	}
	if err := t.ranks.Barrier(context.Background()); err != nil {
		return fmt.Errorf("train: waiting for the other ranks %s: %w", fmt.Sprintf(what, args...), err)
	}
	return nil
}

// sharded says that the step keeps only this rank's part of the optimizer
// state (ZeRO-1).
func (t *Trainer) sharded() bool { return t.Graphs.Step.Shards != nil }

// fullStateTypes is what a checkpoint holds: every trained param and its two
// moments, whole, whether or not this rank keeps all of them.
func (t *Trainer) fullStateTypes() map[string]graph.TensorType {
	if !t.sharded() {
		return t.stateTypes()
	}
	vals := t.Graphs.Step.Graph.Values()
	m := map[string]graph.TensorType{}
	for _, p := range t.Graphs.Step.Params {
		m[p] = vals[p].Type
		m[momentM+p] = vals[p].Type
		m[momentV+p] = vals[p].Type
	}
	return m
}

// The checkpoint names of a param's AdamW moments (autodiff.TrainingGraph's).
const (
	momentM = "opt.m."
	momentV = "opt.v."
)

// momentParam returns the param a moment's name belongs to.
func momentParam(name string) (string, bool) {
	for _, prefix := range []string{momentM, momentV} {
		if p, ok := strings.CutPrefix(name, prefix); ok {
			return p, true
		}
	}
	return "", false
}

// partOf cuts this rank's part out of a whole moment from a checkpoint (a
// param, or a moment of a param the rank holds no part of, is returned as
// it is).
func (t *Trainer) partOf(name string, whole *graph.Tensor) *graph.Tensor {
	p, ok := momentParam(name)
	if !ok {
		return whole
	}
	r, ok := t.Graphs.Step.Shards[p]
	if !ok {
		return whole
	}
	part := graph.NewTensor(whole.DType, graph.Shape{r[1] - r[0]})
	for i := range part.Len() {
		part.Set(i, whole.At(r[0]+i))
	}
	return part
}

// gatherState fills state with the whole weights and moments: the weights
// are whole on every rank; each moment is summed over the ranks with this
// rank's part in place and -0 elsewhere (x + -0 is x, bits and all), in the
// same order on every rank.
func (t *Trainer) gatherState(state map[string]*graph.Tensor) error {
	vals := t.Graphs.Step.Graph.Values()
	negZero := math.Float32frombits(1 << 31)
	params := slices.Sorted(slices.Values(t.Graphs.Step.Params))
	for _, p := range params {
		w, err := t.exec.Initializer(p)
		if err != nil {
			return fmt.Errorf("train: state: %w", err)
		}
		state[p] = w
		typ := vals[p].Type
		if typ.DType != graph.Float32 {
			return fmt.Errorf("train: state: a sharded optimizer gathers float32 moments, %s is %v", p, typ.DType)
		}
		for _, prefix := range []string{momentM, momentV} {
			whole := graph.NewTensor(typ.DType, typ.Shape.Clone())
			for i := range whole.F32 {
				whole.F32[i] = negZero
			}
			if r, ok := t.Graphs.Step.Shards[p]; ok {
				part, err := t.exec.Initializer(prefix + p)
				if err != nil {
					return fmt.Errorf("train: state: %w", err)
				}
				copy(whole.F32[r[0]:r[1]], part.F32)
			}
			if err := t.ranks.AllReduceSum(context.Background(), whole.F32); err != nil {
				return fmt.Errorf("train: gathering the optimizer state for a checkpoint: %w", err)
			}
			state[prefix+p] = whole
		}
	}
	return nil
}

// OptimizerStateBytes is the memory of the optimizer state this rank keeps:
// the AdamW moments, whole or (ZeRO-1) this rank's parts.
func (t *Trainer) OptimizerStateBytes() int64 {
	vals := t.Graphs.Step.Graph.Values()
	var n int64
	for _, ms := range t.Graphs.Step.Moments {
		for _, m := range ms {
			typ := vals[m].Type
			n += int64(typ.Shape.Numel()) * int64(typ.DType.Size())
		}
	}
	return n
}
