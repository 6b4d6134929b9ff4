package cpu

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

type binOp uint8

const (
	opAdd binOp = iota
	opSub
	opMul
	opDiv
	opPow
)

// binaryKernel: Add, Sub, Mul, Div, Pow with broadcasting, for float storage
// and int64 (integer Div truncates toward zero, as C and ONNX Runtime do;
// division by zero is an error).
func binaryKernel(op binOp) kernel {
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		a, b, c := in[0], in[1], out[0]
		p := newBPlan(c.Shape, a.Shape, b.Shape)
		switch storageOf(c.DType) {
		case stF32:
			binaryFloat(op, c.F32, a.F32, b.F32, p)
		case stF64:
			binaryFloat(op, c.F64, a.F64, b.F64, p)
		case stI64:
			return binaryInt(n.Op, c.I64, a.I64, b.I64, p)
		default:
			return errDType(c.DType)
		}
		return nil
	}
}

func binaryFloat[T float](op binOp, c, a, b []T, p *bplan) {
	sa, sb := p.inner(0), p.inner(1)
	parallelFor(p.n, grain, func(lo, hi int) {
		p.walk(lo, hi, func(o, cnt int, offs []int) {
			ia, ib := offs[0], offs[1]
			dst := c[o : o+cnt]
			// One loop per op keeps the switch out of the element loop.
			switch op {
			case opAdd:
				for i := range dst {
					dst[i] = a[ia] + b[ib]
					ia, ib = ia+sa, ib+sb
				}
			case opSub:
				for i := range dst {
					dst[i] = a[ia] - b[ib]
					ia, ib = ia+sa, ib+sb
				}
			case opMul:
				for i := range dst {
					dst[i] = a[ia] * b[ib]
					ia, ib = ia+sa, ib+sb
				}
			case opDiv:
				for i := range dst {
					dst[i] = a[ia] / b[ib]
					ia, ib = ia+sa, ib+sb
				}
			case opPow:
				for i := range dst {
					dst[i] = T(math.Pow(float64(a[ia]), float64(b[ib])))
					ia, ib = ia+sa, ib+sb
				}
			}
		})
	})
}

// binaryInt applies the op table's int64 form of the op (wrapping,
// truncating division, an error on division by zero): integer arithmetic is
// rare and small here (shape computations), so it runs the definition itself.
func binaryInt(op string, c, a, b []int64, p *bplan) error {
	spec, ok := graph.LookupOp(op)
	if !ok || spec.Map == nil || spec.Map.Int == nil {
		return fmt.Errorf("%s has no int64 form", op)
	}
	sa, sb := p.inner(0), p.inner(1)
	var err error
	x := make([]int64, 2)
	p.walk(0, p.n, func(o, cnt int, offs []int) {
		ia, ib := offs[0], offs[1]
		for i := range cnt {
			x[0], x[1] = a[ia], b[ib]
			z, e := spec.Map.Int(x)
			if e != nil && err == nil {
				err = e
			}
			c[o+i] = z
			ia, ib = ia+sa, ib+sb
		}
	})
	return err
}

type unOp uint8

const (
	uNeg unOp = iota
	uSqrt
	uRecip
	uExp
	uLog
	uSigmoid
	uTanh
	uRelu
	uErf
	uAbs
)

// unaryKernel: float elementwise functions. Neg, Abs, Relu and Reciprocal
// are float32 arithmetic for float32 data; the rest evaluate Go's float64
// math and round once (Sqrt is then exactly the float32 square root).
func unaryKernel(op unOp) kernel {
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		switch storageOf(out[0].DType) {
		case stF32:
			unaryFloat(op, out[0].F32, in[0].F32)
		case stF64:
			unaryFloat(op, out[0].F64, in[0].F64)
		default:
			return errDType(out[0].DType)
		}
		return nil
	}
}

func unaryFloat[T float](op unOp, y, x []T) {
	parallelFor(len(y), grain, func(lo, hi int) {
		dst, src := y[lo:hi], x[lo:hi]
		switch op {
		case uNeg:
			for i, v := range src {
				dst[i] = -v
			}
		case uAbs:
			for i, v := range src {
				if v < 0 {
					v = -v
				}
				dst[i] = v + 0 // -0 becomes +0
			}
		case uRelu:
			for i, v := range src {
				if v > 0 {
					dst[i] = v
				} else if v != v {
					dst[i] = v // NaN propagates
				} else {
					dst[i] = 0
				}
			}
		case uRecip:
			for i, v := range src {
				dst[i] = 1 / v
			}
		case uSqrt:
			for i, v := range src {
				dst[i] = T(math.Sqrt(float64(v)))
			}
		case uExp:
			for i, v := range src {
				dst[i] = T(math.Exp(float64(v)))
			}
		case uLog:
			for i, v := range src {
				dst[i] = T(math.Log(float64(v)))
			}
		case uSigmoid:
			for i, v := range src {
				dst[i] = T(sigmoid(float64(v)))
			}
		case uTanh:
			for i, v := range src {
				dst[i] = T(math.Tanh(float64(v)))
			}
		case uErf:
			for i, v := range src {
				dst[i] = T(math.Erf(float64(v)))
			}
		}
	})
}

// tableUnaryKernel runs a float unary op from its op-table definition
// (graph.MapFunc.Float): float64 math rounded once to the output's storage,
// as unaryKernel does for its transcendentals. An op without a hand-written
// loop (Softplus) needs only an entry in kernels.
func tableUnaryKernel(op string) kernel {
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		spec, ok := graph.LookupOp(op)
		if !ok || spec.Map == nil || spec.Map.Float == nil {
			return fmt.Errorf("%s has no float definition in the op table", op)
		}
		switch storageOf(out[0].DType) {
		case stF32:
			mapUnary(spec.Map.Float, out[0].F32, in[0].F32)
		case stF64:
			mapUnary(spec.Map.Float, out[0].F64, in[0].F64)
		default:
			return errDType(out[0].DType)
		}
		return nil
	}
}

func mapUnary[T float](f func([]float64) float64, y, x []T) {
	parallelFor(len(y), grain, func(lo, hi int) {
		arg := make([]float64, 1)
		for i, v := range x[lo:hi] {
			arg[0] = float64(v)
			y[lo+i] = T(f(arg))
		}
	})
}

// sigmoid avoids exp overflow for large |x| by using the form whose
// exponential is at most 1.
func sigmoid(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// identityKernel copies the data: Identity, and Reshape, Squeeze and
// Unsqueeze, whose row-major data is unchanged (the output type, already
// inferred, carries the new shape). Copying rather than aliasing keeps every
// buffer owned by exactly one value, which liveness relies on.
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

// whereKernel: condition ? X : Y for any dtype, broadcasting all three.
func whereKernel(n *graph.Node, in, out []*graph.Tensor) error {
	c, x, y, o := in[0], in[1], in[2], out[0]
	p := newBPlan(o.Shape, c.Shape, x.Shape, y.Shape)
	switch storageOf(o.DType) {
	case stF32:
		where(o.F32, c.B, x.F32, y.F32, p)
	case stF64:
		where(o.F64, c.B, x.F64, y.F64, p)
	case stI64:
		where(o.I64, c.B, x.I64, y.I64, p)
	case stBool:
		where(o.B, c.B, x.B, y.B, p)
	default:
		return errDType(o.DType)
	}
	return nil
}

func where[T any](o []T, c []bool, x, y []T, p *bplan) {
	sc, sx, sy := p.inner(0), p.inner(1), p.inner(2)
	parallelFor(p.n, grain, func(lo, hi int) {
		p.walk(lo, hi, func(at, cnt int, offs []int) {
			ic, ix, iy := offs[0], offs[1], offs[2]
			for i := range cnt {
				if c[ic] {
					o[at+i] = x[ix]
				} else {
					o[at+i] = y[iy]
				}
				ic, ix, iy = ic+sc, ix+sx, iy+sy
			}
		})
	})
}

// equalKernel: A == B for any dtype, broadcasting, bool result (NaN is not
// equal to itself, as in IEEE).
func equalKernel(n *graph.Node, in, out []*graph.Tensor) error {
	a, b, o := in[0], in[1], out[0]
	p := newBPlan(o.Shape, a.Shape, b.Shape)
	switch storageOf(a.DType) {
	case stF32:
		equal(o.B, a.F32, b.F32, p)
	case stF64:
		equal(o.B, a.F64, b.F64, p)
	case stI64:
		equal(o.B, a.I64, b.I64, p)
	case stBool:
		equal(o.B, a.B, b.B, p)
	default:
		return errDType(a.DType)
	}
	return nil
}

func equal[T comparable](o []bool, a, b []T, p *bplan) {
	sa, sb := p.inner(0), p.inner(1)
	p.walk(0, p.n, func(at, cnt int, offs []int) {
		ia, ib := offs[0], offs[1]
		for i := range cnt {
			o[at+i] = a[ia] == b[ib]
			ia, ib = ia+sa, ib+sb
		}
	})
}

// castKernel converts between any two dtypes. Float to int64 truncates
// toward zero (NaN and out-of-range values are an error rather than Go's
// implementation-defined result); to bool is x != 0; narrow floats round to
// nearest even (the executor rounds float32-held outputs).
func castKernel(n *graph.Node, in, out []*graph.Tensor) error {
	x, y := in[0], out[0]
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
