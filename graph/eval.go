package graph

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// The reference meaning of every op. Each op table row carries an Eval: the op
// computed by its definition in float64, as plain index loops over
// multi-indices (no stride tricks, no blocking, no BLAS), so that it reads
// like the op's Doc and shares no code with any backend's kernels. It is the
// one definition of each op: the conformance suite (backend/backendtest)
// checks every backend against it, constant folding (passes and onnx) runs
// it, and speed is irrelevant (test sizes and masks are small).
//
// Results are stored with Tensor.Set, which rounds to each output's dtype:
// an op's value is its float64 result rounded once, as a backend computing in
// the output's type would give it. Int64 operands of elementwise ops with an
// integer form (MapFunc.Int) are computed in int64, as the CPU backend does.

// EvalFunc computes an op's outputs from its inputs. in[i] is nil for an
// omitted optional input; attrs are normalized (defaults filled); out holds
// one tensor per declared output, allocated by the caller with the node's
// output types. It writes every element of every output and returns an
// error, never panics, on data it cannot evaluate (an index out of range).
type EvalFunc func(in []*Tensor, attrs Attrs, out []*Tensor) error

// MapFunc is the scalar meaning of an elementwise op: the function applied at
// every position of the (broadcast) inputs.
type MapFunc struct {
	// Float is the op in float64 arithmetic.
	Float func(x []float64) float64
	// Int, when set, is the op on int64 operands (two's complement wrap,
	// truncating division); nil for ops defined on floats only.
	Int func(x []int64) (int64, error)
}

// Eval computes op on host tensors with the op table's reference: attributes
// are checked and defaulted, output types are inferred with every input's
// data known, and the outputs are allocated and computed. in[i] may be nil
// for an omitted optional input.
func Eval(op string, attrs Attrs, in ...*Tensor) ([]*Tensor, error) {
	s, ok := ops[op]
	if !ok {
		return nil, fmt.Errorf("unknown op %q", op)
	}
	if s.Eval == nil {
		return nil, fmt.Errorf("op %s has no reference evaluation", op)
	}
	lo, hi := s.Arity()
	if err := checkArity(op, lo, hi, len(in)); err != nil {
		return nil, err
	}
	na, err := s.normalizeAttrs(attrs)
	if err != nil {
		return nil, err
	}
	types := make([]*TensorType, len(in))
	for i, t := range in {
		if t == nil {
			if i < lo {
				return nil, fmt.Errorf("%s input %d (%s) is required", op, i, s.inputName(i))
			}
			continue
		}
		if err := t.Check(); err != nil {
			return nil, fmt.Errorf("%s input %d: %w", op, i, err)
		}
		tt := t.Type()
		types[i] = &tt
	}
	consts := slices.Clone(in)
	for hi > len(types) {
		types = append(types, nil)
		consts = append(consts, nil)
	}
	outTypes, err := s.inferTypes(types, na, consts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	out := make([]*Tensor, len(outTypes))
	for i, t := range outTypes {
		if err := t.Shape.Check(); err != nil {
			return nil, fmt.Errorf("%s output %d: %w", op, i, err)
		}
		out[i] = NewTensor(t.DType, t.Shape)
	}
	if err := s.Eval(consts, na, out); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

func checkArity(op string, lo, hi, n int) error {
	if n < lo || (hi >= 0 && n > hi) {
		if hi == lo {
			return fmt.Errorf("%s takes %d inputs, got %d", op, lo, n)
		}
		return fmt.Errorf("%s takes %d to %d inputs, got %d", op, lo, hi, n)
	}
	return nil
}

// unravel writes the multi-index of row-major position p of shape into idx.
func unravel(p int, shape Shape, idx []int) {
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = p % shape[d]
			p /= shape[d]
		}
	}
}

// ravel is unravel's inverse.
func ravel(idx []int, shape Shape) int {
	p := 0
	for d := range shape {
		p = p*shape[d] + idx[d]
	}
	return p
}

// bcastPos is the position in a tensor of shape in of the element that
// numpy broadcasting reads at output multi-index idx: dims align to the
// right, size-1 dims read index 0.
func bcastPos(idx []int, in Shape) int {
	off := len(idx) - len(in)
	p := 0
	for d, n := range in {
		i := 0
		if n != 1 {
			i = idx[off+d]
		}
		p = p*n + i
	}
	return p
}

// intAt reads element i of an int64 or bool tensor as an int64 (a float one
// truncated).
func intAt(t *Tensor, i int) int64 {
	if t.I64 != nil {
		return t.I64[i]
	}
	return SaturateInt64(t.At(i))
}

// copyElem stores src[j] at dst[i]: exactly between int64 tensors, rounded to
// dst's type otherwise.
func copyElem(dst *Tensor, i int, src *Tensor, j int) {
	if dst.S != nil && src.S != nil {
		dst.S[i] = src.S[j]
		return
	}
	if dst.I64 != nil && src.I64 != nil {
		dst.I64[i] = src.I64[j]
		return
	}
	dst.Set(i, src.At(j))
}

// intsOf reads an int64 operand (axes, starts, shape, k).
func intsOf(t *Tensor, what string) ([]int, error) {
	if t == nil {
		return nil, nil
	}
	if t.DType != Int64 {
		return nil, fmt.Errorf("%s must be int64, got %v", what, t.DType)
	}
	out := make([]int, len(t.I64))
	for i, v := range t.I64 {
		out[i] = int(v)
	}
	return out, nil
}

// evalMap applies an elementwise op at every broadcast position.
func evalMap(m *MapFunc) EvalFunc {
	return func(in []*Tensor, _ Attrs, out []*Tensor) error {
		o := out[0]
		useInt := false
		if m.Int != nil {
			for _, t := range in {
				useInt = useInt || t.DType == Int64
			}
		}
		idx := make([]int, o.Shape.Rank())
		fx := make([]float64, len(in))
		ix := make([]int64, len(in))
		for p := range o.Len() {
			unravel(p, o.Shape, idx)
			for k, t := range in {
				j := bcastPos(idx, t.Shape)
				if useInt {
					ix[k] = intAt(t, j)
				} else {
					fx[k] = t.At(j)
				}
			}
			if !useInt {
				o.Set(p, m.Float(fx))
				continue
			}
			v, err := m.Int(ix)
			if err != nil {
				return err
			}
			if o.I64 != nil {
				o.I64[p] = v
			} else {
				o.Set(p, float64(v))
			}
		}
		return nil
	}
}

// errIntDivZero is integer division by zero (float division gives ±Inf).
var errIntDivZero = errors.New("integer division by zero")

// IntPow is x^y for int64 operands: exact (wrapping) for y >= 0; a negative
// exponent gives the integer part of the real result (0 unless |x| == 1).
func IntPow(x, y int64) int64 {
	if y < 0 {
		return SaturateInt64(math.Pow(float64(x), float64(y)))
	}
	r := int64(1)
	for ; y > 0; y >>= 1 {
		if y&1 == 1 {
			r *= x
		}
		x *= x
	}
	return r
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// evalCopy is Identity, Cast, Reshape, Squeeze, Unsqueeze: the elements in
// order, converted to the output's dtype.
func evalCopy(in []*Tensor, _ Attrs, out []*Tensor) error {
	for i := range out[0].Len() {
		copyElem(out[0], i, in[0], i)
	}
	return nil
}
