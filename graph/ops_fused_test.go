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
		{"Transpose(i0)", "Transpose takes its parameters in <...>"},
		{"Transpose<1,0>(i0,i1)", "Transpose takes 1 operands, got 2"},
	} {
		_, err := ParseFusedBody(tc.body, 2)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("body %q: error %v, want %q", tc.body, err, tc.want)
		}
	}
	for _, body := range []string{"Sigmoid(i0);Mul(i0,t0);Where(i1,t1,i0)", "Slice<3,-2,64>(i0);Neg(t0);Concat<-1>(t1,i1);ReduceSum(t2)",
		"Transpose<0,2,1,3>(i0);Mul(t0,i1);Transpose<0,2,1,3>(t1)"} {
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

// A Transpose step is ONNX Transpose with its perm: its type comes from the
// op's inference (a perm that does not fit the operand's rank is an error
// naming the step), and it evaluates to the permuted tensor.
func TestFusedTransposeStep(t *testing.T) {
	x := NewTensor(Float64, Shape{2, 3, 2})
	for i := range x.Len() {
		x.Set(i, float64(i))
	}
	attrs := Attrs{"body": Str("Transpose<1,0,2>(i0);Neg(t0)"), "outputs": Ints(1)}
	out, err := Eval("FusedElementwise", attrs, x)
	if err != nil {
		t.Fatal(err)
	}
	if !out[0].Shape.Equal(Shape{3, 2, 2}) {
		t.Fatalf("shape %v, want [3,2,2]", out[0].Shape)
	}
	// y[a][b][c] = -x[b][a][c]
	for a := range 3 {
		for b := range 2 {
			for c := range 2 {
				if got, want := out[0].At((a*2+b)*2+c), -x.At((b*3+a)*2+c); got != want {
					t.Errorf("y[%d,%d,%d] = %v, want %v", a, b, c, got, want)
				}
			}
		}
	}
	b := NewBuilder("f")
	in := b.Input("x", Float32, 2, 3, 4)
	b.OpN("FusedElementwise", Attrs{"body": Str("Transpose<1,0>(i0)"), "outputs": Ints(0)}, in)
	if b.Err() == nil || !strings.Contains(b.Err().Error(), "step 0 (Transpose)") || !strings.Contains(b.Err().Error(), "rank 3") {
		t.Errorf("a perm of the wrong rank: %v", b.Err())
	}
	b2 := NewBuilder("g")
	b2.OpN("FusedElementwise", Attrs{"body": Str("Transpose<0,0,2>(i0)"), "outputs": Ints(0)}, b2.Input("x", Float32, 2, 3, 4))
	if b2.Err() == nil || !strings.Contains(b2.Err().Error(), "not a permutation") {
		t.Errorf("a perm that repeats an axis: %v", b2.Err())
	}
}
