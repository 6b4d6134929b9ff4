package model

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// Decoding with a KV cache takes two graphs of the same model and weights:
//
//   - the prefill graph runs the prompt [1, P] through the model as the
//     training graph does (causal attention, which the fusion pass turns into
//     FlashAttention), and returns the logits of the last position and every
//     layer's keys and values [1, KV, P, D] for the cache;
//   - the decode graph runs one new token at position pos: its query attends
//     over the cache (positions before pos) and its own key and value, and it
//     returns the logits and that key and value, which the caller writes into
//     the cache at pos.
//
// Shapes are static: the cache holds Capacity positions, and a mask input
// hides the slots not filled yet. The position enters through the RoPE rows
// of pos, which the caller feeds (RopeRows).
//
// The cache holds the model's KV key/value heads (config KVHeads; H with
// plain multi-head attention), never keys and values repeated to H heads:
// grouped-query attention needs H/KV times less cache memory, and a decode
// step reads that much less. The prefill repeats K/V for its composed
// attention as the training graph does, and its fusion reads them from
// before the repeat; the decode graph attends with each group's H/KV query
// heads as the query rows of their K/V head (groupedAttention), so nothing
// is repeated there at all.

// Names of the decoding graphs' inputs and outputs.
const (
	TokensInput = "tokens"     // int64 [1, P] (prefill) or [1, 1] (decode)
	LogitsOut   = "logits"     // [1, V]: the logits of the last position
	CosInput    = "rope_cos"   // [1, D]: the RoPE cos row of the position (decode)
	SinInput    = "rope_sin"   // [1, D]
	MaskInput   = "cache_mask" // [1, Capacity+1]: 0 where visible, −inf where not (decode)
)

// KeyOut and ValueOut name layer i's new keys and values (outputs of both
// graphs); CacheKey and CacheValue the decode graph's cache inputs.
func KeyOut(i int) string     { return fmt.Sprintf("layers.%d/attn/k", i) }
func ValueOut(i int) string   { return fmt.Sprintf("layers.%d/attn/v", i) }
func CacheKey(i int) string   { return fmt.Sprintf("cache.k.%d", i) }
func CacheValue(i int) string { return fmt.Sprintf("cache.v.%d", i) }

// CacheShape is the shape of one layer's key (or value) cache for capacity
// positions, batch 1: [1, KV, capacity, D], KV the model's key/value heads.
func CacheShape(cfg Config, capacity int) graph.Shape {
	return graph.Shape{1, cfg.KV(), capacity, cfg.HeadDim}
}

// CacheBytes is the memory of the whole KV cache for capacity positions:
// every layer's keys and values at CacheShape, in cfg's compute type.
func CacheBytes(cfg Config, capacity int) int64 {
	return int64(2*cfg.Layers) * int64(CacheShape(cfg, capacity).Numel()) * int64(cfg.dtype().Size())
}

// BuildPrefill returns the prefill graph of cfg for a prompt of p tokens
// (batch 1; cfg.Batch and cfg.Seq are not used, p must not exceed cfg.Seq,
// the context the model was trained on).
func BuildPrefill(cfg Config, p int) (*graph.Graph, error) {
	if err := checkContext(cfg, p); err != nil {
		return nil, err
	}
	c := cfg
	c.Batch, c.Seq = 1, p
	m := &builder{Builder: graph.NewBuilder(cfg.Name + "_prefill"), cfg: c, dt: c.dtype()}
	tokens := m.Input(TokensInput, graph.Int64, 1, p)
	m.declareParams()
	m.mask = m.Const("causal_mask", m.dt, graph.Shape{p, p}, graph.CausalMask())
	m.cos = m.Const("rope_cos", m.dt, graph.Shape{p, c.HeadDim}, graph.RopeCos(RopeTheta))
	m.sin = m.Const("rope_sin", m.dt, graph.Shape{p, c.HeadDim}, graph.RopeSin(RopeTheta))
	m.attend = func(i int, q, k, v *graph.Value) *graph.Value {
		m.kv = append(m.kv, k, v)
		if c.KV() != c.Heads {
			// As the training graph writes grouped-query attention; the
			// fusion takes K and V from before the repeat again.
			k, v = m.repeatKV("repeat_k", k), m.repeatKV("repeat_v", v)
		}
		return m.causalAttention(fmt.Sprintf("layers.%d", i), q, k, v, m.mask)
	}
	return m.finish(tokens, p)
}

// BuildDecode returns the decode graph of cfg for a cache of capacity
// positions (batch 1).
func BuildDecode(cfg Config, capacity int) (*graph.Graph, error) {
	if err := checkContext(cfg, capacity); err != nil {
		return nil, err
	}
	c := cfg
	c.Batch, c.Seq = 1, 1
	KV, D := c.KV(), c.HeadDim
	m := &builder{Builder: graph.NewBuilder(cfg.Name + "_decode"), cfg: c, dt: c.dtype()}
	tokens := m.Input(TokensInput, graph.Int64, 1, 1)
	m.cos = m.Input(CosInput, m.dt, 1, D)
	m.sin = m.Input(SinInput, m.dt, 1, D)
	mask := m.Input(MaskInput, m.dt, 1, capacity+1)
	var cacheK, cacheV []*graph.Value
	for i := range c.Layers {
		cacheK = append(cacheK, m.Input(CacheKey(i), m.dt, CacheShape(c, capacity)...))
		cacheV = append(cacheV, m.Input(CacheValue(i), m.dt, CacheShape(c, capacity)...))
	}
	m.declareParams()
	m.attend = func(i int, q, k, v *graph.Value) *graph.Value {
		m.kv = append(m.kv, k, v)
		m.Push("cache")
		keys := m.Concat(2, cacheK[i], k) // [1, KV, capacity+1, D]
		values := m.Concat(2, cacheV[i], v)
		m.Pop()
		scope := fmt.Sprintf("layers.%d", i)
		if KV != c.Heads {
			return m.groupedAttention(scope, q, keys, values, mask)
		}
		return m.causalAttention(scope, q, keys, values, mask)
	}
	return m.finish(tokens, 1)
}

// groupedAttention is the decode step's grouped-query attention without
// repeating K/V: q [1, H, 1, D] reshaped to [1, KV, H/KV, D] makes the H/KV
// query heads of each group (query head h reads K/V head h/(H/KV)) the
// query rows of their one K/V head, so the composed attention runs over
// keys and values [1, KV, Sk, D] as they are and mask [1, Sk] hides the
// same slots from every row. The output is reshaped back to [1, H, 1, D].
func (m *builder) groupedAttention(scope string, q, keys, values, mask *graph.Value) *graph.Value {
	c := m.cfg
	H, KV, D := c.Heads, c.KV(), c.HeadDim
	m.Push("group")
	rows := m.Reshape(q, 1, KV, H/KV, D)
	m.Pop()
	o := m.causalAttention(scope, rows, keys, values, mask) // [1, KV, H/KV, D]
	m.Push("ungroup")
	defer m.Pop()
	return m.Reshape(o, 1, H, 1, D)
}

// finish builds the layers over the embedded tokens and the outputs of a
// decoding graph: the last position's logits [1, V] and the keys and values
// that attend collected into m.kv.
func (m *builder) finish(tokens *graph.Value, s int) (*graph.Graph, error) {
	c := m.cfg
	x := m.Gather(m.params["tok_emb"], tokens, 0) // [1, s, dim]
	m.Rename(x, "embed")
	for i := range c.Layers {
		x = m.layer(i, x)
	}
	x = m.Slice(x, 1, s-1, s) // only the last position's logits are needed
	x = m.rmsnorm("final_norm", x, m.params["final_norm"])
	logits := m.Rename(m.Reshape(m.MatMul(x, m.params["lm_head"]), 1, c.Vocab), LogitsOut)
	m.Output(logits)
	m.Output(m.kv...)
	g, err := m.Build()
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", c.Name, err)
	}
	return g, nil
}

func checkContext(cfg Config, n int) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if n < 1 || n > cfg.Seq {
		return fmt.Errorf("model %s: %d positions: want 1 to %d, the context the model was built for (its -seq)", cfg.Name, n, cfg.Seq)
	}
	return nil
}

// RopeRows returns the RoPE cos and sin rows [1, D] of position pos, the
// rows of the tables the prefill and training graphs use.
func RopeRows(cfg Config, pos int) (cos, sin *graph.Tensor, err error) {
	dt := cfg.dtype()
	tt := graph.TensorType{DType: dt, Shape: graph.Shape{pos + 1, cfg.HeadDim}}
	out := [2]*graph.Tensor{}
	for k, init := range []graph.Init{graph.RopeCos(RopeTheta), graph.RopeSin(RopeTheta)} {
		table, err := init.Materialize(tt)
		if err != nil {
			return nil, nil, err
		}
		row := graph.NewTensor(dt, graph.Shape{1, cfg.HeadDim})
		for d := range cfg.HeadDim {
			row.Set(d, table.At(pos*cfg.HeadDim+d))
		}
		out[k] = row
	}
	return out[0], out[1], nil
}
