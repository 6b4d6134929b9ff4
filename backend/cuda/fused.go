package cuda

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
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

// ewCompileOptions: --fmad=false keeps a*b+c two rounded operations, as the
// CPU reference computes it.
var ewCompileOptions = []string{"-std=c++17", "--fmad=false"}

// ewProgram is one generated elementwise kernel.
type ewProgram struct {
	shape graph.Shape // every step's shape (the outputs')
	ins   []operand   // read through strides over shape
	steps []graph.FusedStep
	outs  []int    // the step each output holds
	obufs []buffer // the outputs
	// ostrides, when set, place output k at offset ooff[k] with strides
	// ostrides[k] over shape (a slice of a larger tensor: Concat); nil
	// means contiguous.
	ostrides [][]int64
	ooff     []int64
	// narrow, when set, is each step's dtype: a bfloat16 or float16 step is
	// rounded to it before later steps read it, as separate nodes would be.
	narrow []graph.DType
	// usesFlag is set by generate when a step divides integers: the kernel
	// then takes the error flag and the node's code after the buffers.
	usesFlag bool
}

// ctype is the C type a buffer holds.
func ctype(dt graph.DType) (string, error) {
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

// exprC renders an op-table expression (graph.Expr) as C over operand
// expressions args, computed in ct: "float" or "double", or "long long" for
// integer work (int64 and bool data). The renderer knows primitives, not
// ops: every elementwise op gets its code from its one definition. Integer
// division by zero calls fg_idiv, which raises the node's error flag (the
// kernel then takes flag and code parameters: usesFlag).
func exprC(e *graph.Expr, ct string, args []string) (string, error) {
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

// opExpr is the C expression of op over operand expressions a: the op
// table's expression rendered, or the operand itself for Identity (a copy,
// which converts between the operand's and the output's types).
// An op whose expression reads attributes is rendered at the node's (or
// the step's) values, which the C holds as literals.
func opExpr(op string, attrs graph.Attrs, ct string, a []string) (string, error) {
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
	return exprC(e, ct, a)
}

// stepExpr is the C expression of a body step: op over the operand
// expressions ops, rounded to narrow when that is a 16-bit type, as the
// result of a node of its own would be stored.
func stepExpr(st graph.FusedStep, ct string, ops []string, narrow graph.DType) (string, error) {
	e, err := opExpr(st.Op, st.Attrs, ct, ops)
	if err != nil {
		return "", err
	}
	if is16(narrow) {
		t, _ := ctype(narrow)
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

// vecType is an integer type of n bytes, for moving n bytes at once.
func vecType(n int) string {
	switch n {
	case 16:
		return "uint4"
	case 8:
		return "uint2"
	case 4:
		return "unsigned int"
	case 2:
		return "unsigned short"
	}
	return "unsigned char"
}

// generate writes the kernel source ("ew" is its entry point) and returns it
// with the launch's element count and vector width.
func (p *ewProgram) generate() (src string, n int64, vec int, err error) {
	n = int64(p.shape.Numel())
	dims := make([]int64, p.shape.Rank())
	for i, d := range p.shape {
		dims[i] = int64(d)
	}
	strides := make([][]int64, 0, len(p.ins)+1)
	for _, o := range p.ins {
		strides = append(strides, o.strides)
	}
	for k := range p.obufs {
		strides = append(strides, p.outStrides(k))
	}
	dims, strides = coalesce(dims, strides)
	r := len(dims)

	types := make([]string, len(p.ins))
	otypes := make([]string, len(p.obufs))
	maxSize := 1
	var dts []graph.DType
	for i, o := range p.ins {
		if types[i], err = ctype(o.buf.dt); err != nil {
			return "", 0, 0, err
		}
		dts = append(dts, o.buf.dt)
		maxSize = max(maxSize, o.buf.dt.Size())
	}
	for i, b := range p.obufs {
		if otypes[i], err = ctype(b.dt); err != nil {
			return "", 0, 0, err
		}
		dts = append(dts, b.dt)
		maxSize = max(maxSize, b.dt.Size())
	}
	ct := computeType(dts...)

	// Vector width: 16 bytes of the widest type, when the innermost axis
	// splits into whole vectors, every operand reads it contiguously or
	// broadcasts it, and every vector starts aligned.
	vec = 16 / maxSize
	inner := dims[r-1]
	ok := inner%int64(vec) == 0
	aligned := func(b buffer, off int64, width int) bool {
		return (int64(b.ptr)+off*int64(b.dt.Size()))%int64(width*b.dt.Size()) == 0
	}
	for k, o := range p.ins {
		s := strides[k]
		switch s[r-1] {
		case 0:
		case 1:
			if !aligned(o.buf, o.off, vec) {
				ok = false
			}
			for j := 0; j < r-1; j++ {
				if s[j]%int64(vec) != 0 {
					ok = false
				}
			}
		default:
			ok = false
		}
	}
	for k, b := range p.obufs {
		s := strides[len(p.ins)+k]
		if s[r-1] != 1 || !aligned(b, p.outOff(k), vec) {
			ok = false
		}
		for j := 0; j < r-1; j++ {
			if s[j]%int64(vec) != 0 {
				ok = false
			}
		}
	}
	if !ok || n < int64(vec) {
		vec = 1
	}

	idx := "unsigned"
	if n >= 1<<31 {
		idx = "unsigned long long"
	}
	// The body is written first: the head declares the error flag's
	// parameters only when a step divides integers.
	var body strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&body, format, args...) }
	p.usesFlag = false
	// Operands that broadcast over everything are loaded once.
	scalar := make([]bool, len(p.ins))
	for k := range p.ins {
		scalar[k] = true
		for _, s := range strides[k] {
			if s != 0 {
				scalar[k] = false
			}
		}
		if scalar[k] {
			w("    const %s s%d = %s;\n", ct, k, loadExpr(types[k], ct, fmt.Sprintf("in%d[%d]", k, p.ins[k].off)))
		}
	}
	// Offsets in 32 bits where they fit (cheaper multiplies).
	offType := make([]string, len(p.ins))
	for k, o := range p.ins {
		last := o.off
		for j := 0; j < r; j++ {
			last += (dims[j] - 1) * strides[k][j]
		}
		offType[k] = "unsigned long long"
		if idx == "unsigned" && last < 1<<31 {
			offType[k] = "unsigned"
		}
	}
	outOffType := make([]string, len(p.obufs))
	for k := range p.obufs {
		last := p.outOff(k)
		for j := 0; j < r; j++ {
			last += (dims[j] - 1) * strides[len(p.ins)+k][j]
		}
		outOffType[k] = "unsigned long long"
		if idx == "unsigned" && last < 1<<31 {
			outOffType[k] = "unsigned"
		}
	}
	w("    for (%s base = (blockIdx.x * (%s)blockDim.x + threadIdx.x) * %d; base < %dull; base += (%s)gridDim.x * blockDim.x * %d) {\n",
		idx, idx, vec, n, idx, vec)
	// Coordinates of base, innermost last.
	w("        %s rem = base;\n", idx)
	for j := r - 1; j >= 0; j-- {
		if j > 0 {
			w("        const %s c%d = rem %% %du; rem /= %du;\n", idx, j, dims[j], dims[j])
		} else {
			w("        const %s c0 = rem;\n", idx)
		}
	}
	for k := range p.ins {
		if scalar[k] {
			continue
		}
		terms := []string{fmt.Sprintf("%du", p.ins[k].off)}
		for j := 0; j < r; j++ {
			if s := strides[k][j]; s != 0 {
				terms = append(terms, fmt.Sprintf("(%s)c%d * %du", offType[k], j, s))
			}
		}
		w("        const %s o%d = %s;\n", offType[k], k, strings.Join(terms, " + "))
		if vec > 1 && strides[k][r-1] == 1 {
			sz := p.ins[k].buf.dt.Size()
			w("        __align__(16) %s v%d[%d];\n", types[k], k, vec)
			w("        *reinterpret_cast<%s*>(v%d) = *reinterpret_cast<const %s*>(in%d + o%d);\n",
				vecType(vec*sz), k, vecType(vec*sz), k, k)
		}
	}
	for i, t := range otypes {
		terms := []string{fmt.Sprintf("%du", p.outOff(i))}
		for j := 0; j < r; j++ {
			if s := strides[len(p.ins)+i][j]; s != 0 {
				terms = append(terms, fmt.Sprintf("(%s)c%d * %du", outOffType[i], j, s))
			}
		}
		w("        const %s q%d = %s;\n", outOffType[i], i, strings.Join(terms, " + "))
		if vec > 1 {
			w("        __align__(16) %s w%d[%d];\n", t, i, vec)
		}
	}
	w("#pragma unroll\n        for (int e = 0; e < %d; e++) {\n", vec)
	if vec == 1 {
		w("            (void)e;\n")
	}
	args := make([]string, len(p.ins))
	for k := range p.ins {
		switch {
		case scalar[k]:
			args[k] = fmt.Sprintf("s%d", k)
		case vec > 1 && strides[k][r-1] == 1:
			w("            const %s a%d = %s;\n", ct, k, loadExpr(types[k], ct, fmt.Sprintf("v%d[e]", k)))
			args[k] = fmt.Sprintf("a%d", k)
		default: // read at o (a broadcast inner axis, or one element per thread)
			w("            const %s a%d = %s;\n", ct, k, loadExpr(types[k], ct, fmt.Sprintf("in%d[o%d]", k, k)))
			args[k] = fmt.Sprintf("a%d", k)
		}
	}
	for s, st := range p.steps {
		e, err := stepExpr(st, ct, operandExprs(st, args), narrowOf(p.narrow, s))
		if err != nil {
			return "", 0, 0, err
		}
		p.usesFlag = p.usesFlag || usesIntFlag(e)
		w("            const %s t%d = %s;\n", ct, s, e)
	}
	for i, s := range p.outs {
		if vec > 1 {
			w("            w%d[e] = %s;\n", i, storeExpr(otypes[i], ct, fmt.Sprintf("t%d", s)))
		} else {
			w("            out%d[q%d] = %s;\n", i, i, storeExpr(otypes[i], ct, fmt.Sprintf("t%d", s)))
		}
	}
	w("        }\n")
	if vec > 1 {
		for i := range otypes {
			sz := p.obufs[i].dt.Size()
			w("        *reinterpret_cast<%s*>(out%d + q%d) = *reinterpret_cast<const %s*>(w%d);\n", vecType(vec*sz), i, i, vecType(vec*sz), i)
		}
	}
	w("    }\n}\n")
	var head strings.Builder
	hw := func(format string, args ...any) { fmt.Fprintf(&head, format, args...) }
	hw("#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n")
	if ct == "long long" {
		hw("%s", intHelpers)
	}
	hw("// %v, %d inputs, %d steps, %d outputs, vector %d\n", p.shape, len(p.ins), len(p.steps), len(p.obufs), vec)
	hw("extern \"C\" __global__ void __launch_bounds__(256) ew(")
	var params []string
	for i, t := range types {
		params = append(params, fmt.Sprintf("const %s* __restrict__ in%d", t, i))
	}
	for i, t := range otypes {
		params = append(params, fmt.Sprintf("%s* __restrict__ out%d", t, i))
	}
	if p.usesFlag {
		params = append(params, "int* __restrict__ flag", "int code")
	}
	hw("%s)\n{\n", strings.Join(params, ", "))
	return head.String() + body.String(), n, vec, nil
}

// computeType is the C type a kernel over buffers of types dts computes in:
// double if any is float64, float if any other is floating point, else
// long long (int64 and bool data).
func computeType(dts ...graph.DType) string {
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

// generatedFunction compiles (once per source) a generated kernel and
// returns its entry point.
func (b *Backend) generatedFunction(src, entry string) (*Function, error) {
	if b.render != nil {
		b.render(entry, src)
		return &Function{}, nil
	}
	b.genMu.Lock()
	defer b.genMu.Unlock()
	key := entry + "\x00" + src
	if f, ok := b.generated[key]; ok {
		return f, nil
	}
	m, err := b.dev.Compile("generated_"+entry+".cu", src, ewCompileOptions...)
	if err != nil {
		return nil, fmt.Errorf("generated kernel: %w\n%s", err, src)
	}
	f, err := m.Function(entry)
	if err != nil {
		return nil, err
	}
	if b.generated == nil {
		b.generated = map[string]*Function{}
	}
	b.generated[key] = f
	return f, nil
}

// lowerEwProgram generates, compiles and launches p.
func (c *lowerCtx) lowerEwProgram(p *ewProgram) (func() error, error) {
	src, n, vec, err := p.generate()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nop, nil
	}
	ins := make([]buffer, len(p.ins))
	for i, o := range p.ins {
		ins[i] = o.buf
	}
	var extra []any
	if p.usesFlag {
		extra = []any{c.flag(), c.code()}
	}
	return c.launchGeneratedWith(src, "ew", (n+int64(vec)-1)/int64(vec), extra, ins, p.obufs)
}

// launchGenerated compiles a generated kernel (once per source) and returns
// the launch of its entry point with threads threads in blocks of 256 and
// the buffers' addresses as its arguments, in order.
func (c *lowerCtx) launchGenerated(src, entry string, threads int64, bufs ...[]buffer) (func() error, error) {
	return c.launchGeneratedWith(src, entry, threads, nil, bufs...)
}

// launchGeneratedWith is launchGenerated with extra arguments after the
// buffers (the error flag and the node's code).
func (c *lowerCtx) launchGeneratedWith(src, entry string, threads int64, extra []any, bufs ...[]buffer) (func() error, error) {
	f, err := c.x.b.generatedFunction(src, entry)
	if err != nil {
		return nil, err
	}
	var args []any
	for _, list := range bufs {
		for _, b := range list {
			args = append(args, b.ptr)
		}
	}
	args = append(args, extra...)
	l, err := driver.NewRawLaunch(f, c.gridFor(threads, 256), [3]uint32{256, 1, 1}, 0, args...)
	if err != nil {
		return nil, err
	}
	d := c.dev()
	return func() error { return l.Run(d) }, nil
}

// lowerFusedElementwise lowers a FusedElementwise node to one generated kernel.
func lowerFusedElementwise(c *lowerCtx) (func() error, error) {
	n := c.n
	steps, err := graph.FusedBody(n.Attrs.String("body", ""), len(n.Inputs))
	if err != nil {
		return nil, err
	}
	inTypes := make([]graph.TensorType, len(n.Inputs))
	for i, v := range n.Inputs {
		inTypes[i] = v.Type
	}
	types, err := graph.FusedTypes(steps, inTypes, n.Attrs)
	if err != nil {
		return nil, err
	}
	for _, st := range steps {
		if graph.FusibleReduce[st.Op] {
			return lowerFusedRows(c, steps, types)
		}
	}
	for _, st := range steps {
		if _, ok := graph.FusibleIndex[st.Op]; ok {
			return lowerFusedIndex(c, steps, types)
		}
	}
	shape := n.Outputs[0].Type.Shape
	for k, t := range types {
		if !t.Shape.Equal(shape) {
			return nil, fmt.Errorf("step %d is %v, the outputs %v: a generated kernel computes one shape", k, t.Shape, shape)
		}
	}
	p := &ewProgram{shape: shape, steps: steps}
	for _, t := range types {
		p.narrow = append(p.narrow, t.DType)
	}
	for i, v := range n.Inputs {
		p.ins = append(p.ins, broadcastOperand(c.in(i), v.Type.Shape, shape))
	}
	for k, o := range n.Attrs["outputs"].Ints {
		p.outs = append(p.outs, int(o))
		p.obufs = append(p.obufs, c.out(k))
	}
	return c.lowerEwProgram(p)
}

// lowerGenerated lowers a node of an op defined by an expression (every
// elementwise op of the op table): the node becomes a generated program of
// one step, in whatever dtypes it has (float work in float or double,
// int64 and bool work in long long).
func lowerGenerated(op string) lowerFn {
	return func(c *lowerCtx) (func() error, error) {
		shape := c.n.Outputs[0].Type.Shape
		st := graph.FusedStep{Op: op, Attrs: graph.ExprStepAttrs(op, c.n.Attrs)}
		p := &ewProgram{shape: shape, outs: []int{0}, obufs: []buffer{c.out(0)}}
		for i, v := range c.n.Inputs {
			p.ins = append(p.ins, broadcastOperand(c.in(i), v.Type.Shape, shape))
			st.Args = append(st.Args, graph.FusedOperand{Index: i})
		}
		p.steps = []graph.FusedStep{st}
		return c.lowerEwProgram(p)
	}
}

// copyTo copies (and converts) operand src, read over shape, into dst:
// data movement (Transpose, Slice, Expand, Cast, a copy) as a generated
// program of one Identity step.
func (c *lowerCtx) copyTo(dst buffer, shape graph.Shape, src operand) (func() error, error) {
	if shape.Numel() == 0 {
		return nop, nil
	}
	p := &ewProgram{shape: shape, ins: []operand{src}, outs: []int{0}, obufs: []buffer{dst},
		steps: []graph.FusedStep{{Op: "Identity", Args: []graph.FusedOperand{{Index: 0}}}}}
	return c.lowerEwProgram(p)
}

// outStrides are output k's strides over the program's shape.
func (p *ewProgram) outStrides(k int) []int64 {
	if k < len(p.ostrides) && p.ostrides[k] != nil {
		return p.ostrides[k]
	}
	return contiguousStrides(p.shape)
}

// outOff is output k's offset in elements.
func (p *ewProgram) outOff(k int) int64 {
	if k < len(p.ooff) {
		return p.ooff[k]
	}
	return 0
}
