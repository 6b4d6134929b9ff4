package graph

import (
	"strings"
	"testing"
)

// An expression reads attributes by name; binding replaces them with a
// node's values, defaults where the node has none, and folds what became
// constant (a string attribute's choice of form leaves only that form).
func TestExprForBindsAttributes(t *testing.T) {
	leaky, _ := LookupOp("LeakyRelu")
	if got := leaky.Expr.String(); got != "select(gt(x0,0),x0,mul(x0,@alpha))" {
		t.Errorf("LeakyRelu = %s", got)
	}
	for _, c := range []struct {
		op    string
		attrs Attrs
		want  string
	}{
		{"LeakyRelu", nil, "select(gt(x0,0),x0,mul(x0,0.01))"},
		{"LeakyRelu", Attrs{"alpha": Float(0.5)}, "select(gt(x0,0),x0,mul(x0,0.5))"},
		{"Shrink", Attrs{"lambd": Float(2)}, "select(gt(-2,x0),add(x0,0),select(gt(x0,2),sub(x0,0),0))"},
		{"Mod", Attrs{"fmod": Int(1)}, "fmod(x0,x1)"},
		{"IsInf", Attrs{"detect_negative": Int(0)}, "mul(isinf(x0),add(mul(1,gt(x0,0)),mul(0,gt(0,x0))))"},
		{"Exp", Attrs{"alpha": Float(3)}, "exp(x0)"}, // reads none: Expr itself
	} {
		s, _ := LookupOp(c.op)
		e, err := s.ExprFor(c.attrs)
		if err != nil {
			t.Errorf("%s %v: %v", c.op, c.attrs, err)
			continue
		}
		if e.String() != c.want {
			t.Errorf("%s %v = %s, want %s", c.op, c.attrs, e, c.want)
		}
	}
	gelu, _ := LookupOp("Gelu")
	for form, want := range map[string]string{"none": "erf(", "tanh": "tanh("} {
		e, err := gelu.ExprFor(Attrs{"approximate": Str(form)})
		if err != nil || !strings.Contains(e.String(), want) || strings.Contains(e.String(), "select") {
			t.Errorf("Gelu %s = %v (%v), want only the %s form", form, e, err, want)
		}
	}
	if _, err := gelu.ExprFor(Attrs{"approximate": Str("fast")}); err == nil {
		t.Error("Gelu approximate=fast bound")
	}
	if _, err := leaky.MapFor(Attrs{"alpha": Str("x")}); err == nil {
		t.Error("LeakyRelu alpha=\"x\" bound")
	}
	// A node gets the attribute values checked like any other.
	x := &Value{Type: TensorType{DType: Float32, Shape: Shape{2}}}
	if _, _, err := InferNode("Gelu", []*Value{x}, Attrs{"approximate": Str("fast")}); err == nil || !strings.Contains(err.Error(), "fast") {
		t.Errorf("Gelu node with approximate=fast: %v", err)
	}
	if _, _, err := InferNode("Mod", []*Value{x, x}, nil); err == nil || !strings.Contains(err.Error(), "fmod must be 1") {
		t.Errorf("float Mod with fmod=0: %v", err)
	}
}

// MatchOp never names an op whose expression reads attributes, a logical
// one, or PRelu (whose slope must broadcast to X): a product is a Mul, not
// an And; a maximum a Max, not an Or; a leaky select a Where.
func TestMatchOpSkipsBoundAndLogicalOps(t *testing.T) {
	for e, want := range map[*Expr]string{
		ExprOf(PrimMul, ExprVar(0), ExprVar(1)):     "Mul",
		ExprOf(PrimMax, ExprVar(0), ExprVar(1)):     "Max",
		ExprOf(PrimEqual, ExprVar(0), ExprConst(0)): "Equal",
		ExprOf(PrimSelect, ExprOf(PrimGreater, ExprVar(0), ExprConst(0)), ExprVar(0), ExprOf(PrimMul, ExprVar(0), ExprConst(0.01))): "Where",
	} {
		if op, _, ok := MatchOp(e); !ok || op != want {
			t.Errorf("MatchOp(%v) = %s, %v; want %s", e, op, ok, want)
		}
	}
}
