package sgemm

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
)

// TestAccMatchesGonumBits: Acc and Mul give gonum's Sgemm bits (beta 1 and
// 0), element for element, with A plain and transposed, with each kernel, on shapes with and without edges
// (rows past a block of 4, columns past a block of 16), with padded leading
// dimensions, accumulating into a C that holds values, and with the values
// where skipping a zero term shows: zeros in A against infinities and NaNs
// in B, and signed zeros in A, B and C.
func TestAccMatchesGonumBits(t *testing.T) {
	if !have16 {
		t.Skip("no AVX2 here: Acc is gonum itself")
	}
	// Both kernels: with AVX-512 the 16-wide one computes only a last
	// block of 16 columns, so run once more without it.
	widths := []bool{false}
	if have32 {
		widths = append(widths, true)
	}
	defer func(h bool) { have32 = h }(have32)
	for _, wide := range widths {
		have32 = wide
		testAccBits(t)
	}
}

func testAccBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := [][3]int{{4, 16, 1}, {4, 16, 7}, {8, 32, 64}, {5, 17, 3}, {67, 45, 129}, {128, 96, 256}, {3, 40, 9}, {9, 15, 20}, {8, 48, 33}, {12, 80, 5}, {64, 768, 256}}
	for _, sh := range shapes {
		m, n, k := sh[0], sh[1], sh[2]
		for _, tA := range []bool{false, true} {
			for _, special := range []bool{false, true} {
				for _, pad := range []int{0, 3} {
					ar, ac := m, k
					if tA {
						ar, ac = k, m
					}
					lda, ldb, ldc := ac+pad, n+pad, n+pad
					a := randF32(rng, (ar-1)*lda+ac)
					b := randF32(rng, (k-1)*ldb+n)
					c := randF32(rng, (m-1)*ldc+n)
					if special {
						for i := 0; i < len(a); i += 37 {
							a[i] = 0
						}
						a[len(a)/2] = negZero
						b[0] = float32(math.Inf(1))
						b[len(b)/3] = float32(math.NaN())
						b[len(b)/2] = negZero
						b[len(b)-1] = float32(math.Inf(-1))
						for i := 0; i < len(c); i += 5 {
							c[i] = negZero
						}
					}
					for _, acc := range []bool{false, true} {
						beta := float32(0)
						if acc {
							beta = 1
						}
						want := append([]float32(nil), c...)
						impl.Sgemm(trans(tA), blas.NoTrans, m, n, k, 1, a, lda, b, ldb, beta, want, ldc)
						for _, par := range []bool{false, true} {
							got := append([]float32(nil), c...)
							if acc {
								Acc(tA, m, n, k, a, lda, b, ldb, got, ldc, par)
							} else {
								Mul(tA, m, n, k, a, lda, b, ldb, got, ldc, par)
							}
							for i := range m {
								for j := range n {
									w, g := want[i*ldc+j], got[i*ldc+j]
									if math.Float32bits(w) != math.Float32bits(g) && !(w != w && g != g) {
										t.Fatalf("m=%d n=%d k=%d tA=%v acc=%v wide=%v special=%v pad=%d par=%v: C[%d,%d] = %v (%#x), gonum %v (%#x)", m, n, k, tA, acc, have32, special, pad, par, i, j, g, math.Float32bits(g), w, math.Float32bits(w))
									}
								}
							}
						}
					}
				}
			}
		}
	}
}

var negZero = float32(math.Copysign(0, -1))

func trans(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}

func randF32(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// BenchmarkAcc is the small config's widest product, [2048,256]·[256,768],
// by gonum and by Acc.
func BenchmarkAcc(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	m, n, k := 2048, 768, 256
	x, y, z := randF32(rng, m*k), randF32(rng, k*n), make([]float32, m*n)
	gflops := func(b *testing.B) {
		b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	}
	b.Run("gonum", func(b *testing.B) {
		for b.Loop() {
			impl.Sgemm(blas.NoTrans, blas.NoTrans, m, n, k, 1, x, k, y, n, 0, z, n)
		}
		gflops(b)
	})
	b.Run("Mul", func(b *testing.B) {
		for b.Loop() {
			Mul(false, m, n, k, x, k, y, n, z, n, true)
		}
		gflops(b)
	})
}

// TestZeroIn: the vector scan finds a zero of either sign at every position
// of runs of every length up to 40 (whole vectors and tails), and no zero
// where there is none (NaN, denormals and infinities are not zero).
func TestZeroIn(t *testing.T) {
	if !have16 {
		t.Skip("no AVX2 here")
	}
	denorm := math.Float32frombits(1)
	for n := 1; n <= 40; n++ {
		a := make([]float32, n+1) // a[n] guards against reading past n
		for i := range a {
			a[i] = []float32{1, -2, float32(math.NaN()), denorm, float32(math.Inf(1)), -denorm}[i%6]
		}
		a[n] = 0
		if zeroIn(&a[0], n) {
			t.Fatalf("n=%d: zero found in %v", n, a[:n])
		}
		for i := range n {
			for _, z := range []float32{0, negZero} {
				old := a[i]
				a[i] = z
				if !zeroIn(&a[0], n) {
					t.Fatalf("n=%d: zero at %d (%v) not found", n, i, z)
				}
				a[i] = old
			}
		}
	}
}
