package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

// resumeConfig is the model config of train -resume (and the step it
// resumes from): the newest checkpoint's
// (its config, sizes, dtype and seed), so that resuming needs no model
// flags. A model flag given explicitly must agree with the checkpoint; all
// the flags that do not are named in one error. -dtype bf16 (mixed
// precision on CUDA: a float32 model) agrees with a float32 checkpoint.
func resumeConfig(fs *flag.FlagSet, mf *modelFlags, out, ckpt string) (model.Config, int64, error) {
	dir := ckpt
	if dir == "" {
		dir = filepath.Join(out, "ckpt")
	}
	p, step, err := train.LatestCheckpoint(dir)
	if err != nil {
		return model.Config{}, 0, fmt.Errorf("-resume: %w", err)
	}
	if p == "" {
		return model.Config{}, 0, fmt.Errorf("-resume: no checkpoint in %s (train without -resume first, or give the folder with -ckpt)", dir)
	}
	ck, err := train.CheckpointConfig(p)
	if err != nil {
		return model.Config{}, 0, fmt.Errorf("-resume: %w", err)
	}
	var conflicts []string
	fs.Visit(func(f *flag.Flag) {
		var ok bool
		var have string
		switch f.Name {
		case "config":
			ok, have = mf.config == ck.Name, ck.Name
		case "batch":
			ok, have = mf.batch == ck.Batch, fmt.Sprint(ck.Batch)
		case "seq":
			ok, have = mf.seq == ck.Seq, fmt.Sprint(ck.Seq)
		case "layers":
			ok, have = mf.layers == ck.Layers, fmt.Sprint(ck.Layers)
		case "seed":
			ok, have = mf.seed == ck.Seed, fmt.Sprint(ck.Seed)
		case "dtype":
			dt, err := mf.graphDType()
			ok, have = err == nil && dt == ck.DType, ck.DType.String()
			if ck.DType == graph.Float32 {
				have += " (or bf16)"
			}
		default:
			return
		}
		if !ok {
			conflicts = append(conflicts, fmt.Sprintf("-%s %s (the checkpoint's: %s)", f.Name, f.Value, have))
		}
	})
	if len(conflicts) > 0 {
		return model.Config{}, 0, fmt.Errorf("-resume: %s %s for another model than the checkpoint %s, a %s model (batch %d, seq %d, %d layers, %s, seed %d), which -resume continues: drop %s to resume it, or train a new run without -resume (into another -out)",
			strings.Join(conflicts, ", "), conflictVerb(len(conflicts)), p, ck.Name, ck.Batch, ck.Seq, ck.Layers, ck.DType, ck.Seed, pronoun(len(conflicts)))
	}
	if _, err := mf.graphDType(); err != nil { // sets mf.bf16 from -dtype
		return model.Config{}, 0, err
	}
	return ck, step, nil
}

func conflictVerb(n int) string {
	if n == 1 {
		return "asks"
	}
	return "ask"
}

func pronoun(n int) string {
	if n == 1 {
		return "that flag"
	}
	return "those flags"
}
