package codegen

import (
	"fmt"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// The skeleton every generated kernel shares. A kernel is a signature over
// its buffers (inputs const, outputs written, each __restrict__), in C
// types chosen from the buffers' dtypes, and a body that one of the
// variants writes around the shape of its loop:
//
//   - elementwise (fused.go): a grid-stride loop over the coalesced output
//     elements, operands at 32- or 64-bit offsets, a vector per thread;
//   - rows (fused_rows.go): segments of a warp per row, a body per element
//     and per row around a warp reduction;
//   - index (fused_index.go): a grid-stride loop over the output's own
//     coordinates, values computed at the coordinates their readers ask for;
//   - reductions (fused_reduce.go): a row reduction (segments of a warp per
//     row) and a column reduction (row chunks by column groups).
//
// What they share is here: the source's layout, the parameter list, the
// compute and accumulator types, the vector width and the 16-byte moves,
// the loops' headers, the coordinates of a linear index, offsets as sums of
// coordinate × stride, and the body's steps rendered from their op-table
// expressions (ExprC).

// CompileOptions: --fmad=false keeps a*b+c two rounded operations, as the
// CPU reference computes it.
var CompileOptions = []string{"-std=c++17", "--fmad=false"}

// Kernel is a generated kernel as the executor compiles and launches it;
// every variant's Generate returns one.
type Kernel struct {
	Entry, Source string
	// Threads is the work of a kernel whose threads stride over it, in
	// blocks of 256 (the launcher caps the grid at what keeps the device
	// busy); 0: nothing to launch.
	Threads int64
	// Grid and Block, when Block is set, are the launch's shape as it is
	// (the column reduction sizes its own).
	Grid, Block [3]uint32
	Args        []Buffer // the buffer arguments, in order
	// UsesFlag: the node's error flag and code follow the buffers (a step
	// divides integers).
	UsesFlag bool
	// What the generator chose: the elements a thread moves at once, and
	// the lanes that share a row (row kernels and row reductions).
	Vec, Lanes int
}

// Program is a kernel to generate, of any variant: Elementwise, Rows,
// Index, RowReduce, ColReduce.
type Program interface {
	Generate() (Kernel, error)
}

// includes are the headers of the 16-bit float types, which every kernel
// includes whatever its dtypes.
const includes = "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"

// kernel is the source of one generated kernel as its variant writes it.
type kernel struct {
	entry   string // the entry point's name
	comment string // one line: what the kernel is specialised to
	// commentFirst puts the comment above the includes (the reductions'
	// layout; the others put it under the device helpers).
	commentFirst bool
	helpers      string   // device functions the body calls
	params       []string // the entry point's parameters
	body         strings.Builder
}

// w appends to the body.
func (k *kernel) w(format string, args ...any) { fmt.Fprintf(&k.body, format, args...) }

// source is the kernel's text: includes, helpers, the comment line, the
// signature and the body (which closes the function).
func (k *kernel) source() string {
	var sb strings.Builder
	if k.commentFirst {
		sb.WriteString("// " + k.comment + "\n")
	}
	sb.WriteString(includes)
	sb.WriteString(k.helpers)
	if !k.commentFirst {
		sb.WriteString("// " + k.comment + "\n")
	}
	fmt.Fprintf(&sb, "extern \"C\" __global__ void __launch_bounds__(256) %s(%s)\n{\n", k.entry, strings.Join(k.params, ", "))
	sb.WriteString(k.body.String())
	return sb.String()
}

// done is the kernel k ready to launch with threads threads over the
// buffers args (inputs, then outputs).
func (k *kernel) done(threads int64, args ...[]Buffer) Kernel {
	var bufs []Buffer
	for _, list := range args {
		bufs = append(bufs, list...)
	}
	return Kernel{Entry: k.entry, Source: k.source(), Threads: threads, Args: bufs}
}

// inParam and outParam are a read and a written buffer parameter of C
// element type t.
func inParam(t, name string) string  { return "const " + t + "* __restrict__ " + name }
func outParam(t, name string) string { return t + "* __restrict__ " + name }

// bufferParams are the parameters in0, in1, ... and out0, out1, ... of
// element types ins and outs.
func bufferParams(ins, outs []string) []string {
	var params []string
	for k, t := range ins {
		params = append(params, inParam(t, fmt.Sprintf("in%d", k)))
	}
	for k, t := range outs {
		params = append(params, outParam(t, fmt.Sprintf("out%d", k)))
	}
	return params
}

// cTypes are the C element types of bufs.
func cTypes(bufs []Buffer) ([]string, error) {
	ts := make([]string, len(bufs))
	for i, b := range bufs {
		var err error
		if ts[i], err = CType(b.DType); err != nil {
			return nil, err
		}
	}
	return ts, nil
}

// opBufs are the buffers of operands ops.
func opBufs(ops []Operand) []Buffer {
	bufs := make([]Buffer, len(ops))
	for k, o := range ops {
		bufs[k] = o.Buf
	}
	return bufs
}

// dtypesOf are the element types of bufs.
func dtypesOf(bufs ...[]Buffer) []graph.DType {
	var dts []graph.DType
	for _, list := range bufs {
		for _, b := range list {
			dts = append(dts, b.DType)
		}
	}
	return dts
}

// floatComputeType is the compute type of a kernel that works in floating
// point whatever its buffers (rows, index): double with a float64 buffer,
// float otherwise.
func floatComputeType(dts ...graph.DType) string {
	if ComputeType(dts...) == "double" {
		return "double"
	}
	return "float"
}

// accumulatorType is what a reduction sums in: float when a 16-bit type is
// involved, double otherwise (as the generic kernels pick).
func accumulatorType(dts ...graph.DType) string {
	for _, dt := range dts {
		if Is16(dt) {
			return "float"
		}
	}
	return "double"
}

// widest is the largest element size among bufs, in bytes.
func widest(bufs ...[]Buffer) int {
	size := 1
	for _, list := range bufs {
		for _, b := range list {
			size = max(size, b.DType.Size())
		}
	}
	return size
}

// dims64 are the dims of s as int64.
func dims64(s graph.Shape) []int64 {
	dims := make([]int64, s.Rank())
	for i, d := range s {
		dims[i] = int64(d)
	}
	return dims
}

// vectorOf is how many elements of size bytes a 16-byte vector holds.
func vectorOf(size int) int { return 16 / size }

// movesVectors reports whether an operand read (or written) at off with
// stride inner along the vectorised axis and strides lead along the others
// allows vectors of vec elements: it broadcasts along the axis, or walks it
// contiguously from an aligned start with every other stride a whole
// number of vectors.
func movesVectors(b Buffer, off, inner int64, lead []int64, vec int) bool {
	switch inner {
	case 0:
		return true
	case 1:
		if !b.alignedFor(off, vec) {
			return false
		}
		for _, s := range lead {
			if s%int64(vec) != 0 {
				return false
			}
		}
		return true
	}
	return false
}

// alignedArray declares a 16-byte aligned array of vec elements of type t.
func alignedArray(t, name string, vec int) string {
	return fmt.Sprintf("__align__(16) %s %s[%d];", t, name, vec)
}

// vecMove copies n bytes from src to dst as one load and one store.
func vecMove(dst, src string, n int) string {
	vt := vecType(n)
	return fmt.Sprintf("*reinterpret_cast<%s*>(%s) = *reinterpret_cast<const %s*>(%s);", vt, dst, vt, src)
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

// indexType is the type of a linear index below n: 32 bits where it fits
// (cheaper divisions and multiplies).
func indexType(n int64) string {
	if n >= 1<<31 {
		return "unsigned long long"
	}
	return "unsigned"
}

// gridStride opens the loop of a thread over elements v, vec at a time,
// below n (elementwise and index kernels).
func (k *kernel) gridStride(idx, v string, vec int, n int64) {
	k.w("    for (%s %s = (blockIdx.x * (%s)blockDim.x + threadIdx.x) * %d; %s < %dull; %s += (%s)gridDim.x * blockDim.x * %d) {\n",
		idx, v, idx, vec, v, n, v, idx, vec)
}

// coordinates declares c0, c1, ... (innermost last) of the linear index
// from over dims, as idx values; literals take suffix ("u", "ull").
func (k *kernel) coordinates(indent, idx, from string, dims []int64, suffix string) {
	k.w("%s%s rem = %s;\n", indent, idx, from)
	for j := len(dims) - 1; j >= 0; j-- {
		if j > 0 {
			k.w("%sconst %s c%d = rem %% %d%s; rem /= %d%s;\n", indent, idx, j, dims[j], suffix, dims[j], suffix)
		} else {
			k.w("%sconst %s c0 = rem;\n", indent, idx)
		}
	}
}

// offsetExpr is base plus a term per nonzero stride (term renders
// coordinate j times stride s).
func offsetExpr(base string, strides []int64, term func(j int, s int64) string) string {
	terms := []string{base}
	for j, s := range strides {
		if s != 0 {
			terms = append(terms, term(j, s))
		}
	}
	return strings.Join(terms, " + ")
}

// rowSplit is how a row of cols elements, taken vec at a time, is shared
// by the lanes of a warp: the most lanes, up to 32, that each get a
// vector, and the iterations that walk the row.
func rowSplit(cols int64, vec int) (lanes int, iters int64) {
	lanes = 1
	for lanes < 32 && int64(lanes*2*vec) <= cols {
		lanes *= 2
	}
	return lanes, (cols + int64(lanes*vec) - 1) / int64(lanes*vec)
}

// warpRows opens the loop of a segment of lanes lanes over rows (row and
// reduction kernels): every lane of a warp runs the same iterations, so
// the shuffles that combine a row always have the whole warp.
func (k *kernel) warpRows(lanes int, rows int64) {
	k.w("    const unsigned lane = threadIdx.x %% %du;\n", lanes)
	k.w("    const unsigned long long warp = (blockIdx.x * 256ull + threadIdx.x) / 32;\n")
	k.w("    const unsigned long long warps = gridDim.x * 256ull / 32;\n")
	k.w("    const unsigned seg = (threadIdx.x %% 32) / %du;\n", lanes)
	k.w("    for (unsigned long long r0 = warp * %d; r0 < %dull; r0 += warps * %d) {\n", 32/lanes, rows, 32/lanes)
	k.w("        const unsigned long long row = r0 + seg;\n")
}

// maxFullUnroll is the longest row walk unrolled fully.
const maxFullUnroll = 16

// walkRow opens the walk of a segment's lanes over a row of cols elements
// (row and row-reduction kernels): iteration it gives lane the vector at
// col, of type idx; literals take suffix. Short walks unroll fully; long
// ones by 4, because NVRTC takes minutes to unroll thousands of iterations
// (a 262144-column sum has 1024) and the code gains nothing from it.
func (k *kernel) walkRow(idx, suffix string, iters int64, lanes, vec int, cols int64) {
	unroll := "#pragma unroll\n"
	if iters > maxFullUnroll {
		unroll = "#pragma unroll 4\n"
	}
	k.w("%s            for (int it = 0; it < %d; it++) {\n", unroll, iters)
	k.w("                const %s col = (it * %du + lane) * %du;\n", idx, lanes, vec)
	k.w("                if (col < %d%s) {\n", cols, suffix)
}

// steps writes each step s of steps that keep selects (nil: all) as
// "const ct ts = ...;" over operands args, rounded to narrow[s], and
// reports whether any raises the error flag.
func (k *kernel) steps(indent, ct string, steps []graph.FusedStep, narrow []graph.DType, args []string, keep func(s int) bool) (usesFlag bool, err error) {
	for s, st := range steps {
		if keep != nil && !keep(s) {
			continue
		}
		e, err := stepExpr(st, ct, operandExprs(st, args), narrowOf(narrow, s))
		if err != nil {
			return false, err
		}
		usesFlag = usesFlag || usesIntFlag(e)
		k.w("%sconst %s t%d = %s;\n", indent, ct, s, e)
	}
	return usesFlag, nil
}

// elemIn is how the loop over a thread's vector reads an input of C type
// t: as a value named outside the loop (arg: broadcast along it), as a<k>
// loaded from load (an element of the thread's vector, indexed by e, or of
// memory), or not at all (both empty).
type elemIn struct{ arg, load, t string }

// elementLoop opens the loop over the vec elements a thread holds
// (elementwise and row kernels) and returns the inputs' values in it, as
// operand expressions of the body's steps.
func (k *kernel) elementLoop(indent, ct string, vec int, voidE bool, ins []elemIn) []string {
	k.w("#pragma unroll\n%sfor (int e = 0; e < %d; e++) {\n", indent, vec)
	if voidE {
		k.w("%s    (void)e;\n", indent)
	}
	args := make([]string, len(ins))
	for i, in := range ins {
		switch {
		case in.arg != "":
			args[i] = in.arg
		case in.load != "":
			k.w("%s    const %s a%d = %s;\n", indent, ct, i, loadExpr(in.t, ct, in.load))
			args[i] = fmt.Sprintf("a%d", i)
		}
	}
	return args
}

// elemOut is an output the loop over a thread's vector writes: step's
// value, at out<k> + at (the vector's first element), in C type t of size
// bytes; "" writes none.
type elemOut struct {
	at, t      string
	step, size int
}

// closeElementLoop stores the outputs' elements (into the w<k> arrays when
// vec > 1, else to memory), closes the loop, and writes each w<k> as one
// vector.
func (k *kernel) closeElementLoop(indent, ct string, vec int, outs []elemOut) {
	for i, o := range outs {
		v := storeExpr(o.t, ct, fmt.Sprintf("t%d", o.step))
		switch {
		case o.at == "":
		case vec > 1:
			k.w("%s    w%d[e] = %s;\n", indent, i, v)
		default:
			k.w("%s    out%d[%s] = %s;\n", indent, i, o.at, v)
		}
	}
	k.w("%s}\n", indent)
	if vec == 1 {
		return
	}
	for i, o := range outs {
		if o.at != "" {
			k.w("%s%s\n", indent, vecMove(fmt.Sprintf("out%d + %s", i, o.at), fmt.Sprintf("w%d", i), vec*o.size))
		}
	}
}
