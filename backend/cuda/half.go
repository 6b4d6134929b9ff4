package cuda

import "github.com/flashgraph/flashgraph/graph"

// Host-side conversions for the 16-bit float types the GPU computes in. They
// are graph's (graph/numfmt.go, the one home of numeric formats), which round
// to nearest, ties to even, like the device's own __float2bfloat16 and
// __float2half, so host and device agree bit for bit.

// BF16FromFloat32 rounds f to bfloat16 bits.
func BF16FromFloat32(f float32) uint16 { return graph.BF16FromFloat32(f) }

// BF16ToFloat32 widens bfloat16 bits exactly.
func BF16ToFloat32(h uint16) float32 { return graph.BF16ToFloat32(h) }

// F16FromFloat32 rounds f to IEEE 754 binary16 bits.
func F16FromFloat32(f float32) uint16 { return graph.F16FromFloat32(f) }

// F16ToFloat32 widens binary16 bits exactly.
func F16ToFloat32(h uint16) float32 { return graph.F16ToFloat32(h) }
