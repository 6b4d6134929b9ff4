package graph

import (
	"fmt"
	"strconv"
	"strings"
)

// Shape is a static tensor shape; a scalar has rank 0.
type Shape []int

// Numel is the number of elements (1 for a scalar).
func (s Shape) Numel() int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// MaxElements bounds the elements of any one tensor (2^48): far beyond any
// device, and small enough that products of dims never overflow an int.
const MaxElements = 1 << 48

// Check reports a negative dim or a shape whose element count exceeds
// MaxElements (which would also overflow Numel).
func (s Shape) Check() error {
	n := 1
	for _, d := range s {
		if d < 0 {
			return fmt.Errorf("shape %v has a negative dim", s)
		}
		if d > 0 && n > MaxElements/d {
			return fmt.Errorf("shape %v has more than 2^48 elements", s)
		}
		n *= d
	}
	return nil
}

// Rank is len(s).
func (s Shape) Rank() int { return len(s) }

// Equal reports whether two shapes are the same.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// Clone returns a copy that does not alias s.
func (s Shape) Clone() Shape { return append(Shape{}, s...) }

func (s Shape) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for i, d := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(d))
	}
	b.WriteByte(']')
	return b.String()
}

// Strides returns row-major element strides.
func (s Shape) Strides() []int {
	st := make([]int, len(s))
	n := 1
	for i := len(s) - 1; i >= 0; i-- {
		st[i] = n
		n *= s[i]
	}
	return st
}

// Broadcast returns the numpy/ONNX multidirectional broadcast of shapes.
func Broadcast(shapes ...Shape) (Shape, error) {
	rank := 0
	for _, s := range shapes {
		rank = max(rank, len(s))
	}
	out := make(Shape, rank)
	for i := range out {
		out[i] = 1
	}
	for _, s := range shapes {
		off := rank - len(s)
		for i, d := range s {
			switch {
			case d == out[off+i] || d == 1:
			case out[off+i] == 1:
				out[off+i] = d
			default:
				return nil, fmt.Errorf("shapes %v do not broadcast (axis %d: %d vs %d)", shapes, off+i, out[off+i], d)
			}
		}
	}
	return out, nil
}

// NormAxis maps a possibly negative axis into [0, rank).
func NormAxis(axis, rank int) (int, error) {
	a := axis
	if a < 0 {
		a += rank
	}
	if a < 0 || a >= rank {
		return 0, fmt.Errorf("axis %d out of range for rank %d", axis, rank)
	}
	return a, nil
}

// TensorType is a value's static type.
type TensorType struct {
	DType DType
	Shape Shape
}

func (t TensorType) String() string { return t.DType.String() + t.Shape.String() }

// Equal reports whether two types match exactly.
func (t TensorType) Equal(o TensorType) bool { return t.DType == o.DType && t.Shape.Equal(o.Shape) }
