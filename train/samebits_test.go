package train

import (
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

// sameBits says whether a and b have the same type and bit-identical
// elements (the check checkpoint's tests make of a round trip; test helpers
// do not cross packages).
func sameBits(a, b *graph.Tensor) bool {
	if !a.Type().Equal(b.Type()) || a.Len() != b.Len() {
		return false
	}
	for i := range a.Len() {
		switch {
		case a.F32 != nil:
			if math.Float32bits(a.F32[i]) != math.Float32bits(b.F32[i]) {
				return false
			}
		case a.F64 != nil:
			if math.Float64bits(a.F64[i]) != math.Float64bits(b.F64[i]) {
				return false
			}
		case a.I64 != nil:
			if a.I64[i] != b.I64[i] {
				return false
			}
		case a.B != nil:
			if a.B[i] != b.B[i] {
				return false
			}
		}
	}
	return true
}
