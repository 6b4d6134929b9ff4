package graph

import (
	"math"
	"strings"
	"testing"
)

// TestTrainingOptimizers works one step of each optimizer out by hand from
// the ONNX pseudo code, on X = 2, G = 1 with norm_coefficient 0.5 (so the
// regularized gradient g is 0.5·2 + 1 = 2), R = 0.5, and checks that a
// second tensor in the same node is updated on its own.
func TestTrainingOptimizers(t *testing.T) {
	r := f64Tensor(Shape{}, 0.5)
	step := func(v int64) *Tensor { return i64Tensor(Shape{}, v) }
	one := func(v float64) *Tensor { return f64Tensor(Shape{1}, v) }
	for _, c := range []struct {
		name  string
		op    string
		attrs Attrs
		in    []*Tensor
		want  []float64
	}{
		// r = 0.5/(1 + 2·0.25) = 1/3; H' = 5 + 4 = 9; X' = 2 − (1/3)·2/(3 + 0.5) = 38/21.
		{"adagrad", "Adagrad", Attrs{"decay_factor": Float(0.25), "epsilon": Float(0.5), "norm_coefficient": Float(0.5)},
			[]*Tensor{r, step(2), one(2), one(1), one(5)}, []float64{38.0 / 21, 9}},
		// V' = 0.5·1 + 0.5·2 = 1.5; H' = 0.75·3 + 0.25·4 = 3.25;
		// r = 0.5·√(1 − 0.75²)/(1 − 0.5²); X' = 0.5·(2 − r·1.5/(√3.25 + 0.5)).
		{"adam", "Adam", Attrs{"alpha": Float(0.5), "beta": Float(0.75), "epsilon": Float(0.5), "norm_coefficient": Float(0.5), "norm_coefficient_post": Float(0.5)},
			[]*Tensor{r, step(2), one(2), one(1), one(1), one(3)}, []float64{0.8563824853519819, 1.5, 3.25}},
		// At T = 0 the rate is R itself: X' = 0.5·(2 − 0.5·1.5/(√3.25 + 0.5)).
		{"adam first step", "Adam", Attrs{"alpha": Float(0.5), "beta": Float(0.75), "epsilon": Float(0.5), "norm_coefficient": Float(0.5), "norm_coefficient_post": Float(0.5)},
			[]*Tensor{r, step(0), one(2), one(1), one(1), one(3)}, []float64{0.5 * (2 - 0.75/(math.Sqrt(3.25)+0.5)), 1.5, 3.25}},
		// V' = 0.5·4 + 0.25·2 = 2.5; X' = 2 − 0.5·2.5.
		{"momentum", "Momentum", Attrs{"alpha": Float(0.5), "beta": Float(0.25), "norm_coefficient": Float(0.5), "mode": Str("standard")},
			[]*Tensor{r, step(3), one(2), one(1), one(4)}, []float64{0.75, 2.5}},
		// X' = 2 − 0.5·(2 + 0.5·2.5).
		{"nesterov", "Momentum", Attrs{"alpha": Float(0.5), "beta": Float(0.25), "norm_coefficient": Float(0.5), "mode": Str("nesterov")},
			[]*Tensor{r, step(3), one(2), one(1), one(4)}, []float64{0.375, 2.5}},
		// At T = 0 beta is taken as 1: V' = 0.5·4 + 2 = 4; X' = 2 − 0.5·4.
		{"momentum first step", "Momentum", Attrs{"alpha": Float(0.5), "beta": Float(0.25), "norm_coefficient": Float(0.5), "mode": Str("standard")},
			[]*Tensor{r, step(0), one(2), one(1), one(4)}, []float64{0, 4}},
	} {
		out, err := Eval(c.op, c.attrs, c.in...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(out) != len(c.want) {
			t.Fatalf("%s: %d outputs, want %d", c.name, len(out), len(c.want))
		}
		for i, w := range c.want {
			if got := out[i].At(0); math.Abs(got-w) > 1e-12 {
				t.Errorf("%s: output %d = %v, want %v", c.name, i, got, w)
			}
		}
		// Two tensors in one node ([R, T, X1, X2, G1, G2, S1, S2]; outputs
		// [X1', X2', S1', S2']): each is updated as in a node of its own.
		k := len(c.in) - 2
		second := []*Tensor{c.in[0], c.in[1]}
		two := []*Tensor{c.in[0], c.in[1]}
		for j := range k {
			v := one(float64(j + 1)) // X = 1, G = 2, states 3 (and 4)
			second = append(second, v)
			two = append(two, c.in[2+j], v)
		}
		alone, err := Eval(c.op, c.attrs, second...)
		if err != nil {
			t.Fatalf("%s, second tensor: %v", c.name, err)
		}
		out2, err := Eval(c.op, c.attrs, two...)
		if err != nil {
			t.Fatalf("%s, two tensors: %v", c.name, err)
		}
		for i := range c.want {
			if got, want := out2[2*i].At(0), out[i].At(0); got != want {
				t.Errorf("%s, two tensors: output %d = %v, want %v", c.name, 2*i, got, want)
			}
			if got, want := out2[2*i+1].At(0), alone[i].At(0); got != want {
				t.Errorf("%s, two tensors: output %d = %v, want %v", c.name, 2*i+1, got, want)
			}
		}
	}
}

// TestTrainingOptimizersRefuse: malformed nodes are errors naming the
// problem.
func TestTrainingOptimizersRefuse(t *testing.T) {
	r, step := f64Tensor(Shape{}, 0.1), i64Tensor(Shape{}, 1)
	x := f64Tensor(Shape{2}, 1, 2)
	mom := Attrs{"alpha": Float(0.9), "beta": Float(1), "norm_coefficient": Float(0), "mode": Str("standard")}
	for _, c := range []struct {
		name, op string
		attrs    Attrs
		in       []*Tensor
		want     string
	}{
		{"group count", "Adagrad", nil, []*Tensor{r, step, x, x}, "want 3 groups"},
		{"shape", "Adagrad", nil, []*Tensor{r, step, x, x, f64Tensor(Shape{1}, 1)}, "the tensor it belongs to"},
		{"T type", "Adam", nil, []*Tensor{r, f64Tensor(Shape{}, 1), x, x, x, x}, "T must be an int64 scalar"},
		{"R shape", "Adam", nil, []*Tensor{x, step, x, x, x, x}, "R must be a float scalar"},
		{"integer tensors", "Momentum", mom, []*Tensor{r, step, step, step, step}, "not a float type"},
		{"mode", "Momentum", Attrs{"alpha": Float(0.9), "beta": Float(1), "norm_coefficient": Float(0), "mode": Str("heavy")}, []*Tensor{r, step, x, x, x}, "neither standard nor nesterov"},
		{"required", "Momentum", Attrs{"alpha": Float(0.9)}, []*Tensor{r, step, x, x, x}, "beta"},
	} {
		if _, err := Eval(c.op, c.attrs, c.in...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestTrainingOpsText: a node of the training domain writes its domain in
// the canonical text, which parses back to the same graph.
func TestTrainingOpsText(t *testing.T) {
	b := NewBuilder("train")
	r, step := b.Input("r", Float32), b.Input("t", Int64)
	x, g, h := b.Input("x", Float32, 3), b.Input("g", Float32, 3), b.Input("h", Float32, 3)
	b.Output(b.OpN("Adagrad", Attrs{"epsilon": Float(1e-5)}, r, step, x, g, h)...)
	gr, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	text := Format(gr)
	if !strings.Contains(text, "ai.onnx.preview.training.Adagrad(") {
		t.Fatalf("the text does not name the op with its domain:\n%s", text)
	}
	back, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	if Format(back) != text {
		t.Fatalf("round trip changed the text:\n%s\nwant\n%s", Format(back), text)
	}
}
