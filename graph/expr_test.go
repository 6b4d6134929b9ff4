package graph

import (
	"math"
	"math/rand/v2"
	"testing"
)

// knownValues pin each elementwise definition to values worked out by
// hand or by an identity, independently of its expression: a definition
// that drifts (a wrong primitive, a swapped operand) fails here first.
var knownValues = []struct {
	op   string
	x    []float64
	want float64
}{
	{"Add", []float64{2, 3}, 5}, {"Sub", []float64{2, 3}, -1}, {"Mul", []float64{2, 3}, 6},
	{"Div", []float64{3, 2}, 1.5}, {"Pow", []float64{2, 10}, 1024}, {"Neg", []float64{2}, -2},
	{"Sqrt", []float64{9}, 3}, {"Reciprocal", []float64{4}, 0.25}, {"Exp", []float64{1}, math.E},
	{"Log", []float64{math.E}, 1}, {"Sigmoid", []float64{0}, 0.5}, {"Sigmoid", []float64{-800}, 0},
	{"Tanh", []float64{0}, 0}, {"Relu", []float64{-2}, 0}, {"Relu", []float64{2}, 2},
	{"Erf", []float64{0}, 0}, {"Abs", []float64{-3}, 3},
	{"Softplus", []float64{0}, math.Ln2}, {"Softplus", []float64{800}, 800}, {"Softplus", []float64{-40}, 4.248354255291589e-18},
	{"Mish", []float64{1}, 0.8650983882673103}, {"Mish", []float64{-30}, -2.807286890651921e-12},
	{"Where", []float64{1, 2, 3}, 2}, {"Where", []float64{0, 2, 3}, 3},
	{"Equal", []float64{2, 2}, 1}, {"Greater", []float64{2, 2}, 0}, {"Greater", []float64{3, 2}, 1},
	// At the ONNX defaults of their attributes (knownAttrValues: others).
	{"LeakyRelu", []float64{-2}, -0.02}, {"LeakyRelu", []float64{3}, 3},
	{"Elu", []float64{-1}, 1/math.E - 1}, {"Elu", []float64{2}, 2}, {"Elu", []float64{-800}, -1},
	{"Celu", []float64{-1}, 1/math.E - 1}, {"Celu", []float64{800}, 800},
	{"Selu", []float64{1}, 1.05070102214813232421875},
	{"Selu", []float64{-1}, 1.05070102214813232421875 * 1.67326319217681884765625 * (1/math.E - 1)},
	{"HardSigmoid", []float64{1}, 0.7}, {"HardSigmoid", []float64{-3}, 0}, {"HardSigmoid", []float64{3}, 1},
	{"HardSwish", []float64{1}, 1 * (1.0/6 + 0.5)}, {"HardSwish", []float64{-4}, 0}, {"HardSwish", []float64{4}, 4},
	{"Softsign", []float64{3}, 0.75}, {"Softsign", []float64{-1}, -0.5},
	{"ThresholdedRelu", []float64{1}, 0}, {"ThresholdedRelu", []float64{1.5}, 1.5}, {"ThresholdedRelu", []float64{-2}, 0},
	{"Shrink", []float64{0.4}, 0}, {"Shrink", []float64{-0.6}, -0.6}, {"Shrink", []float64{2}, 2},
	{"Gelu", []float64{1}, 0.8413447460685429}, {"Gelu", []float64{0}, 0},
	{"PRelu", []float64{-2, 0.25}, -0.5}, {"PRelu", []float64{2, 0.25}, 2},
	{"Floor", []float64{-1.5}, -2}, {"Ceil", []float64{-1.5}, -1},
	{"Round", []float64{2.5}, 2}, {"Round", []float64{-0.5}, 0}, {"Round", []float64{1.5}, 2}, {"Round", []float64{1.2}, 1},
	{"Sign", []float64{-3}, -1}, {"Sign", []float64{0}, 0}, {"Sign", []float64{0.1}, 1},
	{"IsNaN", []float64{math.NaN()}, 1}, {"IsNaN", []float64{math.Inf(1)}, 0},
	{"IsInf", []float64{math.Inf(-1)}, 1}, {"IsInf", []float64{math.Inf(1)}, 1}, {"IsInf", []float64{math.NaN()}, 0}, {"IsInf", []float64{1e308}, 0},
	// Mod's default fmod=0 takes the divisor's sign (Python's %).
	{"Mod", []float64{-7, 3}, 2}, {"Mod", []float64{7, -3}, -2}, {"Mod", []float64{-7, -3}, -1}, {"Mod", []float64{6, -3}, 0},
	{"Min", []float64{2, -3}, -3}, {"Max", []float64{2, -3}, 2},
	{"And", []float64{1, 0}, 0}, {"And", []float64{1, 1}, 1}, {"Or", []float64{1, 0}, 1}, {"Or", []float64{0, 0}, 0},
	{"Xor", []float64{1, 1}, 0}, {"Xor", []float64{0, 1}, 1}, {"Not", []float64{0}, 1}, {"Not", []float64{1}, 0},
	{"Sin", []float64{math.Pi / 6}, 0.5}, {"Cos", []float64{math.Pi / 3}, 0.5}, {"Tan", []float64{math.Pi / 4}, 1},
	{"Asin", []float64{0.5}, math.Pi / 6}, {"Acos", []float64{0.5}, math.Pi / 3}, {"Atan", []float64{1}, math.Pi / 4},
	{"Sinh", []float64{math.Ln2}, 0.75}, {"Cosh", []float64{math.Ln2}, 1.25},
	{"BitShift", []float64{3, 4}, 48}, {"BitShift", []float64{5, 0}, 5},
	{"Asinh", []float64{0.75}, math.Ln2}, {"Acosh", []float64{1.25}, math.Ln2}, {"Atanh", []float64{0.6}, math.Ln2},
}

// knownAttrValues pin the ops whose expressions read attributes at values
// other than the defaults.
var knownAttrValues = []struct {
	op    string
	attrs Attrs
	x     []float64
	want  float64
}{
	{"LeakyRelu", Attrs{"alpha": Float(0.5)}, []float64{-3}, -1.5},
	{"Elu", Attrs{"alpha": Float(2)}, []float64{-1}, 2 * (1/math.E - 1)},
	{"Celu", Attrs{"alpha": Float(2)}, []float64{-2}, 2 * (1/math.E - 1)},
	{"Selu", Attrs{"alpha": Float(2), "gamma": Float(3)}, []float64{-1}, 6 * (1/math.E - 1)},
	{"Selu", Attrs{"alpha": Float(2), "gamma": Float(3)}, []float64{2}, 6},
	{"HardSigmoid", Attrs{"alpha": Float(0.5), "beta": Float(0.25)}, []float64{1}, 0.75},
	{"ThresholdedRelu", Attrs{"alpha": Float(2)}, []float64{1.5}, 0},
	{"Shrink", Attrs{"bias": Float(1), "lambd": Float(1.5)}, []float64{2}, 1},
	{"Shrink", Attrs{"bias": Float(1), "lambd": Float(1.5)}, []float64{-2}, -1},
	{"Shrink", Attrs{"bias": Float(1), "lambd": Float(1.5)}, []float64{1.5}, 0},
	{"Gelu", Attrs{"approximate": Str("tanh")}, []float64{1}, 0.8411919906082768},
	{"IsInf", Attrs{"detect_negative": Int(0)}, []float64{math.Inf(-1)}, 0},
	{"IsInf", Attrs{"detect_negative": Int(0)}, []float64{math.Inf(1)}, 1},
	{"IsInf", Attrs{"detect_positive": Int(0)}, []float64{math.Inf(1)}, 0},
	{"IsInf", Attrs{"detect_positive": Int(0)}, []float64{math.Inf(-1)}, 1},
	{"BitShift", Attrs{"direction": Str("RIGHT")}, []float64{200, 3}, 25},
	{"BitShift", Attrs{"direction": Str("RIGHT")}, []float64{7, 63}, 0},
	{"Mod", Attrs{"fmod": Int(1)}, []float64{-7, 3}, -1},
	{"Mod", Attrs{"fmod": Int(1)}, []float64{7.5, -2}, 1.5},
}

func TestExprKnownValues(t *testing.T) {
	for _, c := range knownValues {
		s, ok := LookupOp(c.op)
		if !ok || s.Expr == nil {
			t.Errorf("%s is not defined by an expression", c.op)
			continue
		}
		m, err := s.MapFor(nil)
		if err != nil {
			t.Errorf("%s: %v", c.op, err)
			continue
		}
		if got := m.Float(c.x); math.Abs(got-c.want) > 1e-15*math.Max(1, math.Abs(c.want)) {
			t.Errorf("%s%v = %v, want %v", c.op, c.x, got, c.want)
		}
	}
	for _, c := range knownAttrValues {
		s, _ := LookupOp(c.op)
		m, err := s.MapFor(c.attrs)
		if err != nil {
			t.Errorf("%s %v: %v", c.op, c.attrs, err)
			continue
		}
		if got := m.Float(c.x); math.Abs(got-c.want) > 1e-15*math.Max(1, math.Abs(c.want)) {
			t.Errorf("%s%v%v = %v, want %v", c.op, c.attrs, c.x, got, c.want)
		}
	}
	// Every definition has a known value: a new op adds one line above.
	has := map[string]bool{}
	for _, c := range knownValues {
		has[c.op] = true
	}
	for _, s := range ExprOps() {
		if !has[s.Name] {
			t.Errorf("%s has no known value in knownValues", s.Name)
		}
	}
}

// The integer forms: wrapping arithmetic, truncating division that refuses
// a zero divisor, and none for the float functions.
func TestExprIntForms(t *testing.T) {
	div, _ := LookupOp("Div")
	if v, err := div.Map.Int([]int64{-7, 2}); err != nil || v != -3 {
		t.Errorf("Div(-7, 2) = %d, %v; want -3", v, err)
	}
	if _, err := div.Map.Int([]int64{1, 0}); err == nil {
		t.Error("Div(1, 0) in int64 gave no error")
	}
	if exp, _ := LookupOp("Exp"); exp.Map.Int != nil {
		t.Error("Exp has an integer form")
	}
}

// TestExprDerivFiniteDifference checks each definition's symbolic
// derivative against central differences of the definition itself, in
// float64, away from kinks (|x| ≥ 0.2) and on positive values where an op
// needs them.
func TestExprDerivFiniteDifference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	const h = 1e-6
	type at struct {
		s     *OpSpec
		attrs Attrs
	}
	var cases []at
	for _, s := range ExprOps() {
		cases = append(cases, at{s, nil})
	}
	for _, c := range knownAttrValues {
		s, _ := LookupOp(c.op)
		cases = append(cases, at{s, c.attrs})
	}
	for _, c := range cases {
		s := c.s
		e, err := s.ExprFor(c.attrs)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		n := len(s.Inputs)
		f := e.CompileFloat()
		for i := range n {
			d := e.Deriv(i).CompileFloat()
			for range 20 {
				x := make([]float64, n)
				for k := range x {
					x[k] = (0.2 + 1.8*rng.Float64()) * float64(1-2*rng.IntN(2))
					switch {
					case s.Name == "Pow" && k == 0 || s.Name == "Sqrt" || s.Name == "Log":
						x[k] = math.Abs(x[k])
					case s.Name == "Asin" || s.Name == "Acos" || s.Name == "Atanh" || s.Name == "Tan":
						x[k] /= 2.1 // inside (−1, 1); Tan away from ±π/2
					case s.Name == "Acosh":
						x[k] = 1.2 + math.Abs(x[k])
					}
				}
				if s.Name == "Where" {
					x[0] = float64(rng.IntN(2))
				}
				at := func(v float64) float64 {
					y := append([]float64(nil), x...)
					y[i] = v
					return f(y)
				}
				fd := (at(x[i]+h) - at(x[i]-h)) / (2 * h)
				if s.Name == "Where" && i == 0 {
					fd = 0 // the condition is not differentiated
				}
				if got := d(x); math.Abs(got-fd) > 1e-6*math.Max(1, math.Abs(fd)) {
					t.Errorf("∂%s%v/∂x%d at %v: %v, finite difference %v (%v)", s.Name, c.attrs, i, x, got, fd, e.Deriv(i))
				}
			}
		}
	}
}

// MatchOp names, for each definition, an op with that very definition (the
// largest pattern that matches), and finds nothing for a primitive no op
// computes at its root.
func TestMatchOp(t *testing.T) {
	for _, s := range ExprOps() {
		if s.HasExprAttrs() || s.noMatch {
			continue // bound per node, or never matched (And is a product of bools)
		}
		op, operands, ok := MatchOp(s.Expr)
		if !ok {
			t.Errorf("%s: no op matches its own expression", s.Name)
			continue
		}
		m, _ := LookupOp(op)
		if m.Expr.String() != s.Expr.String() {
			t.Errorf("%s matched %s (%v)", s.Name, op, m.Expr)
		}
		for k, o := range operands {
			if o.String() != ExprVar(k).String() {
				t.Errorf("%s: operand %d bound to %v", s.Name, k, o)
			}
		}
	}
	if op, _, ok := MatchOp(ExprOf(PrimLog1p, ExprVar(0))); ok {
		t.Errorf("log1p(x0) matched %s; no op computes it", op)
	}
}

// The derivatives reuse the forward value where a primitive's rule is
// written with it, and fold away what is identically zero or one.
func TestExprVJPForms(t *testing.T) {
	for _, c := range []struct{ op, want string }{
		{"Add", "x2"}, {"Sub", "neg(x2)"}, {"Mul", "mul(x2,x1)"}, {"Log", "div(x1,x0)"},
		{"Exp", "mul(x1,exp(x0))"}, {"Sigmoid", "mul(x1,mul(sigmoid(x0),sub(1,sigmoid(x0))))"},
		{"Relu", "select(gt(x0,0),x1,0)"}, {"Sqrt", "div(mul(x1,0.5),sqrt(x0))"},
	} {
		s, _ := LookupOp(c.op)
		i, dy := 0, len(s.Inputs)
		if c.op == "Sub" {
			i = 1
		}
		if got := s.Expr.VJP(i, dy).String(); got != c.want {
			t.Errorf("%s: VJP %s, want %s", c.op, got, c.want)
		}
	}
	where, _ := LookupOp("Where")
	if g := where.Expr.VJP(0, 3); g != nil {
		t.Errorf("Where's condition has a cotangent: %v", g)
	}
}
