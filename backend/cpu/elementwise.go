package cpu

import (
	"context"
	"fmt"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// binaryFloat is the typed loop of an arithmetic primitive over two
// operands of the output's storage type (exprProg.direct): for + − × ÷ the
// float32 result is the float64 one rounded once, so it is the same value
// as the general path gives, without its conversions.
func binaryFloat[T float](op graph.Prim, c, a, b []T, p *bplan) {
	sa, sb := p.inner(0), p.inner(1)
	parallelFor(p.n, grain, func(lo, hi int) {
		p.walk(lo, hi, func(o, cnt int, offs []int) {
			dst := c[o : o+cnt]
			ia, ib := offs[0], offs[1]
			switch {
			case sa == 1 && sb == 1:
				binaryRun(op, dst, a[ia:ia+cnt], b[ib:ib+cnt])
			case sa == 1 && sb == 0:
				binaryRunScalarB(op, dst, a[ia:ia+cnt], b[ib])
			default:
				binaryStrided(op, dst, a, b, ia, ib, sa, sb)
			}
		})
	})
}

// binaryRun is dst = a op b over runs of equal length: the loops the
// compiler keeps free of bounds checks. One loop per op keeps the switch
// out of the element loop.
func binaryRun[T float](op graph.Prim, dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	switch op {
	case graph.PrimAdd:
		for i := range dst {
			dst[i] = a[i] + b[i]
		}
	case graph.PrimSub:
		for i := range dst {
			dst[i] = a[i] - b[i]
		}
	case graph.PrimMul:
		for i := range dst {
			dst[i] = a[i] * b[i]
		}
	case graph.PrimDiv:
		for i := range dst {
			dst[i] = a[i] / b[i]
		}
	}
}

// binaryRunScalarB is dst = a op y for one value y of b (b broadcast along
// the run).
func binaryRunScalarB[T float](op graph.Prim, dst, a []T, y T) {
	a = a[:len(dst)]
	switch op {
	case graph.PrimAdd:
		for i := range dst {
			dst[i] = a[i] + y
		}
	case graph.PrimSub:
		for i := range dst {
			dst[i] = a[i] - y
		}
	case graph.PrimMul:
		for i := range dst {
			dst[i] = a[i] * y
		}
	case graph.PrimDiv:
		for i := range dst {
			dst[i] = a[i] / y
		}
	}
}

// binaryStrided is dst = a op b with a and b read at strides sa and sb
// (0: broadcast) from ia and ib.
func binaryStrided[T float](op graph.Prim, dst, a, b []T, ia, ib, sa, sb int) {
	switch op {
	case graph.PrimAdd:
		for i := range dst {
			dst[i] = a[ia] + b[ib]
			ia, ib = ia+sa, ib+sb
		}
	case graph.PrimSub:
		for i := range dst {
			dst[i] = a[ia] - b[ib]
			ia, ib = ia+sa, ib+sb
		}
	case graph.PrimMul:
		for i := range dst {
			dst[i] = a[ia] * b[ib]
			ia, ib = ia+sa, ib+sb
		}
	case graph.PrimDiv:
		for i := range dst {
			dst[i] = a[ia] / b[ib]
			ia, ib = ia+sa, ib+sb
		}
	}
}

// allReduceKernel is AllReduce on one rank, the identity on each input.
// Compile gives a node of a job of several ranks collectiveKernel instead;
// this refusal is for a kernel called on such a node directly.
func allReduceKernel(n *graph.Node, in, out []*graph.Tensor) error {
	if w := n.Attrs.Int("world", 1); w > 1 {
		return fmt.Errorf("AllReduce over %d ranks: the CPU executor is not connected to a collective yet", w)
	}
	for i := range in {
		if err := identityKernel(n, in[i:i+1], out[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// collectiveKernel is AllReduce over a job of several ranks: the node's
// bucket of gradients, packed into one buffer, summed through c in one call
// (float64 in rank order inside the collective), then for reduce=mean divided
// by the world size, so that every rank holds the same bits.
func collectiveKernel(n *graph.Node, c backend.Collective) (kernel, error) {
	w := n.Attrs.Int("world", 1)
	if c == nil {
		return nil, fmt.Errorf("AllReduce over %d ranks needs a collective (backend.Options.Collective)", w)
	}
	if int64(c.WorldSize()) != w {
		return nil, fmt.Errorf("AllReduce over %d ranks, but the collective has %d", w, c.WorldSize())
	}
	total := 0
	for _, x := range n.Inputs {
		if dt := x.Type.DType; dt != graph.Float32 {
			return nil, fmt.Errorf("AllReduce of %v (%s): the collective reduces float32 only", dt, x.Name)
		}
		total += x.Type.Shape.Numel()
	}
	mean := n.Attrs.String("reduce", "mean") == "mean"
	bucket := make([]float32, total)
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		off := 0
		for _, x := range in {
			off += copy(bucket[off:], x.F32)
		}
		if err := c.AllReduceSum(context.Background(), bucket); err != nil {
			return fmt.Errorf("AllReduce: %w", err)
		}
		off = 0
		for _, y := range out {
			for i := range y.F32 {
				v := bucket[off+i]
				if mean {
					v = float32(float64(v) / float64(w))
				}
				y.F32[i] = v
			}
			off += len(y.F32)
		}
		return nil
	}, nil
}

// identityKernel copies the data: Identity, and Reshape, Squeeze and
// Unsqueeze, whose row-major data is unchanged (the output type, already
// inferred, carries the new shape). The executor makes these ops views of
// their input instead where it can (viewStep) and runs this kernel only
// where it cannot; fused bodies and one-rank collectives copy through it.
func identityKernel(n *graph.Node, in, out []*graph.Tensor) error {
	x, y := in[0], out[0]
	if x.Len() != y.Len() {
		return fmt.Errorf("input has %d elements, output %v has %d", x.Len(), y.Shape, y.Len())
	}
	copy(y.F32, x.F32)
	copy(y.F64, x.F64)
	copy(y.I64, x.I64)
	copy(y.B, x.B)
	return nil
}

// castStrings is Cast to or from strings: the op table's Eval.
var castStrings = evalKernel("Cast")

// castKernel converts between any two dtypes. Float to int64 truncates
// toward zero (NaN and out-of-range values are an error rather than Go's
// implementation-defined result); to bool is x != 0; narrow floats round to
// nearest even (the executor rounds float32-held outputs).
func castKernel(n *graph.Node, in, out []*graph.Tensor) error {
	x, y := in[0], out[0]
	if x.DType == graph.String || y.DType == graph.String {
		// To or from text: the op table's definition is the kernel.
		return castStrings(n, in, out)
	}
	switch storageOf(y.DType) {
	case stF32:
		switch storageOf(x.DType) {
		case stF32:
			copy(y.F32, x.F32)
		case stF64:
			for i, v := range x.F64 {
				y.F32[i] = float32(v)
			}
		case stI64:
			for i, v := range x.I64 {
				y.F32[i] = float32(v)
			}
		case stBool:
			for i, v := range x.B {
				y.F32[i] = float32(b2f(v))
			}
		}
	case stF64:
		switch storageOf(x.DType) {
		case stF32:
			for i, v := range x.F32 {
				y.F64[i] = float64(v)
			}
		case stF64:
			copy(y.F64, x.F64)
		case stI64:
			for i, v := range x.I64 {
				y.F64[i] = float64(v)
			}
		case stBool:
			for i, v := range x.B {
				y.F64[i] = b2f(v)
			}
		}
	case stI64:
		switch storageOf(x.DType) {
		case stI64:
			copy(y.I64, x.I64)
		case stBool:
			for i, v := range x.B {
				y.I64[i] = int64(b2f(v))
			}
		default:
			for i := range y.I64 {
				v := x.At(i)
				// ±2^63 are exact in float64; [-2^63, 2^63) is int64's
				// range, and NaN fails both comparisons.
				if !(v >= -0x1p63 && v < 0x1p63) {
					return fmt.Errorf("element %d (%v) does not fit in int64", i, v)
				}
				y.I64[i] = int64(v)
			}
		}
	case stBool:
		for i := range y.B {
			switch storageOf(x.DType) {
			case stBool:
				y.B[i] = x.B[i]
			case stI64:
				y.B[i] = x.I64[i] != 0
			default:
				y.B[i] = x.At(i) != 0
			}
		}
	default:
		return errDType(y.DType)
	}
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
