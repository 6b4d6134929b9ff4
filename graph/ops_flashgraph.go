package graph

import "fmt"

// Ops of our own domain: the fused attention, the backward ops autodiff
// emits, and the optimizer update. Each keeps a meaning written with ONNX ops
// (Doc), which the CPU backend implements and the fusion tests compare with.

// LSEType is the logsumexp dtype for attention inputs of dtype dt: float32,
// except float64 for float64 inputs so that float64 graphs stay exact to 1e-10.
func LSEType(dt DType) DType {
	if dt == Float64 {
		return Float64
	}
	return Float32
}

// AttnShape is what FlashAttention's operand shapes say: BH query heads
// (batch·heads), each reading K/V head bh/Group of the BH/Group K/V heads,
// Sq queries and Sk keys of width D.
//
// Group > 1 is grouped-query attention (Group = H/H_kv; multi-query when
// H_kv = 1): K and V have H_kv heads and query head h uses K/V head
// h/(H/H_kv), as LLaMA's repeat_kv arranges the repeated heads. In the
// flattened [BH,S,D] form the same rule, bh/Group, picks the K/V head:
// b·H + h over Group is b·H_kv + h/Group because Group divides H.
type AttnShape struct {
	BH, Group, Sq, Sk, D int
}

// KVHeads is the number of K/V heads, batch included (BH/Group).
func (a AttnShape) KVHeads() int { return a.BH / a.Group }

// AttentionShape checks FlashAttention operand shapes: Q [B,H,Sq,D] (or
// [BH,Sq,D]), K and V [B,H_kv,Sk,D] (or [BH_kv,Sk,D]) with H_kv dividing H.
func AttentionShape(q, k, v Shape) (AttnShape, error) {
	r := q.Rank()
	if r != 3 && r != 4 {
		return AttnShape{}, fmt.Errorf("Q must be [B,H,S,D] or [BH,S,D], got %v", q)
	}
	if k.Rank() != r || v.Rank() != r {
		return AttnShape{}, fmt.Errorf("Q, K, V ranks differ: %v %v %v", q, k, v)
	}
	if !k[:r-2].Equal(v[:r-2]) {
		return AttnShape{}, fmt.Errorf("K and V batch/head dims differ: %v %v", k, v)
	}
	if !q[:r-3].Equal(k[:r-3]) {
		return AttnShape{}, fmt.Errorf("Q, K, V batch dims differ: %v %v %v", q, k, v)
	}
	hq, hkv := q[r-3], k[r-3]
	if hkv == 0 || hq%hkv != 0 {
		what := "heads"
		if r == 3 {
			what = "batch·heads"
		}
		return AttnShape{}, fmt.Errorf("Q has %d %s and K, V %d: the K/V %s must divide Q's (grouped-query attention): %v %v %v", hq, what, hkv, what, q, k, v)
	}
	if q[r-1] != k[r-1] || v[r-1] != q[r-1] {
		return AttnShape{}, fmt.Errorf("head dims differ: Q %v, K %v, V %v", q, k, v)
	}
	if k[r-2] != v[r-2] {
		return AttnShape{}, fmt.Errorf("K and V lengths differ: %v vs %v", k, v)
	}
	if q[r-1] == 0 {
		// Kernels tile over D (flashattn refuses d=0); an attention over
		// 0-wide heads stays composed.
		return AttnShape{}, fmt.Errorf("head dim D is 0: %v", q)
	}
	return AttnShape{BH: q[:r-2].Numel(), Group: hq / hkv, Sq: q[r-2], Sk: k[r-2], D: q[r-1]}, nil
}

// AttentionDims checks FlashAttention operand shapes with as many K/V heads
// as query heads ([B,H,S,D] or [BH,S,D]) and returns (batch·heads, Sq, Sk,
// D). Grouped K/V heads are refused: a caller that handles them reads
// AttentionShape.
func AttentionDims(q, k, v Shape) (bh, sq, sk, d int, err error) {
	a, err := AttentionShape(q, k, v)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	if a.Group != 1 {
		return 0, 0, 0, 0, fmt.Errorf("grouped K/V heads (K %v for Q %v) are not supported here", k, q)
	}
	return a.BH, a.Sq, a.Sk, a.D, nil
}

var attentionAttrs = []AttrSpec{
	{Name: "causal", Kind: AttrInt, Default: Int(0)},
	{Name: "scale", Kind: AttrFloat, Required: true},
}

func init() {
	register(&OpSpec{
		Name: "FlashAttention", Domain: DomainFlashgraph,
		Doc:    "Y = Softmax(scale·Q·Kᵀ + causal mask)·V and its row logsumexp L (ONNX Attention, is_causal, scale); K, V may have fewer heads than Q (grouped-query: query head h reads K/V head h/(H/H_kv)); a row with no visible key gives Y = 0, L = +inf",
		Inputs: []string{"Q", "K", "V"}, Outputs: []string{"Y", "L?"}, Attrs: attentionAttrs, Eval: evalAttention, KeepDType: []int{1},
		Infer: func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
			if err := sameFloat(in); err != nil {
				return nil, err
			}
			if in[1].DType != in[0].DType || in[2].DType != in[0].DType {
				return nil, fmt.Errorf("Q, K, V dtypes differ")
			}
			if _, err := AttentionShape(in[0].Shape, in[1].Shape, in[2].Shape); err != nil {
				return nil, err
			}
			q := in[0].Shape
			return []TensorType{*in[0], {LSEType(in[0].DType), q[:q.Rank()-1].Clone()}}, nil
		},
	})
	register(&OpSpec{
		Name: "FlashAttentionGrad", Domain: DomainFlashgraph,
		Doc:    "dQ, dK, dV of FlashAttention from Q, K, V, Y, L and dY, recomputing P from L; with grouped K/V heads, dK and dV sum over each head's group of query heads",
		Inputs: []string{"Q", "K", "V", "Y", "L", "dY"}, Outputs: []string{"dQ", "dK", "dV"}, Attrs: attentionAttrs, Eval: evalAttentionGrad,
		Infer: func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
			if _, err := AttentionShape(in[0].Shape, in[1].Shape, in[2].Shape); err != nil {
				return nil, err
			}
			if !in[3].Equal(*in[0]) || !in[5].Equal(*in[0]) {
				return nil, fmt.Errorf("Y and dY must have Q's type %v, got %v and %v", in[0], in[3], in[5])
			}
			q := in[0].Shape
			if want := (TensorType{LSEType(in[0].DType), q[:q.Rank()-1]}); !in[4].Equal(want) {
				return nil, fmt.Errorf("L must be %v, got %v", want, in[4])
			}
			return []TensorType{*in[0], *in[1], *in[2]}, nil
		},
	})
	register(&OpSpec{
		Name: "SoftmaxGrad", Domain: DomainFlashgraph,
		Doc:    "dX = Y·(dY − sum(dY·Y, axis)) for Y = Softmax(X, axis)",
		Inputs: []string{"Y", "dY"}, Outputs: []string{"dX"}, Eval: evalSoftmaxGrad,
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: Int(-1)}},
		Infer: func(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
			if !in[0].Equal(*in[1]) {
				return nil, fmt.Errorf("Y %v and dY %v differ", in[0], in[1])
			}
			return inferAxisSoftmax(in[:1], a, c)
		},
	})
	register(&OpSpec{
		Name: "SoftmaxCrossEntropyLossGrad", Domain: DomainFlashgraph,
		Doc:    "dScores = dLoss·(softmax(scores) − onehot(labels)) / N (mean) of SoftmaxCrossEntropyLoss",
		Inputs: []string{"dLoss", "scores", "labels"}, Outputs: []string{"dScores"}, Eval: evalSCEGrad,
		Attrs: []AttrSpec{{Name: "reduction", Kind: AttrString, Default: Str("mean")}},
		Infer: func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
			if in[0].Shape.Rank() != 0 {
				return nil, fmt.Errorf("dLoss must be a scalar, got %v", in[0].Shape)
			}
			if in[1].Shape.Rank() != 2 || in[2].Shape.Rank() != 1 || in[2].DType != Int64 {
				return nil, fmt.Errorf("want scores [N, C] and int64 labels [N], got %v and %v", in[1], in[2])
			}
			return []TensorType{*in[1]}, nil
		},
	})
	register(&OpSpec{
		Name: "GatherGrad", Domain: DomainFlashgraph,
		Doc:    "dData of Gather: zeros of data's shape with dY's slices added at indices (scatter-add)",
		Inputs: []string{"dY", "indices"}, Outputs: []string{"dData"}, Eval: evalGatherGrad,
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: Int(0)}, {Name: "shape", Kind: AttrInts, Required: true}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			shape := Shape{}
			for _, d := range a.IntList("shape") {
				shape = append(shape, int(d))
			}
			ax, err := NormAxis(int(a.Int("axis", 0)), shape.Rank())
			if err != nil {
				return nil, err
			}
			want := append(append(shape[:ax].Clone(), in[1].Shape...), shape[ax+1:]...)
			if !in[0].Shape.Equal(want) {
				return nil, fmt.Errorf("dY is %v, Gather of %v at indices %v gives %v", in[0].Shape, shape, in[1].Shape, want)
			}
			return []TensorType{{in[0].DType, shape}}, nil
		},
	})
	register(&OpSpec{
		Name: "AdamW", Domain: DomainFlashgraph,
		Doc:    "one AdamW step (decoupled weight decay, bias correction at step t): param', m', v'",
		Inputs: []string{"param", "grad", "m", "v", "lr", "step"}, Outputs: []string{"param_out", "m_out", "v_out"}, Eval: evalAdamW,
		InPlace: []int{0, 2, 3}, KeepDType: []int{0, 1, 2},
		Attrs: []AttrSpec{
			{Name: "beta1", Kind: AttrFloat, Default: Float(0.9)}, {Name: "beta2", Kind: AttrFloat, Default: Float(0.95)},
			{Name: "eps", Kind: AttrFloat, Default: Float(1e-8)}, {Name: "weight_decay", Kind: AttrFloat, Default: Float(0)},
		},
		Infer: func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
			p := in[0]
			if !in[1].Shape.Equal(p.Shape) || !in[2].Shape.Equal(p.Shape) || !in[3].Shape.Equal(p.Shape) {
				return nil, fmt.Errorf("param, grad, m, v shapes differ: %v %v %v %v", p, in[1], in[2], in[3])
			}
			if in[4].Shape.Rank() != 0 || in[5].Shape.Rank() != 0 {
				return nil, fmt.Errorf("lr and step must be scalars, got %v and %v", in[4], in[5])
			}
			return []TensorType{*p, *in[2], *in[3]}, nil
		},
	})
}

func init() {
	register(&OpSpec{
		Name: "AllReduce", Domain: DomainFlashgraph,
		Doc:    "data parallel: each y_i is the sum (reduce=sum) or mean (reduce=mean) of x_i over the job's world ranks, the inputs of one bucket reduced together in one collective call; identity on one rank",
		Inputs: []string{"x..."}, Outputs: []string{"y..."}, Eval: evalAllReduce,
		KeepDType: []int{0},
		Attrs: []AttrSpec{
			{Name: "reduce", Kind: AttrString, Default: Str("mean"), Enum: []string{"sum", "mean"}},
			{Name: "world", Kind: AttrInt, Default: Int(1)},
			{Name: "bucket", Kind: AttrInt, Default: Int(0)},
		},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			if w := a.Int("world", 1); w < 1 {
				return nil, fmt.Errorf("world must be at least 1, got %d", w)
			}
			if b := a.Int("bucket", 0); b < 0 {
				return nil, fmt.Errorf("bucket must be at least 0, got %d", b)
			}
			out := make([]TensorType, len(in))
			for i, t := range in {
				if t == nil {
					return nil, fmt.Errorf("input %d is omitted", i)
				}
				out[i] = *t
			}
			return out, nil
		},
	})
}

// evalAllReduce is the op's meaning on one process: every rank holding the
// same x, the mean over the ranks is x, and the sum is world·x. A backend
// running a job of several ranks replaces it with its collective.
func evalAllReduce(in []*Tensor, a Attrs, out []*Tensor) error {
	k := 1.0
	if a.String("reduce", "mean") == "sum" {
		k = float64(a.Int("world", 1))
	}
	for j, x := range in {
		for i := range x.Len() {
			out[j].Set(i, k*x.At(i))
		}
	}
	return nil
}

// shardAttrs are the attributes of the sharded collectives (ZeRO-1): the
// job's world size, this node's rank, and offsets, world+1 increasing
// element offsets into the flat bucket (the concatenation of the bucket's
// tensors, row-major): rank r holds elements [offsets[r], offsets[r+1]).
var shardAttrs = []AttrSpec{
	{Name: "world", Kind: AttrInt, Default: Int(1)},
	{Name: "rank", Kind: AttrInt, Default: Int(0)},
	{Name: "bucket", Kind: AttrInt, Default: Int(0)},
	{Name: "offsets", Kind: AttrInts, Required: true},
}

// ShardRange checks a sharded collective's attributes against a flat bucket
// of total elements and returns the node's rank's part [lo, hi).
func ShardRange(a Attrs, total int) (lo, hi int, err error) {
	w, r := a.Int("world", 1), a.Int("rank", 0)
	if w < 1 {
		return 0, 0, fmt.Errorf("world must be at least 1, got %d", w)
	}
	if r < 0 || r >= w {
		return 0, 0, fmt.Errorf("rank %d is outside [0, %d)", r, w)
	}
	off := a.IntList("offsets")
	if int64(len(off)) != w+1 {
		return 0, 0, fmt.Errorf("offsets has %d entries, want world+1 = %d", len(off), w+1)
	}
	if off[0] != 0 || off[w] != int64(total) {
		return 0, 0, fmt.Errorf("offsets run from %d to %d, want 0 to the bucket's %d elements", off[0], off[w], total)
	}
	for i := range w {
		if off[i+1] < off[i] {
			return 0, 0, fmt.Errorf("offsets decrease at rank %d (%d after %d)", i+1, off[i+1], off[i])
		}
	}
	return int(off[r]), int(off[r+1]), nil
}

func init() {
	register(&OpSpec{
		Name: "ReduceScatter", Domain: DomainFlashgraph,
		Doc:    "data parallel (ZeRO-1): the node's rank's part [offsets[rank], offsets[rank+1]) of the flat concatenation of x_i, summed (reduce=sum) or averaged (reduce=mean) over the job's world ranks; on one rank the whole concatenation",
		Inputs: []string{"x..."}, Outputs: []string{"y"}, Eval: evalReduceScatter,
		KeepDType: []int{0},
		Attrs:     append([]AttrSpec{{Name: "reduce", Kind: AttrString, Default: Str("mean"), Enum: []string{"sum", "mean"}}}, shardAttrs...),
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			total := 0
			for i, t := range in {
				if t == nil {
					return nil, fmt.Errorf("input %d is omitted", i)
				}
				if t.DType != in[0].DType {
					return nil, fmt.Errorf("input %d is %v, input 0 %v: a bucket has one dtype", i, t.DType, in[0].DType)
				}
				total += t.Shape.Numel()
			}
			lo, hi, err := ShardRange(a, total)
			if err != nil {
				return nil, err
			}
			return []TensorType{{DType: in[0].DType, Shape: Shape{hi - lo}}}, nil
		},
	})
	register(&OpSpec{
		Name: "AllGather", Domain: DomainFlashgraph,
		Doc:    "data parallel (ZeRO-1): the flat bucket whose elements [offsets[r], offsets[r+1]) are rank r's x, for every rank r of the job; on one rank x itself",
		Inputs: []string{"x"}, Outputs: []string{"y"}, Eval: evalAllGather,
		KeepDType: []int{0},
		Attrs:     shardAttrs,
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			off := a.IntList("offsets")
			if len(off) == 0 {
				return nil, fmt.Errorf("offsets is empty")
			}
			total := int(off[len(off)-1])
			lo, hi, err := ShardRange(a, total)
			if err != nil {
				return nil, err
			}
			if in[0].Shape.Rank() != 1 || in[0].Shape[0] != hi-lo {
				return nil, fmt.Errorf("x is %v, want the rank's %d elements [%d]", in[0].Shape, hi-lo, hi-lo)
			}
			return []TensorType{{DType: in[0].DType, Shape: Shape{total}}}, nil
		},
	})
}

// evalReduceScatter is the op's meaning on one process: every rank holding
// the same inputs, the mean over the ranks is the inputs and the sum world
// times them; the node keeps its rank's part of the flat bucket.
func evalReduceScatter(in []*Tensor, a Attrs, out []*Tensor) error {
	k := 1.0
	if a.String("reduce", "mean") == "sum" {
		k = float64(a.Int("world", 1))
	}
	total := 0
	for _, x := range in {
		total += x.Len()
	}
	lo, hi, err := ShardRange(a, total)
	if err != nil {
		return err
	}
	flat := 0
	for _, x := range in {
		for i := range x.Len() {
			if flat >= lo && flat < hi {
				out[0].Set(flat-lo, k*x.At(i))
			}
			flat++
		}
	}
	return nil
}

// evalAllGather is the op's meaning on one rank, x itself. Over several
// ranks the other ranks' parts exist only in their processes: only an
// executor connected to the job's collective computes it.
func evalAllGather(in []*Tensor, a Attrs, out []*Tensor) error {
	if w := a.Int("world", 1); w > 1 {
		return fmt.Errorf("AllGather over %d ranks needs the job's collective: the other ranks' parts are theirs", w)
	}
	for i := range in[0].Len() {
		out[0].Set(i, in[0].At(i))
	}
	return nil
}
