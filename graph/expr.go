package graph

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// An elementwise op is defined once, as an expression over a small closed
// set of scalar primitives (Prim). Everything else about the op follows from
// that one definition:
//
//   - its reference meaning (the row's Map, built by compiling the
//     expression: float64 arithmetic, and int64 arithmetic where every
//     primitive has an integer form),
//   - the backends' code: the CPU backend compiles the expression into
//     block loops, the CUDA backend renders it as C in generated kernels,
//   - its derivative (Expr.Deriv, symbolic), from which autodiff emits the
//     vector-Jacobian product as graph nodes,
//   - that it may be fused (FusibleElementwise lists the ops with an
//     expression and a numeric result) and constant folded.
//
// An expression may read its op's attributes (ExprAttr: LeakyRelu's alpha,
// with ONNX's default in the op's AttrSpec); a node computes it bound to its
// own values (OpSpec.ExprFor), which is what every backend compiles, the
// derivative differentiates and a fused body step carries.
//
// A backend therefore knows primitives, never elementwise ops: adding an op
// is one row with an expression. Adding a primitive is the rare change that
// touches every backend (its float and int meaning here, a derivative rule
// here, its C in backend/cuda's renderer, its block loop in backend/cpu).

// Prim is a scalar primitive of an elementwise expression.
type Prim uint8

const (
	PrimVar     Prim = iota // operand Var of the op
	PrimConst               // the number Const
	PrimAttr                // the op's attribute Attr, a number (see OpSpec.ExprFor)
	PrimAdd                 // a + b
	PrimSub                 // a − b
	PrimMul                 // a · b
	PrimDiv                 // a / b (int64: truncating; division by zero is an error)
	PrimPow                 // a ^ b (int64: IntPow)
	PrimNeg                 // −a
	PrimExp                 // e^a
	PrimLog                 // ln a
	PrimLog1p               // ln(1 + a), exact for tiny a
	PrimSqrt                // √a
	PrimTanh                // tanh a
	PrimSigmoid             // 1 / (1 + e^−a), computed without overflow
	PrimErf                 // the error function
	PrimAbs                 // |a| (|−0| = +0)
	PrimMax                 // the larger of a and b; NaN if either is NaN
	PrimGreater             // 1 if a > b, else 0
	PrimEqual               // 1 if a == b, else 0
	PrimSelect              // b if a != 0, else c
	PrimMin                 // the smaller of a and b; NaN if either is NaN
	PrimFloor               // ⌊a⌋
	PrimCeil                // ⌈a⌉
	PrimRound               // a rounded to the nearest integer, halves to even
	PrimFmod                // a − b·trunc(a/b), the sign of a (int64: a % b; zero divisor is an error)
	PrimIsNaN               // 1 if a is NaN, else 0
	PrimIsInf               // 1 if a is ±Inf, else 0
	PrimSin                 // sin a
	PrimCos                 // cos a
	PrimTan                 // tan a
	PrimAsin                // arcsin a
	PrimAcos                // arccos a
	PrimAtan                // arctan a
	PrimSinh                // sinh a
	PrimCosh                // cosh a
	PrimAsinh               // arsinh a
	PrimAcosh               // arcosh a
	PrimAtanh               // artanh a
	numPrims
)

// primInfo is what the IR knows of a primitive: its name in expression text,
// arity, float64 and int64 meaning (int nil: float only).
type primInfo struct {
	name  string
	arity int
	float func(x []float64) float64
	int   func(x []int64) (int64, error)
}

var prims = [numPrims]primInfo{
	PrimVar:   {name: "x", arity: 0},
	PrimConst: {name: "c", arity: 0},
	PrimAttr:  {name: "attr", arity: 0},
	PrimAdd: {"add", 2, func(x []float64) float64 { return x[0] + x[1] },
		func(x []int64) (int64, error) { return x[0] + x[1], nil }},
	PrimSub: {"sub", 2, func(x []float64) float64 { return x[0] - x[1] },
		func(x []int64) (int64, error) { return x[0] - x[1], nil }},
	PrimMul: {"mul", 2, func(x []float64) float64 { return x[0] * x[1] },
		func(x []int64) (int64, error) { return x[0] * x[1], nil }},
	PrimDiv: {"div", 2, func(x []float64) float64 { return x[0] / x[1] },
		func(x []int64) (int64, error) {
			if x[1] == 0 {
				return 0, errIntDivZero
			}
			return x[0] / x[1], nil
		}},
	PrimPow: {"pow", 2, func(x []float64) float64 { return math.Pow(x[0], x[1]) },
		func(x []int64) (int64, error) { return IntPow(x[0], x[1]), nil }},
	PrimNeg: {"neg", 1, func(x []float64) float64 { return -x[0] },
		func(x []int64) (int64, error) { return -x[0], nil }},
	PrimExp:     {"exp", 1, func(x []float64) float64 { return math.Exp(x[0]) }, nil},
	PrimLog:     {"log", 1, func(x []float64) float64 { return math.Log(x[0]) }, nil},
	PrimLog1p:   {"log1p", 1, func(x []float64) float64 { return math.Log1p(x[0]) }, nil},
	PrimSqrt:    {"sqrt", 1, func(x []float64) float64 { return math.Sqrt(x[0]) }, nil},
	PrimTanh:    {"tanh", 1, func(x []float64) float64 { return math.Tanh(x[0]) }, nil},
	PrimSigmoid: {"sigmoid", 1, func(x []float64) float64 { return Sigmoid(x[0]) }, nil},
	PrimErf:     {"erf", 1, func(x []float64) float64 { return math.Erf(x[0]) }, nil},
	PrimAbs: {"abs", 1, func(x []float64) float64 { return math.Abs(x[0]) },
		func(x []int64) (int64, error) { return max(x[0], -x[0]), nil }},
	PrimMax: {"max", 2, func(x []float64) float64 { return math.Max(x[0], x[1]) },
		func(x []int64) (int64, error) { return max(x[0], x[1]), nil }},
	PrimGreater: {"gt", 2, func(x []float64) float64 { return b2f(x[0] > x[1]) },
		func(x []int64) (int64, error) { return int64(b2f(x[0] > x[1])), nil }},
	PrimEqual: {"eq", 2, func(x []float64) float64 { return b2f(x[0] == x[1]) },
		func(x []int64) (int64, error) { return int64(b2f(x[0] == x[1])), nil }},
	PrimSelect: {"select", 3, func(x []float64) float64 {
		if x[0] != 0 {
			return x[1]
		}
		return x[2]
	}, func(x []int64) (int64, error) {
		if x[0] != 0 {
			return x[1], nil
		}
		return x[2], nil
	}},
	PrimMin: {"min", 2, func(x []float64) float64 { return math.Min(x[0], x[1]) },
		func(x []int64) (int64, error) { return min(x[0], x[1]), nil }},
	PrimFloor: {"floor", 1, func(x []float64) float64 { return math.Floor(x[0]) },
		func(x []int64) (int64, error) { return x[0], nil }},
	PrimCeil: {"ceil", 1, func(x []float64) float64 { return math.Ceil(x[0]) },
		func(x []int64) (int64, error) { return x[0], nil }},
	PrimRound: {"round", 1, func(x []float64) float64 { return math.RoundToEven(x[0]) },
		func(x []int64) (int64, error) { return x[0], nil }},
	PrimFmod: {"fmod", 2, func(x []float64) float64 { return math.Mod(x[0], x[1]) },
		func(x []int64) (int64, error) {
			if x[1] == 0 {
				return 0, errIntDivZero
			}
			return x[0] % x[1], nil
		}},
	PrimIsNaN: {"isnan", 1, func(x []float64) float64 { return b2f(math.IsNaN(x[0])) },
		func(x []int64) (int64, error) { return 0, nil }},
	PrimIsInf: {"isinf", 1, func(x []float64) float64 { return b2f(math.IsInf(x[0], 0)) },
		func(x []int64) (int64, error) { return 0, nil }},
	PrimSin:   {"sin", 1, func(x []float64) float64 { return math.Sin(x[0]) }, nil},
	PrimCos:   {"cos", 1, func(x []float64) float64 { return math.Cos(x[0]) }, nil},
	PrimTan:   {"tan", 1, func(x []float64) float64 { return math.Tan(x[0]) }, nil},
	PrimAsin:  {"asin", 1, func(x []float64) float64 { return math.Asin(x[0]) }, nil},
	PrimAcos:  {"acos", 1, func(x []float64) float64 { return math.Acos(x[0]) }, nil},
	PrimAtan:  {"atan", 1, func(x []float64) float64 { return math.Atan(x[0]) }, nil},
	PrimSinh:  {"sinh", 1, func(x []float64) float64 { return math.Sinh(x[0]) }, nil},
	PrimCosh:  {"cosh", 1, func(x []float64) float64 { return math.Cosh(x[0]) }, nil},
	PrimAsinh: {"asinh", 1, func(x []float64) float64 { return math.Asinh(x[0]) }, nil},
	PrimAcosh: {"acosh", 1, func(x []float64) float64 { return math.Acosh(x[0]) }, nil},
	PrimAtanh: {"atanh", 1, func(x []float64) float64 { return math.Atanh(x[0]) }, nil},
}

func (p Prim) String() string {
	if p < numPrims {
		return prims[p].name
	}
	return "prim(" + strconv.Itoa(int(p)) + ")"
}

// Prims lists the primitives that take operands (every one but PrimVar
// and PrimConst): what a backend must implement.
func Prims() []Prim {
	var out []Prim
	for p := PrimAdd; p < numPrims; p++ {
		out = append(out, p)
	}
	return out
}

// Arity is how many operands the primitive takes.
func (p Prim) Arity() int { return prims[p].arity }

// Float applies the primitive in float64 arithmetic.
func (p Prim) Float(x ...float64) float64 { return prims[p].float(x) }

// Sigmoid is 1/(1+e^−x) in the form whose exponential is at most 1, so it
// never overflows.
func Sigmoid(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// Expr is a scalar expression: a tree of primitives over an op's operands.
// Expressions are immutable once built; subtrees may be shared.
type Expr struct {
	Prim  Prim
	Var   int     // PrimVar: the operand's index
	Const float64 // PrimConst
	Attr  string  // PrimAttr: the attribute's name
	Args  []*Expr
}

// String writes the expression in prefix form (add(x0,c1)); equal strings
// mean structurally equal expressions.
func (e *Expr) String() string {
	var sb strings.Builder
	e.write(&sb)
	return sb.String()
}

func (e *Expr) write(sb *strings.Builder) {
	switch e.Prim {
	case PrimVar:
		sb.WriteString("x" + strconv.Itoa(e.Var))
		return
	case PrimConst:
		sb.WriteString(strconv.FormatFloat(e.Const, 'g', -1, 64))
		return
	case PrimAttr:
		sb.WriteString("@" + e.Attr)
		return
	}
	sb.WriteString(e.Prim.String())
	sb.WriteByte('(')
	for i, a := range e.Args {
		if i > 0 {
			sb.WriteByte(',')
		}
		a.write(sb)
	}
	sb.WriteByte(')')
}

// Size is the number of primitives in the tree (shared subtrees counted
// each time they occur).
func (e *Expr) Size() int {
	n := 1
	for _, a := range e.Args {
		n += a.Size()
	}
	return n
}

// NumVars is one more than the largest operand index the expression reads.
func (e *Expr) NumVars() int {
	if e.Prim == PrimVar {
		return e.Var + 1
	}
	n := 0
	for _, a := range e.Args {
		n = max(n, a.NumVars())
	}
	return n
}

// HasInt reports whether every primitive of e has an integer form.
func (e *Expr) HasInt() bool {
	if e.Prim == PrimConst {
		return e.Const == math.Trunc(e.Const)
	}
	if e.Prim == PrimAttr {
		return false // bind it first (Bind)
	}
	if e.Prim != PrimVar && prims[e.Prim].int == nil {
		return false
	}
	for _, a := range e.Args {
		if !a.HasInt() {
			return false
		}
	}
	return true
}

// Constructors, for op rows and derivative rules.

// ExprVar is operand i.
func ExprVar(i int) *Expr { return &Expr{Prim: PrimVar, Var: i} }

// ExprConst is the number v.
func ExprConst(v float64) *Expr { return &Expr{Prim: PrimConst, Const: v} }

// ExprAttr is the op's attribute name, a number: a float attribute's
// value, an int attribute's, or a string attribute's index in its AttrSpec's
// Enum. An expression with attributes is bound to a node's values
// (OpSpec.ExprFor) before anything computes it.
func ExprAttr(name string) *Expr { return &Expr{Prim: PrimAttr, Attr: name} }

// Attrs lists the attributes e reads, in the order they first occur.
func (e *Expr) Attrs() []string {
	var out []string
	var walk func(e *Expr)
	walk = func(e *Expr) {
		if e.Prim == PrimAttr && !slices.Contains(out, e.Attr) {
			out = append(out, e.Attr)
		}
		for _, a := range e.Args {
			walk(a)
		}
	}
	walk(e)
	return out
}

// Bind replaces e's attributes by their values and folds what became
// constant: a subtree of constants is its value, and a selection on a
// constant condition is the branch it takes (an attribute that picks a
// form, such as Gelu's approximate, leaves only that form). An expression
// without attributes is returned as it is.
func (e *Expr) Bind(values map[string]float64) (*Expr, error) {
	if len(e.Attrs()) == 0 {
		return e, nil
	}
	var err error
	var bind func(e *Expr) *Expr
	bind = func(e *Expr) *Expr {
		switch e.Prim {
		case PrimVar, PrimConst:
			return e
		case PrimAttr:
			v, ok := values[e.Attr]
			if !ok && err == nil {
				err = fmt.Errorf("attribute %s has no value", e.Attr)
			}
			return ExprConst(v)
		}
		args := make([]*Expr, len(e.Args))
		allConst := true
		for i, a := range e.Args {
			args[i] = bind(a)
			allConst = allConst && args[i].Prim == PrimConst
		}
		if allConst {
			v := make([]float64, len(args))
			for i, a := range args {
				v[i] = a.Const
			}
			return ExprConst(e.Prim.Float(v...))
		}
		if e.Prim == PrimSelect && args[0].Prim == PrimConst {
			if args[0].Const != 0 {
				return args[1]
			}
			return args[2]
		}
		return &Expr{Prim: e.Prim, Args: args}
	}
	out := bind(e)
	return out, err
}

// ExprOf applies p to args.
func ExprOf(p Prim, args ...*Expr) *Expr {
	if len(args) != p.Arity() {
		panic(fmt.Sprintf("graph: %v takes %d operands, got %d", p, p.Arity(), len(args))) // programming error in a row
	}
	return &Expr{Prim: p, Args: args}
}

func isConst(e *Expr, v float64) bool { return e.Prim == PrimConst && e.Const == v }

// CompileFloat turns e into a function of its operands in float64: the
// op's reference scalar function.
func (e *Expr) CompileFloat() func(x []float64) float64 {
	switch e.Prim {
	case PrimVar:
		i := e.Var
		return func(x []float64) float64 { return x[i] }
	case PrimConst:
		c := e.Const
		return func([]float64) float64 { return c }
	case PrimAttr:
		panic("graph: expression not bound to its attributes: " + e.String()) // programming error: Bind first
	}
	f := prims[e.Prim].float
	args := make([]func([]float64) float64, len(e.Args))
	for i, a := range e.Args {
		args[i] = a.CompileFloat()
	}
	switch len(args) {
	case 1:
		a := args[0]
		return func(x []float64) float64 {
			v := [1]float64{a(x)}
			return f(v[:])
		}
	case 2:
		a, b := args[0], args[1]
		return func(x []float64) float64 {
			v := [2]float64{a(x), b(x)}
			return f(v[:])
		}
	}
	return func(x []float64) float64 {
		v := make([]float64, len(args))
		for i, a := range args {
			v[i] = a(x)
		}
		return f(v)
	}
}

// CompileInt turns e into a function of int64 operands (nil when a
// primitive of e has no integer form).
func (e *Expr) CompileInt() func(x []int64) (int64, error) {
	if !e.HasInt() {
		return nil
	}
	return e.compileInt()
}

func (e *Expr) compileInt() func(x []int64) (int64, error) {
	switch e.Prim {
	case PrimVar:
		i := e.Var
		return func(x []int64) (int64, error) { return x[i], nil }
	case PrimConst:
		c := int64(e.Const)
		return func([]int64) (int64, error) { return c, nil }
	}
	f := prims[e.Prim].int
	args := make([]func([]int64) (int64, error), len(e.Args))
	for i, a := range e.Args {
		args[i] = a.compileInt()
	}
	return func(x []int64) (int64, error) {
		v := make([]int64, len(args))
		for i, a := range args {
			r, err := a(x)
			if err != nil {
				return 0, err
			}
			v[i] = r
		}
		return f(v)
	}
}

// Deriv is ∂e/∂(operand i) as an expression over the same operands. Where a
// primitive's derivative is best written with its own value (e^a, tanh a,
// σ(a), √a, a/b), the rule uses the subtree itself, so that autodiff reuses
// the forward value instead of recomputing it in a form that can overflow
// (σ' = σ(1−σ), never e^−a/(1+e^−a)²). Comparisons are piecewise constant
// and have derivative 0; at a tie, max takes its second operand's slope and
// |a| the slope of a.
func (e *Expr) Deriv(i int) *Expr {
	return simplify(e.deriv(i))
}

// VJP is the cotangent that reaches operand i when the cotangent of e's
// value is operand dy: dy·∂e/∂(operand i), simplified (nil when it is
// identically zero: operand i is a condition, or only compared).
func (e *Expr) VJP(i, dy int) *Expr {
	g := simplify(ExprOf(PrimMul, ExprVar(dy), e.Deriv(i)))
	if isConst(g, 0) {
		return nil
	}
	return g
}

func (e *Expr) deriv(i int) *Expr {
	zero, one := ExprConst(0), ExprConst(1)
	switch e.Prim {
	case PrimVar:
		if e.Var == i {
			return one
		}
		return zero
	case PrimConst, PrimAttr, PrimGreater, PrimEqual, PrimFloor, PrimCeil, PrimRound, PrimIsNaN, PrimIsInf:
		return zero
	}
	a := e.Args[0]
	da := simplify(a.deriv(i))
	var b, db *Expr
	if len(e.Args) > 1 {
		b = e.Args[1]
		db = simplify(b.deriv(i))
	}
	mul := func(x, y *Expr) *Expr { return ExprOf(PrimMul, x, y) }
	add := func(x, y *Expr) *Expr { return ExprOf(PrimAdd, x, y) }
	sub := func(x, y *Expr) *Expr { return ExprOf(PrimSub, x, y) }
	div := func(x, y *Expr) *Expr { return ExprOf(PrimDiv, x, y) }
	gt := func(x, y *Expr) *Expr { return ExprOf(PrimGreater, x, y) }
	sel := func(c, x, y *Expr) *Expr { return ExprOf(PrimSelect, c, x, y) }
	neg := func(x *Expr) *Expr { return ExprOf(PrimNeg, x) }
	switch e.Prim {
	case PrimAdd:
		return add(da, db)
	case PrimSub:
		return sub(da, db)
	case PrimMul:
		return add(mul(da, b), mul(a, db))
	case PrimDiv: // d(a/b) = da/b − (a/b)·db/b
		return sub(div(da, b), mul(db, div(e, b)))
	case PrimPow: // d(a^b) = b·a^(b−1)·da + a^b·ln a·db
		return add(mul(da, mul(b, ExprOf(PrimPow, a, sub(b, one)))), mul(db, mul(e, ExprOf(PrimLog, a))))
	case PrimNeg:
		return neg(da)
	case PrimExp:
		return mul(da, e)
	case PrimLog:
		return div(da, a)
	case PrimLog1p:
		return div(da, add(one, a))
	case PrimSqrt:
		return mul(da, div(ExprConst(0.5), e))
	case PrimTanh:
		return mul(da, sub(one, mul(e, e)))
	case PrimSigmoid:
		return mul(da, mul(e, sub(one, e)))
	case PrimErf: // 2/√π · e^(−a²)
		return mul(da, mul(ExprOf(PrimExp, neg(mul(a, a))), ExprConst(2/math.Sqrt(math.Pi))))
	case PrimAbs:
		return sel(gt(zero, a), neg(da), da)
	case PrimMax:
		return sel(gt(a, b), da, db)
	case PrimSelect:
		return sel(a, simplify(e.Args[1].deriv(i)), simplify(e.Args[2].deriv(i)))
	case PrimMin: // at a tie, the second operand's slope (as max)
		return sel(gt(b, a), da, db)
	case PrimFmod: // a − b·trunc(a/b): ∂a = 1, ∂b = −trunc(a/b) = −(a − e)/b
		return sub(da, mul(db, div(sub(a, e), b)))
	case PrimSin:
		return mul(da, ExprOf(PrimCos, a))
	case PrimCos:
		return neg(mul(da, ExprOf(PrimSin, a)))
	case PrimTan: // 1 + tan²
		return mul(da, add(one, mul(e, e)))
	case PrimAsin: // 1/√(1 − a²)
		return div(da, ExprOf(PrimSqrt, sub(one, mul(a, a))))
	case PrimAcos:
		return neg(div(da, ExprOf(PrimSqrt, sub(one, mul(a, a)))))
	case PrimAtan:
		return div(da, add(one, mul(a, a)))
	case PrimSinh:
		return mul(da, ExprOf(PrimCosh, a))
	case PrimCosh:
		return mul(da, ExprOf(PrimSinh, a))
	case PrimAsinh: // 1/√(a² + 1)
		return div(da, ExprOf(PrimSqrt, add(mul(a, a), one)))
	case PrimAcosh: // 1/√(a² − 1)
		return div(da, ExprOf(PrimSqrt, sub(mul(a, a), one)))
	case PrimAtanh:
		return div(da, sub(one, mul(a, a)))
	}
	panic("graph: no derivative rule for " + e.Prim.String()) // a primitive added without its rule
}

// simplify applies the algebra that keeps derivatives small: constants
// folded, additive and multiplicative identities and zeros dropped (a zero
// factor drops its partner: a derivative of 0 contributes nothing even
// where the partner is not finite), negations moved outward, and a product
// with a 0/1 selection turned into a selection.
func simplify(e *Expr) *Expr {
	if e.Prim == PrimVar || e.Prim == PrimConst || e.Prim == PrimAttr {
		return e
	}
	args := make([]*Expr, len(e.Args))
	allConst := true
	for i, a := range e.Args {
		args[i] = simplify(a)
		allConst = allConst && args[i].Prim == PrimConst
	}
	if allConst {
		v := make([]float64, len(args))
		for i, a := range args {
			v[i] = a.Const
		}
		return ExprConst(e.Prim.Float(v...))
	}
	out := &Expr{Prim: e.Prim, Args: args}
	var a, b *Expr
	a = args[0]
	if len(args) > 1 {
		b = args[1]
	}
	switch e.Prim {
	case PrimAdd:
		switch {
		case isConst(a, 0):
			return b
		case isConst(b, 0):
			return a
		case b.Prim == PrimNeg:
			return simplify(ExprOf(PrimSub, a, b.Args[0]))
		}
	case PrimSub:
		switch {
		case isConst(b, 0):
			return a
		case isConst(a, 0):
			return simplify(ExprOf(PrimNeg, b))
		case b.Prim == PrimNeg:
			return simplify(ExprOf(PrimAdd, a, b.Args[0]))
		}
	case PrimMul:
		switch {
		case isConst(a, 0) || isConst(b, 0):
			return ExprConst(0)
		case isConst(a, 1):
			return b
		case isConst(b, 1):
			return a
		case isConst(a, -1):
			return simplify(ExprOf(PrimNeg, b))
		case isConst(b, -1):
			return simplify(ExprOf(PrimNeg, a))
		case a.Prim == PrimNeg:
			return simplify(ExprOf(PrimNeg, ExprOf(PrimMul, a.Args[0], b)))
		case b.Prim == PrimNeg:
			return simplify(ExprOf(PrimNeg, ExprOf(PrimMul, a, b.Args[0])))
		case b.Prim == PrimSelect && (isConst(b.Args[1], 0) || isConst(b.Args[2], 0)):
			// a·(c ? u : v) with a zero branch is c ? a·u : a·v.
			return simplify(ExprOf(PrimSelect, b.Args[0], ExprOf(PrimMul, a, b.Args[1]), ExprOf(PrimMul, a, b.Args[2])))
		case b.Prim == PrimDiv && b.Args[0].Prim == PrimConst:
			// a·(k/v) is (a·k)/v: one rounding fewer, and a/v for k = 1.
			return simplify(ExprOf(PrimDiv, ExprOf(PrimMul, a, b.Args[0]), b.Args[1]))
		}
	case PrimDiv:
		switch {
		case isConst(a, 0):
			return ExprConst(0)
		case isConst(b, 1):
			return a
		case a.Prim == PrimNeg:
			return simplify(ExprOf(PrimNeg, ExprOf(PrimDiv, a.Args[0], b)))
		}
	case PrimNeg:
		if a.Prim == PrimNeg {
			return a.Args[0]
		}
	case PrimSelect:
		if args[1].String() == args[2].String() {
			return args[1]
		}
	}
	return out
}

// Match reports whether t is the pattern e with e's operands replaced by
// subexpressions, and binds them: bind[i] is what e's operand i stands for
// (an operand read twice must stand for equal trees).
func (e *Expr) Match(t *Expr, bind []*Expr) bool {
	switch e.Prim {
	case PrimVar:
		if b := bind[e.Var]; b != nil {
			return b.String() == t.String()
		}
		bind[e.Var] = t
		return true
	case PrimConst:
		return t.Prim == PrimConst && t.Const == e.Const
	case PrimAttr:
		return false // an op with attributes is not matched (MatchOp)
	}
	if t.Prim != e.Prim {
		return false
	}
	for i, a := range e.Args {
		if !a.Match(t.Args[i], bind) {
			return false
		}
	}
	return true
}

// ExprOps are the ops defined by an expression, in the order in which
// MatchOp tries them.
func ExprOps() []*OpSpec { return exprOps() }

// exprOps is computed once, after every init has registered its rows.
var exprOps = sync.OnceValue(func() []*OpSpec {
	var out []*OpSpec
	for _, s := range Ops() {
		if s.Expr != nil {
			out = append(out, s)
		}
	}
	// Larger patterns first, then the more specific (fewer operands: 1/x
	// is a Reciprocal before it is a Div), then by name (Ops' order).
	slices.SortStableFunc(out, func(a, b *OpSpec) int {
		if d := b.Expr.Size() - a.Expr.Size(); d != 0 {
			return d
		}
		return a.Expr.NumVars() - b.Expr.NumVars()
	})
	return out
})

// MatchOp finds an op that computes e at its root: the op and the
// subexpressions its operands stand for. The largest matching definition
// wins, so a subtree that is a whole Softplus is one Softplus node, not the
// five primitives it is made of. ok is false when no op computes e's root
// primitive (a primitive with no op of its own, outside every pattern).
func MatchOp(e *Expr) (op string, operands []*Expr, ok bool) {
	for _, s := range ExprOps() {
		if s.noMatch || s.exprAttrs {
			continue // not an arithmetic building block (a logical op, PRelu), or bound per node
		}
		bind := make([]*Expr, len(s.Inputs))
		if s.Expr.Match(e, bind) && !slices.Contains(bind, nil) {
			return s.Name, bind, true
		}
	}
	return "", nil, false
}
