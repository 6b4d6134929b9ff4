package dist

import "fmt"

// Shard is rank's part of a global batch of globalBatch rows split over world
// ranks: rows [lo, hi) of the batch the single-process run would draw. The
// parts are contiguous, equal and in rank order, so their union is the global
// batch exactly once and every rank computes its part without talking to the
// others. An uneven split is refused rather than rounded: ranks with different
// batch sizes would weight their gradients differently in the all-reduce's
// average, and the 1-GPU and N-GPU runs would no longer agree.
func Shard(globalBatch, world, rank int) (lo, hi int, err error) {
	if world < 1 {
		return 0, 0, fmt.Errorf("dist: world size must be at least 1, got %d", world)
	}
	if rank < 0 || rank >= world {
		return 0, 0, fmt.Errorf("dist: rank %d is outside [0, %d)", rank, world)
	}
	if globalBatch < 1 {
		return 0, 0, fmt.Errorf("dist: global batch must be at least 1, got %d", globalBatch)
	}
	if globalBatch%world != 0 {
		return 0, 0, fmt.Errorf("dist: global batch %d does not split evenly over %d ranks: use a batch that is a multiple of %d", globalBatch, world, world)
	}
	per := globalBatch / world
	return rank * per, (rank + 1) * per, nil
}
