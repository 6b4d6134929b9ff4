package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

// trainModelConfig is the model train builds. A -resume run builds the
// newest checkpoint's model in ckptDir (its config, sizes, dtype and seed),
// so it needs no model flags. A model flag given explicitly must agree with
// the checkpoint; all the flags that do not are named in one error, before
// anything runs. -dtype bf16 (mixed precision on CUDA: a float32 model)
// agrees with a float32 checkpoint. Without a checkpoint, or with one that
// is not a built-in model's (or a damaged one), the flags decide, and the
// run reports what is missing or does not match when it restores.
func trainModelConfig(mf *modelFlags, resume bool, ckptDir string, log io.Writer) (model.Config, error) {
	if !resume || ckptDir == "" {
		return mf.modelConfig()
	}
	p, _, err := checkpoint.LatestCheckpoint(ckptDir)
	if err != nil || p == "" {
		// The run reports the missing checkpoint itself.
		return mf.modelConfig()
	}
	base, err := train.CheckpointConfig(p)
	if err != nil {
		return mf.modelConfig()
	}
	dt, err := mf.graphDType() // also sets mf.bf16 from -dtype
	if err != nil {
		return base, err
	}
	kvHeads := func(c model.Config) int {
		if c.KVHeads == 0 {
			return c.Heads
		}
		return c.KVHeads
	}
	var conflicts []string
	mf.fs.Visit(func(f *flag.Flag) {
		var ok bool
		var have string
		flagInt := func(v, ck int) {
			ok, have = v == ck, fmt.Sprint(ck)
		}
		switch f.Name {
		case "config":
			ok, have = mf.config == base.Name, base.Name
		case "batch":
			flagInt(mf.batch, base.Batch)
		case "seq":
			flagInt(mf.seq, base.Seq)
		case "layers":
			flagInt(mf.layers, base.Layers)
		case "seed":
			flagInt(mf.seed, base.Seed)
		case "dim":
			flagInt(mf.size.dim, base.Dim)
		case "heads":
			flagInt(mf.size.heads, base.Heads)
		case "kv-heads":
			flagInt(mf.size.kvHeads, kvHeads(base))
		case "head-dim":
			flagInt(mf.size.headDim, base.HeadDim)
		case "ffn":
			flagInt(mf.size.ffn, base.FFN)
		case "vocab":
			flagInt(mf.size.vocab, base.Vocab)
		case "dtype":
			ok, have = dt == base.DType, base.DType.String()
			if base.DType == graph.Float32 {
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
		return base, fmt.Errorf("-resume: the checkpoint is of another model than %s %s for: %s, a %s model (batch %d, seq %d, %d layers, %s, seed %d), which -resume continues: drop %s to resume it, or train a new run without -resume (into another -out)",
			strings.Join(conflicts, ", "), conflictVerb(len(conflicts)), p, base.Name, base.Batch, base.Seq, base.Layers, base.DType, base.Seed, pronoun(len(conflicts)))
	}
	fmt.Fprintf(log, "resume: the model of %s: %s\n", p, describeConfig(base))
	return base, nil
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

// describeConfig is a config's size in one line.
func describeConfig(c model.Config) string {
	kv := ""
	if c.KVHeads > 0 {
		kv = fmt.Sprintf(" (%d key/value heads)", c.KVHeads)
	}
	return fmt.Sprintf("%s: vocab %d, dim %d, %d layers, %d heads%s of %d, ffn %d, seq %d, batch %d, %s",
		c.Name, c.Vocab, c.Dim, c.Layers, c.Heads, kv, c.HeadDim, c.FFN, c.Seq, c.Batch, c.DType)
}

const dataFormatHelp = `how to read a -data file: auto, text (bytes), uint16 (raw little-endian uint16 tokens, nanoGPT's train.bin) or llm.c (a 1024-byte header: magic 20240520, version 1, token count; then uint16 tokens). auto decides by content, then by name: llm.c's magic number makes an llm.c file, a name ending in .bin raw uint16 tokens (they have no header to tell them by), anything else text. A token file's tokens must be below -vocab; its last -val-frac is held out, or all of the file named like it with "val" for "train" (train.bin and val.bin) when that is beside it`

const dataOrderHelp = `random: each row a window at a random offset (seeded by -seed and the step); sequential: step i reads B consecutive, non-overlapping windows of seq+1 tokens starting at token i·B·(seq+1), wrapping to token 0 after the last whole window (to compare a run batch for batch with another framework)`

// loadTrainData reads -data in -data-format and checks its tokens against
// the model's vocabulary, saying what it read.
func loadTrainData(log io.Writer, src string, valFrac float64, format string, cfg model.Config) (*train.Corpus, error) {
	f, err := train.ParseDataFormat(format)
	if err != nil {
		return nil, fmt.Errorf("-data-format: %w", err)
	}
	t0 := time.Now()
	c, err := train.LoadData(src, valFrac, f)
	if err != nil {
		return nil, err
	}
	took := time.Since(t0).Round(time.Millisecond)
	if c.Unit() == "tokens" {
		val := fmt.Sprintf("the last %g", valFrac)
		if c.ValSource != "" {
			val = c.ValSource
		}
		fmt.Fprintf(log, "data: %s: %s tokens (%s), %s train / %s validation tokens (validation: %s), read in %v\n",
			src, c.Format, trainCount(int64(c.TrainLen()+c.ValLen())), trainCount(int64(c.TrainLen())), trainCount(int64(c.ValLen())), val, took)
	} else {
		fmt.Fprintf(log, "data: %s: %d files (%d skipped), %s train / %s validation bytes, read in %v\n",
			src, c.Files, c.Skip, trainBytes(int64(c.TrainLen())), trainBytes(int64(c.ValLen())), took)
	}
	if c.Note != "" {
		fmt.Fprintf(log, "note: %s\n", c.Note)
	}
	if err := c.CheckVocab(cfg.Vocab); err != nil {
		return nil, err
	}
	return c, nil
}

func parseDataOrder(s string) (train.DataOrder, error) {
	o, err := train.ParseDataOrder(s)
	if err != nil {
		return "", fmt.Errorf("-data-order: %w", err)
	}
	if o == train.OrderRandom {
		return "", nil // the zero value: checkpoints of earlier runs compare equal
	}
	return o, nil
}
