package dist

import (
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/train"
)

// The ranks' shards of batch k, laid end to end in rank order, are exactly the
// batch a single process draws at step k: data parallel training sees the same
// global batch on any number of ranks.
func TestShardUnionIsTheSingleProcessBatch(t *testing.T) {
	data := make([]byte, 5000)
	for i := range data {
		data[i] = byte(i*7 + i/13)
	}
	const batch, seq = 8, 16
	full, err := train.NewBatcher(data, batch, seq, 42)
	if err != nil {
		t.Fatal(err)
	}
	for _, world := range []int{1, 2, 4, 8} {
		shards := make([]*train.ShardBatcher, world)
		for r := range world {
			lo, hi, err := Shard(batch, world, r)
			if err != nil {
				t.Fatal(err)
			}
			if shards[r], err = train.NewShardBatcher(full, lo, hi); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range []int64{0, 1, 17, 1 << 40} {
			wantTok, wantTgt := full.Batch(k)
			var gotTok, gotTgt []int64
			for r, s := range shards {
				tok, tgt := s.Batch(k)
				if got, want := tok.Shape, (graph.Shape{batch / world, seq}); !slices.Equal(got, want) {
					t.Fatalf("world %d rank %d: shard shape %v, want %v", world, r, got, want)
				}
				gotTok = append(gotTok, tok.I64...)
				gotTgt = append(gotTgt, tgt.I64...)
			}
			if !slices.Equal(gotTok, wantTok.I64) || !slices.Equal(gotTgt, wantTgt.I64) {
				t.Errorf("world %d, batch %d: the shards' union differs from the single-process batch", world, k)
			}
		}
	}
	// Different steps draw different batches, so the comparison above is not
	// comparing constants.
	a, _ := full.Batch(0)
	b, _ := full.Batch(1)
	if slices.Equal(a.I64, b.I64) {
		t.Fatal("batches 0 and 1 are equal: the test data cannot tell shards apart")
	}
}

func TestShardBatcherRejectsBadRows(t *testing.T) {
	full, err := train.NewBatcher(make([]byte, 100), 4, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, rows := range [][2]int{{-1, 2}, {0, 5}, {2, 2}, {3, 1}} {
		if _, err := train.NewShardBatcher(full, rows[0], rows[1]); err == nil {
			t.Errorf("rows [%d, %d) of a batch of 4: no error", rows[0], rows[1])
		}
	}
}
