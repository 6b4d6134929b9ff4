package onnx

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// ONNX's activations with parameters import as the table's ops with the
// node's attributes (float32 in the file, so compared at that value) and
// the ONNX semantics, computed here from the operator spec's formulas.
func TestImportActivationAttributes(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 2))
	x := randTensor(rng, graph.Float64, 3, 4)
	for i := range x.F64 {
		x.F64[i] *= 3
	}
	f := func(v float32) float64 { return float64(v) }
	cases := []struct {
		op    string
		attrs []*onnxpb.Attribute
		opset int64
		ref   func(v float64) float64
	}{
		{"LeakyRelu", []*onnxpb.Attribute{aFloat("alpha", 0.3)}, 16, func(v float64) float64 {
			if v < 0 {
				return f(0.3) * v
			}
			return v
		}},
		{"LeakyRelu", nil, 16, func(v float64) float64 { return math.Max(v, 0) + math.Min(v, 0)*0.01 }},
		{"Elu", []*onnxpb.Attribute{aFloat("alpha", 0.7)}, 7, func(v float64) float64 {
			if v < 0 {
				return f(0.7) * (math.Exp(v) - 1)
			}
			return v
		}},
		{"Celu", []*onnxpb.Attribute{aFloat("alpha", 2)}, 12, func(v float64) float64 {
			return math.Max(0, v) + math.Min(0, 2*(math.Exp(v/2)-1))
		}},
		{"Selu", nil, 7, func(v float64) float64 {
			const alpha, gamma = 1.67326319217681884765625, 1.05070102214813232421875
			if v <= 0 {
				return gamma * (alpha*math.Exp(v) - alpha)
			}
			return gamma * v
		}},
		{"HardSigmoid", []*onnxpb.Attribute{aFloat("alpha", 0.25), aFloat("beta", 0.375)}, 7, func(v float64) float64 {
			return math.Max(0, math.Min(1, 0.25*v+0.375))
		}},
		{"HardSwish", nil, 14, func(v float64) float64 { return v * math.Max(0, math.Min(1, v/6+0.5)) }},
		{"Softsign", nil, 7, func(v float64) float64 { return v / (1 + math.Abs(v)) }},
		{"ThresholdedRelu", []*onnxpb.Attribute{aFloat("alpha", 0.5)}, 10, func(v float64) float64 {
			if v > 0.5 {
				return v
			}
			return 0
		}},
		{"Shrink", []*onnxpb.Attribute{aFloat("bias", 0.25), aFloat("lambd", 1)}, 9, func(v float64) float64 {
			switch {
			case v < -1:
				return v + 0.25
			case v > 1:
				return v - 0.25
			}
			return 0
		}},
		{"Round", nil, 11, math.RoundToEven},
		{"Sign", nil, 9, func(v float64) float64 {
			switch {
			case v > 0:
				return 1
			case v < 0:
				return -1
			}
			return 0
		}},
		{"Atan", nil, 7, math.Atan}, {"Sinh", nil, 9, math.Sinh},
	}
	for _, c := range cases {
		m := modelOf(c.opset, []*onnxpb.ValueInfo{vi("x", onnxpb.Double, 3, 4)}, nil, []string{"y"},
			nd(c.op, []string{"x"}, []string{"y"}, c.attrs...))
		g, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
		if ops := g.CountOps(); ops[c.op] != 1 || len(ops) != 1 {
			t.Errorf("%s imported as %v, want the one table op", c.op, ops)
		}
		var want []float64
		for _, v := range data(x) {
			want = append(want, c.ref(v))
		}
		closeTo(t, c.op, out["y"], want, graph.Shape{3, 4}, 1e-15)
	}
}

// Mod follows ONNX's integer semantics (fmod=0: the divisor's sign;
// fmod=1: the dividend's), PRelu's slope broadcasts to X, IsInf reads its
// detect attributes, and the logical ops take bools.
func TestImportModPReluIsInfLogic(t *testing.T) {
	a := graph.NewTensor(graph.Int64, graph.Shape{6})
	b := graph.NewTensor(graph.Int64, graph.Shape{6})
	copy(a.I64, []int64{-7, 7, -7, 7, 6, 0})
	copy(b.I64, []int64{3, -3, -3, 3, -3, 5})
	ints := []*onnxpb.ValueInfo{vi("a", onnxpb.Int64, 6), vi("b", onnxpb.Int64, 6)}
	m := modelOf(13, ints, nil, []string{"m", "f"},
		nd("Mod", []string{"a", "b"}, []string{"m"}),
		nd("Mod", []string{"a", "b"}, []string{"f"}, aInt("fmod", 1)))
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"a": a, "b": b})
	closeTo(t, "mod", out["m"], []float64{2, -2, -1, 1, 0, 0}, graph.Shape{6}, 0)
	closeTo(t, "fmod", out["f"], []float64{-1, 1, -1, 1, 0, 0}, graph.Shape{6}, 0)

	x := graph.NewTensor(graph.Float32, graph.Shape{2, 3})
	copy(x.F32, []float32{-1, 2, -3, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())})
	m = modelOf(13, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 3)},
		[]*onnxpb.Tensor{onnxpb.NewFloat32("slope", []int64{3}, []float32{0.5, 0.25, 2})}, []string{"p", "inf", "neg", "nan"},
		nd("PRelu", []string{"x", "slope"}, []string{"p"}),
		nd("IsInf", []string{"x"}, []string{"inf"}),
		nd("IsInf", []string{"x"}, []string{"neg"}, aInt("detect_positive", 0)),
		nd("IsNaN", []string{"x"}, []string{"nan"}))
	_, out = importAndRun(t, m, map[string]*graph.Tensor{"x": x})
	p := out["p"]
	for i, w := range []float64{-0.5, 2, -6, math.Inf(1), math.Inf(-1)} {
		if p.At(i) != w {
			t.Errorf("PRelu[%d] = %v, want %v", i, p.At(i), w)
		}
	}
	if !math.IsNaN(p.At(5)) {
		t.Errorf("PRelu(NaN) = %v", p.At(5))
	}
	closeTo(t, "isinf", out["inf"], []float64{0, 0, 0, 1, 1, 0}, graph.Shape{2, 3}, 0)
	closeTo(t, "isinf negative", out["neg"], []float64{0, 0, 0, 0, 1, 0}, graph.Shape{2, 3}, 0)
	closeTo(t, "isnan", out["nan"], []float64{0, 0, 0, 0, 0, 1}, graph.Shape{2, 3}, 0)

	p0 := graph.NewTensor(graph.Bool, graph.Shape{4})
	q0 := graph.NewTensor(graph.Bool, graph.Shape{4})
	copy(p0.B, []bool{false, false, true, true})
	copy(q0.B, []bool{false, true, false, true})
	bools := []*onnxpb.ValueInfo{vi("p", onnxpb.Bool, 4), vi("q", onnxpb.Bool, 4)}
	m = modelOf(13, bools, nil, []string{"and", "or", "xor", "not"},
		nd("And", []string{"p", "q"}, []string{"and"}), nd("Or", []string{"p", "q"}, []string{"or"}),
		nd("Xor", []string{"p", "q"}, []string{"xor"}), nd("Not", []string{"p"}, []string{"not"}))
	_, out = importAndRun(t, m, map[string]*graph.Tensor{"p": p0, "q": q0})
	closeTo(t, "and", out["and"], []float64{0, 0, 0, 1}, graph.Shape{4}, 0)
	closeTo(t, "or", out["or"], []float64{0, 1, 1, 1}, graph.Shape{4}, 0)
	closeTo(t, "xor", out["xor"], []float64{0, 1, 1, 0}, graph.Shape{4}, 0)
	closeTo(t, "not", out["not"], []float64{1, 1, 0, 0}, graph.Shape{4}, 0)
}

// An op used at an opset that does not define it, Mod's fmod=0 on floats,
// an attribute of the wrong kind and an unknown Gelu form are refused
// with the reason.
func TestActivationRefusals(t *testing.T) {
	x := []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 3)}
	for _, c := range []struct {
		name string
		m    *onnxpb.Model
		want []string
	}{
		{"celu before 12", modelOf(11, x, nil, []string{"y"}, nd("Celu", []string{"x"}, []string{"y"})), []string{"Celu", "opset 12"}},
		{"hardswish before 14", modelOf(13, x, nil, []string{"y"}, nd("HardSwish", []string{"x"}, []string{"y"})), []string{"HardSwish", "opset 14"}},
		{"mish before 18", modelOf(17, x, nil, []string{"y"}, nd("Mish", []string{"x"}, []string{"y"})), []string{"Mish", "opset 18"}},
		{"round before 11", modelOf(10, x, nil, []string{"y"}, nd("Round", []string{"x"}, []string{"y"})), []string{"opset 11"}},
		{"mod before 10", modelOf(9, x, nil, []string{"y"}, nd("Mod", []string{"x", "x"}, []string{"y"}, aInt("fmod", 1))), []string{"opset 10"}},
		{"sinh before 9", modelOf(8, x, nil, []string{"y"}, nd("Sinh", []string{"x"}, []string{"y"})), []string{"opset 9"}},
		{"float mod fmod 0", modelOf(13, x, nil, []string{"y"}, nd("Mod", []string{"x", "x"}, []string{"y"})), []string{"fmod must be 1"}},
		{"alpha as int", modelOf(13, x, nil, []string{"y"}, nd("LeakyRelu", []string{"x"}, []string{"y"}, aInt("alpha", 1))), []string{"alpha"}},
		{"gelu form", modelOf(20, x, nil, []string{"y"}, nd("Gelu", []string{"x"}, []string{"y"}, aStr("approximate", "sigmoid"))), []string{"sigmoid"}},
		{"and of floats", modelOf(13, x, nil, []string{"y"}, nd("And", []string{"x", "x"}, []string{"y"})), []string{"bool"}},
		{"constant mod with one operand", modelOf(13, x, []*onnxpb.Tensor{onnxpb.NewFloat32("c", []int64{2}, []float32{1, 2})}, []string{"y"},
			nd("Mod", []string{"c"}, []string{"m"}, aInt("fmod", 1)), nd("Add", []string{"x", "m"}, []string{"y"})), []string{"input 1 is required"}},
	} {
		g, err := ImportBytes(onnxpb.Encode(c.m))
		if err == nil {
			t.Errorf("%s: imported:\n%s", c.name, graph.Format(g))
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.name, err, w)
			}
		}
	}
}

// Our graphs with these ops export and import back byte for byte; a Gelu
// raises the declared opset to 20, where ONNX defines it, and an explicit
// older opset is refused.
func TestRoundTripActivations(t *testing.T) {
	b := graph.NewBuilder("acts")
	x := b.Input("x", graph.Float32, 2, 3)
	s := b.Input("s", graph.Float32, 3)
	i := b.Input("i", graph.Int64, 4)
	h := b.Op("LeakyRelu", graph.Attrs{"alpha": graph.Float(0.1)}, x) // 0.1 is no float32
	h = b.Op("Selu", nil, h)
	h = b.Op("HardSigmoid", graph.Attrs{"alpha": graph.Float(0.3), "beta": graph.Float(0.6)}, h)
	h = b.Op("PRelu", nil, h, s)
	h = b.Op("Max", nil, h, b.Op("Sin", nil, x))
	inf := b.Op("IsInf", graph.Attrs{"detect_negative": graph.Int(0)}, h)
	b.Output(b.Op("Gelu", graph.Attrs{"approximate": graph.Str("tanh")}, h), b.Op("Not", nil, inf),
		b.Op("Mod", nil, i, b.Op("Sign", nil, i)))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	m := roundTrip(t, g)
	if v, _ := m.Opset(""); v != 20 {
		t.Errorf("opset %d, want 20 (Gelu)", v)
	}
	if _, err := ExportWith(g, ExportOptions{Opset: 18}); err == nil || !strings.Contains(err.Error(), "Gelu") {
		t.Errorf("export at opset 18 with a Gelu: %v", err)
	}
}
