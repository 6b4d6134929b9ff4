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
	} {
		_, err := ParseFusedBody(tc.body, 2)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("body %q: error %v, want %q", tc.body, err, tc.want)
		}
	}
	steps, err := ParseFusedBody("Sigmoid(i0);Mul(i0,t0);Where(i1,t1,i0)", 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := FormatFusedBody(steps); got != "Sigmoid(i0);Mul(i0,t0);Where(i1,t1,i0)" {
		t.Errorf("FormatFusedBody = %q", got)
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
