package cpu

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/internal/parallel"
)

// kernel computes a node's outputs from its inputs, never writing into an
// input (a view may share its buffer). Output tensors are allocated (and
// poisoned, in tests) by the executor with the node's declared types; a
// kernel must write every element. Outputs hold zeros, except for the ops
// listed in overwriting (buffers.go), whose outputs may hold an earlier
// value's data. in[i] is nil for an omitted optional input.
type kernel func(n *graph.Node, in, out []*graph.Tensor) error

// kernels is the one list of CPU kernels, keyed by op name. The op table
// (graph.Ops) is the list of ops; a test checks that every one is here.
var kernels map[string]kernel

func init() {
	kernels = map[string]kernel{
		// elementwise.go; the ops defined by an expression are added below
		"FusedElementwise": fusedKernel,
		"Identity":         identityKernel, "Cast": castKernel,
		"AllReduce":     allReduceKernel,
		"ReduceScatter": reduceScatterKernel,
		"AllGather":     allGatherKernel,
		// matmul.go
		"MatMul": matmulKernel, "Gemm": gemmKernel,
		// reduce.go
		"ReduceMean": reduceKernel(redMean), "ReduceSum": reduceKernel(redSum), "ReduceMax": reduceKernel(redMax),
		"Softmax": softmaxKernel(false), "LogSoftmax": softmaxKernel(true),
		"SoftmaxCrossEntropyLoss": sceLossKernel, "SoftmaxCrossEntropyLossGrad": sceLossGradKernel,
		"SoftmaxGrad": softmaxGradKernel,
		// shape.go
		"Transpose": transposeKernel, "Reshape": identityKernel, "Squeeze": identityKernel,
		"Unsqueeze": identityKernel, "Concat": concatKernel, "Slice": sliceKernel,
		"Expand": expandKernel, "Gather": gatherKernel, "GatherGrad": gatherGradKernel,
		"Trilu": triluKernel,
		// flashgraph.go
		"FlashAttention": flashAttentionKernel, "FlashAttentionGrad": flashAttentionGradKernel,
		"AdamW": adamwKernel,
	}
	// expr.go: every op the op table defines by an expression.
	for _, s := range graph.Ops() {
		if s.Expr != nil {
			kernels[s.Name] = exprKernel(s.Name)
		}
	}
}

// float is the element type of float kernels: float32 storage serves
// float32, bfloat16 and float16.
type float interface{ ~float32 | ~float64 }

// storage classes of a dtype: which Tensor slice holds it.
type storage uint8

const (
	stNone storage = iota
	stF32
	stF64
	stI64
	stBool
)

func storageOf(dt graph.DType) storage {
	switch dt {
	case graph.Float32, graph.BFloat16, graph.Float16:
		return stF32
	case graph.Float64:
		return stF64
	case graph.Int64:
		return stI64
	case graph.Bool:
		return stBool
	}
	return stNone
}

func errDType(dt graph.DType) error { return fmt.Errorf("dtype %v is not supported by this op", dt) }

// grain is the number of elements below which splitting work over
// goroutines costs more than it saves.
const grain = 1 << 14

// parallelFor is parallel.For (one index, one call: results do not
// depend on the split).
func parallelFor(n, minChunk int, fn func(lo, hi int)) { parallel.For(n, minChunk, fn) }

// bplan walks an output of some shape while reading inputs broadcast to it
// (ONNX multidirectional broadcasting). Dims are coalesced where every
// operand is contiguous across them, so same-shape and scalar operands walk
// the whole tensor as one run.
type bplan struct {
	dims    []int   // coalesced output dims, outermost first
	strides [][]int // per input, per coalesced dim; 0 where broadcast
	n       int
}

func newBPlan(out graph.Shape, ins ...graph.Shape) *bplan {
	r := out.Rank()
	p := &bplan{n: out.Numel(), strides: make([][]int, len(ins))}
	full := make([][]int, len(ins))
	for k, s := range ins {
		st := make([]int, r)
		acc := 1
		for i := s.Rank() - 1; i >= 0; i-- {
			oi := r - s.Rank() + i
			if s[i] != 1 {
				st[oi] = acc
			}
			acc *= s[i]
		}
		full[k] = st
	}
	// Drop size-1 output dims, then merge dim i into i+1 when every input
	// steps across the boundary with stride[i] == stride[i+1]·dim[i+1].
	for i := 0; i < r; i++ {
		if out[i] == 1 {
			continue
		}
		if len(p.dims) > 0 {
			last := len(p.dims) - 1
			merge := true
			for k := range ins {
				if p.strides[k][last] != full[k][i]*out[i] {
					merge = false
					break
				}
			}
			if merge {
				p.dims[last] *= out[i]
				for k := range ins {
					p.strides[k][last] = full[k][i]
				}
				continue
			}
		}
		p.dims = append(p.dims, out[i])
		for k := range ins {
			p.strides[k] = append(p.strides[k], full[k][i])
		}
	}
	if len(p.dims) == 0 {
		p.dims = []int{1}
		for k := range ins {
			p.strides[k] = []int{0}
		}
	}
	return p
}

// inner returns the innermost stride of input k.
func (p *bplan) inner(k int) int { return p.strides[k][len(p.dims)-1] }

// walk calls fn for each run of consecutive output elements [o, o+cnt) in
// [lo, hi) that lies within one innermost row; offs[k] is input k's offset
// of element o (input k then advances by inner(k) per element).
func (p *bplan) walk(lo, hi int, fn func(o, cnt int, offs []int)) {
	if lo >= hi {
		return
	}
	r := len(p.dims)
	idx := make([]int, r)
	offs := make([]int, len(p.strides))
	rem := lo
	for i := r - 1; i >= 0; i-- {
		idx[i] = rem % p.dims[i]
		rem /= p.dims[i]
	}
	for k, st := range p.strides {
		for i := range r {
			offs[k] += idx[i] * st[i]
		}
	}
	last := p.dims[r-1]
	for o := lo; o < hi; {
		cnt := min(hi-o, last-idx[r-1])
		fn(o, cnt, offs)
		o += cnt
		// Advance the odometer by cnt along the innermost dim, carrying.
		idx[r-1] += cnt
		for k, st := range p.strides {
			offs[k] += cnt * st[r-1]
		}
		for i := r - 1; i > 0 && idx[i] == p.dims[i]; i-- {
			idx[i] = 0
			idx[i-1]++
			for k, st := range p.strides {
				offs[k] += st[i-1] - p.dims[i]*st[i]
			}
		}
	}
}

// shapeInts reads a constant int64 operand (axes, starts, ...).
func shapeInts(t *graph.Tensor, what string) ([]int, error) {
	if t == nil {
		return nil, nil
	}
	if t.DType != graph.Int64 {
		return nil, fmt.Errorf("%s must be int64, got %v", what, t.DType)
	}
	out := make([]int, len(t.I64))
	for i, v := range t.I64 {
		out[i] = int(v)
	}
	return out, nil
}

// optIn returns input i or nil when it is absent.
func optIn(in []*graph.Tensor, i int) *graph.Tensor {
	if i < len(in) {
		return in[i]
	}
	return nil
}
