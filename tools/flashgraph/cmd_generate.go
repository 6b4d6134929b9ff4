package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/generate"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

func init() {
	register(&command{name: "generate", summary: "write text with a trained checkpoint (KV-cached decoding; a FILE-trained model: its whole forward per token)", run: runGenerate})
}

func runGenerate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("generate", "", `Continues -prompt with the model of a training checkpoint and prints the prompt and the
new bytes to stdout as they come. The prompt runs once through the prefill graph (attention
fused into FlashAttention); every new byte runs through the decode graph, which reads the
keys and values of the earlier positions from a KV cache. Prompt and new bytes must fit in
the context the model was trained with (its -seq): a longer prompt is refused. -temperature 0
is greedy decoding; -top-k and -top-p restrict sampling and so need a -temperature above 0.
-stop ends the text before the first occurrence of a string. Flags are checked before
anything is printed; a model whose logits are not finite is an error, not text. A model trained
from a graph FILE (tokens [B, S] to logits [B, S, V]) has no decode graph: every new byte runs
its whole forward over the S positions (no KV cache), and its logits must be causal.`, stderr)
	ckpt := fs.String("ckpt", filepath.Join("out", "ckpt"), "a checkpoint file, or a folder: its newest checkpoint (train's default folder)")
	prompt := fs.String("prompt", "\n", "the text to continue (bytes)")
	maxNew := fs.Int("max-new", 0, "new bytes to write (0: up to the end of the model's context)")
	temperature := fs.Float64("temperature", 0, "sampling temperature (0: greedy, the most likely byte every time)")
	topK := fs.Int("top-k", 0, "sample only among the k most likely bytes (0: all; needs -temperature > 0)")
	topP := fs.Float64("top-p", 0, "sample only among the most likely bytes whose probability adds up to p (nucleus sampling; 0 or 1: all; needs -temperature > 0)")
	stop := fs.String("stop", "", "end the text before the first occurrence of this string (not printed)")
	seed := fs.Uint64("seed", 0, "seed of the sampling")
	device := fs.String("device", defaultDevice, "where to run: cpu, cuda, or auto (CUDA when present, else the CPU)")
	dtype := fs.String("dtype", "", "compute type: float32 or float64 (default: the checkpoint's); float64 on both sides makes a token-for-token comparison with PyTorch immune to rounding")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	sampling := generate.Sampling{Temperature: *temperature, TopK: *topK, TopP: *topP, Seed: *seed}
	if err := sampling.Validate(); err != nil {
		return err
	}
	if *maxNew < 0 {
		return fmt.Errorf("-max-new must be at least 0 (0: up to the end of the context), got %d", *maxNew)
	}
	if *prompt == "" {
		return fmt.Errorf("-prompt is empty: give at least one byte to continue")
	}
	path := *ckpt
	if st, err := os.Stat(path); err != nil {
		return fmt.Errorf("-ckpt: %w (train writes checkpoints into -out's ckpt/ folder)", err)
	} else if st.IsDir() {
		p, _, err := checkpoint.LatestCheckpoint(path)
		if err != nil {
			return fmt.Errorf("-ckpt: %w", err)
		}
		if p == "" {
			return fmt.Errorf("-ckpt %s: no checkpoint in the folder", path)
		}
		path = p
	}
	var m *genModel
	var err error
	if spec, serr := train.CheckpointFileSpec(path); serr == nil && spec != nil {
		if *dtype != "" {
			return fmt.Errorf("-dtype: the model of %s was trained from %s and runs in the graph's own dtypes; -dtype is for the built-in models", path, spec.File)
		}
		m, err = graphModel(path)
	} else {
		m, err = builtInModel(path, *dtype)
	}
	if err != nil {
		return err
	}
	tokens := make([]int64, len(*prompt))
	for i := range len(*prompt) {
		tokens[i] = int64((*prompt)[i])
	}
	if len(tokens) > m.seq {
		return fmt.Errorf("the prompt is %d bytes; %s was trained with a context of %d bytes (-seq), and this model cannot read past it: give a prompt of at most %d bytes (e.g. its last %d)", len(tokens), m.name, m.seq, m.seq, m.seq)
	}
	n := *maxNew
	if n == 0 {
		n = m.seq - len(tokens) + 1
	}
	if n < 1 || len(tokens)+n-1 > m.seq {
		return fmt.Errorf("a %d-byte prompt and -max-new %d need %d positions; %s was trained with a context of %d (-seq)", len(tokens), n, len(tokens)+n, m.name, m.seq)
	}
	be, note, err := resolveDevice(*device, false)
	if err != nil {
		return err
	}
	defer be.Close()
	if note != "" {
		fmt.Fprintln(stderr, note)
	}
	gs, err := m.graphs(len(tokens), n)
	if err != nil {
		return err
	}
	if err := guardMemory(stderr, be, false, fmt.Sprintf("generating with %s", m.name), m.memHint, false, gs...); err != nil {
		return err
	}
	if m.note != "" {
		fmt.Fprintln(stderr, m.note)
	}
	upTo := ""
	if *stop != "" {
		upTo = "up to "
	}
	fmt.Fprintf(stderr, "generate: %s from %s, %s%d new bytes after a %d-byte prompt on %s\n", m.name, path, upTo, n, len(tokens), be.Name())
	if m.cache != "" {
		fmt.Fprintln(stderr, m.cache)
	}
	tokenIDs := m.vocab > 256 // the model was not trained on bytes
	if tokenIDs {
		fmt.Fprintf(stderr, "note: %s has a vocabulary of %d tokens, not bytes: the prompt's bytes are token ids 0-255 and each new token is printed as <id>\n", m.name, m.vocab)
	}
	out := bufio.NewWriter(stdout)
	text := newStopWriter(out, *stop)
	t0 := time.Now()
	started := false
	newBytes, st, err := m.generate(be, tokens, n, sampling,
		func(t int64) bool {
			if !started { // the prompt once the first byte is there: an error prints nothing
				out.WriteString(*prompt)
				started = true
			}
			var more bool
			if tokenIDs { // -stop matches the printed text, ids included
				for _, b := range []byte(fmt.Sprintf("<%d>", t)) {
					if more = text.add(b); !more {
						break
					}
				}
			} else {
				more = text.add(byte(t))
			}
			out.Flush()
			return more
		})
	if started {
		text.finish()
		out.WriteString("\n")
		out.Flush()
	}
	if err != nil {
		return err
	}
	if note := greedyNote(sampling, newBytes, tokenIDs); note != "" {
		fmt.Fprintln(stderr, note)
	}
	fmt.Fprintf(stderr, "generated %d bytes in %v: prefill of %d in %v, %.1f tokens/s decoding (compile %v)\n",
		st.NewTokens, time.Since(t0).Round(time.Millisecond), st.PromptTokens, st.Prefill.Round(time.Microsecond), st.TokensPerSec(), st.Compile.Round(time.Millisecond))
	return nil
}

// genModel is what generate runs: the built-in model of a checkpoint
// (prefill and KV-cached decode graphs) or the graph of a model trained from
// a graph FILE (its whole forward for every token).
type genModel struct {
	name       string
	seq, vocab int
	note       string // said before generating
	cache      string // the KV cache's size, said before generating ("": none)
	memHint    string // the way out of a memory refusal
	graphs     func(prompt, n int) ([]*graph.Graph, error)
	generate   func(be backend.Backend, prompt []int64, n int, s generate.Sampling, onToken func(int64) bool) ([]int64, generate.Stats, error)
}

// builtInModel reads the checkpoint of a built-in model, its weights in
// dtype ("": the checkpoint's).
func builtInModel(path, dtype string) (*genModel, error) {
	cfg, weights, err := generate.FromCheckpoint(path)
	if err != nil {
		return nil, err
	}
	if dtype != "" {
		dt, err := graph.ParseDType(dtype)
		if err != nil || (dt != graph.Float32 && dt != graph.Float64) {
			return nil, fmt.Errorf("-dtype %q: want float32 or float64", dtype)
		}
		cfg.DType = dt
		for name, w := range weights {
			c := graph.NewTensor(dt, w.Shape)
			for i := range w.Len() {
				c.Set(i, w.At(i))
			}
			weights[name] = c
		}
	}
	// The cache holds the key/value heads: with grouped-query attention
	// (-kv-heads) fewer than the query heads.
	cache := fmt.Sprintf("generate: KV cache %s: keys and values of %d layers at %d key/value heads (of %d query heads), %d positions",
		trainBytes(model.CacheBytes(cfg, cfg.Seq)), cfg.Layers, cfg.KV(), cfg.Heads, cfg.Seq)
	return &genModel{name: cfg.Name, seq: cfg.Seq, vocab: cfg.Vocab, cache: cache,
		memHint: "Use a shorter -prompt or -max-new, or -dtype float32",
		graphs:  func(prompt, n int) ([]*graph.Graph, error) { return generate.Graphs(cfg, prompt, n) },
		generate: func(be backend.Backend, prompt []int64, n int, s generate.Sampling, onToken func(int64) bool) ([]int64, generate.Stats, error) {
			return generate.GenerateUntil(be, cfg, weights, prompt, n, s, onToken)
		}}, nil
}

// graphModel rebuilds the forward of a model trained from a graph FILE, as
// export does (the model file and bound inputs the checkpoint folder keeps,
// the trained weights), and cuts it down to its logits.
func graphModel(path string) (*genModel, error) {
	tr, err := train.LoadTrained(path)
	if err != nil {
		return nil, err
	}
	g, binds, err := trainedForward(tr, "")
	if err != nil {
		return nil, err
	}
	gm, err := train.PrepareGraph(g, *tr.Spec, binds)
	if err != nil {
		return nil, err
	}
	p, err := generate.FullGraph{Graph: gm.Forward, Tokens: gm.Tokens, Logits: gm.Logits}.Prepare()
	if err != nil {
		return nil, fmt.Errorf("-ckpt %s: %w", path, err)
	}
	return &genModel{name: fmt.Sprintf("%s (%s)", g.Name, tr.Spec.File), seq: p.Seq, vocab: p.Vocab,
		note:    fmt.Sprintf("note: %s was trained from a graph FILE: no KV cache, each new token runs the whole forward over its %d positions", g.Name, p.Seq),
		memHint: "The graph's shapes are fixed by the model FILE",
		graphs:  func(int, int) ([]*graph.Graph, error) { return []*graph.Graph{p.Graph}, nil },
		generate: func(be backend.Backend, prompt []int64, n int, s generate.Sampling, onToken func(int64) bool) ([]int64, generate.Stats, error) {
			return p.Generate(be, prompt, n, s, onToken)
		}}, nil
}
