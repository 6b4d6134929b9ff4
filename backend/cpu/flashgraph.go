package cpu

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/backend/cpu/flashattn"
	"github.com/flashgraph/flashgraph/graph"
)

// Kernels of the flashgraph domain.

// attnParams reads FlashAttention's shape (grouped K/V heads included) and
// attributes.
func attnParams(n *graph.Node, q, k, v *graph.Tensor) (a graph.AttnShape, scale float64, causal bool, err error) {
	a, err = graph.AttentionShape(q.Shape, k.Shape, v.Shape)
	scale = n.Attrs.Float("scale", 0)
	causal = n.Attrs.Int("causal", 0) != 0
	return
}

// flashAttentionKernel runs package flashattn's tiled forward pass. Its
// logsumexp type parameter follows graph.LSEType: float64 for float64 data,
// float32 otherwise (bfloat16/float16 data is computed on its float32
// values; the executor rounds Y, and L stays float32 by the op's type).
func flashAttentionKernel(n *graph.Node, in, out []*graph.Tensor) error {
	q, k, v := in[0], in[1], in[2]
	a, scale, causal, err := attnParams(n, q, k, v)
	if err != nil {
		return err
	}
	y, l := out[0], out[1]
	if l.DType != graph.LSEType(q.DType) {
		return fmt.Errorf("L is %v, want %v", l.DType, graph.LSEType(q.DType))
	}
	switch storageOf(q.DType) {
	case stF32:
		return flashattn.ForwardGrouped(q.F32, k.F32, v.F32, y.F32, l.F32, a.BH, a.Group, a.Sq, a.Sk, a.D, scale, causal)
	case stF64:
		return flashattn.ForwardGrouped(q.F64, k.F64, v.F64, y.F64, l.F64, a.BH, a.Group, a.Sq, a.Sk, a.D, scale, causal)
	}
	return errDType(q.DType)
}

// flashAttentionGradKernel recomputes P from the saved logsumexp
// (flashattn.Backward).
func flashAttentionGradKernel(n *graph.Node, in, out []*graph.Tensor) error {
	q, k, v, y, l, dy := in[0], in[1], in[2], in[3], in[4], in[5]
	a, scale, causal, err := attnParams(n, q, k, v)
	if err != nil {
		return err
	}
	dq, dk, dv := out[0], out[1], out[2]
	switch storageOf(q.DType) {
	case stF32:
		return flashattn.BackwardGrouped(q.F32, k.F32, v.F32, y.F32, dy.F32, l.F32, dq.F32, dk.F32, dv.F32, a.BH, a.Group, a.Sq, a.Sk, a.D, scale, causal)
	case stF64:
		return flashattn.BackwardGrouped(q.F64, k.F64, v.F64, y.F64, dy.F64, l.F64, dq.F64, dk.F64, dv.F64, a.BH, a.Group, a.Sq, a.Sk, a.D, scale, causal)
	}
	return errDType(q.DType)
}

// adamwKernel: one AdamW step with bias correction at step t and decoupled
// weight decay:
//
//	m' = β1·m + (1−β1)·g          v' = β2·v + (1−β2)·g²
//	m̂ = m'/(1−β1^t)               v̂ = v'/(1−β2^t)
//	p' = p − lr·(m̂/(√v̂ + eps) + wd·p)
//
// lr and step are scalars of any numeric dtype. The per-element arithmetic
// is in the param's storage type (float32 for float32/bfloat16/float16
// params); the scalar coefficients are computed in float64 and rounded once.
func adamwKernel(n *graph.Node, in, out []*graph.Tensor) error {
	p, g, m, v := in[0], in[1], in[2], in[3]
	lr, t := in[4].At(0), in[5].At(0)
	if t < 1 {
		return fmt.Errorf("step is %v; bias correction needs step >= 1", t)
	}
	c := adamCoef{
		b1: n.Attrs.Float("beta1", 0.9), b2: n.Attrs.Float("beta2", 0.95),
		eps: n.Attrs.Float("eps", 1e-8), wd: n.Attrs.Float("weight_decay", 0), lr: lr,
	}
	c.bc1 = 1 - math.Pow(c.b1, t)
	c.bc2 = 1 - math.Pow(c.b2, t)
	st := storageOf(p.DType)
	for _, x := range []*graph.Tensor{g, m, v} {
		if storageOf(x.DType) != st {
			return fmt.Errorf("param is %v but grad/m/v include %v; mixed storage types are not supported", p.DType, x.DType)
		}
	}
	switch st {
	case stF32:
		adamw(p.F32, g.F32, m.F32, v.F32, out[0].F32, out[1].F32, out[2].F32, c)
	case stF64:
		adamw(p.F64, g.F64, m.F64, v.F64, out[0].F64, out[1].F64, out[2].F64, c)
	default:
		return errDType(p.DType)
	}
	return nil
}

type adamCoef struct{ b1, b2, eps, wd, lr, bc1, bc2 float64 }

func adamw[T float](p, g, m, v, po, mo, vo []T, c adamCoef) {
	b1, b2, eps, wd, lr := T(c.b1), T(c.b2), T(c.eps), T(c.wd), T(c.lr)
	omb1, omb2 := T(1-c.b1), T(1-c.b2)
	bc1, bc2 := T(c.bc1), T(c.bc2)
	parallelFor(len(p), grain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			gi := g[i]
			mi := b1*m[i] + omb1*gi
			vi := b2*v[i] + omb2*gi*gi
			mh := mi / bc1
			vh := vi / bc2
			po[i] = p[i] - lr*(mh/(T(math.Sqrt(float64(vh)))+eps)+wd*p[i])
			mo[i], vo[i] = mi, vi
		}
	})
}
