package cuda

import (
	"fmt"
	"strings"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/graph"
)

// Generated row reductions: a ReduceSum/Mean/Max over the last axis of a
// contiguous float tensor becomes a kernel specialised to the row length and
// dtypes. Each row is read by a segment of lanes of one warp with 16-byte
// loads, fully unrolled (the row length is a constant), and combined with
// shuffles in a fixed order; short rows share a warp (a 64-element row takes
// 8 lanes). The generic kernels walk a row one element per lane per step
// with a dtype switch in the loop, which kept one load in flight per warp.

// rowReduceProgram is one generated row reduction.
type rowReduceProgram struct {
	x, y    buffer
	rows    int64
	cols    int64
	op      int32 // 0 sum, 2 max
	divisor int64 // 1, or cols for a mean
}

func (p *rowReduceProgram) generate() (src string, lanes int, err error) {
	xt, err := ctype(p.x.dt)
	if err != nil {
		return "", 0, err
	}
	yt, err := ctype(p.y.dt)
	if err != nil {
		return "", 0, err
	}
	// The accumulator: float when a 16-bit type is involved, double
	// otherwise (as reduceSuffix picks for the generic kernels).
	acc := "double"
	if is16(p.x.dt) || is16(p.y.dt) {
		acc = "float"
	}
	size := p.x.dt.Size()
	vec := 16 / size
	if p.cols%int64(vec) != 0 || int64(p.x.ptr)%16 != 0 {
		vec = 1
	}
	lanes = 1
	for lanes < 32 && int64(lanes*2*vec) <= p.cols {
		lanes *= 2
	}
	iters := (p.cols + int64(lanes*vec) - 1) / int64(lanes*vec)
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	w("// rows %d x %d, %s -> %s, op %d, vector %d, %d lanes per row\n", p.rows, p.cols, xt, yt, p.op, vec, lanes)
	ident := reducePreamble(&sb, p.op, acc)
	w("extern \"C\" __global__ void __launch_bounds__(256) red(const %s* __restrict__ x, %s* __restrict__ y)\n{\n", xt, yt)
	w("    const unsigned lane = threadIdx.x %% %du;\n", lanes)
	w("    const unsigned long long warp = (blockIdx.x * 256ull + threadIdx.x) / 32;\n")
	w("    const unsigned long long warps = gridDim.x * 256ull / 32;\n")
	w("    const unsigned seg = (threadIdx.x %% 32) / %du;\n", lanes)
	// Every lane of a warp runs the same iterations, so the shuffles always
	// have the whole warp; rows past the end contribute nothing.
	w("    for (unsigned long long r0 = warp * %d; r0 < %dull; r0 += warps * %d) {\n", 32/lanes, p.rows, 32/lanes)
	w("        const unsigned long long row = r0 + seg;\n")
	w("        const bool valid = row < %dull;\n", p.rows)
	w("        %s a = %s;\n", acc, ident)
	w("        if (valid) {\n")
	w("            const %s* xr = x + row * %dull;\n", xt, p.cols)
	w("#pragma unroll\n            for (int it = 0; it < %d; it++) {\n", iters)
	w("                const unsigned col = (it * %du + lane) * %du;\n", lanes, vec)
	w("                if (col < %du) {\n", p.cols)
	if vec > 1 {
		w("                    __align__(16) %s v[%d];\n", xt, vec)
		w("                    *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(xr + col);\n")
		w("#pragma unroll\n                    for (int e = 0; e < %d; e++) {\n", vec)
		w("                        a = combine(a, %s);\n", loadExpr(xt, acc, "v[e]"))
		w("                    }\n")
	} else {
		w("                    a = combine(a, %s);\n", loadExpr(xt, acc, "xr[col]"))
	}
	w("                }\n            }\n        }\n")
	w("#pragma unroll\n        for (int m = %d; m > 0; m >>= 1) {\n", lanes/2)
	w("            a = combine(a, __shfl_xor_sync(0xffffffffu, a, m));\n        }\n")
	result := "a"
	if p.divisor != 1 {
		result = fmt.Sprintf("a / (%s)%d", acc, p.divisor)
	}
	w("        if (valid && lane == 0) {\n            y[row] = %s;\n        }\n    }\n}\n", storeExpr(yt, acc, result))
	return sb.String(), lanes, nil
}

// lowerRowReduceGenerated returns the generated kernel for rp when it is a
// reduction over the last axis of a contiguous float tensor, or nil.
func (c *lowerCtx) lowerRowReduceGenerated(rp reducePlan, x, y buffer) (func() error, error) {
	if !rp.rows || len(rp.red) != 1 || rp.redS[0] != 1 || !x.dt.IsFloat() || !y.dt.IsFloat() {
		return nil, nil
	}
	// Rows must follow each other: the kept dims merge into one of stride
	// count (or there is one row).
	if rp.nout > 1 && (len(rp.kept) != 1 || rp.keptS[0] != rp.count) {
		return nil, nil
	}
	p := &rowReduceProgram{x: x, y: y, rows: rp.nout, cols: rp.count, op: rp.op, divisor: 1}
	if rp.mean {
		p.divisor = rp.count
	}
	src, lanes, err := p.generate()
	if err != nil {
		return nil, err
	}
	f, err := c.x.b.generatedFunction(src, "red")
	if err != nil {
		return nil, err
	}
	rowsPerBlock := int64(256 / lanes)
	l, err := driver.NewRawLaunch(f, c.gridFor((rp.nout+rowsPerBlock-1)/rowsPerBlock, 1), [3]uint32{256, 1, 1}, 0, x.ptr, y.ptr)
	if err != nil {
		return nil, err
	}
	d := c.dev()
	return func() error { return l.Run(d) }, nil
}

// colReduceProgram is one pass of a generated column reduction: x is
// [rows, cols] row-major, and block b of the grid's x axis combines rows
// [b·clen, (b+1)·clen) into row b of y (y is [ceil(rows/clen), cols]). Each
// thread owns one 16-byte group of columns and walks rows at a stride of the
// block's row lanes; the lanes combine in shared memory in a fixed order, so
// the result is deterministic. A reduction over the leading axes of a
// contiguous tensor (a norm weight's gradient) is two passes: row chunks
// into partials, then the partials into the result.
type colReduceProgram struct {
	x, y       buffer
	rows, cols int64
	clen       int64
	op         int32 // 0 sum, 2 max
	divisor    int64
	// partialsF32: the data is a float32 partials buffer of 16-bit input,
	// summed in float like the first pass.
	partialsF32 bool
}

func (p *colReduceProgram) generate() (src string, grid, block [3]uint32, err error) {
	xt, err := ctype(p.x.dt)
	if err != nil {
		return "", grid, block, err
	}
	yt, err := ctype(p.y.dt)
	if err != nil {
		return "", grid, block, err
	}
	// As the generic kernels: float with 16-bit data (and for its float32
	// partials), double otherwise.
	acc := "double"
	if is16(p.x.dt) || is16(p.y.dt) || p.x.dt == graph.Float32 && p.y.dt == graph.Float32 && p.partialsF32 {
		acc = "float"
	}
	vec := 16 / p.x.dt.Size()
	if p.cols%int64(vec) != 0 || int64(p.x.ptr)%16 != 0 {
		vec = 1
	}
	groups := p.cols / int64(vec)
	// At most a warp of column groups per block, the other lanes along
	// rows: a pass over few rows and many columns (the partials) then still
	// has at least 8 lanes per column, where a block as wide as the columns
	// walked every row of its chunk serially (one block summing 512 partial
	// rows took ~40 µs of a 768-column norm gradient).
	tx := min(groups, 32)
	ty := max(1, 256/tx)
	chunks := (p.rows + p.clen - 1) / p.clen
	grid = [3]uint32{uint32(chunks), uint32((groups + tx - 1) / tx), 1}
	block = [3]uint32{uint32(tx * ty), 1, 1}
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	w("// columns of [%d, %d] in chunks of %d rows, %s -> %s, op %d, vector %d, block %dx%d\n", p.rows, p.cols, p.clen, xt, yt, p.op, vec, tx, ty)
	ident := reducePreamble(&sb, p.op, acc)
	w("extern \"C\" __global__ void __launch_bounds__(256) cols(const %s* __restrict__ x, %s* __restrict__ y)\n{\n", xt, yt)
	w("    __shared__ %s sh[%d];\n", acc, tx*ty*int64(vec))
	w("    const unsigned tx = threadIdx.x %% %du, ty = threadIdx.x / %du;\n", tx, tx)
	w("    const unsigned long long g = (unsigned long long)blockIdx.y * %d + tx;\n", tx)
	w("    const bool valid = g < %dull;\n", groups)
	w("    %s a[%d];\n#pragma unroll\n    for (int e = 0; e < %d; e++) {\n        a[e] = %s;\n    }\n", acc, vec, vec, ident)
	w("    const unsigned long long r0 = (unsigned long long)blockIdx.x * %dull;\n", p.clen)
	w("    const unsigned long long r1 = r0 + %dull < %dull ? r0 + %dull : %dull;\n", p.clen, p.rows, p.clen, p.rows)
	w("    if (valid) {\n#pragma unroll 4\n        for (unsigned long long r = r0 + ty; r < r1; r += %d) {\n", ty)
	if vec > 1 {
		w("            __align__(16) %s v[%d];\n", xt, vec)
		w("            *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(x + r * %dull + g * %d);\n", p.cols, vec)
		w("#pragma unroll\n            for (int e = 0; e < %d; e++) {\n                a[e] = combine(a[e], %s);\n            }\n", vec, loadExpr(xt, acc, "v[e]"))
	} else {
		w("            a[0] = combine(a[0], %s);\n", loadExpr(xt, acc, fmt.Sprintf("x[r * %dull + g]", p.cols)))
	}
	w("        }\n    }\n")
	w("#pragma unroll\n    for (int e = 0; e < %d; e++) {\n        sh[(ty * %du + tx) * %d + e] = a[e];\n    }\n    __syncthreads();\n", vec, tx, vec)
	w("    if (ty == 0 && valid) {\n#pragma unroll\n        for (int e = 0; e < %d; e++) {\n", vec)
	w("            %s s = sh[tx * %d + e];\n", acc, vec)
	w("            for (int k = 1; k < %d; k++) {\n                s = combine(s, sh[(k * %du + tx) * %d + e]);\n            }\n", ty, tx, vec)
	result := "s"
	if p.divisor != 1 {
		result = fmt.Sprintf("s / (%s)%d", acc, p.divisor)
	}
	w("            y[(unsigned long long)blockIdx.x * %dull + g * %d + e] = %s;\n        }\n    }\n}\n", p.cols, vec, storeExpr(yt, acc, result))
	return sb.String(), grid, block, nil
}

// colChunks is how many row chunks the first pass of a generated column
// reduction over count rows uses (1: a single pass). At most 128: the second
// pass walks the partials with 8 or more lanes per column, 16 rows a lane.
func colChunks(count int64) int64 {
	if count < 64 {
		return 1
	}
	return min((count+15)/16, 128)
}

// lowerColReduceGenerated lowers a reduction over the leading axes of a
// contiguous float tensor (rp.colsContig): one pass, or two with partials in
// the node's scratch.
func (c *lowerCtx) lowerColReduceGenerated(rp reducePlan, x, y buffer) (func() error, error) {
	div := int64(1)
	if rp.mean {
		div = rp.count
	}
	launch := func(p *colReduceProgram) (func() error, error) {
		src, grid, block, err := p.generate()
		if err != nil {
			return nil, err
		}
		f, err := c.x.b.generatedFunction(src, "cols")
		if err != nil {
			return nil, err
		}
		l, err := driver.NewRawLaunch(f, grid, block, 0, p.x.ptr, p.y.ptr)
		if err != nil {
			return nil, err
		}
		d := c.dev()
		return func() error { return l.Run(d) }, nil
	}
	if rp.chunks <= 1 {
		return launch(&colReduceProgram{x: x, y: y, rows: rp.count, cols: rp.nout, clen: rp.count, op: rp.op, divisor: div})
	}
	part, err := c.takeScratch()
	if err != nil {
		return nil, err
	}
	first, err := launch(&colReduceProgram{x: x, y: part, rows: rp.count, cols: rp.nout, clen: rp.clen, op: rp.op, divisor: 1})
	if err != nil {
		return nil, err
	}
	second, err := launch(&colReduceProgram{x: part, y: y, rows: rp.chunks, cols: rp.nout, clen: rp.chunks, op: rp.op, divisor: div,
		partialsF32: part.dt == graph.Float32})
	if err != nil {
		return nil, err
	}
	return seq(first, second), nil
}

// reducePreamble writes the includes and the combine function of a
// generated reduction (a sum, or for op 2 a max in which NaN wins, as in the
// generic kernels' nanmax) and returns the identity element's expression.
func reducePreamble(sb *strings.Builder, op int32, acc string) (ident string) {
	ident, combine := "("+acc+")0", "a + b"
	if op == 2 {
		ident = "-__int_as_float(0x7f800000)"
		if acc == "double" {
			ident = "-__longlong_as_double(0x7ff0000000000000LL)"
		}
		combine = "(b > a || b != b || a != a) ? (a != a ? a : b) : a"
	}
	fmt.Fprintf(sb, "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n")
	fmt.Fprintf(sb, "__device__ __forceinline__ %s combine(%s a, %s b) { return %s; }\n", acc, acc, acc, combine)
	return ident
}
