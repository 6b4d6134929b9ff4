package train

import (
	"context"
	"fmt"

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
		return nil
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
