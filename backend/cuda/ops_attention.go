package cuda

import (
	"github.com/flashgraph/flashgraph/graph"
)

// FlashAttention and FlashAttentionGrad.
//
// The composed lowering (used whenever the fused kernels do not take a node)
// materialises the [BH, Sq, Sk] scores in a scratch buffer:
//
//	forward:  S = scale·Q·Kᵀ (cuBLAS) → attn_softmax: P in place, L → Y = P·V (cuBLAS)
//	backward: S = scale·Q·Kᵀ → attn_probs: P = exp(S − L) → dV = Pᵀ·dY → dP = dY·Vᵀ
//	          → attn_dscores: dS = P∘(dP − rowsum(dY∘Y)) → dQ = scale·dS·K, dK = scale·dSᵀ·Q
//
// which is the op's unfused meaning, with the memory cost the fusion exists to
// avoid; the plan shows that scratch.

// fusedAttention reports whether node n runs on the fused flash kernels
// (kernels/flash_attention.cu); false means the composed lowering.
func fusedAttention(n *graph.Node, storage func(*graph.Value) graph.DType) bool {
	return false
}

// fusedAttentionScratch is the scratch of the fused lowering of n.
func fusedAttentionScratch(n *graph.Node, storage func(*graph.Value) graph.DType) []scratchReq {
	return nil
}

// attnDims reads a FlashAttention(Grad) node's dims and attributes.
func attnDims(n *graph.Node) (bh, sq, sk, d int, scale float64, causal int32, err error) {
	bh, sq, sk, d, err = graph.AttentionDims(n.Inputs[0].Type.Shape, n.Inputs[1].Type.Shape, n.Inputs[2].Type.Shape)
	scale = n.Attrs.Float("scale", 0)
	if n.Attrs.Int("causal", 0) != 0 {
		causal = 1
	}
	return
}

// gemmResult returns where a GEMM writes output buf: buf itself when it has
// GEMM type gt, else a scratch buffer plus the conversion into buf.
func (c *lowerCtx) gemmResult(buf buffer, gt graph.DType) (buffer, func() error, error) {
	if buf.dt == gt {
		return buf, nil, nil
	}
	s, err := c.takeScratch()
	if err != nil {
		return buffer{}, nil, err
	}
	conv, err := c.convert(buf, s)
	return s, conv, err
}

func lowerFlashAttention(c *lowerCtx) (func() error, error) {
	bh, sq, sk, d, scale, causal, err := attnDims(c.n)
	if err != nil {
		return nil, err
	}
	if bh*sq == 0 {
		return nop, nil
	}
	y, l := c.out(0), c.out(1)
	gt := gemmType(y.dt)
	var convs []func() error
	var qkv [3]buffer
	for i := range 3 {
		b, conv, err := c.gemmOperand(c.in(i), gt)
		if err != nil {
			return nil, err
		}
		qkv[i] = b
		convs = append(convs, conv)
	}
	Q, K, V := qkv[0], qkv[1], qkv[2]
	S, err := c.takeScratch()
	if err != nil {
		return nil, err
	}
	Y, convY, err := c.gemmResult(y, gt)
	if err != nil {
		return nil, err
	}
	rows := int64(bh * sq)
	scores, err := c.gemm(gt, false, true, sq, sk, d, scale, Q.ptr, int64(sq*d), K.ptr, int64(sk*d), 0, S.ptr, int64(sq*sk), bh)
	if err != nil {
		return nil, err
	}
	softmax, err := c.kernel("attn_softmax"+mathSuffix(gt), rowGrid(rows), rowBlock(int64(sk)),
		rows, int64(sq), int64(sk), causal, S.ptr, dtCode(S.dt), l.ptr, dtCode(l.dt))
	if err != nil {
		return nil, err
	}
	pv, err := c.gemm(gt, false, false, sq, d, sk, 1, S.ptr, int64(sq*sk), V.ptr, int64(sk*d), 0, Y.ptr, int64(sq*d), bh)
	if err != nil {
		return nil, err
	}
	return seq(append(convs, scores, softmax, pv, convY)...), nil
}

func lowerFlashAttentionGrad(c *lowerCtx) (func() error, error) {
	bh, sq, sk, d, scale, causal, err := attnDims(c.n)
	if err != nil {
		return nil, err
	}
	gt := gemmType(c.out(0).dt)
	var convs []func() error
	var qkv [3]buffer
	for i := range 3 {
		b, conv, err := c.gemmOperand(c.in(i), gt)
		if err != nil {
			return nil, err
		}
		qkv[i] = b
		convs = append(convs, conv)
	}
	Q, K, V := qkv[0], qkv[1], qkv[2]
	y, l, dyIn := c.in(3), c.in(4), c.in(5)
	S, err := c.takeScratch()
	if err != nil {
		return nil, err
	}
	dY, convDY, err := c.gemmOperand(dyIn, gt)
	if err != nil {
		return nil, err
	}
	convs = append(convs, convDY)
	dP, err := c.takeScratch()
	if err != nil {
		return nil, err
	}
	var outs [3]buffer
	var after []func() error
	for i := range 3 {
		b, conv, err := c.gemmResult(c.out(i), gt)
		if err != nil {
			return nil, err
		}
		outs[i] = b
		after = append(after, conv)
	}
	dQ, dK, dV := outs[0], outs[1], outs[2]
	rows := int64(bh * sq)
	ms := mathSuffix(gt)
	var fns []func() error
	add := func(f func() error, err error) error {
		fns = append(fns, f)
		return err
	}
	if rows > 0 {
		if err := add(c.gemm(gt, false, true, sq, sk, d, scale, Q.ptr, int64(sq*d), K.ptr, int64(sk*d), 0, S.ptr, int64(sq*sk), bh)); err != nil {
			return nil, err
		}
		if err := add(c.kernel("attn_probs"+ms, rowGrid(rows), rowBlock(int64(sk)),
			rows, int64(sq), int64(sk), causal, S.ptr, dtCode(S.dt), l.ptr, dtCode(l.dt))); err != nil {
			return nil, err
		}
	}
	// dV = Pᵀ·dY (zeros when there are no queries: k = 0).
	if err := add(c.gemm(gt, true, false, sk, d, sq, 1, S.ptr, int64(sq*sk), dY.ptr, int64(sq*d), 0, dV.ptr, int64(sk*d), bh)); err != nil {
		return nil, err
	}
	if rows > 0 {
		if err := add(c.gemm(gt, false, true, sq, sk, d, 1, dY.ptr, int64(sq*d), V.ptr, int64(sk*d), 0, dP.ptr, int64(sq*sk), bh)); err != nil {
			return nil, err
		}
		if err := add(c.kernel("attn_dscores"+ms, rowGrid(rows), rowBlock(int64(max(sk, d))),
			rows, int64(sk), int64(d), S.ptr, dtCode(S.dt), dP.ptr, dtCode(dP.dt), y.ptr, dtCode(y.dt), dyIn.ptr, dtCode(dyIn.dt))); err != nil {
			return nil, err
		}
	}
	if err := add(c.gemm(gt, false, false, sq, d, sk, scale, dP.ptr, int64(sq*sk), K.ptr, int64(sk*d), 0, dQ.ptr, int64(sq*d), bh)); err != nil {
		return nil, err
	}
	if err := add(c.gemm(gt, true, false, sk, d, sq, scale, dP.ptr, int64(sq*sk), Q.ptr, int64(sq*d), 0, dK.ptr, int64(sk*d), bh)); err != nil {
		return nil, err
	}
	return seq(append(append(convs, fns...), after...)...), nil
}
