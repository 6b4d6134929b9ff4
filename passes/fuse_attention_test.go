package passes

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// fusingCases are the attention spellings that must fuse: one FlashAttention
// per layer, no Softmax and no MatMul left, the right attributes, and the
// same outputs as the unfused graph on the CPU backend.
var fusingCases = []attnCase{
	{name: "model_form", rank: 4, scale: "mul", k: "t", mask: "recipe", layers: 1},
	{name: "three_layers", rank: 4, scale: "mul", k: "t", mask: "recipe", layers: 3},
	{name: "heads_3d", rank: 3, scale: "mul", k: "t", mask: "recipe", layers: 2},
	{name: "scale_first_operand", rank: 4, scale: "cmul", k: "t", mask: "recipe", layers: 1},
	{name: "div_sqrt_d", rank: 4, scale: "div", k: "t", mask: "recipe", layers: 1},
	{name: "div_sqrt_node", rank: 3, scale: "divsqrt", k: "t", mask: "inf", layers: 1},
	{name: "scale_on_q", rank: 4, scale: "q", k: "t", mask: "recipe", layers: 2},
	{name: "div_on_q", rank: 3, scale: "qdiv", k: "t", mask: "recipe", layers: 1},
	{name: "scale_on_k", rank: 4, scale: "k", k: "t", mask: "recipe", layers: 1},
	{name: "scale_on_k_pre", rank: 4, scale: "k", k: "pre", mask: "recipe", layers: 1},
	{name: "scale_split_qk", rank: 4, scale: "qk", k: "t", mask: "recipe", layers: 2},
	{name: "scale_after_mask", rank: 4, scale: "post", k: "t", mask: "recipe", layers: 1},
	{name: "scale_after_mask_finfo", rank: 3, scale: "post", k: "t", mask: "finfo", layers: 1},
	{name: "no_scale", rank: 4, scale: "none", k: "t", mask: "recipe", layers: 1},
	{name: "k_pretransposed", rank: 4, scale: "mul", k: "pre", mask: "recipe", layers: 2},
	{name: "k_pretransposed_3d", rank: 3, scale: "mul", k: "pre", mask: "inf", layers: 1},
	{name: "k_bshd_perm_0231", rank: 4, scale: "div", k: "bshd", mask: "recipe", layers: 1},
	{name: "k_double_transpose", rank: 4, scale: "mul", k: "tt", mask: "recipe", layers: 1},
	{name: "mask_literal_inf", rank: 4, scale: "mul", k: "t", mask: "inf", layers: 1},
	{name: "mask_minus_1e4", rank: 4, scale: "mul", k: "t", mask: "1e4", layers: 1},
	{name: "mask_finfo_min", rank: 4, scale: "mul", k: "t", mask: "finfo", layers: 1},
	{name: "mask_trilu", rank: 4, scale: "mul", k: "t", mask: "trilu", layers: 2},
	{name: "mask_one_minus_tril", rank: 3, scale: "div", k: "t", mask: "sub", layers: 1},
	{name: "mask_broadcast_4d", rank: 4, scale: "mul", k: "t", mask: "bcast4", layers: 1},
	{name: "mask_where_keep", rank: 4, scale: "mul", k: "t", mask: "where", layers: 2},
	{name: "mask_where_fill", rank: 3, scale: "mul", k: "t", mask: "wherefill", layers: 1},
	{name: "mask_gpt2_bias_slice", rank: 4, scale: "div", k: "bshd", mask: "slice", layers: 1},
	{name: "where_then_scale", rank: 4, scale: "post", k: "t", mask: "where", layers: 1},
	{name: "noop_casts_hf_llama", rank: 4, scale: "div", k: "t", mask: "trilu", layers: 2, noops: true},
	{name: "no_mask", rank: 4, scale: "mul", k: "t", mask: "none", layers: 1},
	{name: "no_mask_no_scale", rank: 3, scale: "none", k: "pre", mask: "none", layers: 1},
}

func TestFuseAttentionVariants(t *testing.T) {
	for _, c := range fusingCases {
		for _, dt := range []graph.DType{graph.Float64, graph.Float32} {
			t.Run(c.name+"/"+dt.String(), func(t *testing.T) {
				g := c.build(t, dt)
				before := graph.Format(g)
				fused, log := fzRun(t, Default(true), g)
				if graph.Format(g) != before {
					t.Fatal("the pipeline modified its input graph")
				}
				ops := fused.CountOps()
				if ops["FlashAttention"] != c.layers || ops["Softmax"] != 0 || ops["MatMul"] != 0 {
					t.Fatalf("ops after fusion %v, want %d FlashAttention and no Softmax/MatMul\n%s\n%s", ops, c.layers, log, graph.Format(fused))
				}
				if ops["Div"] != 0 || ops["Where"] != 0 || ops["Add"] != 0 || ops["Trilu"] != 0 || ops["Mul"] != 0 || ops["Cast"] != 0 || ops["Identity"] != 0 {
					t.Errorf("scale or mask ops left behind: %v", ops)
				}
				for _, n := range fzNodes(fused, "FlashAttention") {
					wantCausal := int64(1)
					if c.mask == "none" {
						wantCausal = 0
					}
					if got := n.Attrs.Int("causal", -1); got != wantCausal {
						t.Errorf("%s causal=%d, want %d", n.Name, got, wantCausal)
					}
					// The product of the graph's constants, up to the
					// rounding of multiplying two of them.
					if got, want := n.Attrs.Float("scale", 0), c.wantScale(dt); math.Abs(got-want) > 1e-15*want && !(c.scale == "qk" && math.Abs(got-want) <= 1e-7*want) {
						t.Errorf("%s scale=%v, want %v", n.Name, got, want)
					}
					if len(n.Outputs) != 2 {
						t.Errorf("%s has %d outputs", n.Name, len(n.Outputs))
					}
				}
				// The last layer's output is the graph output: it keeps its name.
				if fused.Outputs[0].Name != g.Outputs[0].Name {
					t.Errorf("graph output renamed from %s to %s", g.Outputs[0].Name, fused.Outputs[0].Name)
				}
				xs := ExplainLog(g, log)
				if len(xs) != c.layers {
					t.Fatalf("%d explanations for %d softmaxes", len(xs), c.layers)
				}
				for _, x := range xs {
					if !x.Fused || !strings.Contains(x.Into, "FlashAttention") {
						t.Errorf("explanation: %v", x)
					}
				}
				fzSameOutputs(t, g, fused, dt)
			})
		}
	}
}

// TestFuseAttentionKLayout checks what K becomes: no node for the plain
// transpose, one Transpose for a pre-transposed input, and the head split
// only ([0,2,1,3]) for GPT-2's [0,2,3,1].
func TestFuseAttentionKLayout(t *testing.T) {
	for _, tc := range []struct {
		k         string
		wantPerms [][]int64
	}{
		{"t", nil},
		{"pre", [][]int64{{0, 1, 3, 2}}},
		{"bshd", [][]int64{{0, 2, 1, 3}}},
		{"tt", [][]int64{{0, 2, 1, 3}}},
	} {
		g := attnCase{name: "k_" + tc.k, rank: 4, scale: "mul", k: tc.k, mask: "recipe", layers: 1}.build(t, graph.Float64)
		fused, _ := fzRun(t, Default(true), g)
		var perms [][]int64
		for _, n := range fzNodes(fused, "Transpose") {
			perms = append(perms, n.Attrs.IntList("perm"))
		}
		if len(perms) != len(tc.wantPerms) {
			t.Errorf("k=%s: transposes %v, want %v", tc.k, perms, tc.wantPerms)
			continue
		}
		for i := range perms {
			if !slicesEqual(perms[i], tc.wantPerms[i]) {
				t.Errorf("k=%s: transposes %v, want %v", tc.k, perms, tc.wantPerms)
			}
		}
		fa := fzNodes(fused, "FlashAttention")[0]
		if want := (graph.Shape{fzB, fzH, fzS, fzD}); !fa.Inputs[1].Type.Shape.Equal(want) {
			t.Errorf("k=%s: K is %v, want %v", tc.k, fa.Inputs[1].Type.Shape, want)
		}
	}
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// refusalCase builds a graph in which fusing would change the meaning.
type refusalCase struct {
	name string
	want string // a substring of the Softmax's explanation
	// build returns the graph; the helper gives the usual pieces.
	build func(b *graph.Builder, a fzAttn) []*graph.Value
}

// fzAttn holds the inputs of a refusal graph: 4-D Q, K, V and handy consts.
type fzAttn struct {
	q, k, v, scale, mask *graph.Value
	dt                   graph.DType
}

// scores is Q·Kᵀ·scale, the start of most refusal graphs.
func (a fzAttn) scores(b *graph.Builder) *graph.Value {
	return b.Mul(b.MatMul(a.q, b.Transpose(a.k, 0, 1, 3, 2)), a.scale)
}

// literalMask is a [S, S] const with value(i, j) at each position.
func literalMask(b *graph.Builder, dt graph.DType, name string, value func(i, j int) float64) *graph.Value {
	d := make([]float64, fzS*fzS)
	for i := range fzS {
		for j := range fzS {
			d[i*fzS+j] = value(i, j)
		}
	}
	return b.Const(name, dt, graph.Shape{fzS, fzS}, graph.Literal(d...))
}

var refusalCases = []refusalCase{
	{"banded_mask", "mask is a sliding window of 3 keys, not causal: query i sees keys i-2..i only ([3,0] is masked)", func(b *graph.Builder, a fzAttn) []*graph.Value {
		m := literalMask(b, a.dt, "band", func(i, j int) float64 {
			if j > i || i-j > 2 {
				return math.Inf(-1)
			}
			return 0
		})
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), m), -1), a.v)}
	}},
	{"anti_causal_mask", "mask is not causal: it masks [1,0]", func(b *graph.Builder, a fzAttn) []*graph.Value {
		m := literalMask(b, a.dt, "upper", func(i, j int) float64 {
			if j < i {
				return math.Inf(-1)
			}
			return 0
		})
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), m), -1), a.v)}
	}},
	{"padding_mask_input", "mask pad [2,1,1,8] is a padding mask (one value per key), read from graph input pad", func(b *graph.Builder, a fzAttn) []*graph.Value {
		pad := b.Input("pad", a.dt, fzB, 1, 1, fzS)
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), pad), -1), a.v)}
	}},
	{"padding_mask_from_ids", "mask Mul_0 [2,1,1,8] is a padding mask (one value per key), read from graph input attention_mask", func(b *graph.Builder, a fzAttn) []*graph.Value {
		// BERT's: (1 − attention_mask[:, None, None, :]) · −1e9.
		am := b.Input("attention_mask", a.dt, fzB, fzS)
		pad := b.Mul(b.Sub(b.Scalar(a.dt, 1), b.Reshape(am, fzB, 1, 1, fzS)), b.Scalar(a.dt, -1e9))
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), pad), -1), a.v)}
	}},
	{"padding_mask_where_input", "mask condition keep [2,1,1,8] is a padding mask (one value per key), read from graph input keep", func(b *graph.Builder, a fzAttn) []*graph.Value {
		keep := b.Input("keep", graph.Bool, fzB, 1, 1, fzS)
		s := b.Op("Where", nil, keep, a.scores(b), b.Scalar(a.dt, math.Inf(-1)))
		return []*graph.Value{b.MatMul(b.Softmax(s, -1), a.v)}
	}},
	{"mask_input_per_query", "mask bias [2,1,8,8] is a mask computed at run time, read from graph input bias", func(b *graph.Builder, a fzAttn) []*graph.Value {
		bias := b.Input("bias", a.dt, fzB, 1, fzS, fzS)
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), bias), -1), a.v)}
	}},
	{"padding_mask_const", "mask is a padding mask, not causal: it masks the same keys for every query (keys [6 7] of the first [8,8] matrix)", func(b *graph.Builder, a fzAttn) []*graph.Value {
		d := make([]float64, fzS)
		d[fzS-2], d[fzS-1] = math.Inf(-1), math.Inf(-1)
		pad := b.Const("pad", a.dt, graph.Shape{1, 1, 1, fzS}, graph.Literal(d...))
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), pad), -1), a.v)}
	}},
	{"mask_partly_causal", "mask is not causal: [0,7] above the diagonal is not masked", func(b *graph.Builder, a fzAttn) []*graph.Value {
		m := literalMask(b, a.dt, "holey", func(i, j int) float64 {
			if j > i && !(i == 0 && j == fzS-1) {
				return math.Inf(-1)
			}
			return 0
		})
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), m), -1), a.v)}
	}},
	{"mask_too_weak", "mask value -100.0 at [0,1] does not stand for −inf", func(b *graph.Builder, a fzAttn) []*graph.Value {
		m := literalMask(b, a.dt, "weak", func(i, j int) float64 {
			if j > i {
				return -100
			}
			return 0
		})
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), m), -1), a.v)}
	}},
	{"mask_1e4_scaled_after", "mask value -5000.0 at [0,1] does not stand for −inf", func(b *graph.Builder, a fzAttn) []*graph.Value {
		// −1e4 would do before the scale; the scale after it weakens it.
		m := literalMask(b, a.dt, "weak", func(i, j int) float64 {
			if j > i {
				return -1e4
			}
			return 0
		})
		s := b.Mul(b.Add(b.MatMul(a.q, b.Transpose(a.k, 0, 1, 3, 2)), m), b.Scalar(a.dt, 0.5))
		return []*graph.Value{b.MatMul(b.Softmax(s, -1), a.v)}
	}},
	{"mask_with_bias", "mask is not causal: it adds -0.5 at [1,0] (a bias, not a mask)", func(b *graph.Builder, a fzAttn) []*graph.Value {
		m := literalMask(b, a.dt, "alibi", func(i, j int) float64 {
			if j > i {
				return math.Inf(-1)
			}
			return -0.5 * float64(i-j)
		})
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), m), -1), a.v)}
	}},
	{"where_mask_wrong_way", "mask is not causal: it masks [0,0], on or below the diagonal", func(b *graph.Builder, a fzAttn) []*graph.Value {
		// Keeps the strict upper triangle: the mask of the other direction.
		cond := b.Op("Trilu", graph.Attrs{"upper": graph.Int(1)}, b.Const("ones", graph.Bool, graph.Shape{fzS, fzS}, graph.Ones()), b.Scalar(graph.Int64, 1))
		s := b.Op("Where", nil, cond, a.scores(b), b.Scalar(a.dt, math.Inf(-1)))
		return []*graph.Value{b.MatMul(b.Softmax(s, -1), a.v)}
	}},
	{"where_fill_not_constant", "mask fill value fill is a graph input, not a constant", func(b *graph.Builder, a fzAttn) []*graph.Value {
		cond := b.Op("Trilu", graph.Attrs{"upper": graph.Int(0)}, b.Const("ones", graph.Bool, graph.Shape{fzS, fzS}, graph.Ones()))
		s := b.Op("Where", nil, cond, a.scores(b), b.Input("fill", a.dt))
		return []*graph.Value{b.MatMul(b.Softmax(s, -1), a.v)}
	}},
	{"probs_used_twice", "probs also used by node ReduceSum_0", func(b *graph.Builder, a fzAttn) []*graph.Value {
		p := b.Softmax(b.Add(a.scores(b), a.mask), -1)
		return []*graph.Value{b.MatMul(p, a.v), b.ReduceSum(p, false, -1)}
	}},
	{"probs_output", "probs are a graph output", func(b *graph.Builder, a fzAttn) []*graph.Value {
		p := b.Softmax(b.Add(a.scores(b), a.mask), -1)
		return []*graph.Value{b.MatMul(p, a.v), p}
	}},
	{"probs_right_operand", "probs are the right operand of node MatMul_1", func(b *graph.Builder, a fzAttn) []*graph.Value {
		p := b.Softmax(b.Add(a.scores(b), a.mask), -1)
		return []*graph.Value{b.MatMul(b.Transpose(a.v, 0, 1, 3, 2), p)}
	}},
	{"scores_used_twice", "scores MatMul_0 also used by node ReduceMax_0", func(b *graph.Builder, a fzAttn) []*graph.Value {
		s := b.MatMul(a.q, b.Transpose(a.k, 0, 1, 3, 2))
		p := b.Softmax(b.Add(b.Mul(s, a.scale), a.mask), -1)
		return []*graph.Value{b.MatMul(p, a.v), b.Op("ReduceMax", nil, s)}
	}},
	{"masked_scores_output", "masked scores Add_0 are a graph output", func(b *graph.Builder, a fzAttn) []*graph.Value {
		s := b.Add(a.scores(b), a.mask)
		return []*graph.Value{b.MatMul(b.Softmax(s, -1), a.v), s}
	}},
	{"softmax_axis", "softmax axis is 2, not the last axis (3)", func(b *graph.Builder, a fzAttn) []*graph.Value {
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), a.mask), 2), a.v)}
	}},
	{"scale_input", "scale s is a graph input, not a constant", func(b *graph.Builder, a fzAttn) []*graph.Value {
		s := b.Mul(b.MatMul(a.q, b.Transpose(a.k, 0, 1, 3, 2)), b.Input("s", a.dt))
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(s, a.mask), -1), a.v)}
	}},
	{"scale_param", "scale temperature is a trainable param, not a constant", func(b *graph.Builder, a fzAttn) []*graph.Value {
		s := b.Mul(b.MatMul(a.q, b.Transpose(a.k, 0, 1, 3, 2)), b.Param("temperature", a.dt, graph.Shape{}, graph.Fill(0.3)))
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(s, a.mask), -1), a.v)}
	}},
	{"scale_not_scalar", "scale const per_key is not a scalar (shape [8])", func(b *graph.Builder, a fzAttn) []*graph.Value {
		s := b.Mul(b.MatMul(a.q, b.Transpose(a.k, 0, 1, 3, 2)), b.Const("per_key", a.dt, graph.Shape{fzS}, graph.Fill(0.3)))
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(s, a.mask), -1), a.v)}
	}},
	{"scale_after_mask_negative", "scale after the mask c_1 is -0.5: a scale that is not positive", func(b *graph.Builder, a fzAttn) []*graph.Value {
		s := b.Mul(b.Add(a.scores(b), a.mask), b.Scalar(a.dt, -0.5))
		return []*graph.Value{b.MatMul(b.Softmax(s, -1), a.v)}
	}},
	{"dropout_mul", "probs feed node Mul_1 (Mul), not MatMul(probs, V): dropout", func(b *graph.Builder, a fzAttn) []*graph.Value {
		p := b.Softmax(b.Add(a.scores(b), a.mask), -1)
		keep := b.Input("keep", a.dt, fzB, fzH, fzS, fzS)
		return []*graph.Value{b.MatMul(b.Mul(p, keep), a.v)}
	}},
	{"cast_between", "probs feed node Cast_0 (Cast), not MatMul(probs, V)", func(b *graph.Builder, a fzAttn) []*graph.Value {
		p := b.Softmax(b.Add(a.scores(b), a.mask), -1)
		p16 := b.Op("Cast", graph.Attrs{"to": graph.Str("float16")}, p)
		return []*graph.Value{b.MatMul(p16, b.Op("Cast", graph.Attrs{"to": graph.Str("float16")}, a.v))}
	}},
	{"softmax_in_float32_of_float16", "not an attention pattern: node Cast_2 (Cast) where", func(b *graph.Builder, a fzAttn) []*graph.Value {
		// Mixed precision: float16 scores, softmax upcast to float32 and the
		// probs cast back; fusing would change the softmax's precision.
		h := func(x *graph.Value) *graph.Value { return b.Op("Cast", graph.Attrs{"to": graph.Str("float16")}, x) }
		s := b.MatMul(h(a.q), b.Transpose(h(a.k), 0, 1, 3, 2))
		p := b.Softmax(b.Op("Cast", graph.Attrs{"to": graph.Str("float32")}, s), -1)
		return []*graph.Value{b.MatMul(h(p), h(a.v))}
	}},
	{"v_head_dim_differs", "V head dim 4 differs from Q's 8", func(b *graph.Builder, a fzAttn) []*graph.Value {
		v := b.Input("v4", a.dt, fzB, fzH, fzS, 4)
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), a.mask), -1), v)}
	}},
	{"k_broadcast_batch", "Q, Kᵀ, V batch dims differ", func(b *graph.Builder, a fzAttn) []*graph.Value {
		k1 := b.Input("k1", a.dt, 1, fzH, fzS, fzD)
		s := b.Mul(b.MatMul(a.q, b.Transpose(k1, 0, 1, 3, 2)), a.scale)
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(s, a.mask), -1), a.v)}
	}},
	{"mask_broadcasts_scores_up", "changes the scores from float", func(b *graph.Builder, a fzAttn) []*graph.Value {
		q3 := b.Input("q3", a.dt, fzH, fzS, fzD)
		k3 := b.Input("k3", a.dt, fzH, fzS, fzD)
		v3 := b.Input("v3", a.dt, fzH, fzS, fzD)
		m4 := b.Reshape(a.mask, 1, 1, fzS, fzS)
		s := b.Add(b.MatMul(q3, b.Transpose(k3, 0, 2, 1)), m4) // [1,1,S,S] + [H,S,S] → [1,H,S,S]
		return []*graph.Value{b.MatMul(b.Softmax(s, -1), v3)}
	}},
	{"rank_2", "Q q2 is rank 2: FlashAttention takes [B,H,S,D] or [BH,S,D]", func(b *graph.Builder, a fzAttn) []*graph.Value {
		q2 := b.Input("q2", a.dt, fzS, fzD)
		k2 := b.Input("k2", a.dt, fzS, fzD)
		v2 := b.Input("v2", a.dt, fzS, fzD)
		s := b.Add(b.Mul(b.MatMul(q2, b.Transpose(k2, 1, 0)), a.scale), a.mask)
		return []*graph.Value{b.MatMul(b.Softmax(s, -1), v2)}
	}},
	{"not_attention", "not an attention pattern: node Relu_0 (Relu) where Mul, Add, Where or MatMul was expected", func(b *graph.Builder, a fzAttn) []*graph.Value {
		return []*graph.Value{b.Softmax(b.Op("Relu", nil, a.q), -1)}
	}},
	// Constant evaluation runs every elementwise op (Exp of a constant is a
	// constant); a LogSoftmax of one is computed at run time.
	{"mask_computed_at_run_time", "mask LogSoftmax_0 is computed at run time (by node LogSoftmax_0, LogSoftmax)", func(b *graph.Builder, a fzAttn) []*graph.Value {
		m := b.Op("LogSoftmax", graph.Attrs{"axis": graph.Int(-1)}, a.mask)
		return []*graph.Value{b.MatMul(b.Softmax(b.Add(a.scores(b), m), -1), a.v)}
	}},
}

// TestFuseAttentionRefusals: each graph stays unfused, the explanation of
// its Softmax gives the reason, and what the pipeline did (canonicalising)
// still computes the same outputs.
func TestFuseAttentionRefusals(t *testing.T) {
	var golden strings.Builder
	for _, c := range refusalCases {
		t.Run(c.name, func(t *testing.T) {
			dt := graph.Float64
			b := graph.NewBuilder(c.name)
			a := fzAttn{
				q: b.Input("q", dt, fzB, fzH, fzS, fzD), k: b.Input("k", dt, fzB, fzH, fzS, fzD), v: b.Input("v", dt, fzB, fzH, fzS, fzD),
				dt: dt,
			}
			a.scale = b.Scalar(dt, 1/math.Sqrt(fzD))
			a.mask = b.Const("mask", dt, graph.Shape{fzS, fzS}, graph.CausalMask())
			b.Output(c.build(b, a)...)
			g, err := b.Build()
			if err != nil {
				t.Fatal(err)
			}
			fused, log := fzRun(t, Default(true), g)
			if n := fzCount(fused, "FlashAttention"); n != 0 {
				t.Fatalf("fused %d attention(s):\n%s", n, log)
			}
			if fzCount(fused, "Softmax") != fzCount(g, "Softmax") {
				t.Fatal("a Softmax disappeared")
			}
			xs := ExplainLog(g, log)
			if len(xs) != 1 {
				t.Fatalf("%d explanations", len(xs))
			}
			if xs[0].Fused || !strings.Contains(xs[0].Reason, c.want) {
				t.Errorf("explanation %q, want it to contain %q\nlog:\n%s", xs[0], c.want, log)
			}
			golden.WriteString(c.name + ": " + xs[0].String() + "\n")
			fzSameOutputs(t, g, fused, dt)
		})
	}
	if !t.Failed() {
		fzGolden(t, "refusals.golden", golden.String())
	}
}

// TestExplainEverySoftmax: a graph with a fusable attention, a refused one
// and a classifier softmax gets one explanation per Softmax, in order.
func TestExplainEverySoftmax(t *testing.T) {
	dt := graph.Float32
	b := graph.NewBuilder("mixed")
	q := b.Input("q", dt, fzB, fzH, fzS, fzD)
	k := b.Input("k", dt, fzB, fzH, fzS, fzD)
	v := b.Input("v", dt, fzB, fzH, fzS, fzD)
	mask := b.Const("mask", dt, graph.Shape{fzS, fzS}, graph.CausalMask())
	scale := b.Scalar(dt, 0.25)
	attn := func(x *graph.Value) (*graph.Value, *graph.Value) {
		p := b.Softmax(b.Add(b.Mul(b.MatMul(x, b.Transpose(k, 0, 1, 3, 2)), scale), mask), -1)
		return b.MatMul(p, v), p
	}
	o1, _ := attn(q)
	o2, p2 := attn(o1)
	cls := b.Softmax(b.ReduceMean(o2, false, 1), -1)
	b.Output(o2, b.ReduceSum(p2, false, -1), cls)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	xs, err := Explain(g)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, x := range xs {
		lines = append(lines, x.String())
	}
	want := []string{
		"Softmax_0: fused into FlashAttention_0 {causal=1, scale=0.25} by attention_add_mask",
		"Softmax_1: not fused: probs also used by node ReduceSum_0",
		"Softmax_2: not fused: not an attention pattern: node ReduceMean_0 (ReduceMean) where Mul, Add, Where or MatMul was expected",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("explanations:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// TestFusedGoldenText pins the fused text of a small graph (names, K's
// transpose, attributes, the dropped consts) for review.
func TestFusedGoldenText(t *testing.T) {
	g := attnCase{name: "golden", rank: 4, scale: "div", k: "bshd", mask: "where", layers: 2}.build(t, graph.Float32)
	fused, log := fzRun(t, Default(true), g)
	fzGolden(t, "fused_bshd_where.txt", graph.Format(fused))
	var events strings.Builder
	for _, e := range log.Events() {
		if e.Kind == Fired || e.Kind == Refused { // Info lines carry timings
			events.WriteString(e.String() + "\n")
		}
	}
	fzGolden(t, "fused_bshd_where.log", events.String())
}

// TestFuseCrossAttention: with Sq ≠ Sk the causal flag is top-left aligned
// (FlashAttention's and ONNX Attention's is_causal): a mask masking j > i
// fuses, a bottom-right aligned one (decoding with a KV cache) is refused.
func TestFuseCrossAttention(t *testing.T) {
	const sq, sk = 4, 8
	build := func(dt graph.DType, masked func(i, j int) bool) *graph.Graph {
		b := graph.NewBuilder("cross")
		q := b.Input("q", dt, fzB, fzH, sq, fzD)
		k := b.Input("k", dt, fzB, fzH, sk, fzD)
		v := b.Input("v", dt, fzB, fzH, sk, fzD)
		d := make([]float64, sq*sk)
		for i := range sq {
			for j := range sk {
				if masked(i, j) {
					d[i*sk+j] = math.Inf(-1)
				}
			}
		}
		m := b.Const("mask", dt, graph.Shape{sq, sk}, graph.Literal(d...))
		s := b.Add(b.Mul(b.MatMul(q, b.Transpose(k, 0, 1, 3, 2)), b.Scalar(dt, 0.3)), m)
		b.Output(b.MatMul(b.Softmax(s, -1), v))
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	for _, dt := range []graph.DType{graph.Float64, graph.Float32} {
		g := build(dt, func(i, j int) bool { return j > i })
		fused, log := fzRun(t, Default(true), g)
		fa := fzNodes(fused, "FlashAttention")
		if len(fa) != 1 || fa[0].Attrs.Int("causal", 0) != 1 {
			t.Fatalf("top-left causal cross attention not fused:\n%s", log)
		}
		fzSameOutputs(t, g, fused, dt)
	}
	g := build(graph.Float64, func(i, j int) bool { return j > i+sk-sq })
	fused, log := fzRun(t, Default(true), g)
	xs := ExplainLog(g, log)
	if fzCount(fused, "FlashAttention") != 0 || !strings.Contains(xs[0].Reason, "mask is not causal: [0,1] above the diagonal is not masked") {
		t.Errorf("bottom-right aligned mask: %v", xs)
	}
	// A decode step (one query, every key visible) has an all-zero mask:
	// no mask, causal=0.
	g = build(graph.Float64, func(i, j int) bool { return false })
	fused, _ = fzRun(t, Default(true), g)
	if fa := fzNodes(fused, "FlashAttention"); len(fa) != 1 || fa[0].Attrs.Int("causal", 1) != 0 {
		t.Errorf("all-zero mask should fuse with causal=0: %s", graph.Format(fused))
	}
	fzSameOutputs(t, g, fused, graph.Float64)
}

// TestRulePanicIsAnError: a rule that panics fails the pass with an error
// naming it; the input graph is untouched.
func TestRulePanicIsAnError(t *testing.T) {
	g := attnCase{name: "panic", rank: 4, scale: "mul", k: "t", mask: "recipe", layers: 1}.build(t, graph.Float64)
	before := graph.Format(g)
	r := attentionRules[0]
	r.Rewrite = func(*Match, *Edit) error { panic("boom") }
	_, err := (&RulePass{PassName: "panicky", Rules: []Rule{r}}).Run(g, nil)
	if err == nil || !strings.Contains(err.Error(), "panicky: internal error: boom") {
		t.Errorf("err = %v", err)
	}
	if graph.Format(g) != before {
		t.Error("the input graph changed")
	}
}

// TestSlidingWindowNeverFusedAsCausal: a sliding-window mask (Mistral's:
// query i sees keys i-w+1..i) is causal plus more masking below the
// diagonal. Fused as plain causal it would let queries see keys the model
// hides, so for every window shorter than the sequence, in each spelling
// exporters use, the Softmax stays, the explanation names the sliding
// window, and the pipeline's graph computes what the model does. A window
// of the whole sequence (or more) hides nothing below the diagonal: it is
// exactly causal and fuses.
func TestSlidingWindowNeverFusedAsCausal(t *testing.T) {
	spellings := map[string]func(b *graph.Builder, a fzAttn, w int) *graph.Value{
		// Add of a literal: −inf, or HF's large negative.
		"add_inf": func(b *graph.Builder, a fzAttn, w int) *graph.Value {
			m := literalMask(b, a.dt, "window", func(i, j int) float64 {
				if j > i || i-j >= w {
					return math.Inf(-1)
				}
				return 0
			})
			return b.Add(a.scores(b), m)
		},
		"add_1e9": func(b *graph.Builder, a fzAttn, w int) *graph.Value {
			m := literalMask(b, a.dt, "window", func(i, j int) float64 {
				if j > i || i-j >= w {
					return -1e9
				}
				return 0
			})
			return b.Add(a.scores(b), m)
		},
		// The exporters' form: triu(full(−inf), 1) + tril(full(−inf), −w).
		"add_trilu": func(b *graph.Builder, a fzAttn, w int) *graph.Value {
			full := b.Const("neg_inf", a.dt, graph.Shape{fzS, fzS}, graph.Fill(math.Inf(-1)))
			upper := b.Op("Trilu", graph.Attrs{"upper": graph.Int(1)}, full, b.Scalar(graph.Int64, 1))
			lower := b.Op("Trilu", graph.Attrs{"upper": graph.Int(0)}, full, b.Scalar(graph.Int64, float64(-w)))
			return b.Add(a.scores(b), b.Add(upper, lower))
		},
		// Where(keep, scores, −inf) with keep the band.
		"where_keep": func(b *graph.Builder, a fzAttn, w int) *graph.Value {
			keep := make([]float64, fzS*fzS)
			for i := range fzS {
				for j := range fzS {
					if j <= i && i-j < w {
						keep[i*fzS+j] = 1
					}
				}
			}
			cond := b.Const("keep", graph.Bool, graph.Shape{fzS, fzS}, graph.Literal(keep...))
			return b.Op("Where", nil, cond, a.scores(b), b.Scalar(a.dt, math.Inf(-1)))
		},
	}
	for name, spell := range spellings {
		for w := 1; w <= fzS+1; w++ {
			t.Run(fmt.Sprintf("%s/window_%d", name, w), func(t *testing.T) {
				dt := graph.Float64
				b := graph.NewBuilder("window")
				a := fzAttnInputs(b, dt)
				a.scale = b.Scalar(dt, 1/math.Sqrt(fzD))
				b.Output(b.MatMul(b.Softmax(spell(b, a, w), -1), a.v))
				g, err := b.Build()
				if err != nil {
					t.Fatal(err)
				}
				fused, log := fzRun(t, Default(true), g)
				xs := ExplainLog(g, log)
				if len(xs) != 1 {
					t.Fatalf("%d explanations", len(xs))
				}
				if w >= fzS {
					if fa := fzNodes(fused, "FlashAttention"); len(fa) != 1 || fa[0].Attrs.Int("causal", 0) != 1 {
						t.Errorf("a window of %d keys over %d is causal and should fuse: %v", w, fzS, xs[0])
					}
				} else {
					if n := fzCount(fused, "FlashAttention"); n != 0 {
						t.Fatalf("sliding window of %d keys fused into %d FlashAttention:\n%s", w, n, log)
					}
					if want := fmt.Sprintf("sliding window of %d keys", w); xs[0].Fused || !strings.Contains(xs[0].Reason, want) {
						t.Errorf("explanation %q does not say %q", xs[0], want)
					}
				}
				fzSameOutputs(t, g, fused, dt)
			})
		}
	}
}
