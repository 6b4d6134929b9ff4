package model

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// randomWeights gives every parameter of c random values large enough that
// attention is far from uniform (std 0.3; norms around 1), so that a query
// head reading the wrong K/V head changes the logits visibly.
func randomWeights(c Config, rng *rand.Rand) map[string]*graph.Tensor {
	w := map[string]*graph.Tensor{}
	for _, p := range c.Params() {
		t := graph.NewTensor(c.dtype(), p.Shape)
		for i := range t.Len() {
			if strings.HasSuffix(p.Name, "norm") {
				t.Set(i, 1+0.2*rng.NormFloat64())
			} else {
				t.Set(i, 0.3*rng.NormFloat64())
			}
		}
		w[p.Name] = t
	}
	return w
}

// compileWith compiles g (after pipe) on the CPU with weights w.
func compileWith(t *testing.T, g *graph.Graph, pipe passes.Pipeline, w map[string]*graph.Tensor) backend.Executable {
	t.Helper()
	g, err := pipe.Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, x := range w {
		if err := exe.SetInitializer(name, x); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { exe.Close() })
	return exe
}

// logitsDiff is the largest difference between logits [1, V] and row pos of
// the full forward's logits [1, S, V], and the largest |logit| of that row.
func logitsDiff(got, full *graph.Tensor, pos int) (diff, scale float64) {
	V := got.Len()
	for v := range V {
		ref := full.At(pos*V + v)
		diff = max(diff, math.Abs(got.At(v)-ref))
		scale = max(scale, math.Abs(ref))
	}
	return diff, scale
}

// TestDecodeGQAMatchesForward: with grouped-query attention the KV cache
// holds the KV key/value heads ([1, KV, capacity, D], no repeat), and the
// prefill and every decode step give the logits of the training model's
// full-sequence forward at their position (float64, random weights). KV 0
// is plain multi-head attention, the same check on the graphs as before.
func TestDecodeGQAMatchesForward(t *testing.T) {
	const prompt, n = 5, 14
	for _, kv := range []int{1, 2, 0} {
		c := gqaTiny(t, kv)
		KV, D, capacity := c.KV(), c.HeadDim, c.Seq
		rng := rand.New(rand.NewPCG(11, uint64(kv)))
		w := randomWeights(c, rng)
		seq := graph.NewTensor(graph.Int64, graph.Shape{1, n})
		for i := range seq.I64 {
			seq.I64[i] = rng.Int64N(int64(c.Vocab))
		}

		fc := c
		fc.Batch, fc.Seq = 1, n
		full, err := compileWith(t, mustBuild(t, fc), passes.Default(false), w).Run(map[string]*graph.Tensor{"tokens": seq, "targets": seq})
		if err != nil {
			t.Fatal(err)
		}

		pg, err := BuildPrefill(c, prompt)
		if err != nil {
			t.Fatal(err)
		}
		fused, err := passes.Default(true).Run(pg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ops := fused.CountOps(); ops["FlashAttention"] != c.Layers || ops["Expand"] != 0 {
			t.Errorf("kv %d: fused prefill has %d FlashAttention and %d Expand for %d layers", kv, ops["FlashAttention"], ops["Expand"], c.Layers)
		}
		tokens := graph.NewTensor(graph.Int64, graph.Shape{1, prompt})
		copy(tokens.I64, seq.I64[:prompt])
		res, err := compileWith(t, pg, passes.Default(true), w).Run(map[string]*graph.Tensor{TokensInput: tokens})
		if err != nil {
			t.Fatal(err)
		}
		check := func(logits *graph.Tensor, pos int) {
			t.Helper()
			d, s := logitsDiff(logits, full["logits"], pos)
			if d > 1e-10*max(1, s) || s < 0.5 {
				t.Errorf("kv %d, position %d: logits differ from the full forward's by %g (max |logit| %g)", kv, pos, d, s)
			}
		}
		check(res[LogitsOut], prompt-1)

		dg, err := BuildDecode(c, capacity)
		if err != nil {
			t.Fatal(err)
		}
		if ops := dg.CountOps(); ops["Expand"] != 0 || ops["Softmax"] != c.Layers {
			t.Errorf("kv %d: decode graph ops %v: want no repeated K/V", kv, ops)
		}
		caches := map[string]*graph.Tensor{}
		var cacheBytes int64
		for _, in := range dg.Inputs {
			if strings.HasPrefix(in.Name, "cache.") {
				if want := (graph.Shape{1, KV, capacity, D}); !in.Type.Shape.Equal(want) {
					t.Errorf("kv %d: %s is %v, want %v", kv, in.Name, in.Type.Shape, want)
				}
				cacheBytes += int64(in.Type.Shape.Numel() * in.Type.DType.Size())
			}
		}
		if want := int64(2*c.Layers*KV*capacity*D) * 8; cacheBytes != want || CacheBytes(c, capacity) != want {
			t.Errorf("kv %d: cache inputs hold %d bytes, CacheBytes says %d; want %d", kv, cacheBytes, CacheBytes(c, capacity), want)
		}
		// put writes kv [1, KV, m, D] into cache [1, KV, capacity, D] from
		// position from.
		put := func(cache, kv *graph.Tensor, from int) {
			m := kv.Shape[2]
			for h := range KV {
				for p := range m {
					for d := range D {
						cache.Set((h*capacity+from+p)*D+d, kv.At((h*m+p)*D+d))
					}
				}
			}
		}
		for i := range c.Layers {
			for _, o := range [][2]string{{KeyOut(i), CacheKey(i)}, {ValueOut(i), CacheValue(i)}} {
				if want := (graph.Shape{1, KV, prompt, D}); !res[o[0]].Shape.Equal(want) {
					t.Fatalf("kv %d: prefill output %s is %v, want %v", kv, o[0], res[o[0]].Shape, want)
				}
				caches[o[1]] = graph.NewTensor(c.dtype(), CacheShape(c, capacity))
				put(caches[o[1]], res[o[0]], 0)
			}
		}

		decode := compileWith(t, dg, passes.Default(false), w)
		mask := graph.NewTensor(c.dtype(), graph.Shape{1, capacity + 1})
		for k := range capacity {
			mask.Set(k, math.Inf(-1))
		}
		for pos := prompt; pos < n; pos++ {
			cos, sin, err := RopeRows(c, pos)
			if err != nil {
				t.Fatal(err)
			}
			for k := range pos {
				mask.Set(k, 0)
			}
			tok := graph.NewTensor(graph.Int64, graph.Shape{1, 1})
			tok.I64[0] = seq.I64[pos]
			feeds := map[string]*graph.Tensor{TokensInput: tok, CosInput: cos, SinInput: sin, MaskInput: mask}
			for name, x := range caches {
				feeds[name] = x
			}
			out, err := decode.Run(feeds)
			if err != nil {
				t.Fatal(err)
			}
			check(out[LogitsOut], pos)
			for i := range c.Layers {
				put(caches[CacheKey(i)], out[KeyOut(i)], pos)
				put(caches[CacheValue(i)], out[ValueOut(i)], pos)
			}
		}
	}
}

// The cache of grouped-query attention is Heads/KVHeads times smaller than
// the multi-head model's of the same size.
func TestDecodeGQACacheBytes(t *testing.T) {
	mha := gqaTiny(t, 0)
	for _, kv := range []int{1, 2, 4} {
		c := gqaTiny(t, kv)
		if got, want := CacheBytes(c, c.Seq), CacheBytes(mha, mha.Seq)*int64(kv)/int64(c.Heads); got != want {
			t.Errorf("kv %d: cache %d bytes, want %d", kv, got, want)
		}
	}
	// float32: 2 (K, V) · 2 layers · 2 kv heads · 32 positions · 16 · 4 bytes.
	c := gqaTiny(t, 2)
	c.DType = graph.Float32
	if got := CacheBytes(c, c.Seq); got != 2*2*2*32*16*4 {
		t.Errorf("tiny, 2 kv heads, float32: %d bytes", got)
	}
}
