package codegen

import "github.com/flashgraph/flashgraph/graph"

// Buffer is what the generator knows of a device buffer: its address (a
// vector load needs it aligned), its element type and its element count.
// The executor allocates buffers; the generator only reads these facts.
type Buffer struct {
	Addr  uint64
	DType graph.DType
	N     int
}

// alignedFor reports whether a vector of vec elements of b read from
// element off on starts on a whole-vector boundary, as a 16-byte load needs.
// The elementwise, row and index kernels all decide their vector width by it.
func (b Buffer) alignedFor(off int64, vec int) bool {
	return (int64(b.Addr)+off*int64(b.DType.Size()))%int64(vec*b.DType.Size()) == 0
}

// Is16 reports a 16-bit float type (bfloat16 or float16): computed in
// float, stored narrow.
func Is16(dt graph.DType) bool { return dt == graph.BFloat16 || dt == graph.Float16 }

// Operand is an input of an ew kernel: a buffer read at offset + Σ idx·stride
// over the output's dims.
type Operand struct {
	Buf     Buffer
	Off     int64   // elements
	Strides []int64 // one per output dim
}

// BroadcastOperand reads buf (of shape in) broadcast to shape out.
func BroadcastOperand(buf Buffer, in, out graph.Shape) Operand {
	r := out.Rank()
	st := make([]int64, r)
	acc := int64(1)
	for i := in.Rank() - 1; i >= 0; i-- {
		if in[i] != 1 {
			st[r-in.Rank()+i] = acc
		}
		acc *= int64(in[i])
	}
	return Operand{Buf: buf, Strides: st}
}

// Coalesce drops size-1 dims and merges neighbours every operand walks
// contiguously, so most elementwise ops run at rank 1 or 2.
func Coalesce(dims []int64, strides [][]int64) ([]int64, [][]int64) {
	var od []int64
	os := make([][]int64, len(strides))
	for i, d := range dims {
		if d == 1 {
			continue
		}
		if last := len(od) - 1; last >= 0 {
			merge := true
			for k := range strides {
				if os[k][last] != strides[k][i]*d {
					merge = false
					break
				}
			}
			if merge {
				od[last] *= d
				for k := range strides {
					os[k][last] = strides[k][i]
				}
				continue
			}
		}
		od = append(od, d)
		for k := range strides {
			os[k] = append(os[k], strides[k][i])
		}
	}
	if len(od) == 0 {
		od = []int64{1}
		for k := range os {
			os[k] = []int64{0}
		}
	}
	return od, os
}

// ContiguousStrides are the row-major strides, in elements, of shape s.
func ContiguousStrides(s graph.Shape) []int64 {
	st := make([]int64, s.Rank())
	acc := int64(1)
	for i := s.Rank() - 1; i >= 0; i-- {
		st[i] = acc
		acc *= int64(s[i])
	}
	return st
}
