package train

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// FuzzRestoreCheckpoint feeds arbitrary bytes through the whole resume path:
// the safetensors reader, the checkpoint's format and step, and the trainer's
// parsing of the metadata (model config, options, loss and validation
// histories) and its checks of the state tensors. Each must fail with an
// error, never panic; a checkpoint it accepts must leave the trainer at its
// step with its loss history.
func FuzzRestoreCheckpoint(f *testing.F) {
	cfg, err := model.Lookup("tiny")
	if err != nil {
		f.Fatal(err)
	}
	// As small as a model gets (a 1-layer width-4 net, a 25 KB checkpoint): the
	// fuzzer copies and mutates the whole file at every execution.
	cfg.Dim, cfg.Layers, cfg.Heads, cfg.HeadDim, cfg.FFN = 4, 1, 1, 4, 8
	cfg.Seq, cfg.Batch, cfg.DType = 4, 1, graph.Float32
	var text strings.Builder
	for i := range 200 {
		text.WriteString("func add(a, b int) int { return a + b } // line " + strings.Repeat("x", i%7) + "\n")
	}
	corpus, err := NewCorpus("fuzz", []byte(text.String()), 0.1)
	if err != nil {
		f.Fatal(err)
	}
	h := Hyper{LR: 3e-3, MinLR: 3e-4, Warmup: 1, Steps: 2, WeightDecay: 0.1, DataSeed: 11}
	res, err := Run(context.Background(), cpu.New(), corpus, Options{Config: cfg, Hyper: h, CkptDir: f.TempDir()})
	if err != nil {
		f.Fatal(err)
	}
	seed, err := os.ReadFile(res.Checkpoint)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	tr, err := NewTrainer(cpu.New(), cfg, false, h, corpus)
	if err != nil {
		f.Fatal(err)
	}
	defer tr.Close()
	// The seed must pass the whole path, so that mutations start from a
	// checkpoint that restores.
	if ts, err := checkpoint.ReadSafetensors(seed); err != nil {
		f.Fatal(err)
	} else if _, err := tr.Restore(ts, 2); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ts, err := checkpoint.ReadSafetensors(b)
		if err != nil || ts.Metadata[checkpoint.MetaFormat] != checkpoint.CheckpointFormat {
			return
		}
		step, err := strconv.ParseInt(ts.Metadata[checkpoint.MetaStep], 10, 64)
		if err != nil || step < 0 {
			return
		}
		if _, err := tr.Restore(ts, step); err != nil {
			return
		}
		if tr.StepsDone() != step || int64(len(tr.Losses())) != step {
			t.Fatalf("restored a checkpoint of step %d: trainer at step %d with %d losses", step, tr.StepsDone(), len(tr.Losses()))
		}
	})
}
