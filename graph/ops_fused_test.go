package graph

import (
	"strings"
	"testing"
)

// Malformed bodies are refused with the step and the reason, never a panic.
func TestParseFusedBodyErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"", "empty body"},
		{"Mul(i0,i1", "want Op(operands)"},
		{"MatMul(i0,i1)", `op "MatMul" cannot be fused`},
		{"Mul(i0,x1)", "want iN (input) or tN (step)"},
		{"Mul(i0,t0)", "not an earlier step"},
		{"Mul(i0,i2)", "the node has 2 inputs"},
		{"Neg(i0,i1)", "takes 1 operands, got 2"},
		{"Mul(i0,i01)", "bad index"},
		{"Mul(i0,i1);;Neg(t0)", "step 1"},
		{"ReduceSum(i0);ReduceMean(t0)", "at most one reduction"},
		{"ReduceSum(i0,i1)", "takes 1 operands, got 2"},
		{"Slice<3,0>(i0)", "Slice takes 3 parameters"},
		{"Slice<3,0,x>(i0)", `parameter "x" is not an integer`},
		{"Mul<1>(i0,i1)", "Mul takes no <...> parameters"},
		{"Concat<1(i0,i1)", "want Op<integers>(operands)"},
	} {
		_, err := ParseFusedBody(tc.body, 2)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("body %q: error %v, want %q", tc.body, err, tc.want)
		}
	}
	for _, body := range []string{"Sigmoid(i0);Mul(i0,t0);Where(i1,t1,i0)", "Slice<3,-2,64>(i0);Neg(t0);Concat<-1>(t1,i1);ReduceSum(t2)"} {
		steps, err := ParseFusedBody(body, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got := FormatFusedBody(steps); got != body {
			t.Errorf("FormatFusedBody = %q, want %q", got, body)
		}
	}
}

// A body's index steps and reduction mean their ops: a rotate-half written
// with Slice and Concat steps, reduced over the last axis, evaluates to the
// same values as the ops applied one by one.
func TestFusedIndexAndReduceEval(t *testing.T) {
	x := NewTensor(Float64, Shape{2, 4})
	for i := range 8 {
		x.Set(i, float64(i+1))
	}
	attrs := Attrs{"body": Str("Slice<1,2,4>(i0);Neg(t0);Slice<1,0,2>(i0);Concat<1>(t1,t2);Mul(t3,t3);ReduceSum(t4)"),
		"outputs": Ints(3, 5), "axes": Ints(-1), "keepdims": Int(0)}
	out, err := Eval("FusedElementwise", attrs, x)
	if err != nil {
		t.Fatal(err)
	}
	rot := []float64{-3, -4, 1, 2, -7, -8, 5, 6}
	for i, want := range rot {
		if got := out[0].At(i); got != want {
			t.Errorf("rotate-half[%d] = %v, want %v", i, got, want)
		}
	}
	if !out[1].Shape.Equal(Shape{2}) || out[1].At(0) != 30 || out[1].At(1) != 174 {
		t.Errorf("row sums of squares %v %v, want [2] 30 174", out[1].Shape, []float64{out[1].At(0), out[1].At(1)})
	}
	if _, err := Eval("FusedElementwise", Attrs{"body": Str("ReduceSum(i0)"), "outputs": Ints(0)}, x); err == nil ||
		!strings.Contains(err.Error(), "axes attribute") {
		t.Errorf("a reduction without axes: error %v", err)
	}
}

// A FusedElementwise node's types come from its steps' own inference, and a
// listed output that is not a step is an error naming it.
func TestFusedElementwiseInference(t *testing.T) {
	b := NewBuilder("f")
	x := b.Input("x", Float32, 2, 3)
	w := b.Input("w", Float32, 3)
	ys := b.OpN("FusedElementwise", Attrs{"body": Str("Mul(i0,i1);Sigmoid(t0)"), "outputs": Ints(1, 0)}, x, w)
	if b.Err() != nil {
		t.Fatal(b.Err())
	}
	if len(ys) != 2 || !ys[0].Type.Equal(TensorType{Float32, Shape{2, 3}}) {
		t.Fatalf("outputs %v", ys)
	}
	b.OpN("FusedElementwise", Attrs{"body": Str("Mul(i0,i1)"), "outputs": Ints(3)}, x, w)
	if b.Err() == nil || !strings.Contains(b.Err().Error(), "outputs[0] = 3") {
		t.Errorf("out-of-range output: %v", b.Err())
	}
	b2 := NewBuilder("g")
	b2.OpN("FusedElementwise", Attrs{"body": Str("Mul(i0,i1)"), "outputs": Ints(0)}, b2.Input("x", Float32, 2, 3), b2.Input("y", Float32, 4))
	if b2.Err() == nil || !strings.Contains(b2.Err().Error(), "step 0 (Mul)") {
		t.Errorf("unbroadcastable operands: %v", b2.Err())
	}
}
