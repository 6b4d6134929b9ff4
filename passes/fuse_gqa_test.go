package passes

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/graph"
)

// gqaForm builds K or V with H heads [B,H,S,D] (or [BH,S,D] at rank 3) from
// x of kv heads, in one of the spellings of a repeat.
type gqaForm struct {
	name string
	rank int
	kvs  []int // the kv head counts the form is built with
	// grouped: head h reads head h/(H/kv), so the repeat goes; otherwise it
	// stays (and the attention still fuses over the repeated heads).
	grouped bool
	repeat  func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value
}

// tile writes ONNX Tile(x, reps) as onnx import does: Reshape to
// [1,d0,1,d1,..], Expand to [r0,d0,r1,d1,..], Reshape to [r0·d0,..].
func tile(b *graph.Builder, x *graph.Value, reps ...int) *graph.Value {
	var split, expanded, final []int
	for i, d := range x.Type.Shape {
		split = append(split, 1, d)
		expanded = append(expanded, reps[i], d)
		final = append(final, reps[i]*d)
	}
	return b.Reshape(b.Op("Expand", nil, b.Reshape(x, split...), b.Ints(expanded...)), final...)
}

var gqaForms = []gqaForm{
	{"repeat_kv_unsqueeze_expand", 4, []int{2, 1}, true, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		u := b.Op("Unsqueeze", nil, x, b.Ints(2))
		return b.Reshape(b.Op("Expand", nil, u, b.Ints(B, kv, H/kv, S, D)), B, H, S, D)
	}},
	{"model_reshape_expand", 4, []int{2, 1}, true, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		return b.Reshape(b.Op("Expand", nil, b.Reshape(x, B, kv, 1, S, D), b.Ints(B, kv, H/kv, S, D)), B, H, S, D)
	}},
	{"tile_unsqueezed_axis", 4, []int{2, 1}, true, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		return b.Reshape(tile(b, b.Op("Unsqueeze", nil, x, b.Ints(2)), 1, 1, H/kv, 1, 1), B, H, S, D)
	}},
	{"concat_copies_unsqueezed", 4, []int{2, 1}, true, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		u := b.Op("Unsqueeze", nil, x, b.Ints(2))
		copies := make([]*graph.Value, H/kv)
		for i := range copies {
			copies[i] = u
		}
		return b.Reshape(b.Concat(2, copies...), B, H, S, D)
	}},
	{"mqa_expand", 4, []int{1}, true, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		return b.Op("Expand", nil, x, b.Ints(B, H, S, D))
	}},
	{"mqa_tile", 4, []int{1}, true, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		return tile(b, x, 1, H, 1, 1)
	}},
	{"mqa_concat", 4, []int{1}, true, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		return b.Concat(1, x, x, x, x)
	}},
	{"heads_3d", 3, []int{2, 1}, true, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		return b.Reshape(b.Op("Expand", nil, b.Reshape(x, B*kv, 1, S, D), b.Ints(B*kv, H/kv, S, D)), B*H, S, D)
	}},
	// Whole head sets in order: head h reads head h mod kv.
	{"tile_head_axis", 4, []int{2}, false, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		return tile(b, x, 1, H/kv, 1, 1)
	}},
	{"concat_head_sets", 4, []int{2}, false, func(b *graph.Builder, x *graph.Value, B, H, kv, S, D int) *graph.Value {
		return b.Concat(1, x, x)
	}},
}

// TestFuseGQARepeats: every spelling of grouped-query attention's K/V
// repeat fuses to one FlashAttention reading the kv-headed K and V, with no
// repeat left (no Expand, Concat or Reshape in the fused graph), and the
// fused graph computes what the unfused one does — outputs, and dQ, dK, dV
// through autodiff (FlashAttentionGrad summing each group against the
// composed graph's gradient of the repeat). A repeat of whole head sets is
// not grouping: it stays, and the attention fuses over the repeated heads.
func TestFuseGQARepeats(t *testing.T) {
	const B, H, S, D = 2, 4, 8, 8
	for _, f := range gqaForms {
		for _, kv := range f.kvs {
			for _, dt := range []graph.DType{graph.Float64, graph.Float32} {
				t.Run(fmt.Sprintf("%s/kv=%d/%v", f.name, kv, dt), func(t *testing.T) {
					b := graph.NewBuilder("gqa")
					qs, kvs := []int{B, H, S, D}, []int{B, kv, S, D}
					if f.rank == 3 {
						qs, kvs = []int{B * H, S, D}, []int{B * kv, S, D}
					}
					q := b.Input("q", dt, qs...)
					kx, vx := b.Input("k", dt, kvs...), b.Input("v", dt, kvs...)
					k, v := f.repeat(b, kx, B, H, kv, S, D), f.repeat(b, vx, B, H, kv, S, D)
					mask := b.Const("mask", dt, graph.Shape{S, S}, graph.CausalMask())
					out := b.Attention(q, k, v, 1/math.Sqrt(D), mask).Out
					r := b.Const("r", dt, out.Type.Shape, graph.Normal(1, 7))
					b.Output(b.Rename(b.Op("ReduceSum", graph.Attrs{"keepdims": graph.Int(0)}, b.Mul(out, r)), "loss"))
					g, err := b.Build()
					if err != nil {
						t.Fatal(err)
					}
					fused, log := fzRun(t, Default(true), g)
					fa := fzNodes(fused, "FlashAttention")
					if len(fa) != 1 || fzCount(fused, "Softmax") != 0 || fa[0].Attrs.Int("causal", 0) != 1 {
						t.Fatalf("not fused as causal attention:\n%s", log)
					}
					ops := fused.CountOps()
					if f.grouped {
						if fa[0].Inputs[1].Name != kx.Name || fa[0].Inputs[2].Name != vx.Name {
							t.Errorf("FlashAttention reads %s %v and %s %v, want the inputs k and v %v", fa[0].Inputs[1].Name, fa[0].Inputs[1].Type.Shape, fa[0].Inputs[2].Name, fa[0].Inputs[2].Type.Shape, kvs)
						}
						if n := ops["Expand"] + ops["Concat"] + ops["Reshape"] + ops["Unsqueeze"]; n != 0 {
							t.Errorf("%d repeat ops left (%v)", n, ops)
						}
						if !strings.Contains(log.String(), fmt.Sprintf("group=%d}", H/kv)) {
							t.Errorf("the log does not give the group:\n%s", log)
						}
					} else {
						if fa[0].Inputs[1].Name != k.Name || fa[0].Inputs[2].Name != v.Name {
							t.Errorf("FlashAttention reads %s and %s, want the repeated %s and %s", fa[0].Inputs[1].Name, fa[0].Inputs[2].Name, k.Name, v.Name)
						}
						if !strings.Contains(log.String(), "K/V repeats kept") || !strings.Contains(log.String(), "mod 2") {
							t.Errorf("the log does not say why the repeat stays:\n%s", log)
						}
					}
					fzSameOutputs(t, g, fused, dt)
					gqaSameGradients(t, g, fused, dt)
				})
			}
		}
	}
}

// gqaSameGradients differentiates loss of both graphs by q, k and v and
// requires the gradients to agree within the dtype's fusion tolerance.
func gqaSameGradients(t *testing.T, unfused, fused *graph.Graph, dt graph.DType) {
	t.Helper()
	wrt := []string{"q", "k", "v"}
	feeds := fzFeeds(unfused, 3)
	var res [2]map[string]*graph.Tensor
	var names [2]map[string]string
	for i, g := range []*graph.Graph{unfused, fused} {
		gg, grads, err := autodiff.Gradients(g, "loss", wrt)
		if err != nil {
			t.Fatal(err)
		}
		res[i], names[i] = fzCPU(t, gg, feeds), grads
	}
	for _, w := range wrt {
		got, want := res[1][names[1][w]], res[0][names[0][w]]
		if d := fzRelDiff(got, want); !(d <= fzTolerance(dt)) {
			t.Errorf("d loss/d %s: fused and unfused differ by %.3g (relative), tolerance %g", w, d, fzTolerance(dt))
		}
	}
}
