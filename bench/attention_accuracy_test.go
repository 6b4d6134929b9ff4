package bench

import (
	"math"
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda"
)

// The accuracy inputs are the timing bench's draws for bf16 (same seeds),
// the same normals rounded to fp16 for fp16, and depend on nothing else.
func TestAccuracyInputs(t *testing.T) {
	c := AccuracyCase{DType: "bfloat16", B: 1, H: 2, S: 48, D: 16, Causal: true}
	q, k, v, dout, err := AccuracyInputs(c, 7)
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range [][]uint16{q, k, v, dout} {
		if want := randomBF16(c.Elems(), 7+uint64(i)*0x9e3779b9); !slices.Equal(got, want) {
			t.Errorf("bf16 input %d differs from randomBF16 with the same seed", i)
		}
	}
	q2, _, _, _, _ := AccuracyInputs(c, 7)
	if !slices.Equal(q, q2) {
		t.Error("same seed, different inputs")
	}
	h := c
	h.DType = "float16"
	hq, _, _, _, err := AccuracyInputs(h, 7)
	if err != nil {
		t.Fatal(err)
	}
	var sum2 float64
	for i := range hq {
		a, b := float64(cuda.F16ToFloat32(hq[i])), float64(cuda.BF16ToFloat32(q[i]))
		// One normal rounded two ways: apart by at most bf16's half-ulp
		// (2⁻⁸ relative) plus fp16's (2⁻¹¹ relative, 2⁻²⁵ among subnormals).
		if math.Abs(a-b) > math.Abs(b)*(1.0/256+1.0/2048)+0x1p-25 {
			t.Fatalf("element %d: fp16 %v, bf16 %v: not the same normal", i, a, b)
		}
		sum2 += a * a
	}
	if rms := math.Sqrt(sum2 / float64(len(hq))); rms < 0.8 || rms > 1.2 {
		t.Errorf("fp16 inputs have rms %v, want about 1", rms)
	}
	if got := c.Scale(); got != float32(0.25) {
		t.Errorf("scale %v, want 1/√16", got)
	}
}

func TestCheckAccuracyCases(t *testing.T) {
	ok := AccuracyCase{DType: "float16", B: 1, H: 4, S: 1024, D: 128}
	if err := CheckAccuracyCases([]AccuracyCase{ok}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]AccuracyCase{
		nil,
		{{DType: "float32", B: 1, H: 4, S: 1024, D: 128}},
		{ok, {DType: "bfloat16", B: 1, H: 0, S: 1024, D: 128}},
	} {
		if err := CheckAccuracyCases(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if _, _, _, _, err := AccuracyInputs(AccuracyCase{DType: "int8", B: 1, H: 1, S: 1, D: 1}, 1); err == nil {
		t.Error("AccuracyInputs took an int8 case")
	}
}
