package main

import (
	"fmt"
	"io"
	"time"

	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

// trainModelConfig is the model train builds. A -resume run starts from the
// newest checkpoint's config in ckptDir (its size, dtype and seed included),
// so it needs no model flags; flags given still override, and a checkpoint
// of another model is then refused when it is restored.
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
		// Not a built-in model's checkpoint (or a damaged one): the flags
		// decide, and restoring the checkpoint says what does not match.
		return mf.modelConfig()
	}
	cfg, err := mf.modelConfigOn(&base)
	if err == nil && cfg == base {
		fmt.Fprintf(log, "resume: the model of %s: %s\n", p, describeConfig(cfg))
	}
	return cfg, err
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
