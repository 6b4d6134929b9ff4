package model

import (
	"fmt"
	"math"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// Constants of MODEL.md shared with tools/reference/torch_model.py.
const (
	NormEps   = 1e-5    // RMSNorm epsilon
	RopeTheta = 10000.0 // RoPE base
)

// Build returns the forward graph of MODEL.md for cfg: inputs tokens and
// targets (int64 [B, S]), outputs loss (scalar, mean cross-entropy) and
// logits ([B, S, V]). The graph is a pure function of cfg: two builds give
// the same canonical text byte for byte.
func Build(cfg Config) (*graph.Graph, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &builder{Builder: graph.NewBuilder(cfg.Name), cfg: cfg, dt: cfg.dtype()}
	g, err := m.build()
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", cfg.Name, err)
	}
	return g, nil
}

// builder carries the config and the shared constants through the layers.
type builder struct {
	*graph.Builder
	cfg    Config
	dt     graph.DType
	params map[string]*graph.Value

	mask, cos, sin *graph.Value

	// attend computes layer i's attention output [B, H, S, D] from its q
	// [B, H, S, D] and k, v [B, KV, S, D] (after the norms and RoPE; KV
	// heads, not repeated); nil: causal attention over the sequence, as
	// exporters write it, with grouped K/V repeated to H heads (the training
	// graph). The decoding graphs of decode.go put the cache in here.
	attend func(i int, q, k, v *graph.Value) *graph.Value
	kv     []*graph.Value // the keys and values a decoding graph outputs
}

func (m *builder) build() (*graph.Graph, error) {
	c := m.cfg
	B, S := c.Batch, c.Seq
	tokens := m.Input("tokens", graph.Int64, B, S)
	targets := m.Input("targets", graph.Int64, B, S)

	m.declareParams()
	m.mask = m.Const("causal_mask", m.dt, graph.Shape{S, S}, graph.CausalMask())
	m.cos = m.Const("rope_cos", m.dt, graph.Shape{S, c.HeadDim}, graph.RopeCos(RopeTheta))
	m.sin = m.Const("rope_sin", m.dt, graph.Shape{S, c.HeadDim}, graph.RopeSin(RopeTheta))

	x := m.Gather(m.params["tok_emb"], tokens, 0) // [B, S, dim]
	m.Rename(x, "embed")
	for i := range c.Layers {
		x = m.layer(i, x)
	}
	x = m.rmsnorm("final_norm", x, m.params["final_norm"])
	logits := m.Rename(m.MatMul(x, m.params["lm_head"]), "logits") // [B, S, V]

	m.Push("loss")
	flat := m.Reshape(logits, B*S, c.Vocab)
	labels := m.Reshape(targets, B*S)
	loss := m.Op("SoftmaxCrossEntropyLoss", graph.Attrs{"reduction": graph.Str("mean")}, flat, labels)
	m.Pop()
	m.Rename(loss, "loss")

	m.Output(loss, logits)
	return m.Build()
}

// declareParams declares every parameter up front in checkpoint order, so
// the graph's param list reads like the safetensors file.
func (m *builder) declareParams() {
	c := m.cfg
	m.params = map[string]*graph.Value{}
	for k, p := range c.Params() {
		var init graph.Init
		if strings.HasSuffix(p.Name, "norm") {
			init = graph.Ones()
		} else {
			init = graph.Normal(c.initStd(p.Name), c.paramSeed(k))
		}
		m.params[p.Name] = m.Param(p.Name, m.dt, p.Shape, init)
	}
}

// p returns layer i's parameter called name.
func (m *builder) p(i int, name string) *graph.Value {
	return m.params[fmt.Sprintf("layers.%d.%s", i, name)]
}

// layer is one pre-norm block: attention then SwiGLU MLP, each added to the
// residual stream.
func (m *builder) layer(i int, x *graph.Value) *graph.Value {
	c := m.cfg
	B, S, H, D := c.Batch, c.Seq, c.Heads, c.HeadDim
	scope := fmt.Sprintf("layers.%d", i)
	m.Push(scope)
	defer m.Pop()

	h := m.rmsnorm("attn_norm", x, m.p(i, "attn_norm"))

	m.Push("attn")
	// heads splits [B, S, H·D] into [B, H, S, D].
	heads := func(v *graph.Value, n int) *graph.Value {
		return m.Transpose(m.Reshape(v, B, S, n, D), 0, 2, 1, 3)
	}
	KV := c.KV()
	// repeat: the layer repeats grouped K/V heads itself (the training
	// graph); the decoding graphs' attend takes the KV heads as they are,
	// named as the multi-head k and v, since those are what the cache holds.
	repeat := KV != H && m.attend == nil
	q := heads(m.MatMul(h, m.p(i, "wq")), H)
	k := heads(m.MatMul(h, m.p(i, "wk")), KV)
	v := heads(m.MatMul(h, m.p(i, "wv")), KV)
	if !repeat {
		m.Rename(v, scope+"/attn/v")
	} else {
		m.Rename(v, scope+"/attn/v_kv")
	}
	q = m.rmsnorm("q_norm", q, m.p(i, "q_norm"))
	k = m.rmsnorm("k_norm", k, m.p(i, "k_norm"))
	q = m.Rename(m.rope("rope_q", q), scope+"/attn/q")
	k = m.rope("rope_k", k)
	if repeat {
		// Grouped-query attention: the KV key/value heads are repeated to
		// H, as exporters write LLaMA's repeat_kv, so that the composed
		// attention sees equal head counts. The fusion reads K and V from
		// before the repeat (FlashAttention takes KV heads), so a fused
		// graph holds no repeated K/V.
		m.Rename(k, scope+"/attn/k_kv")
		k = m.repeatKV("repeat_k", k)
		v = m.Rename(m.repeatKV("repeat_v", v), scope+"/attn/v")
	}
	k = m.Rename(k, scope+"/attn/k")

	var o *graph.Value
	if m.attend != nil {
		o = m.attend(i, q, k, v)
	} else {
		o = m.causalAttention(scope, q, k, v, m.mask)
	}
	o = m.Reshape(m.Transpose(o, 0, 2, 1, 3), B, S, H*D)       // [B, S, H·D]
	o = m.Rename(m.MatMul(o, m.p(i, "wo")), scope+"/attn/out") // [B, S, dim]
	m.Pop()
	x = m.Rename(m.Add(x, o), scope+"/resid_attn")

	h = m.rmsnorm("mlp_norm", x, m.p(i, "mlp_norm"))
	m.Push("mlp")
	gate := m.MatMul(h, m.p(i, "w_gate"))
	act := m.Mul(gate, m.Sigmoid(gate)) // silu
	up := m.MatMul(h, m.p(i, "w_up"))
	y := m.Rename(m.MatMul(m.Mul(act, up), m.p(i, "w_down")), scope+"/mlp/out")
	m.Pop()
	return m.Rename(m.Add(x, y), scope+"/resid_mlp")
}

// repeatKV repeats each of the KV heads of x [B, KV, S, D] Heads/KV times
// along the head axis ([B, H, S, D], head h reading key/value head h/(H/KV)):
// Reshape [B, KV, 1, S, D], Expand [B, KV, H/KV, S, D], Reshape.
func (m *builder) repeatKV(scope string, x *graph.Value) *graph.Value {
	c := m.cfg
	m.Push(scope)
	defer m.Pop()
	B, S, H, KV, D := c.Batch, c.Seq, c.Heads, c.KV(), c.HeadDim
	u := m.Reshape(x, B, KV, 1, S, D)
	e := m.Op("Expand", nil, u, m.Ints(B, KV, H/KV, S, D))
	return m.Reshape(e, B, H, S, D)
}

// causalAttention is softmax(q·kᵀ/√D + mask)·v as exporters write it; the
// fusion pass matches exactly this. mask is added to the scores [B, H, Sq, Sk].
func (m *builder) causalAttention(scope string, q, k, v, mask *graph.Value) *graph.Value {
	// Attention as exporters write it; the fusion pass matches exactly this.
	att := m.Attention(q, k, v, 1/math.Sqrt(float64(m.cfg.HeadDim)), mask) // causal mask
	m.Rename(att.Scores, scope+"/attn/scores")                             // [B, H, Sq, Sk]
	m.Rename(att.Probs, scope+"/attn/probs")                               // [B, H, Sq, Sk]
	return m.Rename(att.Out, scope+"/attn/o")                              // [B, H, Sq, D]
}

// rmsnorm is x · 1/sqrt(mean(x², last axis) + eps) · w, in elementary ops.
func (m *builder) rmsnorm(scope string, x, w *graph.Value) *graph.Value {
	m.Push(scope)
	defer m.Pop()
	ms := m.ReduceMean(m.Mul(x, x), true, -1)
	inv := m.Reciprocal(m.Sqrt(m.Add(ms, m.Scalar(m.dt, NormEps))))
	return m.Mul(m.Mul(x, inv), w)
}

// rope rotates x [B, H, S, D] by position: x·cos + rotate_half(x)·sin, with
// rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2]) (NeoX/LLaMA-HF layout).
func (m *builder) rope(scope string, x *graph.Value) *graph.Value {
	m.Push(scope)
	defer m.Pop()
	D := m.cfg.HeadDim
	lo := m.Slice(x, -1, 0, D/2)
	hi := m.Slice(x, -1, D/2, D)
	rot := m.Concat(-1, m.Neg(hi), lo)
	return m.Add(m.Mul(x, m.cos), m.Mul(rot, m.sin))
}
