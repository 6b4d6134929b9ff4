// Package model builds the flashgraph transformer of docs/MODEL.md as a
// forward graph: a causal decoder-only transformer over bytes, written with
// elementary ONNX ops the way exporters emit them, so that the attention
// fusion pass sees the same patterns it sees in imported models.
package model

import (
	"fmt"
	"math"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// Config is one model size. The table in docs/MODEL.md is the contract;
// tools/reference/torch_model.py has the same table.
type Config struct {
	Name   string
	Vocab  int // vocabulary size (256: bytes)
	Dim    int // model width
	Layers int
	Heads  int
	// KVHeads is the number of key/value heads (grouped-query attention:
	// each group of Heads/KVHeads query heads shares one). 0 means Heads,
	// plain multi-head attention, and keeps the graph of a config written
	// before the field existed byte for byte.
	KVHeads int `json:",omitempty"`
	HeadDim int // per-head width D; Heads·HeadDim need not equal Dim
	FFN     int // SwiGLU hidden width
	Seq     int // sequence length S (static)
	Batch   int // batch size B (static)
	// DType is the compute type of params and activations. The zero value
	// means float32, so a Config literal without it builds the default model.
	DType graph.DType
	// Seed derives every parameter's initializer seed (see paramSeed).
	Seed int
}

// configs is MODEL.md's table, in its order.
var configs = []Config{
	{Name: "tiny", Vocab: 256, Dim: 64, Layers: 2, Heads: 4, HeadDim: 16, FFN: 128, Seq: 32, Batch: 4, DType: graph.Float32},
	{Name: "small", Vocab: 256, Dim: 256, Layers: 4, Heads: 4, HeadDim: 64, FFN: 768, Seq: 256, Batch: 8, DType: graph.Float32},
	{Name: "gpt2", Vocab: 256, Dim: 768, Layers: 12, Heads: 12, HeadDim: 64, FFN: 3072, Seq: 1024, Batch: 8, DType: graph.Float32},
	{Name: "gpt2-medium", Vocab: 256, Dim: 1024, Layers: 24, Heads: 16, HeadDim: 64, FFN: 4096, Seq: 1024, Batch: 8, DType: graph.Float32},
	{Name: "gpt3-1.3b", Vocab: 256, Dim: 2048, Layers: 24, Heads: 16, HeadDim: 128, FFN: 8192, Seq: 1024, Batch: 8, DType: graph.Float32},
}

// Configs returns the named configurations of MODEL.md (tiny, small, gpt2,
// gpt2-medium, gpt3-1.3b).
func Configs() []Config { return append([]Config(nil), configs...) }

// Names returns the configuration names in table order.
func Names() []string {
	out := make([]string, len(configs))
	for i, c := range configs {
		out[i] = c.Name
	}
	return out
}

// Lookup returns the configuration called name.
func Lookup(name string) (Config, error) {
	for _, c := range configs {
		if c.Name == name {
			return c, nil
		}
	}
	return Config{}, fmt.Errorf("model: unknown config %q (known: %s)", name, strings.Join(Names(), ", "))
}

// dtype resolves the zero DType to float32.
func (c Config) dtype() graph.DType {
	if c.DType == graph.InvalidDType {
		return graph.Float32
	}
	return c.DType
}

// KV returns the number of key/value heads (Heads when KVHeads is 0).
func (c Config) KV() int {
	if c.KVHeads == 0 {
		return c.Heads
	}
	return c.KVHeads
}

// maxSeed keeps every derived parameter seed exactly representable in the
// float64 that initializer recipes store their arguments in.
const maxSeed = 1 << 31

// Validate reports the first thing about c that Build cannot make a model of.
func (c Config) Validate() error {
	if c.Name == "" || strings.ContainsFunc(c.Name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("model: config name %q: want a non-empty name without control characters", c.Name)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"vocab", c.Vocab}, {"dim", c.Dim}, {"layers", c.Layers}, {"heads", c.Heads},
		{"head_dim", c.HeadDim}, {"ffn", c.FFN}, {"seq", c.Seq}, {"batch", c.Batch}} {
		if f.v <= 0 {
			return fmt.Errorf("model: config %s: %s must be positive, got %d", c.Name, f.name, f.v)
		}
		// Shapes are products of these; keep each far from int overflow.
		if f.v > 1<<24 {
			return fmt.Errorf("model: config %s: %s %d is too large", c.Name, f.name, f.v)
		}
	}
	// The largest activations are the attention scores [B, H, S, S] and the
	// logits [B, S, V]; keep element counts where int arithmetic and memory
	// planning stay exact.
	const maxElems = 1 << 40
	B, S := float64(c.Batch), float64(c.Seq)
	if B*float64(c.Heads)*S*S > maxElems || B*S*float64(max(c.Vocab, c.FFN, c.Dim, c.Heads*c.HeadDim)) > maxElems {
		return fmt.Errorf("model: config %s: activations over %d elements", c.Name, int64(maxElems))
	}
	if c.KVHeads < 0 || c.KVHeads > c.Heads || c.Heads%c.KV() != 0 {
		return fmt.Errorf("model: config %s: kv_heads %d must divide heads %d (each key/value head serves heads/kv_heads query heads)", c.Name, c.KVHeads, c.Heads)
	}
	if c.Vocab < 2 {
		return fmt.Errorf("model: config %s: vocab must be at least 2, got %d", c.Name, c.Vocab)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("model: config %s: head_dim must be even for rotate-half RoPE, got %d", c.Name, c.HeadDim)
	}
	if !c.dtype().IsFloat() {
		return fmt.Errorf("model: config %s: dtype must be a float type, got %v", c.Name, c.DType)
	}
	if c.Seed < 0 || c.Seed >= maxSeed {
		return fmt.Errorf("model: config %s: seed must be in [0, %d), got %d", c.Name, maxSeed, c.Seed)
	}
	return nil
}

// ParamShape is one trainable parameter: its checkpoint name and shape.
type ParamShape struct {
	Name  string
	Shape graph.Shape
}

// layerParams is the order of a layer's parameters, as MODEL.md and
// torch_model.py list them; graph params are declared in this order.
var layerParams = []string{"attn_norm", "wq", "wk", "wv", "wo", "q_norm", "k_norm", "mlp_norm", "w_gate", "w_up", "w_down"}

// Params lists every parameter of c with its shape, in declaration order.
func (c Config) Params() []ParamShape {
	hd, kvd := c.Heads*c.HeadDim, c.KV()*c.HeadDim
	per := map[string]graph.Shape{
		"attn_norm": {c.Dim}, "wq": {c.Dim, hd}, "wk": {c.Dim, kvd}, "wv": {c.Dim, kvd}, "wo": {hd, c.Dim},
		"q_norm": {c.HeadDim}, "k_norm": {c.HeadDim}, "mlp_norm": {c.Dim},
		"w_gate": {c.Dim, c.FFN}, "w_up": {c.Dim, c.FFN}, "w_down": {c.FFN, c.Dim},
	}
	out := []ParamShape{{"tok_emb", graph.Shape{c.Vocab, c.Dim}}}
	for i := range c.Layers {
		for _, p := range layerParams {
			out = append(out, ParamShape{fmt.Sprintf("layers.%d.%s", i, p), per[p].Clone()})
		}
	}
	return append(out, ParamShape{"final_norm", graph.Shape{c.Dim}}, ParamShape{"lm_head", graph.Shape{c.Dim, c.Vocab}})
}

// ParamCount is the number of trainable scalars.
func ParamCount(c Config) int64 {
	var n int64
	for _, p := range c.Params() {
		n += int64(p.Shape.Numel())
	}
	return n
}

// FLOPsPerToken is the forward pass's matmul FLOPs per token (a multiply-add
// counts 2), attention included at full S×S as the unfused graph computes it;
// elementwise ops, norms and the loss are left out as small. A training step
// costs about three times this.
func (c Config) FLOPsPerToken() int64 {
	d, hd, f, s := int64(c.Dim), int64(c.Heads*c.HeadDim), int64(c.FFN), int64(c.Seq)
	kvd := int64(c.KV() * c.HeadDim)
	perLayer := 2*d*hd + 2*2*d*kvd + 2*hd*d + 2*d*f*3 + 2*2*s*hd
	return int64(c.Layers)*perLayer + 2*d*int64(c.Vocab)
}

// initStd is MODEL.md's initialisation: residual-output projections are
// scaled down by sqrt(2·layers) so the residual stream's variance does not
// grow with depth.
func (c Config) initStd(param string) float64 {
	if strings.HasSuffix(param, ".wo") || strings.HasSuffix(param, ".w_down") {
		return 0.02 / math.Sqrt(2*float64(c.Layers))
	}
	return 0.02
}

// paramSeed gives parameter number k (in Params order) its own seed, so no
// two parameters share random streams and changing cfg.Seed changes them all.
func (c Config) paramSeed(k int) int {
	return c.Seed*(1<<20) + k + 1
}
