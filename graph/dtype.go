package graph

import "fmt"

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
)

var dtypeNames = [...]string{"invalid", "float32", "float64", "bfloat16", "float16", "int64", "bool"}

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

// Size is the storage size of one element in bytes (on a device).
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
