package backendtest

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// The reference is the op table's: graph.Eval runs each op's Eval, the op
// computed by its definition in float64 as plain index loops (graph/eval.go),
// unlike any backend's code. This file adapts it to the suite's float64
// arrays: the ref* helpers name the op and its operands, nothing more.

// arr is a float64 array (ints and bools as their values).
type arr struct {
	shape []int
	data  []float64
}

func newArr(shape ...int) *arr {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return &arr{shape: append([]int{}, shape...), data: make([]float64, n)}
}

func fromTensor(t *graph.Tensor) *arr {
	a := newArr(t.Shape...)
	for i := range a.data {
		a.data[i] = t.At(i)
	}
	return a
}

func (a *arr) rank() int { return len(a.shape) }

// unravel turns a flat row-major position into a multi-index.
func unravel(i int, shape []int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = i % shape[d]
			i /= shape[d]
		}
	}
	return idx
}

// ravel is unravel's inverse.
func ravel(idx, shape []int) int {
	p := 0
	for d := range shape {
		p = p*shape[d] + idx[d]
	}
	return p
}

func (a *arr) at(idx ...int) float64 { return a.data[ravel(idx, a.shape)] }

// f64 gives a's values as a float64 tensor: the reference computes on the
// values a graph holds, in float64. (Indices and conditions go in as int64
// and bool with tensorFrom.)
func f64(a *arr) *graph.Tensor { return tensorFrom(graph.Float64, a) }

func i64(v ...int) *graph.Tensor {
	t := graph.NewTensor(graph.Int64, graph.Shape{len(v)})
	for i, x := range v {
		t.I64[i] = int64(x)
	}
	return t
}

// refN runs op's reference on the operands. An error is a bug in the test
// (it built the operands), so it panics with the op and the reason.
func refN(op string, attrs graph.Attrs, in ...*graph.Tensor) []*arr {
	outs, err := graph.Eval(op, attrs, in...)
	if err != nil {
		panic(fmt.Sprintf("backendtest: reference %s: %v", op, err))
	}
	res := make([]*arr, len(outs))
	for i, t := range outs {
		res[i] = fromTensor(t)
	}
	return res
}

func ref(op string, attrs graph.Attrs, in ...*graph.Tensor) *arr { return refN(op, attrs, in...)[0] }

// refElem is an elementwise op on float64 operands.
func refElem(op string, in ...*arr) *arr {
	ts := make([]*graph.Tensor, len(in))
	for i, a := range in {
		ts[i] = f64(a)
	}
	return ref(op, nil, ts...)
}

// mapArr applies fn to every element: composite expressions of a test's own
// (a GELU written out), not ops.
func mapArr(a *arr, fn func(float64) float64) *arr {
	out := newArr(a.shape...)
	for i, v := range a.data {
		out.data[i] = fn(v)
	}
	return out
}

func refMatMul(a, b *arr) *arr { return ref("MatMul", nil, f64(a), f64(b)) }

func refTranspose(a *arr, perm []int) *arr {
	return ref("Transpose", graph.Attrs{"perm": graph.Ints(i64s(perm)...)}, f64(a))
}

func refGemm(a, b, c *arr, alpha, beta float64, tA, tB bool) *arr {
	var ct *graph.Tensor
	if c != nil {
		ct = f64(c)
	}
	return ref("Gemm", graph.Attrs{"alpha": graph.Float(alpha), "beta": graph.Float(beta),
		"transA": graph.Int(b2i(tA)), "transB": graph.Int(b2i(tB))}, f64(a), f64(b), ct)
}

func normAxis(ax, rank int) int {
	if ax < 0 {
		return ax + rank
	}
	return ax
}

// refReduce reduces over axes (all when empty) with keepdims; kind is the
// op's name without "Reduce" in lower case (sum, mean, max).
func refReduce(a *arr, axes []int, keepdims bool, kind string) *arr {
	op := map[string]string{"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax"}[kind]
	in := []*graph.Tensor{f64(a)}
	if len(axes) > 0 {
		in = append(in, i64(axes...))
	}
	return ref(op, graph.Attrs{"keepdims": graph.Int(b2i(keepdims))}, in...)
}

func refSoftmax(a *arr, axis int, log bool) *arr {
	op := "Softmax"
	if log {
		op = "LogSoftmax"
	}
	return ref(op, graph.Attrs{"axis": graph.Int(int64(axis))}, f64(a))
}

func refSoftmaxGrad(y, dy *arr, axis int) *arr {
	return ref("SoftmaxGrad", graph.Attrs{"axis": graph.Int(int64(axis))}, f64(y), f64(dy))
}

func refSCE(scores, labels *arr, reduction string) *arr {
	return ref("SoftmaxCrossEntropyLoss", graph.Attrs{"reduction": graph.Str(reduction)},
		f64(scores), tensorFrom(graph.Int64, labels))
}

func refSCEGrad(dLoss float64, scores, labels *arr, reduction string) *arr {
	d := graph.NewTensor(graph.Float64, graph.Shape{})
	d.F64[0] = dLoss
	return ref("SoftmaxCrossEntropyLossGrad", graph.Attrs{"reduction": graph.Str(reduction)},
		d, f64(scores), tensorFrom(graph.Int64, labels))
}

func refGather(data, idx *arr, axis int) *arr {
	return ref("Gather", graph.Attrs{"axis": graph.Int(int64(axis))}, f64(data), tensorFrom(graph.Int64, idx))
}

func refGatherGrad(dy, idx *arr, axis int, shape []int) *arr {
	return ref("GatherGrad", graph.Attrs{"axis": graph.Int(int64(axis)), "shape": graph.Ints(i64s(shape)...)},
		f64(dy), tensorFrom(graph.Int64, idx))
}

func refSlice(a *arr, starts, ends, axes, steps []int) *arr {
	in := []*graph.Tensor{f64(a), i64(starts...), i64(ends...), nil, nil}
	if axes != nil {
		in[3] = i64(axes...)
	}
	if steps != nil {
		in[4] = i64(steps...)
	}
	return ref("Slice", nil, in...)
}

func refConcat(axis int, xs ...*arr) *arr {
	in := make([]*graph.Tensor, len(xs))
	for i, x := range xs {
		in[i] = f64(x)
	}
	return ref("Concat", graph.Attrs{"axis": graph.Int(int64(axis))}, in...)
}

func refExpand(a *arr, shape []int) *arr { return ref("Expand", nil, f64(a), i64(shape...)) }

func refTrilu(a *arr, k int, upper bool) *arr {
	return ref("Trilu", graph.Attrs{"upper": graph.Int(b2i(upper))}, f64(a), i64(k))
}

func reshaped(a *arr, shape ...int) *arr {
	return &arr{shape: append([]int{}, shape...), data: append([]float64{}, a.data...)}
}

// refCast is Cast to dt: the values a tensor of dt holds.
func refCast(dt graph.DType, a *arr) *arr {
	return ref("Cast", graph.Attrs{"to": graph.Str(dt.String())}, f64(a))
}

// roundTo rounds float64 values the way a value of dtype dt holds them.
func roundTo(dt graph.DType, v float64) float64 {
	t := graph.NewTensor(dt, graph.Shape{})
	t.Set(0, v)
	return t.At(0)
}

func attentionAttrs(scale float64, causal bool) graph.Attrs {
	return graph.Attrs{"scale": graph.Float(scale), "causal": graph.Int(b2i(causal))}
}

// refAttention is FlashAttention's reference: Y and the row logsumexp L.
func refAttention(q, k, v *arr, scale float64, causal bool) (y, lse *arr) {
	outs := refN("FlashAttention", attentionAttrs(scale, causal), f64(q), f64(k), f64(v))
	return outs[0], outs[1]
}

// refAttentionGradFrom is FlashAttentionGrad's reference from the given
// forward results.
func refAttentionGradFrom(q, k, v, y, lse, dy *arr, scale float64, causal bool) (dq, dk, dv *arr) {
	outs := refN("FlashAttentionGrad", attentionAttrs(scale, causal), f64(q), f64(k), f64(v), f64(y), f64(lse), f64(dy))
	return outs[0], outs[1], outs[2]
}

// refAdamW is AdamW's reference (lr and step as float64 scalars).
func refAdamW(p, g, m, v *arr, lr, t, b1, b2, eps, wd float64) (po, mo, vo *arr) {
	scalar := func(x float64) *graph.Tensor {
		s := graph.NewTensor(graph.Float64, graph.Shape{})
		s.F64[0] = x
		return s
	}
	outs := refN("AdamW", graph.Attrs{"beta1": graph.Float(b1), "beta2": graph.Float(b2), "eps": graph.Float(eps),
		"weight_decay": graph.Float(wd)}, f64(p), f64(g), f64(m), f64(v), scalar(lr), scalar(t))
	return outs[0], outs[1], outs[2]
}

func (a *arr) String() string { return fmt.Sprintf("%v%v", a.shape, a.data) }
