package graph

import "errors"

// ComposedAttention holds the values of the unfused attention subgraph, so
// that callers can name them.
type ComposedAttention struct {
	Scores *Value // MatMul(Q, Kᵀ)·scale + mask: Softmax's input
	Probs  *Value // Softmax(Scores, -1)
	Out    *Value // Probs·V
}

// Attention builds attention the way exporters write it and the fusion pass
// matches it: S = MatMul(Q, Transpose(K, last two axes swapped)), S·scale
// (a scalar of Q's dtype), + mask (omitted when nil), Softmax over the last
// axis, MatMul(·, V). Q is [..., Sq, D], K and V [..., Sk, D]. It is the
// unfused meaning of FlashAttention and the one builder of this subgraph:
// the model, the conformance suite, the fusion tests and the benchmark use
// it.
func (b *Builder) Attention(q, k, v *Value, scale float64, mask *Value) ComposedAttention {
	if q == nil || k == nil || v == nil {
		b.fail(errors.New("attention: Q, K and V must all be given"))
		return ComposedAttention{}
	}
	r := k.Type.Shape.Rank()
	perm := make([]int64, r)
	for i := range perm {
		perm[i] = int64(i)
	}
	if r >= 2 {
		perm[r-2], perm[r-1] = perm[r-1], perm[r-2]
	}
	s := b.MatMul(q, b.Transpose(k, perm...))
	s = b.Mul(s, b.Scalar(q.Type.DType, scale))
	if mask != nil {
		s = b.Add(s, mask)
	}
	p := b.Softmax(s, -1)
	return ComposedAttention{Scores: s, Probs: p, Out: b.MatMul(p, v)}
}
