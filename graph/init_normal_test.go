package graph

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// referenceNormal is the normal initializer as one sequential loop through
// Tensor.Set: the definition the parallel fillNormal must match bit for bit.
func referenceNormal(t TensorType, seed uint64, std float64) *Tensor {
	out := NewTensor(t.DType, t.Shape)
	n := out.Len()
	rng := rand.NewPCG(seed, 0x9e3779b97f4a7c15)
	for i := 0; i < n; i += 2 {
		u1 := (float64(rng.Uint64()>>11) + 0.5) / (1 << 53)
		u2 := float64(rng.Uint64()>>11) / (1 << 53)
		r := math.Sqrt(-2 * math.Log(u1))
		out.Set(i, std*r*math.Cos(2*math.Pi*u2))
		if i+1 < n {
			out.Set(i+1, std*r*math.Sin(2*math.Pi*u2))
		}
	}
	return out
}

// sameBits reports the first element where got and want differ in their
// bits (NaN payloads included), or "" if none does.
func sameBits(got, want *Tensor) string {
	if got.DType != want.DType || !got.Shape.Equal(want.Shape) {
		return fmt.Sprintf("type %v, want %v", got.Type(), want.Type())
	}
	if len(got.F32) != len(want.F32) || len(got.F64) != len(want.F64) {
		return fmt.Sprintf("storage of %d/%d elements, want %d/%d", len(got.F32), len(got.F64), len(want.F32), len(want.F64))
	}
	for i := range want.F32 {
		if math.Float32bits(got.F32[i]) != math.Float32bits(want.F32[i]) {
			return fmt.Sprintf("element %d is %v (%#x), want %v (%#x)", i, got.F32[i], math.Float32bits(got.F32[i]), want.F32[i], math.Float32bits(want.F32[i]))
		}
	}
	for i := range want.F64 {
		if math.Float64bits(got.F64[i]) != math.Float64bits(want.F64[i]) {
			return fmt.Sprintf("element %d is %v, want %v", i, got.F64[i], want.F64[i])
		}
	}
	return ""
}

// TestNormalMatchesSequential checks the parallel normal initializer against
// the sequential loop for every float dtype, sizes around the chunk
// boundaries (odd and even), several seeds and worker counts.
func TestNormalMatchesSequential(t *testing.T) {
	const c = 2 * normalChunkPairs // elements in a chunk
	shapes := []Shape{
		{}, {0}, {1}, {2}, {3}, {1001}, {7, 13},
		{c - 1}, {c}, {c + 1}, {3*c + 1}, {3*c + 2}, {4 * c},
	}
	seeds := []uint64{0, 1, 42, 1<<40 + 3}
	dtypes := []DType{Float32, Float64, BFloat16, Float16}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{1, 2, 3, 8} {
		runtime.GOMAXPROCS(procs)
		for _, dt := range dtypes {
			for _, s := range shapes {
				for k, seed := range seeds {
					// Float16's range is small: a large std checks
					// its saturation to ±inf as Set does it.
					std := []float64{0.02, 1, 0.5, 3e4}[k]
					tt := TensorType{dt, s}
					got, err := Normal(std, int(seed)).Materialize(tt)
					if err != nil {
						t.Fatalf("%v seed %d: %v", tt, seed, err)
					}
					if d := sameBits(got, referenceNormal(tt, seed, std)); d != "" {
						t.Fatalf("GOMAXPROCS %d, %v, seed %d, std %v: %s", procs, tt, seed, std, d)
					}
				}
			}
		}
	}
}

// TestNormalValues pins a few values as the sequential initializer made
// them, so that a change of both the reference and the initializer cannot
// pass unnoticed, and checks that the draws look like a normal distribution
// of the given std.
func TestNormalValues(t *testing.T) {
	got, err := Normal(1, 7).Materialize(TensorType{Float64, Shape{393217}})
	if err != nil {
		t.Fatal(err)
	}
	var sum, sq float64
	for _, v := range got.F64 {
		sum += v
		sq += v * v
	}
	n := float64(len(got.F64))
	mean, sd := sum/n, math.Sqrt(sq/n-(sum/n)*(sum/n))
	if math.Abs(mean) > 0.01 || math.Abs(sd-1) > 0.01 {
		t.Errorf("mean %v, std %v of %v draws: want about 0 and 1", mean, sd, n)
	}
	for i, want := range map[int]uint64{
		0:      0x3ff34b4c7c2407e0, // 1.2058834885833605
		1:      0x3f98fa91163c47dd, // 0.024393336279054146
		131071: 0x3fb9a56849527997, // 0.10018016615001667
		131072: 0xbff0083ac5c68f7d, // -1.002009174881976
		393216: 0x3fd0676d851694c4, // 0.2563127326669241, the last, alone in its pair
	} {
		if b := math.Float64bits(got.F64[i]); b != want {
			t.Errorf("element %d is %v (%#x), want %v (%#x)", i, got.F64[i], b, math.Float64frombits(want), want)
		}
	}
	bf, err := Normal(0.02, 3).Materialize(TensorType{BFloat16, Shape{3}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint32{0x3c790000, 0x3b520000, 0xbc0f0000} { // 0.015197754, 0.0032043457, -0.008728027
		if b := math.Float32bits(bf.F32[i]); b != want {
			t.Errorf("bfloat16 element %d is %v (%#x), want %v (%#x)", i, bf.F32[i], b, math.Float32frombits(want), want)
		}
	}
}

// TestPCGAdvance checks the jump ahead against drawing in order, from
// several states and over strides of every size the initializer uses.
func TestPCGAdvance(t *testing.T) {
	if !pcgJumps() {
		t.Fatal("a PCG started at a jumped state does not continue the stream: the normal initializer runs on one core")
	}
	for _, s := range []u128{{0, 0}, {0, normalSeq}, {42, normalSeq}, {^uint64(0), ^uint64(0)}} {
		inOrder := rand.NewPCG(s.hi, s.lo)
		var done uint64
		for _, k := range []uint64{0, 1, 2, 3, 5, 64, 1000, 2 * normalChunkPairs, 2*normalChunkPairs + 1, 1 << 20} {
			for ; done < k; done++ {
				inOrder.Uint64()
			}
			j := pcgAdvance(s, k)
			jumped := rand.NewPCG(j.hi, j.lo)
			probe := rand.NewPCG(0, 0)
			*probe = *inOrder
			for i := range 3 {
				if a, b := probe.Uint64(), jumped.Uint64(); a != b {
					t.Fatalf("from %#x:%#x, draw %d after a jump of %d is %#x, in order %#x", s.hi, s.lo, i, k, b, a)
				}
			}
		}
	}
}

// The normal initializer of a [4096, 4096] float32 weight, as the sequential
// loop did it and as Materialize does it now:
//
//	go test -run XXX -bench Normal ./graph/
func BenchmarkNormalSequential4096(b *testing.B) {
	tt := TensorType{Float32, Shape{4096, 4096}}
	for b.Loop() {
		referenceNormal(tt, 7, 0.02)
	}
}

func BenchmarkNormalMaterialize4096(b *testing.B) {
	tt := TensorType{Float32, Shape{4096, 4096}}
	for b.Loop() {
		if _, err := Normal(0.02, 7).Materialize(tt); err != nil {
			b.Fatal(err)
		}
	}
}
