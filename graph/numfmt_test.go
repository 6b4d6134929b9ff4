package graph

import (
	"math"
	"slices"
	"testing"
)

// TestHalfEncoding checks the 16-bit encodings bit by bit against values
// worked out by hand.
func TestHalfEncoding(t *testing.T) {
	for _, c := range []struct {
		f    float32
		bits uint16
	}{{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {float32(math.Pow(2, -24)), 0x0001}, {float32(math.Pow(2, -14)), 0x0400}, {0.5, 0x3800}, {float32(math.Inf(1)), 0x7c00}} {
		if got := F16FromFloat32(c.f); got != c.bits {
			t.Errorf("F16FromFloat32(%v) = %#04x, want %#04x", c.f, got, c.bits)
		}
		if got := F16ToFloat32(c.bits); got != c.f {
			t.Errorf("F16ToFloat32(%#04x) = %v, want %v", c.bits, got, c.f)
		}
	}
	for _, c := range []struct {
		f    float32
		bits uint16
	}{{1, 0x3f80}, {-2, 0xc000}, {1 + 1.0/256, 0x3f80}, {1 + 3.0/256, 0x3f82}, {float32(math.Inf(-1)), 0xff80}} {
		if got := BF16FromFloat32(c.f); got != c.bits {
			t.Errorf("BF16FromFloat32(%v) = %#04x, want %#04x", c.f, got, c.bits)
		}
	}
	if RoundF16(70000) != float32(math.Inf(1)) || RoundF16(65519) != 65504 || RoundF16(1e-9) != 0 {
		t.Errorf("RoundF16: 70000 → %v, 65519 → %v, 1e-9 → %v", RoundF16(70000), RoundF16(65519), RoundF16(1e-9))
	}
	if nan := float32(math.NaN()); RoundBF16(nan) == RoundBF16(nan) || RoundF16(nan) == RoundF16(nan) {
		t.Error("NaN must stay NaN")
	}
}

func TestLittleEndianRoundTrip(t *testing.T) {
	for _, dt := range []DType{Float32, Float64, BFloat16, Float16, Int64, Bool} {
		x := NewTensor(dt, Shape{2, 3})
		for i := range x.Len() {
			x.Set(i, float64(i)*1.25-2)
		}
		b := AppendLE(nil, x)
		if len(b) != x.Len()*dt.Size() {
			t.Fatalf("%v: %d bytes, want %d", dt, len(b), x.Len()*dt.Size())
		}
		y := NewTensor(dt, x.Shape)
		if err := DecodeLE(y, b); err != nil {
			t.Fatalf("%v: %v", dt, err)
		}
		if !slices.Equal(x.F32, y.F32) || !slices.Equal(x.F64, y.F64) || !slices.Equal(x.I64, y.I64) || !slices.Equal(x.B, y.B) {
			t.Errorf("%v: round trip changed the data: %v → %v", dt, x, y)
		}
		if err := DecodeLE(y, b[1:]); err == nil {
			t.Errorf("%v: a short buffer must be an error", dt)
		}
	}
	// float32 1.0 is 00 00 80 3f little endian.
	one := NewTensor(Float32, Shape{})
	one.F32[0] = 1
	if b := AppendLE(nil, one); !slices.Equal(b, []byte{0, 0, 0x80, 0x3f}) {
		t.Errorf("float32 1 encodes as % x", b)
	}
}

// roundF16Arith is RoundF16 by arithmetic, independent of the bit
// manipulation: the nearest multiple of the value's half-precision quantum
// (2^(e−10) for normals, 2^−24 for subnormals), ties to even, ±inf from 65520.
func roundF16Arith(f float32) float32 {
	a := math.Abs(float64(f))
	switch {
	case f != f || math.IsInf(float64(f), 0) || a == 0:
		return f
	case a >= 65520:
		return float32(math.Copysign(math.Inf(1), float64(f)))
	}
	q := math.Pow(2, max(math.Floor(math.Log2(a)), -14)-10)
	return float32(math.Copysign(math.RoundToEven(a/q)*q, float64(f)))
}

// TestRoundF16MatchesArithmetic compares the bit rounding with the
// arithmetic definition on a spread of float32 bit patterns (every exponent,
// both signs). With stride 13 (14 s) the two agreed on every pattern too.
func TestRoundF16MatchesArithmetic(t *testing.T) {
	const stride = 4099
	for u := uint64(0); u < 1<<32; u += stride {
		f := math.Float32frombits(uint32(u))
		if f != f {
			continue
		}
		if got, want := RoundF16(f), roundF16Arith(f); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("RoundF16(%v) = %v, arithmetic gives %v", f, got, want)
		}
	}
}

// A bfloat16 tensor encodes its held values exactly, signalling NaN payloads
// included (a checkpoint read and written back keeps its bits); a float32
// value that is not a bfloat16 is rounded.
func TestAppendLEBF16KeepsHeldBits(t *testing.T) {
	x := NewTensor(BFloat16, Shape{3})
	x.F32[0] = math.Float32frombits(0x7f810000) // a signalling NaN, as read from a file
	x.F32[1] = math.Float32frombits(0xbf800000) // -1
	x.F32[2] = math.Float32frombits(0x3f808001) // not a bfloat16: rounds up to 0x3f81
	b := AppendLE(nil, x)
	got := []uint16{uint16(b[0]) | uint16(b[1])<<8, uint16(b[2]) | uint16(b[3])<<8, uint16(b[4]) | uint16(b[5])<<8}
	if want := []uint16{0x7f81, 0xbf80, 0x3f81}; !slices.Equal(got, want) {
		t.Errorf("AppendLE bf16 = %#x, want %#x", got, want)
	}
}
