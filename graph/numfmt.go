package graph

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Numeric formats, in one place: the 16-bit float encodings and the
// little-endian byte layout of tensor data that checkpoints (safetensors),
// ONNX raw_data and device uploads share. Rounding is to nearest, ties to
// even, like the GPU's own __float2bfloat16 and __float2half, so host and
// device agree bit for bit.

// BF16FromFloat32 rounds f to bfloat16 (the top 16 bits of a float32); NaN
// stays a (quiet) NaN, overflow gives infinity.
func BF16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it a NaN after truncation
		return uint16(b>>16) | 0x40
	}
	// Adding 0x7fff plus the lowest kept bit rounds half to even; an overflow
	// carries into the exponent and correctly gives infinity.
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BF16ToFloat32 widens bfloat16 bits exactly.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16FromFloat32 rounds f to IEEE 754 binary16, with subnormals; overflow
// gives infinity and NaN stays NaN (its payload kept where it fits).
func F16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13) // quiet NaN
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // biased half exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal or zero in binary16 (m · 2^-24, m < 1024): shift the
		// full significand into place and round the dropped bits.
		if e < -10 {
			return sign // below half the smallest subnormal
		}
		m := man | 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rem := m & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	// Normal: keep 10 of 23 mantissa bits, round the dropped 13 to even.
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // a carry into the exponent is the correct rounding (up to inf)
	}
	return sign | uint16(r)
}

// F16ToFloat32 widens binary16 bits exactly, including subnormals,
// infinities and NaN payloads.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf or NaN: the payload in the top mantissa bits
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	case exp != 0: // normal: rebias 15 → 127
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: man × 2⁻²⁴, exactly a float32.
	f := float32(man) * (1.0 / (1 << 24))
	if sign != 0 {
		f = -f
	}
	return f
}

// RoundBF16 rounds a float32 to the nearest bfloat16 value (ties to even),
// as a float32; NaN is returned unchanged.
func RoundBF16(f float32) float32 {
	if f != f {
		return f
	}
	return BF16ToFloat32(BF16FromFloat32(f))
}

// RoundF16 rounds a float32 to the nearest IEEE half value (ties to even),
// saturating to ±inf, as a float32; NaN is returned unchanged.
func RoundF16(f float32) float32 {
	if f != f {
		return f
	}
	return F16ToFloat32(F16FromFloat32(f))
}

// AppendLE appends t's elements in the little-endian layout of its dtype
// (DType.Size bytes each: float32, bfloat16 and float16 bits, float64,
// int64, and one byte 0/1 per bool). Narrow floats are held already rounded,
// so their encoding is exact.
func AppendLE(dst []byte, t *Tensor) []byte {
	le := binary.LittleEndian
	for i := range t.Len() {
		switch t.DType {
		case Float32:
			dst = le.AppendUint32(dst, math.Float32bits(t.F32[i]))
		case BFloat16:
			// A value held rounded has a zero lower half: its top half is
			// the bfloat16, NaN payloads included (BF16FromFloat32 would
			// quiet a signalling NaN read from a checkpoint, and the
			// checkpoint would not survive a rewrite bit for bit).
			b := math.Float32bits(t.F32[i])
			h := uint16(b >> 16)
			if b&0xffff != 0 {
				h = BF16FromFloat32(t.F32[i])
			}
			dst = le.AppendUint16(dst, h)
		case Float16:
			dst = le.AppendUint16(dst, F16FromFloat32(t.F32[i]))
		case Float64:
			dst = le.AppendUint64(dst, math.Float64bits(t.F64[i]))
		case Int64:
			dst = le.AppendUint64(dst, uint64(t.I64[i]))
		case Bool:
			dst = append(dst, byte(b2f(t.B[i])))
		}
	}
	return dst
}

// DecodeLE fills t from b in AppendLE's layout; b must hold exactly
// t.Len()·DType.Size() bytes.
func DecodeLE(t *Tensor, b []byte) error {
	if want := t.Len() * t.DType.Size(); len(b) != want || t.DType.Size() == 0 {
		return fmt.Errorf("%v%v needs %d bytes, got %d", t.DType, t.Shape, want, len(b))
	}
	if err := t.Check(); err != nil {
		return err
	}
	le := binary.LittleEndian
	for i := range t.Len() {
		switch t.DType {
		case Float32:
			t.F32[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		case BFloat16:
			t.F32[i] = BF16ToFloat32(le.Uint16(b[2*i:]))
		case Float16:
			t.F32[i] = F16ToFloat32(le.Uint16(b[2*i:]))
		case Float64:
			t.F64[i] = math.Float64frombits(le.Uint64(b[8*i:]))
		case Int64:
			t.I64[i] = int64(le.Uint64(b[8*i:]))
		case Bool:
			t.B[i] = b[i] != 0
		}
	}
	return nil
}
