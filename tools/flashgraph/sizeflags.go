package main

import (
	"flag"
	"fmt"

	"github.com/flashgraph/flashgraph/model"
)

// sizeFlags size the built-in model: its width, heads, grouped-query
// key/value heads, per-head width, MLP width and vocabulary. 0 keeps the
// config's value, so with none given every config builds its graph as before.
type sizeFlags struct {
	dim, heads, kvHeads, headDim, ffn, vocab int
}

func (s *sizeFlags) add(fs *flag.FlagSet) {
	fs.IntVar(&s.dim, "dim", 0, "model width (0: the config's; -ffn then scales with it)")
	fs.IntVar(&s.heads, "heads", 0, "attention (query) heads (0: the config's)")
	fs.IntVar(&s.kvHeads, "kv-heads", 0, "key/value heads, dividing -heads: grouped-query attention, each K/V head shared by heads/kv-heads query heads (0: as many as -heads)")
	fs.IntVar(&s.headDim, "head-dim", 0, "per-head width, even (0: -dim / -heads when either is given, else the config's)")
	fs.IntVar(&s.ffn, "ffn", 0, "SwiGLU hidden width (0: the config's, scaled by -dim over the config's dim)")
	fs.IntVar(&s.vocab, "vocab", 0, "vocabulary size, at least 2 (0: the config's, 256: bytes); token files need one above their largest token")
}

// set says whether any size flag was given.
func (s *sizeFlags) set() bool {
	return s.dim != 0 || s.heads != 0 || s.kvHeads != 0 || s.headDim != 0 || s.ffn != 0 || s.vocab != 0
}

// apply sizes cfg. Errors name the flags.
func (s *sizeFlags) apply(cfg *model.Config) error {
	for _, f := range []struct {
		name string
		v    int
	}{{"dim", s.dim}, {"heads", s.heads}, {"kv-heads", s.kvHeads}, {"head-dim", s.headDim}, {"ffn", s.ffn}, {"vocab", s.vocab}} {
		if f.v < 0 {
			return fmt.Errorf("-%s must be positive, got %d", f.name, f.v)
		}
		// Shapes are products of these; the model's own check says the same
		// for larger values, but naming the flag is clearer.
		if f.v > 1<<24 {
			return fmt.Errorf("-%s %d is too large", f.name, f.v)
		}
	}
	if s.vocab == 1 {
		return fmt.Errorf("-vocab must be at least 2, got 1")
	}
	if s.dim > 0 && s.ffn == 0 {
		// Keep the config's MLP ratio (tiny 2, small 3, gpt2 4).
		cfg.FFN = max(1, int(int64(cfg.FFN)*int64(s.dim)/int64(cfg.Dim)))
	}
	oldHeads := cfg.Heads
	for _, o := range []struct {
		v   int
		dst *int
	}{{s.dim, &cfg.Dim}, {s.heads, &cfg.Heads}, {s.ffn, &cfg.FFN}, {s.vocab, &cfg.Vocab}, {s.headDim, &cfg.HeadDim}} {
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if s.headDim == 0 && (s.dim > 0 || s.heads > 0) {
		if cfg.Dim%cfg.Heads != 0 {
			return fmt.Errorf("-dim %d is not divisible by -heads %d: give -head-dim to choose the per-head width", cfg.Dim, cfg.Heads)
		}
		cfg.HeadDim = cfg.Dim / cfg.Heads
		if cfg.HeadDim%2 != 0 {
			return fmt.Errorf("-dim %d / -heads %d gives an odd head width %d; rotate-half RoPE needs an even one (give -head-dim)", cfg.Dim, cfg.Heads, cfg.HeadDim)
		}
	}
	switch {
	case s.kvHeads > 0:
		if cfg.Heads%s.kvHeads != 0 {
			return fmt.Errorf("-kv-heads %d must divide -heads %d (each key/value head serves a whole group of query heads)", s.kvHeads, cfg.Heads)
		}
		cfg.KVHeads = s.kvHeads
	case cfg.KVHeads > 0 && cfg.Heads != oldHeads:
		// A base config with grouped-query attention (a checkpoint's) keeps
		// its K/V heads only if they still divide the new head count.
		if cfg.Heads%cfg.KVHeads != 0 {
			return fmt.Errorf("-heads %d is not divisible by the %d key/value heads of the config: give -kv-heads", cfg.Heads, cfg.KVHeads)
		}
	}
	if cfg.KVHeads == cfg.Heads {
		cfg.KVHeads = 0 // plain multi-head attention: the graph of a config without GQA
	}
	return nil
}
