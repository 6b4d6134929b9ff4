package train

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// ShardBatcher draws one rank's rows of a Batcher's batches: rows [lo, hi) of
// exactly the batch the whole Batcher would draw at the same step. A row's
// window depends on the draws of the rows before it, so the whole batch is
// drawn (a few random numbers and a copy per row, nothing next to a training
// step) and the rank's rows are kept; this way data parallel training sees the
// same global batch as a single process, whatever the number of ranks.
type ShardBatcher struct {
	full                  *Batcher
	lo, hi                int
	scratchTok, scratchTg []int64
}

// NewShardBatcher returns the batcher of rows [lo, hi) of full's batches.
func NewShardBatcher(full *Batcher, lo, hi int) (*ShardBatcher, error) {
	if full == nil {
		return nil, fmt.Errorf("data: shard of a nil batcher")
	}
	if lo < 0 || hi > full.batch || lo >= hi {
		return nil, fmt.Errorf("data: shard rows [%d, %d) are not a non-empty part of a batch of %d", lo, hi, full.batch)
	}
	n := full.batch * full.seq
	return &ShardBatcher{full: full, lo: lo, hi: hi, scratchTok: make([]int64, n), scratchTg: make([]int64, n)}, nil
}

// Rows is the number of rows this shard draws, hi - lo.
func (s *ShardBatcher) Rows() int { return s.hi - s.lo }

// Batch returns the shard's tokens and targets of batch k (int64 [hi-lo, S]).
func (s *ShardBatcher) Batch(k int64) (tokens, targets *graph.Tensor) {
	shape := graph.Shape{s.Rows(), s.full.seq}
	tokens = graph.NewTensor(graph.Int64, shape)
	targets = graph.NewTensor(graph.Int64, shape)
	s.Fill(k, tokens.I64, targets.I64)
	return tokens, targets
}

// Fill writes the shard's rows of batch k into tokens and targets (each
// (hi-lo)·S long, row-major).
func (s *ShardBatcher) Fill(k int64, tokens, targets []int64) {
	s.full.Fill(k, s.scratchTok, s.scratchTg)
	a, b := s.lo*s.full.seq, s.hi*s.full.seq
	copy(tokens, s.scratchTok[a:b])
	copy(targets, s.scratchTg[a:b])
}
