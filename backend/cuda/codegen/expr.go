package codegen

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// The expression body every variant renders: a body step's op-table
// expression as C over its operands (ExprC, OpExpr, stepExpr), the
// conversions between a buffer's C type and the compute type (loadExpr,
// storeExpr), and the integer helpers that raise the node's error flag.

// CType is the C type a buffer holds.
func CType(dt graph.DType) (string, error) {
	switch dt {
	case graph.Float32:
		return "float", nil
	case graph.Float64:
		return "double", nil
	case graph.BFloat16:
		return "__nv_bfloat16", nil
	case graph.Float16:
		return "__half", nil
	case graph.Int64:
		return "long long", nil
	case graph.Bool:
		return "unsigned char", nil
	}
	return "", fmt.Errorf("generated elementwise kernels do not handle %v", dt)
}

// ExprC renders an op-table expression (graph.Expr) as C over operand
// expressions args, computed in ct: "float" or "double", or "long long" for
// integer work (int64 and bool data). The renderer knows primitives, not
// ops: every elementwise op gets its code from its one definition. Integer
// division by zero calls fg_idiv, which raises the node's error flag (the
// kernel then takes flag and code parameters: usesFlag).
func ExprC(e *graph.Expr, ct string, args []string) (string, error) {
	return renderC(e, ct, args, true)
}

// renderC writes e; root leaves the outermost operator unparenthesised.
func renderC(e *graph.Expr, ct string, args []string, root bool) (string, error) {
	switch e.Prim {
	case graph.PrimVar:
		if e.Var >= len(args) {
			return "", fmt.Errorf("expression reads operand %d of %d", e.Var, len(args))
		}
		return args[e.Var], nil
	case graph.PrimConst:
		if ct == "long long" && e.Const != math.Trunc(e.Const) || math.IsInf(e.Const, 0) || math.IsNaN(e.Const) {
			return "", fmt.Errorf("constant %v has no C literal in %s", e.Const, ct)
		}
		return "(" + ct + ")" + strconv.FormatFloat(e.Const, 'g', -1, 64), nil
	}
	a := make([]string, len(e.Args))
	for i, x := range e.Args {
		var err error
		if a[i], err = renderC(x, ct, args, false); err != nil {
			return "", err
		}
	}
	integer := ct == "long long"
	f := func(name string) string { // float or double libm
		if ct == "double" {
			return name
		}
		return name + "f"
	}
	one, zero := "("+ct+")1", "("+ct+")0"
	group := func(s string) string {
		if root {
			return s
		}
		return "(" + s + ")"
	}
	call := func(name string) (string, error) {
		if integer {
			return "", fmt.Errorf("%v has no integer form", e.Prim)
		}
		return f(name) + "(" + a[0] + ")", nil
	}
	switch e.Prim {
	case graph.PrimAdd:
		return group(a[0] + " + " + a[1]), nil
	case graph.PrimSub:
		return group(a[0] + " - " + a[1]), nil
	case graph.PrimMul:
		return group(a[0] + " * " + a[1]), nil
	case graph.PrimDiv:
		if integer {
			return "fg_idiv(" + a[0] + ", " + a[1] + ", flag, code)", nil
		}
		return group(a[0] + " / " + a[1]), nil
	case graph.PrimPow:
		if integer {
			return "fg_ipow(" + a[0] + ", " + a[1] + ")", nil
		}
		return f("pow") + "(" + a[0] + ", " + a[1] + ")", nil
	case graph.PrimNeg:
		return group("-" + a[0]), nil
	case graph.PrimExp:
		return call("exp")
	case graph.PrimLog:
		return call("log")
	case graph.PrimLog1p:
		return call("log1p")
	case graph.PrimSqrt:
		return call("sqrt")
	case graph.PrimTanh:
		return call("tanh")
	case graph.PrimErf:
		return call("erf")
	case graph.PrimSigmoid:
		if integer {
			return "", fmt.Errorf("%v has no integer form", e.Prim)
		}
		return group(one + " / (" + one + " + " + f("exp") + "(-" + a[0] + "))"), nil
	case graph.PrimAbs:
		if integer {
			return group(a[0] + " < 0 ? -" + a[0] + " : " + a[0]), nil
		}
		return f("fabs") + "(" + a[0] + ")", nil
	case graph.PrimMax:
		if integer {
			return group(a[0] + " > " + a[1] + " ? " + a[0] + " : " + a[1]), nil
		}
		// NaN in either operand gives NaN, as on the CPU (fmax would
		// drop it).
		return group("(" + a[0] + " > " + a[1] + " || " + a[0] + " != " + a[0] + ") ? " + a[0] + " : " + a[1]), nil
	case graph.PrimGreater:
		return group("(" + a[0] + " > " + a[1] + ") ? " + one + " : " + zero), nil
	case graph.PrimEqual:
		return group("(" + a[0] + " == " + a[1] + ") ? " + one + " : " + zero), nil
	case graph.PrimSelect:
		return group("(" + a[0] + " != " + zero + ") ? " + a[1] + " : " + a[2]), nil
	case graph.PrimMin:
		if integer {
			return group(a[0] + " < " + a[1] + " ? " + a[0] + " : " + a[1]), nil
		}
		// NaN in either operand gives NaN, as on the CPU (fmin would
		// drop it).
		return group("(" + a[0] + " < " + a[1] + " || " + a[0] + " != " + a[0] + ") ? " + a[0] + " : " + a[1]), nil
	case graph.PrimFmod:
		if integer {
			return "fg_imod(" + a[0] + ", " + a[1] + ", flag, code)", nil
		}
		return f("fmod") + "(" + a[0] + ", " + a[1] + ")", nil
	case graph.PrimFloor, graph.PrimCeil, graph.PrimRound:
		if integer {
			return a[0], nil
		}
		// rint rounds halves to even (the default rounding mode).
		return f(map[graph.Prim]string{graph.PrimFloor: "floor", graph.PrimCeil: "ceil", graph.PrimRound: "rint"}[e.Prim]) + "(" + a[0] + ")", nil
	case graph.PrimIsNaN, graph.PrimIsInf:
		if integer {
			return zero, nil
		}
		name := map[graph.Prim]string{graph.PrimIsNaN: "isnan", graph.PrimIsInf: "isinf"}[e.Prim]
		return group(name + "(" + a[0] + ") ? " + one + " : " + zero), nil
	case graph.PrimSin, graph.PrimCos, graph.PrimTan, graph.PrimAsin, graph.PrimAcos, graph.PrimAtan,
		graph.PrimSinh, graph.PrimCosh, graph.PrimAsinh, graph.PrimAcosh, graph.PrimAtanh:
		return call(e.Prim.String()) // the primitive's name is libm's
	}
	return "", fmt.Errorf("no C for primitive %v", e.Prim)
}

// usesIntFlag reports whether generated C calls a helper that raises the
// node's error flag (an integer division or remainder by zero).
func usesIntFlag(c string) bool {
	return strings.Contains(c, "fg_idiv(") || strings.Contains(c, "fg_imod(")
}

// intHelpers are the device functions integer code calls: division that
// reports a zero divisor through the node's flag (the first error wins),
// and int64 powers as the op table computes them (graph.IntPow).
const intHelpers = `__device__ __forceinline__ long long fg_idiv(long long a, long long b, int* flag, int code)
{
    if (b == 0) {
        atomicCAS(flag, 0, code);
        return 0;
    }
    return a / b;
}
__device__ __forceinline__ long long fg_imod(long long a, long long b, int* flag, int code)
{
    if (b == 0) {
        atomicCAS(flag, 0, code);
        return 0;
    }
    if (b == -1) {
        return 0; // the remainder of LLONG_MIN / -1 overflows in C
    }
    return a % b;
}
__device__ __forceinline__ long long fg_ipow(long long x, long long y)
{
    if (y < 0) {
        return (long long)pow((double)x, (double)y);
    }
    long long r = 1;
    for (; y > 0; y >>= 1) {
        if (y & 1) {
            r *= x;
        }
        x *= x;
    }
    return r;
}
`

// OpExpr is the C expression of op over operand expressions a: the op
// table's expression rendered, or the operand itself for Identity (a copy,
// which converts between the operand's and the output's types).
// An op whose expression reads attributes is rendered at the node's (or
// the step's) values, which the C holds as literals.
func OpExpr(op string, attrs graph.Attrs, ct string, a []string) (string, error) {
	if op == "Identity" {
		return a[0], nil
	}
	spec, ok := graph.LookupOp(op)
	if !ok || spec.Expr == nil {
		return "", fmt.Errorf("no generated code for %s (it has no expression in the op table)", op)
	}
	e, err := spec.ExprFor(attrs)
	if err != nil {
		return "", err
	}
	return ExprC(e, ct, a)
}

// stepExpr is the C expression of a body step: op over the operand
// expressions ops, rounded to narrow when that is a 16-bit type, as the
// result of a node of its own would be stored.
func stepExpr(st graph.FusedStep, ct string, ops []string, narrow graph.DType) (string, error) {
	e, err := OpExpr(st.Op, st.Attrs, ct, ops)
	if err != nil {
		return "", err
	}
	if Is16(narrow) {
		t, _ := CType(narrow)
		e = loadExpr(t, ct, storeExpr(t, ct, e))
	}
	return e, nil
}

// operandExprs are a step's operands as C expressions: input k is args[k],
// step k the variable tk.
func operandExprs(st graph.FusedStep, args []string) []string {
	ops := make([]string, len(st.Args))
	for j, a := range st.Args {
		ops[j] = operandOf(a, args)
	}
	return ops
}

// operandOf is a step operand's C name.
func operandOf(a graph.FusedOperand, args []string) string {
	if a.Step {
		return fmt.Sprintf("t%d", a.Index)
	}
	return args[a.Index]
}

// narrowOf is step s's dtype from narrow (none past its end).
func narrowOf(narrow []graph.DType, s int) graph.DType {
	if s < len(narrow) {
		return narrow[s]
	}
	return graph.InvalidDType
}

// loadExpr converts a loaded element of C type t to the compute type.
func loadExpr(t, ct, x string) string {
	switch t {
	case "__nv_bfloat16":
		return "(" + ct + ")__bfloat162float(" + x + ")"
	case "__half":
		return "(" + ct + ")__half2float(" + x + ")"
	case "unsigned char":
		return "(" + x + " != 0)"
	}
	return "(" + ct + ")(" + x + ")"
}

// storeExpr converts a compute-type value to C type t (round to nearest
// even; bool is x != 0; int64 truncates toward zero).
func storeExpr(t, ct, x string) string {
	switch t {
	case "__nv_bfloat16":
		return "__float2bfloat16_rn((float)(" + x + "))"
	case "__half":
		return "__float2half_rn((float)(" + x + "))"
	case "unsigned char":
		return "(unsigned char)((" + x + ") != (" + ct + ")0)"
	}
	return "(" + t + ")(" + x + ")"
}

// ComputeType is the C type a kernel over buffers of types dts computes in:
// double if any is float64, float if any other is floating point, else
// long long (int64 and bool data).
func ComputeType(dts ...graph.DType) string {
	ct := "long long"
	for _, dt := range dts {
		switch {
		case dt == graph.Float64:
			return "double"
		case dt.IsFloat():
			ct = "float"
		}
	}
	return ct
}
