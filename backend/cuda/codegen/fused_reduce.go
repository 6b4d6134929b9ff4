package codegen

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// Generated row reductions: a ReduceSum/Mean/Max over the last axis of a
// contiguous float tensor becomes a kernel specialised to the row length and
// dtypes. Each row is read by a segment of lanes of one warp with 16-byte
// loads, fully unrolled (the row length is a constant), and combined with
// shuffles in a fixed order; short rows share a warp (a 64-element row takes
// 8 lanes). The generic kernels walk a row one element per lane per step
// with a dtype switch in the loop, which kept one load in flight per warp.

// RowReduce is one generated row reduction.
type RowReduce struct {
	X, Y    Buffer
	Rows    int64
	Cols    int64
	Op      int32 // 0 sum, 2 max
	Divisor int64 // 1, or cols for a mean
}

// Generate writes the kernel ("red"): a segment of a warp's lanes per row.
func (p *RowReduce) Generate() (Kernel, error) {
	acc := accumulatorType(p.X.DType, p.Y.DType)
	kn, err := newReduction("red", p.X, p.Y, p.Cols, p.Op, acc)
	if err != nil {
		return Kernel{}, err
	}
	xt, yt, ident, vec := kn.xt, kn.yt, kn.ident, kn.vec
	lanes, iters := rowSplit(p.Cols, vec)
	kn.comment = fmt.Sprintf("rows %d x %d, %s -> %s, op %d, vector %d, %d lanes per row", p.Rows, p.Cols, xt, yt, p.Op, vec, lanes)
	w := kn.w
	kn.warpRows(lanes, p.Rows)
	w("        const bool valid = row < %dull;\n", p.Rows)
	w("        %s a = %s;\n", acc, ident)
	w("        if (valid) {\n")
	w("            const %s* xr = x + row * %dull;\n", xt, p.Cols)
	kn.walkRow("unsigned", "u", iters, lanes, vec, p.Cols)
	if vec > 1 {
		w("                    %s\n", alignedArray(xt, "v", vec))
		w("                    %s\n", vecMove("v", "xr + col", 16))
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
	if p.Divisor != 1 {
		result = fmt.Sprintf("a / (%s)%d", acc, p.Divisor)
	}
	w("        if (valid && lane == 0) {\n            y[row] = %s;\n        }\n    }\n}\n", storeExpr(yt, acc, result))
	rowsPerBlock := int64(256 / lanes)
	k := kn.done((p.Rows+rowsPerBlock-1)/rowsPerBlock*256, []Buffer{p.X, p.Y})
	k.Vec, k.Lanes = vec, lanes
	return k, nil
}

// ColReduce is one pass of a generated column reduction: x is
// [rows, cols] row-major, and block b of the grid's x axis combines rows
// [b·clen, (b+1)·clen) into row b of y (y is [ceil(rows/clen), cols]). Each
// thread owns one 16-byte group of columns and walks rows at a stride of the
// block's row lanes; the lanes combine in shared memory in a fixed order, so
// the result is deterministic. A reduction over the leading axes of a
// contiguous tensor (a norm weight's gradient) is two passes: row chunks
// into partials, then the partials into the result.
type ColReduce struct {
	X, Y       Buffer
	Rows, Cols int64
	ChunkLen   int64
	Op         int32 // 0 sum, 2 max
	Divisor    int64
	// partialsF32: the data is a float32 partials buffer of 16-bit input,
	// summed in float like the first pass.
	PartialsF32 bool
}

// Generate writes the kernel ("cols"), with its launch shape.
func (p *ColReduce) Generate() (Kernel, error) {
	// As the generic kernels: float with 16-bit data (and for its float32
	// partials), double otherwise.
	acc := accumulatorType(p.X.DType, p.Y.DType)
	if p.X.DType == graph.Float32 && p.Y.DType == graph.Float32 && p.PartialsF32 {
		acc = "float"
	}
	kn, err := newReduction("cols", p.X, p.Y, p.Cols, p.Op, acc)
	if err != nil {
		return Kernel{}, err
	}
	xt, yt, ident, vec := kn.xt, kn.yt, kn.ident, kn.vec
	groups := p.Cols / int64(vec)
	// At most a warp of column groups per block, the other lanes along
	// rows: a pass over few rows and many columns (the partials) then still
	// has at least 8 lanes per column, where a block as wide as the columns
	// walked every row of its chunk serially (one block summing 512 partial
	// rows took ~40 µs of a 768-column norm gradient).
	tx := min(groups, 32)
	ty := max(1, 256/tx)
	chunks := (p.Rows + p.ChunkLen - 1) / p.ChunkLen
	grid := [3]uint32{uint32(chunks), uint32((groups + tx - 1) / tx), 1}
	block := [3]uint32{uint32(tx * ty), 1, 1}
	kn.comment = fmt.Sprintf("columns of [%d, %d] in chunks of %d rows, %s -> %s, op %d, vector %d, block %dx%d", p.Rows, p.Cols, p.ChunkLen, xt, yt, p.Op, vec, tx, ty)
	w := kn.w
	w("    __shared__ %s sh[%d];\n", acc, tx*ty*int64(vec))
	w("    const unsigned tx = threadIdx.x %% %du, ty = threadIdx.x / %du;\n", tx, tx)
	w("    const unsigned long long g = (unsigned long long)blockIdx.y * %d + tx;\n", tx)
	w("    const bool valid = g < %dull;\n", groups)
	w("    %s a[%d];\n#pragma unroll\n    for (int e = 0; e < %d; e++) {\n        a[e] = %s;\n    }\n", acc, vec, vec, ident)
	w("    const unsigned long long r0 = (unsigned long long)blockIdx.x * %dull;\n", p.ChunkLen)
	w("    const unsigned long long r1 = r0 + %dull < %dull ? r0 + %dull : %dull;\n", p.ChunkLen, p.Rows, p.ChunkLen, p.Rows)
	w("    if (valid) {\n#pragma unroll 4\n        for (unsigned long long r = r0 + ty; r < r1; r += %d) {\n", ty)
	if vec > 1 {
		w("            %s\n", alignedArray(xt, "v", vec))
		w("            %s\n", vecMove("v", fmt.Sprintf("x + r * %dull + g * %d", p.Cols, vec), 16))
		w("#pragma unroll\n            for (int e = 0; e < %d; e++) {\n                a[e] = combine(a[e], %s);\n            }\n", vec, loadExpr(xt, acc, "v[e]"))
	} else {
		w("            a[0] = combine(a[0], %s);\n", loadExpr(xt, acc, fmt.Sprintf("x[r * %dull + g]", p.Cols)))
	}
	w("        }\n    }\n")
	w("#pragma unroll\n    for (int e = 0; e < %d; e++) {\n        sh[(ty * %du + tx) * %d + e] = a[e];\n    }\n    __syncthreads();\n", vec, tx, vec)
	w("    if (ty == 0 && valid) {\n#pragma unroll\n        for (int e = 0; e < %d; e++) {\n", vec)
	w("            %s s = sh[tx * %d + e];\n", acc, vec)
	w("            for (int k = 1; k < %d; k++) {\n                s = combine(s, sh[(k * %du + tx) * %d + e]);\n            }\n", ty, tx, vec)
	result := "s"
	if p.Divisor != 1 {
		result = fmt.Sprintf("s / (%s)%d", acc, p.Divisor)
	}
	w("            y[(unsigned long long)blockIdx.x * %dull + g * %d + e] = %s;\n        }\n    }\n}\n", p.Cols, vec, storeExpr(yt, acc, result))
	k := kn.done(0, []Buffer{p.X, p.Y})
	k.Grid, k.Block, k.Vec = grid, block, vec
	return k, nil
}

// ColChunks is how many row chunks the first pass of a generated column
// reduction over count rows uses (1: a single pass). At most 128: the second
// pass walks the partials with 8 or more lanes per column, 16 rows a lane.
func ColChunks(count int64) int64 {
	if count < 64 {
		return 1
	}
	return min((count+15)/16, 128)
}

// reduction is a reduction kernel from x to y as both reductions start it.
type reduction struct {
	*kernel
	xt, yt string // x's and y's C types
	ident  string // the combine's identity element
	vec    int    // elements of x moved at once
}

// newReduction starts a reduction kernel from x to y combining in acc:
// 16-byte vectors along x's rows of cols elements when they split into
// aligned vectors, and the combine helper of op.
func newReduction(entry string, x, y Buffer, cols int64, op int32, acc string) (*reduction, error) {
	ts, err := cTypes([]Buffer{x, y})
	if err != nil {
		return nil, err
	}
	vec := vectorOf(x.DType.Size())
	if cols%int64(vec) != 0 || !x.alignedFor(0, vec) {
		vec = 1
	}
	ident, combine := reduceCombine(op, acc)
	kn := &kernel{entry: entry, commentFirst: true, helpers: combine, params: []string{inParam(ts[0], "x"), outParam(ts[1], "y")}}
	return &reduction{kernel: kn, xt: ts[0], yt: ts[1], ident: ident, vec: vec}, nil
}

// reduceCombine is the combine function of a generated reduction (a sum,
// or for op 2 a max in which NaN wins, as in the generic kernels' nanmax),
// a device helper, and its identity element's expression.
func reduceCombine(op int32, acc string) (ident, helper string) {
	ident, combine := "("+acc+")0", "a + b"
	if op == 2 {
		ident = "-__int_as_float(0x7f800000)"
		if acc == "double" {
			ident = "-__longlong_as_double(0x7ff0000000000000LL)"
		}
		combine = "(b > a || b != b || a != a) ? (a != a ? a : b) : a"
	}
	return ident, fmt.Sprintf("__device__ __forceinline__ %s combine(%s a, %s b) { return %s; }\n", acc, acc, acc, combine)
}
