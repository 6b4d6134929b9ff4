package autodiff

import (
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// A ZeRO-1 step of world ranks: each rank's graph verifies, round-trips the
// text format, and updates every param whole (an AllGather feeds it), while
// the ranks' moments are parts that cover each param exactly once between
// them; a single-rank sharded step is refused where it would mean nothing.
func TestShardedStepPartsCoverEveryParam(t *testing.T) {
	cfg := tinyConfig(t, graph.Float32)
	const world = 3
	covered := map[string][]int{} // param → how many ranks hold each element
	var paramElems, momentElems int
	for rank := range world {
		ts, err := TrainingGraph(buildModel(t, cfg), TrainOptions{World: world, Rank: rank, ShardOptimizer: true, BucketBytes: 50 << 10})
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
		text := graph.Format(ts.Graph)
		back, err := graph.Parse(text)
		if err != nil || graph.Format(back) != text {
			t.Fatalf("rank %d: the sharded step does not round-trip the text format: %v", rank, err)
		}
		vals := ts.Graph.Values()
		ops := ts.Graph.CountOps()
		if ops["ReduceScatter"] < 2 || ops["ReduceScatter"] != ops["AllGather"] || ops["AllReduce"] != 0 {
			t.Errorf("rank %d: %d ReduceScatter, %d AllGather, %d AllReduce; want one scatter and one gather per bucket (several) and no all-reduce", rank, ops["ReduceScatter"], ops["AllGather"], ops["AllReduce"])
		}
		for _, p := range ts.Params {
			n := vals[p].Type.Shape.Numel()
			if rank == 0 {
				paramElems += n
				covered[p] = make([]int, n)
			}
			if ts.Updates[p+".next"] != p {
				t.Errorf("rank %d: %s is not updated whole", rank, p)
			}
			r, ok := ts.Shards[p]
			if !ok {
				continue
			}
			for i := r[0]; i < r[1]; i++ {
				covered[p][i]++
			}
			m := vals[ts.Moments[p][0]].Type.Shape
			if m.Numel() != r[1]-r[0] {
				t.Errorf("rank %d: %s's moment has %v for its part [%d, %d)", rank, p, m, r[0], r[1])
			}
			momentElems += m.Numel()
		}
	}
	for p, c := range covered {
		for i, k := range c {
			if k != 1 {
				t.Fatalf("element %d of %s is held by %d ranks, want exactly one", i, p, k)
			}
		}
	}
	if momentElems != paramElems {
		t.Errorf("the ranks' first moments hold %d elements in all, the params %d", momentElems, paramElems)
	}
	if _, err := TrainingGraph(buildModel(t, cfg), TrainOptions{World: 2, ShardOptimizer: true, ClipNorm: 1}); err == nil {
		t.Error("clipping with a sharded optimizer was accepted")
	}
	if _, err := TrainingGraph(buildModel(t, cfg), TrainOptions{World: 2, Rank: 2, ShardOptimizer: true}); err == nil {
		t.Error("rank 2 of 2 was accepted")
	}
}
