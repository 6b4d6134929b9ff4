// Package generate writes text with a trained model: a prompt is run once
// through the prefill graph (attention fused into FlashAttention), and every
// new token through the decode graph, which reads the keys and values of the
// earlier positions from a KV cache instead of recomputing them. Both graphs
// come from model/decode.go and run on any backend.
package generate

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

// Sampling chooses the next token from the logits. Temperature 0 is greedy
// (argmax, ties to the lowest id); otherwise softmax(logits/Temperature),
// restricted to the TopK most likely tokens when TopK > 0 and then to the
// smallest set of most likely tokens whose probability reaches TopP when
// 0 < TopP < 1 (nucleus sampling), sampled with Seed. TopK and TopP choose
// among samples: with Temperature 0 they are an error (Validate), not
// silently ignored.
type Sampling struct {
	Temperature float64
	TopK        int
	TopP        float64
	Seed        uint64
}

// Validate says what is wrong with s, naming the CLI's flags.
func (s Sampling) Validate() error {
	if s.Temperature < 0 || math.IsNaN(s.Temperature) || math.IsInf(s.Temperature, 0) {
		return fmt.Errorf("generate: -temperature must be finite and at least 0 (0: greedy), got %v", s.Temperature)
	}
	if s.TopK < 0 {
		return fmt.Errorf("generate: -top-k must be at least 0 (0: all tokens), got %d", s.TopK)
	}
	if !(s.TopP >= 0 && s.TopP <= 1) {
		return fmt.Errorf("generate: -top-p must be in [0, 1] (0 or 1: all tokens), got %v", s.TopP)
	}
	if s.Temperature == 0 && (s.TopK > 0 || (s.TopP > 0 && s.TopP < 1)) {
		return fmt.Errorf("generate: -top-k and -top-p restrict sampling, and -temperature 0 is greedy (no sampling): give a -temperature above 0 as well (e.g. -temperature 0.8)")
	}
	return nil
}

// Stats is how long the parts of a generation took.
type Stats struct {
	PromptTokens int
	NewTokens    int
	Compile      time.Duration // both graphs
	Prefill      time.Duration
	Decode       time.Duration // all decode steps
	// CacheBytes is the memory of the KV cache the generation held: every
	// layer's keys and values over the model's context, at its KV heads
	// (model.CacheBytes).
	CacheBytes int64
}

// TokensPerSec is the decoding rate (new tokens after the first, which the
// prefill produces).
func (s Stats) TokensPerSec() float64 {
	if s.NewTokens <= 1 || s.Decode <= 0 {
		return 0
	}
	return float64(s.NewTokens-1) / s.Decode.Seconds()
}

// FromCheckpoint reads a training checkpoint: the model config it was
// trained with and its weights (the optimizer state is left out).
func FromCheckpoint(path string) (model.Config, map[string]*graph.Tensor, error) {
	ts, _, err := checkpoint.LoadCheckpoint(path)
	if err != nil {
		return model.Config{}, nil, err
	}
	var cfg model.Config
	if err := json.Unmarshal([]byte(ts.Metadata[checkpoint.MetaConfig]), &cfg); err != nil {
		return cfg, nil, fmt.Errorf("checkpoint %s: config: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	weights := map[string]*graph.Tensor{}
	for _, p := range cfg.Params() {
		t, ok := ts.Tensors[p.Name]
		if !ok {
			return cfg, nil, fmt.Errorf("checkpoint %s: no tensor %s", path, p.Name)
		}
		weights[p.Name] = t
	}
	return cfg, weights, nil
}

// Generate continues prompt by maxNew tokens with cfg's model on be. weights
// holds every parameter (nil: the model's initial weights, for tests). The
// prompt and the new tokens must fit in cfg.Seq, the context the model was
// trained with. onToken, when set, sees each new token as it is chosen.
func Generate(be backend.Backend, cfg model.Config, weights map[string]*graph.Tensor, prompt []int64, maxNew int, s Sampling, onToken func(int64)) ([]int64, Stats, error) {
	return GenerateUntil(be, cfg, weights, prompt, maxNew, s, func(t int64) bool {
		if onToken != nil {
			onToken(t)
		}
		return true
	})
}

// GenerateUntil is Generate with a callback that can stop the generation:
// it sees each new token and returns false to stop after it (a stop
// string); Stats.NewTokens is then the number generated.
func GenerateUntil(be backend.Backend, cfg model.Config, weights map[string]*graph.Tensor, prompt []int64, maxNew int, s Sampling, onToken func(int64) bool) ([]int64, Stats, error) {
	st := Stats{PromptTokens: len(prompt), NewTokens: maxNew}
	if len(prompt) == 0 {
		return nil, st, fmt.Errorf("generate: empty prompt: give at least one token")
	}
	if maxNew < 1 {
		return nil, st, fmt.Errorf("generate: want at least 1 new token, got %d", maxNew)
	}
	if n := len(prompt) + maxNew - 1; n > cfg.Seq {
		return nil, st, fmt.Errorf("generate: a %d-token prompt and %d new tokens need %d positions; the model's context (-seq it was trained with) is %d", len(prompt), maxNew, n+1, cfg.Seq)
	}
	for i, t := range prompt {
		if t < 0 || t >= int64(cfg.Vocab) {
			return nil, st, fmt.Errorf("generate: prompt token %d is %d, outside the vocabulary [0, %d)", i, t, cfg.Vocab)
		}
	}
	if err := s.Validate(); err != nil {
		return nil, st, err
	}
	capacity := cfg.Seq

	t0 := time.Now()
	prefill, err := compile(be, cfg, weights, func() (*graph.Graph, error) { return model.BuildPrefill(cfg, len(prompt)) }, true)
	if err != nil {
		return nil, st, err
	}
	defer prefill.Close()
	var decode backend.Executable
	if maxNew > 1 {
		if decode, err = compile(be, cfg, weights, func() (*graph.Graph, error) { return model.BuildDecode(cfg, capacity) }, false); err != nil {
			return nil, st, err
		}
		defer decode.Close()
	}
	st.Compile = time.Since(t0)

	r := rand.New(rand.NewPCG(s.Seed, 0x9e3779b97f4a7c15))
	var out []int64
	more := true
	// emit picks the token at position pos from its logits; a non-finite
	// logit (damaged weights) is an error, not a token.
	emit := func(logits *graph.Tensor, pos int) (int64, error) {
		for i := range logits.Len() {
			if v := logits.At(i); math.IsNaN(v) || math.IsInf(v, 0) {
				return 0, fmt.Errorf("generate: the logits at position %d are not finite (token %d: %v): the model's weights are damaged (a diverged checkpoint?)", pos, i, v)
			}
		}
		t := pick(logits, s, r)
		out = append(out, t)
		if onToken != nil {
			more = onToken(t)
		}
		return t, nil
	}

	t1 := time.Now()
	tokens := graph.NewTensor(graph.Int64, graph.Shape{1, len(prompt)})
	copy(tokens.I64, prompt)
	res, err := prefill.Run(map[string]*graph.Tensor{model.TokensInput: tokens})
	if err != nil {
		return nil, st, fmt.Errorf("generate: prefill: %w", err)
	}
	// The caches start with the prompt's keys and values, at the model's
	// KV heads (see model.CacheShape).
	dt := res[model.LogitsOut].DType
	caches := map[string]*graph.Tensor{}
	for i := range cfg.Layers {
		for _, kv := range [][2]string{{model.KeyOut(i), model.CacheKey(i)}, {model.ValueOut(i), model.CacheValue(i)}} {
			c := graph.NewTensor(dt, model.CacheShape(cfg, capacity))
			writeCache(c, res[kv[0]], 0, capacity)
			caches[kv[1]] = c
			st.CacheBytes += int64(c.Len() * c.DType.Size())
		}
	}
	next, err := emit(res[model.LogitsOut], len(prompt))
	if err != nil {
		return nil, st, err
	}
	st.Prefill = time.Since(t1)

	t2 := time.Now()
	mask := graph.NewTensor(dt, graph.Shape{1, capacity + 1})
	for k := range capacity {
		mask.Set(k, math.Inf(-1))
	}
	for pos := len(prompt); more && len(out) < maxNew; pos++ {
		// The token chosen last is at pos; the cache holds positions < pos.
		cos, sin, err := model.RopeRows(cfg, pos)
		if err != nil {
			return nil, st, err
		}
		for k := range pos {
			mask.Set(k, 0)
		}
		feeds := map[string]*graph.Tensor{model.TokensInput: graph.NewTensor(graph.Int64, graph.Shape{1, 1}), model.CosInput: cos, model.SinInput: sin, model.MaskInput: mask}
		feeds[model.TokensInput].I64[0] = next
		for name, c := range caches {
			feeds[name] = c
		}
		res, err := decode.Run(feeds)
		if err != nil {
			return nil, st, fmt.Errorf("generate: decode at position %d: %w", pos, err)
		}
		for i := range cfg.Layers {
			writeCache(caches[model.CacheKey(i)], res[model.KeyOut(i)], pos, capacity)
			writeCache(caches[model.CacheValue(i)], res[model.ValueOut(i)], pos, capacity)
		}
		if next, err = emit(res[model.LogitsOut], pos+1); err != nil {
			return nil, st, err
		}
	}
	st.Decode = time.Since(t2)
	st.NewTokens = len(out)
	return out, st, nil
}

// compile builds a decoding graph, fuses its attention (prefill) or runs the
// checks only (decode: one query against a masked cache is not a causal
// self-attention), compiles it on be and loads the weights.
func compile(be backend.Backend, cfg model.Config, weights map[string]*graph.Tensor, build func() (*graph.Graph, error), fuse bool) (backend.Executable, error) {
	g, err := build()
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	if g, err = passes.Default(fuse).Run(g, nil); err != nil {
		return nil, fmt.Errorf("generate: %s: %w", g.Name, err)
	}
	exe, err := be.Compile(g, backend.Options{})
	if err != nil {
		return nil, fmt.Errorf("generate: compiling %s on %s: %w", g.Name, be.Name(), err)
	}
	for name, w := range weights {
		if err := exe.SetInitializer(name, w); err != nil {
			exe.Close()
			return nil, fmt.Errorf("generate: weight %s: %w", name, err)
		}
	}
	return exe, nil
}

// writeCache copies kv [1, KV, n, D] into cache [1, KV, capacity, D] at
// positions from, from+1, ...
func writeCache(cache, kv *graph.Tensor, from, capacity int) {
	s := kv.Shape
	H, n, D := s[1], s[2], s[3]
	for h := range H {
		for p := range n {
			for d := range D {
				cache.Set((h*capacity+from+p)*D+d, kv.At((h*n+p)*D+d))
			}
		}
	}
}

// pick chooses a token from logits [1, V].
func pick(logits *graph.Tensor, s Sampling, r *rand.Rand) int64 {
	v := logits.Len()
	if s.Temperature == 0 {
		best := 0
		for i := 1; i < v; i++ {
			if logits.At(i) > logits.At(best) {
				best = i
			}
		}
		return int64(best)
	}
	ids := make([]int, v)
	for i := range ids {
		ids[i] = i
	}
	sort.SliceStable(ids, func(a, b int) bool { return logits.At(ids[a]) > logits.At(ids[b]) })
	if s.TopK > 0 && s.TopK < v {
		ids = ids[:s.TopK]
	}
	top := logits.At(ids[0])
	ps := make([]float64, len(ids))
	var sum float64
	for k, id := range ids {
		ps[k] = math.Exp((logits.At(id) - top) / s.Temperature)
		sum += ps[k]
	}
	if s.TopP > 0 && s.TopP < 1 {
		// The smallest prefix (most likely first) whose probability
		// reaches TopP.
		var c float64
		for k := range ps {
			c += ps[k]
			if c >= s.TopP*sum {
				ids, ps, sum = ids[:k+1], ps[:k+1], c
				break
			}
		}
	}
	u := r.Float64() * sum
	for k, p := range ps {
		if u < p {
			return int64(ids[k])
		}
		u -= p
	}
	return int64(ids[len(ids)-1])
}
