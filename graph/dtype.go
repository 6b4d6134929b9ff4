package graph

import (
	"fmt"
	"math"
)

// DType is the element type of a tensor.
type DType uint8

// The element types the IR knows. BFloat16 and Float16 tensors are held on the
// host as float32 values already rounded to the narrow type; backends that
// compute in the narrow type (CUDA) convert at upload.
const (
	InvalidDType DType = iota
	Float32
	Float64
	BFloat16
	Float16
	Int64
	Bool
	// String tensors hold text (Tensor.S). Only the host runs them, and
	// only the ops whose row says so (OpSpec.Strings): the rest refuse a
	// string operand when a node is built or evaluated.
	String
)

var dtypeNames = [...]string{"invalid", "float32", "float64", "bfloat16", "float16", "int64", "bool", "string"}

func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType is the inverse of DType.String.
func ParseDType(s string) (DType, error) {
	for i, n := range dtypeNames {
		if i > 0 && n == s {
			return DType(i), nil
		}
	}
	return InvalidDType, fmt.Errorf("unknown dtype %q", s)
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == Float32 || d == Float64 || d == BFloat16 || d == Float16 }

// Size is the storage size of one element in bytes (on a device): 0 for
// String, which has no fixed-size device form.
func (d DType) Size() int {
	switch d {
	case Float64, Int64:
		return 8
	case Float32:
		return 4
	case BFloat16, Float16:
		return 2
	case Bool:
		return 1
	}
	return 0
}

// narrowInts are the integer element types other than Int64 that a graph's
// inputs and outputs may be declared with (Graph.ElemTypes): the IR holds
// them as Int64, exactly, within these ranges. uint64's is the part of its
// range that int64 holds, [0, 2^63): a value at or above 2^63 is refused
// where it is read or written, never reinterpreted.
var narrowInts = map[string][2]int64{
	"int8": {math.MinInt8, math.MaxInt8}, "int16": {math.MinInt16, math.MaxInt16},
	"int32": {math.MinInt32, math.MaxInt32}, "uint8": {0, math.MaxUint8},
	"uint16": {0, math.MaxUint16}, "uint32": {0, math.MaxUint32},
	"uint64": {0, math.MaxInt64},
}

// NarrowIntRange gives the range of an integer type held as Int64 ("int8",
// "int16", "int32", "uint8", "uint16", "uint32", and "uint64" below 2^63);
// ok is false for any other name.
func NarrowIntRange(name string) (lo, hi int64, ok bool) {
	r, ok := narrowInts[name]
	return r[0], r[1], ok
}

// CheckNarrow reports an error when an Int64 tensor holds a value outside
// the range of the narrow integer type it stands for.
func CheckNarrow(t *Tensor, name string) error {
	lo, hi, ok := NarrowIntRange(name)
	if !ok {
		return fmt.Errorf("%q is not a narrow integer type", name)
	}
	if t.DType != Int64 {
		return fmt.Errorf("a %s value is held as int64, got %v", name, t.DType)
	}
	for k, v := range t.I64 {
		if v < lo || v > hi {
			return fmt.Errorf("element %d is %d, outside %s's range [%d, %d]", k, v, name, lo, hi)
		}
	}
	return nil
}
