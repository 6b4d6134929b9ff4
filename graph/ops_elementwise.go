package graph

import (
	"fmt"
	"math"
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

func inferUnaryNumber(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
	if in[0].DType == Bool {
		return nil, fmt.Errorf("needs a number, got %v", in[0].DType)
	}
	return []TensorType{*in[0]}, nil
}

func inferPredicate(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
	if err := sameFloat(in); err != nil {
		return nil, err
	}
	return []TensorType{{Bool, in[0].Shape}}, nil
}

func inferLogical(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
	for _, t := range in {
		if t.DType != Bool {
			return nil, fmt.Errorf("needs bool inputs, got %v", t.DType)
		}
	}
	return inferBroadcast(in, a, c)
}

func inferMod(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
	t, err := inferBroadcast(in, a, c)
	if err != nil {
		return nil, err
	}
	switch {
	case t[0].DType == Bool:
		return nil, fmt.Errorf("needs numbers, got %v", t[0].DType)
	case t[0].DType.IsFloat() && a.Int("fmod", 0) != 1:
		return nil, fmt.Errorf("fmod must be 1 for %v operands (ONNX defines fmod=0 for integers only)", t[0].DType)
	}
	return t, nil
}

func inferInteger(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
	for _, t := range in {
		if t.DType != Int64 {
			return nil, fmt.Errorf("needs int64 inputs, got %v", t.DType)
		}
	}
	return inferBroadcast(in, a, c)
}

func inferPRelu(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
	if err := sameFloat(in); err != nil {
		return nil, err
	}
	t, err := inferBroadcast(in, a, c)
	if err != nil {
		return nil, err
	}
	if !t[0].Shape.Equal(in[0].Shape) {
		return nil, fmt.Errorf("slope %v does not broadcast to X %v", in[1].Shape, in[0].Shape)
	}
	return t, nil
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
// a zero divisor), because its primitives do. A row whose expression reads
// attributes (ExprAttr) declares them with their ONNX defaults; each node
// computes the expression at its own values (OpSpec.ExprFor). kind says
// what the operands and result are (zero: by the number of operands, a
// float function of one or arithmetic broadcasting two).
var elementwise = []struct {
	name, doc string
	expr      *Expr
	kind      ewKind
	attrs     []AttrSpec
}{
	{"Add", "A + B", ex(PrimAdd, x0, x1), 0, nil},
	{"Sub", "A - B", ex(PrimSub, x0, x1), 0, nil},
	{"Mul", "A * B", ex(PrimMul, x0, x1), 0, nil},
	{"Div", "A / B (int64: truncating, division by zero is an error)", ex(PrimDiv, x0, x1), 0, nil},
	{"Pow", "A ^ B", ex(PrimPow, x0, x1), 0, nil},
	{"Neg", "-X", ex(PrimNeg, x0), 0, nil},
	{"Sqrt", "sqrt(X)", ex(PrimSqrt, x0), 0, nil},
	{"Reciprocal", "1 / X", ex(PrimDiv, ExprConst(1), x0), 0, nil},
	{"Exp", "e^X", ex(PrimExp, x0), 0, nil},
	{"Log", "ln(X)", ex(PrimLog, x0), 0, nil},
	{"Sigmoid", "1 / (1 + e^-X)", ex(PrimSigmoid, x0), 0, nil},
	{"Tanh", "tanh(X)", ex(PrimTanh, x0), 0, nil},
	{"Relu", "max(X, 0)", ex(PrimMax, x0, ExprConst(0)), 0, nil},
	{"Erf", "the error function of X", ex(PrimErf, x0), 0, nil},
	{"Abs", "|X|", ex(PrimAbs, x0), 0, nil},
	{"Softplus", "ln(1 + e^X)", softplusExpr(x0), 0, nil},
	{"Mish", "X * tanh(ln(1 + e^X))", ex(PrimMul, x0, ex(PrimTanh, softplusExpr(x0))), 0, nil},

	// Activations with parameters (ONNX defaults).
	{"LeakyRelu", "X < 0 ? alpha*X : X", ex(PrimSelect, ex(PrimGreater, x0, ExprConst(0)), x0, ex(PrimMul, x0, ExprAttr("alpha"))),
		0, []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: Float(0.01)}}},
	{"Elu", "X < 0 ? alpha*(e^X - 1) : X", eluExpr(x0, ExprAttr("alpha"), nil),
		0, []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: Float(1)}}},
	{"Celu", "max(0, X) + min(0, alpha*(e^(X/alpha) - 1))", eluExpr(x0, ExprAttr("alpha"), ExprAttr("alpha")),
		0, []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: Float(1)}}},
	{"Selu", "gamma * (X <= 0 ? alpha*(e^X - 1) : X)", ex(PrimMul, ExprAttr("gamma"), eluExpr(x0, ExprAttr("alpha"), nil)),
		0, []AttrSpec{
			{Name: "alpha", Kind: AttrFloat, Default: Float(1.67326319217681884765625)},
			{Name: "gamma", Kind: AttrFloat, Default: Float(1.05070102214813232421875)}}},
	{"HardSigmoid", "max(0, min(1, alpha*X + beta))", hardSigmoidExpr(x0, ExprAttr("alpha"), ExprAttr("beta")),
		0, []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: Float(0.2)}, {Name: "beta", Kind: AttrFloat, Default: Float(0.5)}}},
	{"HardSwish", "X * max(0, min(1, X/6 + 1/2))", ex(PrimMul, x0, hardSigmoidExpr(x0, ExprConst(1.0/6), ExprConst(0.5))), 0, nil},
	{"Softsign", "X / (1 + |X|)", ex(PrimDiv, x0, ex(PrimAdd, ExprConst(1), ex(PrimAbs, x0))), 0, nil},
	{"ThresholdedRelu", "X > alpha ? X : 0", ex(PrimSelect, ex(PrimGreater, x0, ExprAttr("alpha")), x0, ExprConst(0)),
		0, []AttrSpec{{Name: "alpha", Kind: AttrFloat, Default: Float(1)}}},
	{"Shrink", "X < -lambd ? X + bias : X > lambd ? X - bias : 0",
		ex(PrimSelect, ex(PrimGreater, ex(PrimNeg, ExprAttr("lambd")), x0), ex(PrimAdd, x0, ExprAttr("bias")),
			ex(PrimSelect, ex(PrimGreater, x0, ExprAttr("lambd")), ex(PrimSub, x0, ExprAttr("bias")), ExprConst(0))),
		0, []AttrSpec{{Name: "bias", Kind: AttrFloat, Default: Float(0)}, {Name: "lambd", Kind: AttrFloat, Default: Float(0.5)}}},
	{"Gelu", "X/2 * (1 + erf(X/sqrt(2))), or with approximate=tanh X/2 * (1 + tanh(sqrt(2/pi)*(X + 0.044715*X^3)))",
		ex(PrimSelect, ExprAttr("approximate"), geluTanhExpr(x0), geluExpr(x0)),
		0, []AttrSpec{{Name: "approximate", Kind: AttrString, Default: Str("none"), Enum: []string{"none", "tanh"}}}},
	{"PRelu", "X < 0 ? slope*X : X, slope broadcasting to X",
		ex(PrimSelect, ex(PrimGreater, x0, ExprConst(0)), x0, ex(PrimMul, x0, x1)), ewPRelu, nil},

	// Rounding, sign and classification.
	{"Floor", "the largest integer <= X", ex(PrimFloor, x0), 0, nil},
	{"Ceil", "the smallest integer >= X", ex(PrimCeil, x0), 0, nil},
	{"Round", "X rounded to the nearest integer, halves to even", ex(PrimRound, x0), 0, nil},
	{"Sign", "1, 0 or -1 as X is positive, zero or negative (NaN: NaN)",
		ex(PrimSelect, ex(PrimIsNaN, x0), x0, signExpr(x0)), ewUnaryNumber, nil},
	{"IsNaN", "X is NaN", ex(PrimIsNaN, x0), ewPredicate, nil},
	{"IsInf", "X is +Inf (if detect_positive) or -Inf (if detect_negative)",
		ex(PrimMul, ex(PrimIsInf, x0), ex(PrimAdd,
			ex(PrimMul, ExprAttr("detect_positive"), ex(PrimGreater, x0, ExprConst(0))),
			ex(PrimMul, ExprAttr("detect_negative"), ex(PrimGreater, ExprConst(0), x0)))),
		ewPredicate, []AttrSpec{{Name: "detect_negative", Kind: AttrInt, Default: Int(1)}, {Name: "detect_positive", Kind: AttrInt, Default: Int(1)}}},
	{"Mod", "A mod B: with fmod=0 (integers only) the sign of B, as Python's %; with fmod=1 the sign of A, as C's fmod (int64: a zero divisor is an error)",
		ex(PrimSelect, ExprAttr("fmod"), ex(PrimFmod, x0, x1), floorModExpr(x0, x1)),
		ewMod, []AttrSpec{{Name: "fmod", Kind: AttrInt, Default: Int(0)}}},
	// BitShift: ONNX defines it on unsigned integers, which the graph holds
	// as non-negative int64: a left shift is a product with 2^B (wrapping
	// as the shift does), a right shift a quotient by it, 0 from a shift
	// of 63 or more (where 2^B no longer fits; the quotient's exponent is
	// capped so that no branch divides by a wrapped 2^B of 0).
	{"BitShift", "A << B or, with direction=RIGHT, A >> B, on non-negative int64 (unsigned values)",
		ex(PrimSelect, ExprAttr("direction"),
			ex(PrimSelect, ex(PrimGreater, x1, ExprConst(62)), ExprConst(0), ex(PrimDiv, x0, ex(PrimPow, ExprConst(2), ex(PrimMin, x1, ExprConst(62))))),
			ex(PrimMul, x0, ex(PrimPow, ExprConst(2), x1))),
		ewInteger, []AttrSpec{{Name: "direction", Kind: AttrString, Default: Str("LEFT"), Enum: []string{"LEFT", "RIGHT"}}}},
	{"Min", "the smaller of A and B (NaN if either is)", ex(PrimMin, x0, x1), 0, nil},
	{"Max", "the larger of A and B (NaN if either is)", ex(PrimMax, x0, x1), 0, nil},

	// Logic on bool tensors (0 and 1).
	{"And", "A and B", ex(PrimMul, x0, x1), ewLogical, nil},
	{"Or", "A or B", ex(PrimMax, x0, x1), ewLogical, nil},
	{"Xor", "A xor B", ex(PrimAbs, ex(PrimSub, x0, x1)), ewLogical, nil},
	{"Not", "not X", ex(PrimEqual, x0, ExprConst(0)), ewLogical, nil},

	// Trigonometric and hyperbolic functions.
	{"Sin", "sin(X)", ex(PrimSin, x0), 0, nil},
	{"Cos", "cos(X)", ex(PrimCos, x0), 0, nil},
	{"Tan", "tan(X)", ex(PrimTan, x0), 0, nil},
	{"Asin", "arcsin(X)", ex(PrimAsin, x0), 0, nil},
	{"Acos", "arccos(X)", ex(PrimAcos, x0), 0, nil},
	{"Atan", "arctan(X)", ex(PrimAtan, x0), 0, nil},
	{"Sinh", "sinh(X)", ex(PrimSinh, x0), 0, nil},
	{"Cosh", "cosh(X)", ex(PrimCosh, x0), 0, nil},
	{"Asinh", "arsinh(X)", ex(PrimAsinh, x0), 0, nil},
	{"Acosh", "arcosh(X)", ex(PrimAcosh, x0), 0, nil},
	{"Atanh", "artanh(X)", ex(PrimAtanh, x0), 0, nil},
}

// ewKind is what a row's operands and result are.
type ewKind uint8

const (
	ewDefault     ewKind = iota // one operand: float; two: any type, broadcasting
	ewUnaryNumber               // one operand of any type but bool
	ewPredicate                 // one float operand, bool result (kept out of bodies)
	ewLogical                   // bool operands and result (kept out of bodies and MatchOp)
	ewMod                       // two operands broadcasting; floats need fmod=1
	ewPRelu                     // float X, slope broadcasting to X
	ewInteger                   // two int64 operands broadcasting (kept out of MatchOp)
)

// eluExpr is max(x, 0) + alpha·(e^(min(x, 0)/div) − 1) (div nil: 1): Elu
// and, with div = alpha, Celu. The exponential only sees x ≤ 0, so it
// never overflows, and for x > 0 the second term is exactly 0.
func eluExpr(x, alpha, div *Expr) *Expr {
	neg := ex(PrimMin, x, ExprConst(0))
	if div != nil {
		neg = ex(PrimDiv, neg, div)
	}
	return ex(PrimAdd, ex(PrimMax, x, ExprConst(0)), ex(PrimMul, alpha, ex(PrimSub, ex(PrimExp, neg), ExprConst(1))))
}

// hardSigmoidExpr is max(0, min(1, alpha·x + beta)).
func hardSigmoidExpr(x, alpha, beta *Expr) *Expr {
	return ex(PrimMax, ex(PrimMin, ex(PrimAdd, ex(PrimMul, alpha, x), beta), ExprConst(1)), ExprConst(0))
}

// geluExpr is x/2·(1 + erf(x/√2)); geluTanhExpr its tanh approximation.
func geluExpr(x *Expr) *Expr {
	return ex(PrimMul, ex(PrimMul, ExprConst(0.5), x), ex(PrimAdd, ExprConst(1), ex(PrimErf, ex(PrimMul, x, ExprConst(1/math.Sqrt2)))))
}

func geluTanhExpr(x *Expr) *Expr {
	cube := ex(PrimMul, x, ex(PrimMul, x, x))
	inner := ex(PrimMul, ExprConst(math.Sqrt(2/math.Pi)), ex(PrimAdd, x, ex(PrimMul, ExprConst(0.044715), cube)))
	return ex(PrimMul, ex(PrimMul, ExprConst(0.5), x), ex(PrimAdd, ExprConst(1), ex(PrimTanh, inner)))
}

// signExpr is (x > 0) − (x < 0).
func signExpr(x *Expr) *Expr {
	return ex(PrimSub, ex(PrimGreater, x, ExprConst(0)), ex(PrimGreater, ExprConst(0), x))
}

// floorModExpr is a mod b with the sign of b: the truncated remainder r,
// plus b where r is not zero and has the other sign than b.
func floorModExpr(a, b *Expr) *Expr {
	r := ex(PrimFmod, a, b)
	return ex(PrimSelect, ex(PrimGreater, ExprConst(0), ex(PrimMul, signExpr(r), signExpr(b))), ex(PrimAdd, r, b), r)
}

func init() {
	for _, op := range elementwise {
		s := &OpSpec{Name: op.name, Doc: op.doc + ", elementwise", Inputs: []string{"X"}, Outputs: []string{"Y"},
			Infer: inferUnaryFloat, Expr: op.expr, Attrs: op.attrs}
		binary := func() {
			s.Doc, s.Inputs, s.Outputs, s.Infer = op.doc+", broadcasting", []string{"A", "B"}, []string{"C"}, inferBroadcast
		}
		switch op.kind {
		case ewDefault:
			if op.expr.NumVars() == 2 {
				binary()
			}
		case ewUnaryNumber:
			s.Infer = inferUnaryNumber
		case ewPredicate:
			s.Infer, s.boolResult = inferPredicate, true
		case ewLogical:
			s.logical, s.noMatch = true, true
			if op.expr.NumVars() == 2 {
				binary()
			}
			s.Infer = inferLogical
		case ewMod:
			binary()
			s.Infer = inferMod
		case ewInteger:
			binary()
			s.Infer, s.noMatch, s.integerOnly = inferInteger, true, true
		case ewPRelu:
			s.Doc, s.Inputs, s.Infer, s.noMatch = op.doc+", elementwise", []string{"X", "slope"}, inferPRelu, true
		}
		register(s)
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
		Name: "Cast", Doc: "X converted to the dtype `to` (floats to int64 truncate toward zero, to bool: X != 0; numbers to and from strings as ONNX spells them)",
		Inputs: []string{"input"}, Outputs: []string{"output"}, Eval: evalCast, KeepDType: []int{0}, Strings: true,
		Attrs: []AttrSpec{{Name: "to", Kind: AttrString, Required: true}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			dt, err := ParseDType(a.String("to", ""))
			if err != nil {
				return nil, err
			}
			if err := castStringDTypes(in[0].DType, dt); err != nil {
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
