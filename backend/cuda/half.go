package cuda

import "math"

// Host-side conversions for the 16-bit float types the GPU computes in. They round
// to nearest, ties to even, like the device's own __float2bfloat16 and
// __float2half, so host and device agree bit for bit.

// BF16FromFloat32 rounds f to bfloat16 (the top 16 bits of a float32).
func BF16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it a (quiet) NaN after truncation
		return uint16(b>>16) | 0x40
	}
	// Adding 0x7fff plus the lowest kept bit rounds half to even; an overflow
	// carries into the exponent and correctly gives infinity.
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BF16ToFloat32 widens a bfloat16 exactly.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16FromFloat32 rounds f to IEEE 754 binary16, with subnormals, overflow to
// infinity and NaN kept.
func F16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15: // too large for half even before rounding
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // biased half exponent
	if e >= 1 {
		// Normal: keep 10 of 23 mantissa bits, round the dropped 13 to nearest even.
		v := uint32(e)<<10 | mant>>13
		rest := mant & 0x1fff
		if rest > 0x1000 || (rest == 0x1000 && v&1 == 1) {
			v++ // may carry into the exponent, up to infinity (0x7c00): correct
		}
		return sign | uint16(v)
	}
	// Subnormal half (or zero): value = m · 2^-24 with m < 1024.
	if e < -10 {
		return sign // below half the smallest subnormal: rounds to zero
	}
	full := mant | 0x800000 // the implicit leading one
	shift := uint32(14 - e) // 13 bits of mantissa difference plus 1-e
	v := full >> shift
	rest := full & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rest > half || (rest == half && v&1 == 1) {
		v++
	}
	return sign | uint16(v)
}

// F16ToFloat32 widens a binary16 exactly.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		// Subnormal or zero: exactly mant · 2^-24.
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}
