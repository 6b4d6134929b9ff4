package cuda

import (
	"fmt"

	"github.com/flashgraph/flashgraph/backend/cuda/attention"
	"github.com/flashgraph/flashgraph/graph"
)

// FlashAttention and FlashAttentionGrad.
//
// Where the fused kernels of kernels/flash_attention.cu apply (float32,
// bfloat16 or float16 data, a float32 logsumexp, head dim <= 256: see
// package attention's FlashForward/FlashBackward), a node is one fused forward (online
// softmax, never an S×S tensor) or backward (scores recomputed from L). The
// rest (float64, and PlanOptions.ComposedAttention) takes the composed
// lowering, which materialises the [BH, Sq, Sk] scores in a scratch buffer:
//
//	forward:  S = scale·Q·Kᵀ (cuBLAS) → attn_softmax: P in place, L → Y = P·V (cuBLAS)
//	backward: S = scale·Q·Kᵀ → attn_probs: P = exp(S − L) → dV = Pᵀ·dY → dP = dY·Vᵀ
//	          → attn_dscores: dS = P∘(dP − rowsum(dY∘Y)) → dQ = scale·dS·K, dK = scale·dSᵀ·Q
//
// which is the op's unfused meaning, with the memory cost the fusion exists to
// avoid; the memory plan shows that scratch. 16-bit data is rounded once, at
// the outputs, as the fused kernels and the reference do (scores and
// probabilities held in bfloat16 would each lose 2⁻⁹): the forward computes
// in float32 (float64 for float64 data). The backward computes in float64
// for every type: it is the fallback, and only float64 sums make
// dP − rowsum(dY∘Y) cancel where it should (a causal row that sees one key
// has P = 1 and dS = 0 exactly), instead of leaving the 1e-7 difference
// between two float32 sums of different order, which float16 gradients
// near 0 cannot hide.

// composedType is the element type of the composed path's GEMMs and scratch.
func composedType(op string, dt graph.DType) graph.DType {
	if dt == graph.Float64 || op == "FlashAttentionGrad" {
		return graph.Float64
	}
	return graph.Float32
}

// fusedAttention reports whether node n can run on the fused flash kernels.
func fusedAttention(n *graph.Node, storage func(*graph.Value) graph.DType) bool {
	a, scale, _, err := attnDims(n)
	if err != nil || attention.CheckShape(a.BH, a.Sq, a.Sk, a.D) != nil {
		return false
	}
	d := a.D
	lse := n.Inputs[len(n.Inputs)-2] // FlashAttentionGrad's L
	if n.Op == "FlashAttention" {
		lse = n.Outputs[1]
	}
	if storage(lse) != graph.Float32 {
		return false
	}
	t, err := gemmTypeOf(gemmType(storage(n.Outputs[0])))
	if err != nil {
		return false
	}
	err = attention.Supported(t, d, float32(scale))
	return err == nil
}

// attentionScratch lists the scratch of FlashAttention(Grad)'s lowering: the
// fused one's (operands cast to the kernels' element type, the backward's
// workspace, then outputs stored in another type) or the composed one's
// (operands cast to composedType, the scores, and for the backward dY's cast
// and the score gradients, then outputs stored in another type).
func attentionScratch(n *graph.Node, storage func(*graph.Value) graph.DType, opts PlanOptions) []scratchReq {
	l := scratchList{storage: storage}
	grad := n.Op == "FlashAttentionGrad"
	if !opts.ComposedAttention && fusedAttention(n, storage) {
		gt := gemmType(storage(n.Outputs[0]))
		names, outs := []string{"Q", "K", "V"}, []string{"Y"}
		if grad {
			names, outs = []string{"Q", "K", "V", "Y", "", "dY"}, []string{"dQ", "dK", "dV"}
		}
		for i, name := range names {
			if name != "" {
				l.cast(name, n.Inputs[i], gt)
			}
		}
		if ws := fusedWorkspaceBytes(n, gt); ws > 0 {
			l.add("workspace", graph.Bool, graph.Shape{ws})
		}
		for i, name := range outs {
			l.cast(name, n.Outputs[i], gt)
		}
		return l.reqs
	}
	a, err := graph.AttentionShape(n.Inputs[0].Type.Shape, n.Inputs[1].Type.Shape, n.Inputs[2].Type.Shape)
	if err != nil {
		return nil
	}
	bh, sq, sk := a.BH, a.Sq, a.Sk
	gt := composedType(n.Op, storage(n.Outputs[0]))
	for i, name := range []string{"Q", "K", "V"} {
		l.cast(name, n.Inputs[i], gt)
	}
	l.add("scores", gt, graph.Shape{bh, sq, sk})
	if grad {
		l.cast("dY", n.Inputs[5], gt)
		l.add("dscores", gt, graph.Shape{bh, sq, sk})
		for i, name := range []string{"dQ", "dK", "dV"} {
			l.cast(name, n.Outputs[i], gt)
		}
	} else {
		l.cast("Y", n.Outputs[0], gt)
	}
	return l.reqs
}

// fusedWorkspaceBytes is the workspace a fused node's kernels need: the
// backward's, or the forward's (the decode forward's partial results; 0 for
// other shapes).
func fusedWorkspaceBytes(n *graph.Node, gt graph.DType) int {
	a, scale, causal, err := attnDims(n)
	if err != nil {
		return 0
	}
	bh, sq, sk, d := a.BH, a.Sq, a.Sk, a.D
	t, err := gemmTypeOf(gt)
	if err != nil {
		return 0
	}
	if n.Op == "FlashAttentionGrad" {
		return FlashBackwardWorkspaceBytes(t, bh, a.Group, sq, sk, d, float32(scale))
	}
	return FlashForwardWorkspaceBytes(t, bh, sq, sk, d, float32(scale), causal != 0)
}

// lowerFused runs a node on FlashForward/FlashBackward.
func lowerFused(c *lowerCtx) (func() error, error) {
	a, scale, causal, err := attnDims(c.n)
	if err != nil {
		return nil, err
	}
	bh, group, sq, sk, d := a.BH, a.Group, a.Sq, a.Sk, a.D
	gt := gemmType(c.out(0).dt)
	t, err := gemmTypeOf(gt)
	if err != nil {
		return nil, err
	}
	grad := c.n.Op == "FlashAttentionGrad"
	var before, after []func() error
	var ins []buffer
	for i := range c.n.Inputs {
		if grad && i == 4 { // L: float32 already
			ins = append(ins, c.in(i))
			continue
		}
		b, conv, err := c.gemmOperand(c.in(i), gt)
		if err != nil {
			return nil, err
		}
		ins = append(ins, b)
		before = append(before, conv)
	}
	var ws buffer
	if fusedWorkspaceBytes(c.n, gt) > 0 {
		if ws, err = c.takeScratch(); err != nil {
			return nil, err
		}
	}
	var outs []buffer
	for i := range c.n.Outputs {
		if !grad && i == 1 { // L
			outs = append(outs, c.out(i))
			continue
		}
		b, conv, err := c.gemmResult(c.out(i), gt)
		if err != nil {
			return nil, err
		}
		outs = append(outs, b)
		after = append(after, conv)
	}
	// FlashForward and FlashBackward are public Device API: this step runs on
	// the caller's goroutine, its conversions in requests of their own.
	c.host = true
	dev := c.dev()
	onDevice := func(fns []func() error) func() error {
		for _, f := range fns {
			if f != nil {
				all := seq(fns...)
				return func() error { return dev.Do(all) }
			}
		}
		return nil
	}
	isCausal := causal != 0
	node := c.n.Name
	var run func() error
	if grad {
		run = func() error {
			// The plan sized the workspace at Compile, reading
			// FLASHGRAPH_FLASH_GQA_BWD then; the launch reads it again. A
			// process that changed it in between would have the repeat
			// write past a workspace sized without it.
			if need := attention.FlashBackwardWorkspaceBytes(t, bh, group, sq, sk, d, float32(scale)); need > ws.bytes() {
				return fmt.Errorf("cuda: %s: the backward needs a %d-byte workspace, the plan made %d: %s changed after Compile",
					node, need, ws.bytes(), attention.FlashGQABwdEnv)
			}
			return attention.FlashBackwardGrouped(dev, t, ins[0].ptr, ins[1].ptr, ins[2].ptr, ins[3].ptr, ins[5].ptr, ins[4].ptr,
				outs[0].ptr, outs[1].ptr, outs[2].ptr, ws.ptr, bh, group, sq, sk, d, float32(scale), isCausal)
		}
	} else {
		run = func() error {
			return attention.FlashForwardGroupedWS(dev, t, ins[0].ptr, ins[1].ptr, ins[2].ptr, outs[0].ptr, outs[1].ptr, ws.ptr, bh, group, sq, sk, d, float32(scale), isCausal)
		}
	}
	return seq(onDevice(before), run, onDevice(after)), nil
}

// attnDims reads a FlashAttention(Grad) node's dims (grouped K/V heads
// included) and attributes.
func attnDims(n *graph.Node) (a graph.AttnShape, scale float64, causal int32, err error) {
	a, err = graph.AttentionShape(n.Inputs[0].Type.Shape, n.Inputs[1].Type.Shape, n.Inputs[2].Type.Shape)
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

// usesFused says whether the plan gave node c.n the fused lowering.
func (c *lowerCtx) usesFused() bool {
	return !c.x.plan.composed && fusedAttention(c.n, func(v *graph.Value) graph.DType { return c.x.plan.values[v].storage })
}

func lowerFlashAttention(c *lowerCtx) (func() error, error) {
	if c.usesFused() {
		return lowerFused(c)
	}
	a, scale, causal, err := attnDims(c.n)
	if err != nil {
		return nil, err
	}
	bh, sq, sk, d := a.BH, a.Sq, a.Sk, a.D
	if bh*sq == 0 {
		return nop, nil
	}
	// Grouped K/V heads: the group's query heads are consecutive, so their
	// rows are one [group·sq, ·] matrix against their K/V head; the batched
	// GEMMs run over the K/V heads (nb) with m = gsq rows.
	nb, gsq := a.KVHeads(), a.Group*sq
	y, l := c.out(0), c.out(1)
	gt := composedType(c.n.Op, y.dt)
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
	scores, err := c.gemm(gt, false, true, gsq, sk, d, scale, Q.ptr, int64(gsq*d), K.ptr, int64(sk*d), 0, S.ptr, int64(gsq*sk), nb)
	if err != nil {
		return nil, err
	}
	softmax, err := c.kernel("attn_softmax_f64", rowGrid(rows), rowBlock(int64(sk)),
		rows, int64(sq), int64(sk), causal, S.ptr, dtCode(S.dt), l.ptr, dtCode(l.dt))
	if err != nil {
		return nil, err
	}
	pv, err := c.gemm(gt, false, false, gsq, d, sk, 1, S.ptr, int64(gsq*sk), V.ptr, int64(sk*d), 0, Y.ptr, int64(gsq*d), nb)
	if err != nil {
		return nil, err
	}
	return seq(append(convs, scores, softmax, pv, convY)...), nil
}

func lowerFlashAttentionGrad(c *lowerCtx) (func() error, error) {
	if c.usesFused() {
		return lowerFused(c)
	}
	a, scale, causal, err := attnDims(c.n)
	if err != nil {
		return nil, err
	}
	bh, sq, sk, d := a.BH, a.Sq, a.Sk, a.D
	// As in the forward: batched over the K/V heads, each with its group's
	// gsq query rows, so that dK and dV sum over the group in the GEMMs.
	nb, gsq := a.KVHeads(), a.Group*sq
	gt := composedType(c.n.Op, c.out(0).dt)
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
	var fns []func() error
	add := func(f func() error, err error) error {
		fns = append(fns, f)
		return err
	}
	if rows > 0 {
		if err := add(c.gemm(gt, false, true, gsq, sk, d, scale, Q.ptr, int64(gsq*d), K.ptr, int64(sk*d), 0, S.ptr, int64(gsq*sk), nb)); err != nil {
			return nil, err
		}
		if err := add(c.kernel("attn_probs_f64", rowGrid(rows), rowBlock(int64(sk)),
			rows, int64(sq), int64(sk), causal, S.ptr, dtCode(S.dt), l.ptr, dtCode(l.dt))); err != nil {
			return nil, err
		}
	}
	// dV = Pᵀ·dY (zeros when there are no queries: k = 0).
	if err := add(c.gemm(gt, true, false, sk, d, gsq, 1, S.ptr, int64(gsq*sk), dY.ptr, int64(gsq*d), 0, dV.ptr, int64(sk*d), nb)); err != nil {
		return nil, err
	}
	if rows > 0 {
		if err := add(c.gemm(gt, false, true, gsq, sk, d, 1, dY.ptr, int64(gsq*d), V.ptr, int64(sk*d), 0, dP.ptr, int64(gsq*sk), nb)); err != nil {
			return nil, err
		}
		if err := add(c.kernel("attn_dscores_f64", rowGrid(rows), rowBlock(int64(max(sk, d))),
			rows, int64(sk), int64(d), S.ptr, dtCode(S.dt), dP.ptr, dtCode(dP.dt), y.ptr, dtCode(y.dt), dyIn.ptr, dtCode(dyIn.dt))); err != nil {
			return nil, err
		}
	}
	if err := add(c.gemm(gt, false, false, gsq, d, sk, scale, dP.ptr, int64(gsq*sk), K.ptr, int64(sk*d), 0, dQ.ptr, int64(gsq*d), nb)); err != nil {
		return nil, err
	}
	if err := add(c.gemm(gt, true, false, sk, d, gsq, scale, dP.ptr, int64(gsq*sk), Q.ptr, int64(gsq*d), 0, dK.ptr, int64(sk*d), nb)); err != nil {
		return nil, err
	}
	return seq(append(append(convs, fns...), after...)...), nil
}
