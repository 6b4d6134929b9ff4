package flashattn_test

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/backend/cpu/flashattn"
)

// A float64 graph carries a float64 logsumexp from Forward to Backward.
func Example() {
	const bh, sq, sk, d = 1, 2, 2, 1
	q := []float64{1, 2}
	k := []float64{1, 1}
	v := []float64{3, 5}
	o := make([]float64, bh*sq*d)
	lse := make([]float64, bh*sq)
	if err := flashattn.Forward(q, k, v, o, lse, bh, sq, sk, d, 1, true); err != nil {
		panic(err)
	}
	fmt.Printf("O = %.4g, LSE = %.4g (row 0 sees key 0 only; row 1 both, equally)\n", o, lse)
	fmt.Printf("ln 2 + 2 = %.4g\n", math.Log(2)+2)

	do := []float64{1, 1}
	dq, dk, dv := make([]float64, bh*sq*d), make([]float64, bh*sk*d), make([]float64, bh*sk*d)
	if err := flashattn.Backward(q, k, v, o, do, lse, dq, dk, dv, bh, sq, sk, d, 1, true); err != nil {
		panic(err)
	}
	fmt.Printf("dV = %.4g\n", dv)
	// Output:
	// O = [3 4], LSE = [1 2.693] (row 0 sees key 0 only; row 1 both, equally)
	// ln 2 + 2 = 2.693
	// dV = [1.5 0.5]
}
