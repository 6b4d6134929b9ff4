package codegen

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// Code generation for elementwise work: a FusedElementwise node (and each
// single float elementwise op, as a body of one step) becomes one NVRTC
// kernel specialised to its dtypes, shape and strides. Every output element
// is computed in registers from its inputs, in float32 (float64 when any
// operand is float64), with no per-element dtype switch and index arithmetic
// by compile-time constants; where every operand walks its innermost axis
// contiguously (or broadcasts along it) and the buffers are aligned, each
// thread moves 16-byte vectors. Kernels are compiled once per distinct
// source and cached on disk with the other cubins.

// CompileOptions: --fmad=false keeps a*b+c two rounded operations, as the
// CPU reference computes it.
var CompileOptions = []string{"-std=c++17", "--fmad=false"}

// Elementwise is one generated elementwise kernel.
type Elementwise struct {
	Shape   graph.Shape // every step's shape (the outputs')
	Ins     []Operand   // read through strides over shape
	Steps   []graph.FusedStep
	Outs    []int    // the step each output holds
	OutBufs []Buffer // the outputs
	// ostrides, when set, place output k at offset ooff[k] with strides
	// ostrides[k] over shape (a slice of a larger tensor: Concat); nil
	// means contiguous.
	OutStrides [][]int64
	OutOffs    []int64
	// narrow, when set, is each step's dtype: a bfloat16 or float16 step is
	// rounded to it before later steps read it, as separate nodes would be.
	Narrow []graph.DType
	// UsesFlag is set by Generate when a step divides integers: the kernel
	// then takes the error flag and the node's code after the buffers.
	UsesFlag bool
}

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

// Generate writes the kernel source ("ew" is its entry point) and returns it
// with the launch's element count and vector width.
func (p *Elementwise) Generate() (src string, n int64, vec int, err error) {
	n = int64(p.Shape.Numel())
	dims := make([]int64, p.Shape.Rank())
	for i, d := range p.Shape {
		dims[i] = int64(d)
	}
	// Inputs and outputs alike are operands over the shape: a buffer read
	// or written at an offset plus coordinates times strides, coalesced
	// together.
	ops := slices.Clone(p.Ins)
	for k, b := range p.OutBufs {
		ops = append(ops, Operand{Buf: b, Off: p.outOff(k), Strides: p.outStrides(k)})
	}
	strides := make([][]int64, len(ops))
	for k, o := range ops {
		strides[k] = o.Strides
	}
	dims, strides = Coalesce(dims, strides)
	r := len(dims)
	nIn := len(p.Ins)
	bufs := opBufs(ops)
	types, err := cTypes(bufs)
	if err != nil {
		return "", 0, 0, err
	}
	maxSize := 1
	for _, b := range bufs {
		maxSize = max(maxSize, b.DType.Size())
	}
	ct := ComputeType(dtypesOf(bufs)...)

	// Vector width: 16 bytes of the widest type, when the innermost axis
	// splits into whole vectors, every input reads it contiguously or
	// broadcasts it, every output writes it contiguously, and every vector
	// starts aligned.
	vec = vectorOf(maxSize)
	ok := dims[r-1]%int64(vec) == 0
	for k, o := range ops {
		s := strides[k]
		if k >= nIn && s[r-1] != 1 || !movesVectors(o.Buf, o.Off, s[r-1], s[:r-1], vec) {
			ok = false
		}
	}
	if !ok || n < int64(vec) {
		vec = 1
	}

	idx := indexType(n)
	// Offsets in 32 bits where they fit (cheaper multiplies).
	offType := make([]string, len(ops))
	for k, o := range ops {
		last := o.Off
		for j := 0; j < r; j++ {
			last += (dims[j] - 1) * strides[k][j]
		}
		offType[k] = "unsigned long long"
		if idx == "unsigned" && last < 1<<31 {
			offType[k] = "unsigned"
		}
	}
	offset := func(k int) string {
		return offsetExpr(fmt.Sprintf("%du", ops[k].Off), strides[k], func(j int, s int64) string {
			return fmt.Sprintf("(%s)c%d * %du", offType[k], j, s)
		})
	}
	kn := &kernel{entry: "ew", comment: fmt.Sprintf("%v, %d inputs, %d steps, %d outputs, vector %d", p.Shape, nIn, len(p.Steps), len(p.OutBufs), vec),
		params: bufferParams(types[:nIn], types[nIn:])}
	if ct == "long long" {
		kn.helpers = intHelpers
	}
	w := kn.w
	// Operands that broadcast over everything are loaded once.
	scalar := make([]bool, nIn)
	for k := range p.Ins {
		scalar[k] = !slices.ContainsFunc(strides[k], func(s int64) bool { return s != 0 })
		if scalar[k] {
			w("    const %s s%d = %s;\n", ct, k, loadExpr(types[k], ct, fmt.Sprintf("in%d[%d]", k, p.Ins[k].Off)))
		}
	}
	kn.gridStride(idx, "base", vec, n)
	kn.coordinates("        ", idx, "base", dims, "u")
	for k := range p.Ins {
		if scalar[k] {
			continue
		}
		w("        const %s o%d = %s;\n", offType[k], k, offset(k))
		if vec > 1 && strides[k][r-1] == 1 {
			w("        %s\n", alignedArray(types[k], fmt.Sprintf("v%d", k), vec))
			w("        %s\n", vecMove(fmt.Sprintf("v%d", k), fmt.Sprintf("in%d + o%d", k, k), vec*p.Ins[k].Buf.DType.Size()))
		}
	}
	for i := range p.OutBufs {
		w("        const %s q%d = %s;\n", offType[nIn+i], i, offset(nIn+i))
		if vec > 1 {
			w("        %s\n", alignedArray(types[nIn+i], fmt.Sprintf("w%d", i), vec))
		}
	}
	ins := make([]elemIn, nIn)
	for k := range p.Ins {
		ins[k].t = types[k]
		switch {
		case scalar[k]:
			ins[k].arg = fmt.Sprintf("s%d", k)
		case vec > 1 && strides[k][r-1] == 1:
			ins[k].load = fmt.Sprintf("v%d[e]", k)
		default: // read at o (a broadcast inner axis, or one element per thread)
			ins[k].load = fmt.Sprintf("in%d[o%d]", k, k)
		}
	}
	args := kn.elementLoop("        ", ct, vec, vec == 1, ins)
	if p.UsesFlag, err = kn.steps("            ", ct, p.Steps, p.Narrow, args, nil); err != nil {
		return "", 0, 0, err
	}
	outs := make([]elemOut, len(p.Outs))
	for i, s := range p.Outs {
		outs[i] = elemOut{at: fmt.Sprintf("q%d", i), t: types[nIn+i], step: s, size: p.OutBufs[i].DType.Size()}
	}
	kn.closeElementLoop("        ", ct, vec, outs)
	w("    }\n}\n")
	// The error flag's parameters follow the buffers only when a step
	// divides integers.
	if p.UsesFlag {
		kn.params = append(kn.params, "int* __restrict__ flag", "int code")
	}
	return kn.source(), n, vec, nil
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

// outStrides are output k's strides over the program's shape.
func (p *Elementwise) outStrides(k int) []int64 {
	if k < len(p.OutStrides) && p.OutStrides[k] != nil {
		return p.OutStrides[k]
	}
	return ContiguousStrides(p.Shape)
}

// outOff is output k's offset in elements.
func (p *Elementwise) outOff(k int) int64 {
	if k < len(p.OutOffs) {
		return p.OutOffs[k]
	}
	return 0
}
