package flashattn

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// repeatHeads returns x [bh/group, s, d] with each head repeated group times
// in place ([bh, s, d], head h a copy of head h/group): what repeat_kv
// materialises.
func repeatHeads(x []float64, bh, group, s, d int) []float64 {
	y := make([]float64, bh*s*d)
	for h := range bh {
		copy(y[h*s*d:(h+1)*s*d], x[h/group*s*d:(h/group+1)*s*d])
	}
	return y
}

// sumGroups folds a gradient of repeated heads back onto the K/V heads.
func sumGroups(x []float64, bh, group, s, d int) []float64 {
	y := make([]float64, bh/group*s*d)
	for h := range bh {
		for i := range s * d {
			y[h/group*s*d+i] += x[h*s*d+i]
		}
	}
	return y
}

// TestGroupedMatchesRepeated: grouped-query attention is attention over
// K and V with each head repeated for its group (forward), and dK, dV are
// the repeated heads' gradients summed over each group (backward). Both
// sides run this package's kernels in float64, so they agree to rounding:
// the sums differ only in order (1e-12 is ~1000 ulp of the values here).
func TestGroupedMatchesRepeated(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, c := range []struct{ bh, group, sq, sk, d int }{
		{4, 2, 70, 70, 8},  // H=4, H_kv=2: ragged tiles
		{4, 4, 65, 130, 8}, // MQA, Sq ≠ Sk
		{6, 3, 5, 5, 4},    // two batches of 3 heads on 1 K/V head each
	} {
		for _, causal := range []bool{false, true} {
			s := shape{bh: c.bh, sq: c.sq, sk: c.sk, d: c.d, causal: causal}
			t.Run(fmt.Sprintf("%v_group%d", s, c.group), func(t *testing.T) {
				nkv := c.bh / c.group
				q, do := randn(rng, s.nq()), randn(rng, s.nq())
				k, v := randn(rng, nkv*c.sk*c.d), randn(rng, nkv*c.sk*c.d)
				kr, vr := repeatHeads(k, c.bh, c.group, c.sk, c.d), repeatHeads(v, c.bh, c.group, c.sk, c.d)
				o, dq, dkr, dvr := grads[float64, float64](t, s, q, kr, vr, do)

				og, lse := nans[float64](s.nq()), nans[float64](s.bh*s.sq)
				if err := ForwardGrouped(q, k, v, og, lse, c.bh, c.group, c.sq, c.sk, c.d, s.getScale(), causal); err != nil {
					t.Fatal(err)
				}
				checkClose(t, "O", og, o, 1e-12, 1e-12)
				dqg, dkg, dvg := nans[float64](s.nq()), nans[float64](len(k)), nans[float64](len(v))
				if err := BackwardGrouped(q, k, v, og, do, lse, dqg, dkg, dvg, c.bh, c.group, c.sq, c.sk, c.d, s.getScale(), causal); err != nil {
					t.Fatal(err)
				}
				checkClose(t, "dQ", dqg, dq, 1e-12, 1e-12)
				checkClose(t, "dK", dkg, sumGroups(dkr, c.bh, c.group, c.sk, c.d), 1e-12, 1e-12)
				checkClose(t, "dV", dvg, sumGroups(dvr, c.bh, c.group, c.sk, c.d), 1e-12, 1e-12)
			})
		}
	}
}

// TestGroupedDeterministicAcrossWorkers: a K/V head's dK, dV sum its group
// in one task, so any worker count gives the same bits.
func TestGroupedDeterministicAcrossWorkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	bh, group, sq, sk, d := 8, 4, 130, 130, 16
	q, do := convert[float32](randn(rng, bh*sq*d)), convert[float32](randn(rng, bh*sq*d))
	k, v := convert[float32](randn(rng, bh/group*sk*d)), convert[float32](randn(rng, bh/group*sk*d))
	run := func(workers int) (o, dk, dv []float32) {
		o, lse := make([]float32, bh*sq*d), make([]float32, bh*sq)
		if err := forward(q, k, v, o, lse, bh, group, sq, sk, d, 0.25, true, workers); err != nil {
			t.Fatal(err)
		}
		dq := make([]float32, bh*sq*d)
		dk, dv = make([]float32, len(k)), make([]float32, len(v))
		if err := backward(q, k, v, o, do, lse, dq, dk, dv, bh, group, sq, sk, d, 0.25, true, workers); err != nil {
			t.Fatal(err)
		}
		return o, dk, dv
	}
	o1, dk1, dv1 := run(1)
	o4, dk4, dv4 := run(4)
	for i := range o1 {
		if o1[i] != o4[i] {
			t.Fatalf("O[%d]: %v with 1 worker, %v with 4", i, o1[i], o4[i])
		}
	}
	for i := range dk1 {
		if dk1[i] != dk4[i] || dv1[i] != dv4[i] {
			t.Fatalf("dK/dV[%d] differ between 1 and 4 workers", i)
		}
	}
}

func TestGroupedRefusesBadGroup(t *testing.T) {
	x := make([]float32, 3*2*4)
	for _, group := range []int{0, 2, -1} {
		err := ForwardGrouped(x, x, x, x, []float32(nil), 3, group, 2, 2, 4, 1, false)
		if !errors.Is(err, ErrShape) {
			t.Errorf("group %d of bh 3: error %v, want ErrShape", group, err)
		}
	}
}
