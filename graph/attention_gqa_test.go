package graph

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestFlashAttentionGroupedShapes: K and V may have fewer heads than Q when
// their count divides Q's; anything else is refused with what is wrong.
func TestFlashAttentionGroupedShapes(t *testing.T) {
	val := func(s ...int) *Value { return &Value{Name: "x", Type: TensorType{Float32, Shape(s)}} }
	attrs := Attrs{"scale": Float(0.5)}
	for _, c := range []struct {
		q, k, v Shape
		group   int
		want    string // "" when accepted
	}{
		{Shape{2, 8, 16, 4}, Shape{2, 2, 16, 4}, Shape{2, 2, 16, 4}, 4, ""},
		{Shape{2, 8, 16, 4}, Shape{2, 1, 32, 4}, Shape{2, 1, 32, 4}, 8, ""},
		{Shape{2, 8, 16, 4}, Shape{2, 8, 16, 4}, Shape{2, 8, 16, 4}, 1, ""},
		{Shape{12, 16, 4}, Shape{4, 16, 4}, Shape{4, 16, 4}, 3, ""},
		{Shape{2, 8, 16, 4}, Shape{2, 3, 16, 4}, Shape{2, 3, 16, 4}, 0, "Q has 8 heads and K, V 3: the K/V heads must divide Q's"},
		{Shape{2, 4, 16, 4}, Shape{2, 8, 16, 4}, Shape{2, 8, 16, 4}, 0, "must divide"},
		{Shape{2, 8, 16, 4}, Shape{1, 2, 16, 4}, Shape{1, 2, 16, 4}, 0, "batch dims differ"},
		{Shape{2, 8, 16, 4}, Shape{2, 2, 16, 4}, Shape{2, 4, 16, 4}, 0, "K and V batch/head dims differ"},
		{Shape{2, 8, 16, 4}, Shape{2, 0, 16, 4}, Shape{2, 0, 16, 4}, 0, "must divide"},
	} {
		_, types, err := InferNode("FlashAttention", []*Value{val(c.q...), val(c.k...), val(c.v...)}, attrs)
		if c.want != "" {
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Q %v K %v V %v: error %v, want one saying %q", c.q, c.k, c.v, err, c.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("Q %v K %v V %v: %v", c.q, c.k, c.v, err)
			continue
		}
		if !types[0].Shape.Equal(c.q) {
			t.Errorf("Q %v K %v: Y is %v", c.q, c.k, types[0].Shape)
		}
		a, err := AttentionShape(c.q, c.k, c.v)
		if err != nil || a.Group != c.group || a.KVHeads()*a.Group != a.BH {
			t.Errorf("Q %v K %v: %+v %v, want group %d", c.q, c.k, a, err, c.group)
		}
		_, gt, err := InferNode("FlashAttentionGrad", []*Value{val(c.q...), val(c.k...), val(c.v...), val(c.q...), {Name: "l", Type: TensorType{Float32, c.q[:c.q.Rank()-1]}}, val(c.q...)}, attrs)
		if err != nil || !gt[1].Shape.Equal(c.k) || !gt[2].Shape.Equal(c.v) {
			t.Errorf("grad of Q %v K %v: %v, %v", c.q, c.k, gt, err)
		}
	}
	if _, _, _, _, err := AttentionDims(Shape{1, 4, 2, 2}, Shape{1, 2, 2, 2}, Shape{1, 2, 2, 2}); err == nil || !strings.Contains(err.Error(), "grouped") {
		t.Errorf("AttentionDims of grouped heads: %v, want a refusal naming them", err)
	}
}

// TestFlashAttentionGroupedIsRepeated: the op's definition with H_kv heads
// is its definition with each K/V head repeated for its group (query head
// h reading head h/(H/H_kv)), and dK, dV are the repeated heads' gradients
// summed over each group. Both sides are the float64 Eval.
func TestFlashAttentionGroupedIsRepeated(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	randT := func(s Shape) *Tensor {
		x := NewTensor(Float64, s)
		for i := range x.Len() {
			x.Set(i, rng.NormFloat64())
		}
		return x
	}
	const B, H, S, D = 2, 4, 6, 3
	for _, kv := range []int{2, 1} {
		g := H / kv
		q, dy := randT(Shape{B, H, S, D}), randT(Shape{B, H, S, D})
		k, v := randT(Shape{B, kv, S, D}), randT(Shape{B, kv, S, D})
		rep := func(x *Tensor) *Tensor {
			r := NewTensor(Float64, Shape{B, H, S, D})
			for i := range r.Len() {
				b, h, rest := i/(H*S*D), i/(S*D)%H, i%(S*D)
				r.Set(i, x.At((b*kv+h/g)*S*D+rest))
			}
			return r
		}
		attrs := Attrs{"scale": Float(0.4), "causal": Int(1)}
		gqa, err := Eval("FlashAttention", attrs, q, k, v)
		if err != nil {
			t.Fatal(err)
		}
		mha, err := Eval("FlashAttention", attrs, q, rep(k), rep(v))
		if err != nil {
			t.Fatal(err)
		}
		for o := range 2 {
			for i := range gqa[o].Len() {
				if gqa[o].At(i) != mha[o].At(i) {
					t.Fatalf("kv %d: output %d [%d] is %v, repeated K/V give %v", kv, o, i, gqa[o].At(i), mha[o].At(i))
				}
			}
		}
		gg, err := Eval("FlashAttentionGrad", attrs, q, k, v, gqa[0], gqa[1], dy)
		if err != nil {
			t.Fatal(err)
		}
		mg, err := Eval("FlashAttentionGrad", attrs, q, rep(k), rep(v), mha[0], mha[1], dy)
		if err != nil {
			t.Fatal(err)
		}
		for i := range gg[0].Len() {
			if gg[0].At(i) != mg[0].At(i) {
				t.Fatalf("kv %d: dQ[%d] %v, repeated %v", kv, i, gg[0].At(i), mg[0].At(i))
			}
		}
		for o := 1; o <= 2; o++ {
			sum := make([]float64, gg[o].Len())
			for i := range mg[o].Len() {
				b, h, rest := i/(H*S*D), i/(S*D)%H, i%(S*D)
				sum[(b*kv+h/g)*S*D+rest] += mg[o].At(i)
			}
			for i, want := range sum {
				if d := gg[o].At(i) - want; d > 1e-12 || d < -1e-12 {
					t.Fatalf("kv %d: d%c[%d] %v, summed over the group %v", kv, "QKV"[o], i, gg[o].At(i), want)
				}
			}
		}
	}
}
