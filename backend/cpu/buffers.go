package cpu

import (
	"slices"

	"github.com/flashgraph/flashgraph/graph"
)

// A run's buffers: a step's output takes, when its kernel writes every
// element anyway, a buffer an earlier step's value released (its last
// reader has run) instead of a new one that Go zeroes and the collector
// later reclaims. Kernels that rely on zeros (or are not known not to) keep
// getting new zeroed buffers.

// bufClass is what makes a released buffer fit a new value: the storage
// slice and its length. bfloat16, float16 and float32 share float32 storage.
type bufClass struct {
	st storage
	n  int
}

// classOf is t's buffer class; strings have none (never reused).
func classOf(t graph.TensorType) (bufClass, bool) {
	st := storageOf(t.DType)
	return bufClass{st, t.Shape.Numel()}, st != stNone
}

// hostBytes is what a value of type t holds on the host: bfloat16 and
// float16 as float32, a string as its header.
func hostBytes(t graph.TensorType) int64 {
	per := int64(16)
	switch storageOf(t.DType) {
	case stF32:
		per = 4
	case stF64, stI64:
		per = 8
	case stBool:
		per = 1
	}
	return int64(t.Shape.Numel()) * per
}

// overwriting lists the ops whose CPU kernel writes every element of every
// output whatever the output held before (checked kernel by kernel: those
// that accumulate, GatherGrad's scatter-add and the attention backward's
// dK/dV/dQ sums, clear their ranges first; the products zero C). The ops
// that run their op table Eval (kernels_conform.go) and the collectives are
// left out: they get zeroed buffers, as before. PoisonOutputs runs, which
// fill every output with NaN before the kernel, check the claim.
var overwriting = map[string]bool{
	"FusedElementwise": true, "Identity": true, "Cast": true,
	"MatMul": true, "Gemm": true,
	"ReduceMean": true, "ReduceSum": true, "ReduceMax": true,
	"Softmax": true, "LogSoftmax": true, "SoftmaxGrad": true,
	"SoftmaxCrossEntropyLoss": true, "SoftmaxCrossEntropyLossGrad": true,
	"Transpose": true, "Reshape": true, "Squeeze": true, "Unsqueeze": true,
	"Concat": true, "Slice": true, "Expand": true, "Gather": true, "GatherGrad": true,
	"Trilu":          true,
	"FlashAttention": true, "FlashAttentionGrad": true, "AdamW": true,
}

// overwrites reports whether op's kernel writes every element of its
// outputs: one of overwriting, or an op defined by an expression (exprKernel
// computes each output element from the operands).
func overwrites(op string) bool {
	if overwriting[op] {
		return true
	}
	s, ok := graph.LookupOp(op)
	return ok && s.Expr != nil && !slices.Contains(evalKernelOps, op)
}

// bufferPool hands out a run's output buffers and takes back released
// ones. The host bytes it holds, live and pooled, stay at most limit (the
// plan's peak of live buffers): to make room for a new buffer it drops the
// oldest pooled ones, so reuse never raises the memory peak above what the
// run would reach without it.
type bufferPool struct {
	free  []*graph.Tensor // released buffers, oldest first
	held  int64           // host bytes handed out and not released, and pooled
	limit int64
	peak  int64 // the most held
}

// get returns a tensor of type t: a pooled buffer of t's class when
// overwritten (the kernel writes every element, so the old data does not
// matter), the most recently released first; else a new zeroed one.
func (p *bufferPool) get(t graph.TensorType, overwritten bool) (*graph.Tensor, error) {
	if c, ok := classOf(t); ok && overwritten {
		for i := len(p.free) - 1; i >= 0; i-- {
			if bc, _ := classOf(p.free[i].Type()); bc == c {
				b := p.free[i]
				p.free = slices.Delete(p.free, i, i+1)
				return &graph.Tensor{DType: t.DType, Shape: t.Shape.Clone(), F32: b.F32, F64: b.F64, I64: b.I64, B: b.B}, nil
			}
		}
	}
	size := hostBytes(t)
	for len(p.free) > 0 && p.held+size > p.limit {
		p.held -= hostBytes(p.free[0].Type())
		p.free = slices.Delete(p.free, 0, 1)
	}
	x, err := allocate(t)
	if err != nil {
		return nil, err
	}
	p.held += size
	p.peak = max(p.peak, p.held)
	return x, nil
}

// put takes back a buffer whose last reader has run: kept for a later
// get when keep (a later step can take its class), else dropped.
func (p *bufferPool) put(b *graph.Tensor, keep bool) {
	if keep {
		p.free = append(p.free, b)
		return
	}
	p.held -= hostBytes(b.Type())
}
