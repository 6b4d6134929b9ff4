package graph

import (
	"fmt"
)

// Elementwise ops: ONNX semantics, multidirectional broadcasting.

func sameFloat(in []*TensorType) error {
	for _, t := range in {
		if t != nil && !t.DType.IsFloat() {
			return fmt.Errorf("needs float inputs, got %v", t.DType)
		}
	}
	return nil
}

func inferBroadcast(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
	shapes := make([]Shape, 0, len(in))
	for _, t := range in {
		if t.DType != in[0].DType {
			return nil, fmt.Errorf("input dtypes differ: %v vs %v", in[0].DType, t.DType)
		}
		shapes = append(shapes, t.Shape)
	}
	s, err := Broadcast(shapes...)
	if err != nil {
		return nil, err
	}
	return []TensorType{{in[0].DType, s}}, nil
}

func inferUnaryFloat(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
	if err := sameFloat(in); err != nil {
		return nil, err
	}
	return []TensorType{*in[0]}, nil
}

func inferSame(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
	return []TensorType{*in[0]}, nil
}

// Expression shorthands for the rows below.
var (
	x0, x1, x2 = ExprVar(0), ExprVar(1), ExprVar(2)
)

func ex(p Prim, args ...*Expr) *Expr { return ExprOf(p, args...) }

// softplusExpr is ln(1 + e^x) in the form whose exponential cannot
// overflow: max(x, 0) + ln(1 + e^−|x|), where e^−|x| ≤ 1 and log1p keeps
// the tiny term exact, so large x gives x rather than +Inf.
func softplusExpr(x *Expr) *Expr {
	return ex(PrimAdd, ex(PrimMax, x, ExprConst(0)), ex(PrimLog1p, ex(PrimExp, ex(PrimNeg, ex(PrimAbs, x)))))
}

// elementwise are the elementwise ops defined by an expression: one row
// each, nothing else to write (see expr.go for what follows from it).
// Binary arithmetic has an int64 form (wrapping; Div truncates and refuses
// a zero divisor), because its primitives do.
var elementwise = []struct {
	name, doc string
	expr      *Expr
}{
	{"Add", "A + B", ex(PrimAdd, x0, x1)},
	{"Sub", "A - B", ex(PrimSub, x0, x1)},
	{"Mul", "A * B", ex(PrimMul, x0, x1)},
	{"Div", "A / B (int64: truncating, division by zero is an error)", ex(PrimDiv, x0, x1)},
	{"Pow", "A ^ B", ex(PrimPow, x0, x1)},
	{"Neg", "-X", ex(PrimNeg, x0)},
	{"Sqrt", "sqrt(X)", ex(PrimSqrt, x0)},
	{"Reciprocal", "1 / X", ex(PrimDiv, ExprConst(1), x0)},
	{"Exp", "e^X", ex(PrimExp, x0)},
	{"Log", "ln(X)", ex(PrimLog, x0)},
	{"Sigmoid", "1 / (1 + e^-X)", ex(PrimSigmoid, x0)},
	{"Tanh", "tanh(X)", ex(PrimTanh, x0)},
	{"Relu", "max(X, 0)", ex(PrimMax, x0, ExprConst(0))},
	{"Erf", "the error function of X", ex(PrimErf, x0)},
	{"Abs", "|X|", ex(PrimAbs, x0)},
	{"Softplus", "ln(1 + e^X)", softplusExpr(x0)},
	{"Mish", "X * tanh(ln(1 + e^X))", ex(PrimMul, x0, ex(PrimTanh, softplusExpr(x0)))},
}

func init() {
	for _, op := range elementwise {
		switch op.expr.NumVars() {
		case 2:
			register(&OpSpec{Name: op.name, Doc: op.doc + ", broadcasting", Inputs: []string{"A", "B"}, Outputs: []string{"C"},
				Infer: inferBroadcast, Expr: op.expr})
		default:
			register(&OpSpec{Name: op.name, Doc: op.doc + ", elementwise", Inputs: []string{"X"}, Outputs: []string{"Y"},
				Infer: inferUnaryFloat, Expr: op.expr})
		}
	}
	register(&OpSpec{Name: "Identity", Doc: "Y = X", Inputs: []string{"X"}, Outputs: []string{"Y"}, Infer: inferSame, Eval: evalCopy, View: true})
	register(&OpSpec{
		Name: "Where", Doc: "condition ? X : Y, broadcasting",
		Inputs: []string{"condition", "X", "Y"}, Outputs: []string{"output"},
		Expr: ex(PrimSelect, x0, x1, x2),
		Infer: func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
			if in[0].DType != Bool {
				return nil, fmt.Errorf("condition must be bool, got %v", in[0].DType)
			}
			if in[1].DType != in[2].DType {
				return nil, fmt.Errorf("X and Y dtypes differ: %v vs %v", in[1].DType, in[2].DType)
			}
			s, err := Broadcast(in[0].Shape, in[1].Shape, in[2].Shape)
			if err != nil {
				return nil, err
			}
			return []TensorType{{in[1].DType, s}}, nil
		},
	})
	register(&OpSpec{
		Name: "Cast", Doc: "X converted to the dtype `to` (floats to int64 truncate toward zero, to bool: X != 0)",
		Inputs: []string{"input"}, Outputs: []string{"output"}, Eval: evalCopy, KeepDType: []int{0},
		Attrs: []AttrSpec{{Name: "to", Kind: AttrString, Required: true}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			dt, err := ParseDType(a.String("to", ""))
			if err != nil {
				return nil, err
			}
			return []TensorType{{dt, in[0].Shape}}, nil
		},
	})
	for _, op := range []struct {
		name, doc string
		p         Prim
	}{{"Equal", "A == B", PrimEqual}, {"Greater", "A > B", PrimGreater}} {
		register(&OpSpec{
			Name: op.name, Doc: op.doc + ", broadcasting, bool result",
			Inputs: []string{"A", "B"}, Outputs: []string{"C"},
			Expr: ex(op.p, x0, x1),
			Infer: func(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
				t, err := inferBroadcast(in, a, c)
				if err != nil {
					return nil, err
				}
				t[0].DType = Bool
				return t, nil
			},
		})
	}
}
