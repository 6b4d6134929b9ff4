package cuda

import (
	"fmt"
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
	case graph.Bool:
		return "unsigned char", nil
	}
	return "", fmt.Errorf("generated elementwise kernels do not handle %v", dt)
}

// ewExpr is the C expression of one step over operand expressions a.
func ewExpr(op string, ct string, a []string) (string, error) {
	f := func(name string) string { // float or double libm
		if ct == "double" {
			return name
		}
		return name + "f"
	}
	one := "(" + ct + ")1"
	zero := "(" + ct + ")0"
	switch op {
	case "Add":
		return a[0] + " + " + a[1], nil
	case "Sub":
		return a[0] + " - " + a[1], nil
	case "Mul":
		return a[0] + " * " + a[1], nil
	case "Div":
		return a[0] + " / " + a[1], nil
	case "Pow":
		return f("pow") + "(" + a[0] + ", " + a[1] + ")", nil
	case "Neg":
		return "-" + a[0], nil
	case "Sqrt":
		return f("sqrt") + "(" + a[0] + ")", nil
	case "Reciprocal":
		return one + " / " + a[0], nil
	case "Exp":
		return f("exp") + "(" + a[0] + ")", nil
	case "Log":
		return f("log") + "(" + a[0] + ")", nil
	case "Sigmoid":
		return one + " / (" + one + " + " + f("exp") + "(-" + a[0] + "))", nil
	case "Tanh":
		return f("tanh") + "(" + a[0] + ")", nil
	case "Relu":
		// NaN stays NaN, as on the CPU.
		return "(" + a[0] + " > " + zero + " || " + a[0] + " != " + a[0] + ") ? " + a[0] + " : " + zero, nil
	case "Erf":
		return f("erf") + "(" + a[0] + ")", nil
	case "Abs":
		return f("fabs") + "(" + a[0] + ")", nil
	case "Softplus":
		// max(x,0) + ln(1 + e^-|x|): the exponential is at most 1, so large
		// x gives x, not +Inf (the op table's form).
		return f("fmax") + "(" + a[0] + ", " + zero + ") + " + f("log1p") + "(" + f("exp") + "(-" + f("fabs") + "(" + a[0] + ")))", nil
	case "Where":
		return "(" + a[0] + ") ? " + a[1] + " : " + a[2], nil
	case "Identity":
		return a[0], nil
	}
	return "", fmt.Errorf("no generated code for %s", op)
}

// stepExpr is the C expression of a body step: op over the operand
// expressions ops, rounded to narrow when that is a 16-bit type, as the
// result of a node of its own would be stored.
func stepExpr(op, ct string, ops []string, narrow graph.DType) (string, error) {
	e, err := ewExpr(op, ct, ops)
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

// storeExpr converts a compute-type value to C type t (round to nearest even).
func storeExpr(t, ct, x string) string {
	switch t {
	case "__nv_bfloat16":
		return "__float2bfloat16_rn((float)(" + x + "))"
	case "__half":
		return "__float2half_rn((float)(" + x + "))"
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

	ct := "float"
	types := make([]string, len(p.ins))
	otypes := make([]string, len(p.obufs))
	maxSize := 1
	for i, o := range p.ins {
		if types[i], err = ctype(o.buf.dt); err != nil {
			return "", 0, 0, err
		}
		if o.buf.dt == graph.Float64 {
			ct = "double"
		}
		maxSize = max(maxSize, o.buf.dt.Size())
	}
	for i, b := range p.obufs {
		if otypes[i], err = ctype(b.dt); err != nil {
			return "", 0, 0, err
		}
		if b.dt == graph.Float64 {
			ct = "double"
		}
		maxSize = max(maxSize, b.dt.Size())
	}

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
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	w("#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n")
	w("// %v, %d inputs, %d steps, %d outputs, vector %d\n", p.shape, len(p.ins), len(p.steps), len(p.obufs), vec)
	w("extern \"C\" __global__ void __launch_bounds__(256) ew(")
	var params []string
	for i, t := range types {
		params = append(params, fmt.Sprintf("const %s* __restrict__ in%d", t, i))
	}
	for i, t := range otypes {
		params = append(params, fmt.Sprintf("%s* __restrict__ out%d", t, i))
	}
	w("%s)\n{\n", strings.Join(params, ", "))
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
		e, err := stepExpr(st.Op, ct, operandExprs(st, args), narrowOf(p.narrow, s))
		if err != nil {
			return "", 0, 0, err
		}
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
	return sb.String(), n, vec, nil
}

// generatedFunction compiles (once per source) a generated kernel and
// returns its entry point.
func (b *Backend) generatedFunction(src, entry string) (*Function, error) {
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
	return c.launchGenerated(src, "ew", (n+int64(vec)-1)/int64(vec), ins, p.obufs)
}

// launchGenerated compiles a generated kernel (once per source) and returns
// the launch of its entry point with threads threads in blocks of 256 and
// the buffers' addresses as its arguments, in order.
func (c *lowerCtx) launchGenerated(src, entry string, threads int64, bufs ...[]buffer) (func() error, error) {
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
	l, err := newRawLaunch(f, c.gridFor(threads, 256), [3]uint32{256, 1, 1}, 0, args...)
	if err != nil {
		return nil, err
	}
	d := c.dev()
	return func() error { return l.run(d) }, nil
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

// ewOpNames are the ops.cu op codes the generator writes, by op-table name
// (a copy is an Identity step).
var ewOpNames = map[int32]string{
	opCopy: "Identity", opAdd: "Add", opSub: "Sub", opMul: "Mul", opDiv: "Div", opPow: "Pow",
	opNeg: "Neg", opSqrt: "Sqrt", opRecip: "Reciprocal", opExp: "Exp", opLog: "Log",
	opSigmoid: "Sigmoid", opTanh: "Tanh", opRelu: "Relu", opErf: "Erf", opAbs: "Abs", opWhere: "Where",
}

// generatedEw is the program of one ew launch when the generator handles it:
// floating-point outputs and operands (and a bool condition), not the integer
// kernel. nil sends it to the generic kernels.
func generatedEw(op int32, kernel string, out buffer, shape graph.Shape, ops []operand) *ewProgram {
	name, ok := ewOpNames[op]
	if !ok || kernel == "ew_i64" || !out.dt.IsFloat() {
		return nil
	}
	st := graph.FusedStep{Op: name}
	for i, o := range ops {
		if !o.buf.dt.IsFloat() && !(op == opWhere && i == 0 && o.buf.dt == graph.Bool) {
			return nil
		}
		st.Args = append(st.Args, graph.FusedOperand{Index: i})
	}
	return &ewProgram{shape: shape, ins: ops, steps: []graph.FusedStep{st}, outs: []int{0}, obufs: []buffer{out}}
}

// lowerGenerated lowers a node of a float elementwise op that has generated
// code (an ewExpr case) and no ops.cu op code: the node becomes a program of
// one step, as generatedEw makes for the ops that have both.
func lowerGenerated(op string) lowerFn {
	return func(c *lowerCtx) (func() error, error) {
		shape := c.n.Outputs[0].Type.Shape
		st := graph.FusedStep{Op: op}
		p := &ewProgram{shape: shape, outs: []int{0}, obufs: []buffer{c.out(0)}}
		if !c.out(0).dt.IsFloat() {
			return nil, fmt.Errorf("%s has no CUDA code for %v", op, c.out(0).dt)
		}
		for i, v := range c.n.Inputs {
			if !c.in(i).dt.IsFloat() {
				return nil, fmt.Errorf("%s has no CUDA code for input %d of %v", op, i, c.in(i).dt)
			}
			p.ins = append(p.ins, broadcastOperand(c.in(i), v.Type.Shape, shape))
			st.Args = append(st.Args, graph.FusedOperand{Index: i})
		}
		p.steps = []graph.FusedStep{st}
		return c.lowerEwProgram(p)
	}
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
