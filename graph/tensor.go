package graph

import (
	"fmt"
	"math"
)

// Tensor is host data for a value. Exactly one slice is used, chosen by DType:
// F32 for float32, bfloat16 and float16 (values rounded to the narrow type),
// F64 for float64, I64 for int64, B for bool, S for string (any bytes, as
// ONNX's string_data holds them).
type Tensor struct {
	DType DType
	Shape Shape
	F32   []float32
	F64   []float64
	I64   []int64
	B     []bool
	S     []string
}

// NewTensor allocates a zero tensor.
func NewTensor(dt DType, shape Shape) *Tensor {
	t := &Tensor{DType: dt, Shape: shape.Clone()}
	n := shape.Numel()
	switch dt {
	case Float32, BFloat16, Float16:
		t.F32 = make([]float32, n)
	case Float64:
		t.F64 = make([]float64, n)
	case Int64:
		t.I64 = make([]int64, n)
	case Bool:
		t.B = make([]bool, n)
	case String:
		t.S = make([]string, n)
	}
	return t
}

// Len is the number of elements.
func (t *Tensor) Len() int { return t.Shape.Numel() }

// At returns element i as a float64 (bools as 0/1; a string is no number:
// NaN, and the ops that read numbers refuse string tensors before this).
func (t *Tensor) At(i int) float64 {
	switch {
	case t.S != nil:
		return math.NaN()
	case t.F32 != nil:
		return float64(t.F32[i])
	case t.F64 != nil:
		return t.F64[i]
	case t.I64 != nil:
		return float64(t.I64[i])
	case t.B != nil:
		if t.B[i] {
			return 1
		}
	}
	return 0
}

// Set stores v at element i, rounding to the tensor's type. A string
// tensor takes no numbers (Cast formats them): Set leaves it unchanged.
func (t *Tensor) Set(i int, v float64) {
	switch t.DType {
	case Float32:
		t.F32[i] = float32(v)
	case BFloat16:
		t.F32[i] = RoundBF16(float32(v))
	case Float16:
		t.F32[i] = RoundF16(float32(v))
	case Float64:
		t.F64[i] = v
	case Int64:
		t.I64[i] = SaturateInt64(v)
	case Bool:
		t.B[i] = v != 0
	}
}

// SaturateInt64 converts toward zero like a C cast, but saturates where Go's
// conversion of an out-of-range float is implementation-defined: ONNX passes
// INT64_MAX (2^63 as a float64) as Slice's "to the end", and int64(2^63) is
// MinInt64 on amd64. NaN gives 0.
func SaturateInt64(v float64) int64 {
	switch {
	case v != v:
		return 0
	case v >= math.MaxInt64:
		return math.MaxInt64
	case v <= math.MinInt64:
		return math.MinInt64
	}
	return int64(v)
}

// Fill poisons or fills every element with v (NaN poisoning before a run).
func (t *Tensor) Fill(v float64) {
	for i := range t.Len() {
		t.Set(i, v)
	}
}

// Clone returns a deep copy.
func (t *Tensor) Clone() *Tensor {
	c := NewTensor(t.DType, t.Shape)
	copy(c.F32, t.F32)
	copy(c.F64, t.F64)
	copy(c.I64, t.I64)
	copy(c.B, t.B)
	copy(c.S, t.S)
	return c
}

// Type returns the tensor's static type.
func (t *Tensor) Type() TensorType { return TensorType{t.DType, t.Shape} }

// Check reports whether the tensor's storage matches its dtype and shape.
func (t *Tensor) Check() error {
	n := t.Shape.Numel()
	var got int
	switch t.DType {
	case Float32, BFloat16, Float16:
		got = len(t.F32)
	case Float64:
		got = len(t.F64)
	case Int64:
		got = len(t.I64)
	case Bool:
		got = len(t.B)
	case String:
		got = len(t.S)
	default:
		return fmt.Errorf("tensor has invalid dtype %v", t.DType)
	}
	if got != n {
		return fmt.Errorf("%v tensor of shape %v holds %d elements, want %d", t.DType, t.Shape, got, n)
	}
	return nil
}
