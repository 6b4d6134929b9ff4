package codegen

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Every op defined by an expression (which includes every op a
// FusedElementwise body may use) has generated code in both float compute
// types, and in integer code where its definition has an integer form;
// every primitive renders.
func TestEwExprCoversFusibleOps(t *testing.T) {
	for op := range graph.FusibleElementwise {
		if spec, _ := graph.LookupOp(op); spec.Expr == nil {
			t.Errorf("fusible op %s has no expression", op)
		}
	}
	for _, spec := range graph.ExprOps() {
		args := []string{"x", "y", "z"}[:len(spec.Inputs)]
		cts := []string{"float", "double"}
		m, err := spec.MapFor(nil)
		if err != nil {
			t.Fatalf("%s: %v", spec.Name, err)
		}
		if m.Int != nil {
			cts = append(cts, "long long")
		}
		for _, ct := range cts {
			if _, err := OpExpr(spec.Name, nil, ct, args); err != nil {
				t.Errorf("%s (%s): %v", spec.Name, ct, err)
			}
		}
	}
	for _, p := range graph.Prims() {
		args := make([]*graph.Expr, p.Arity())
		for i := range args {
			args[i] = graph.ExprVar(i)
		}
		if _, err := ExprC(graph.ExprOf(p, args...), "double", []string{"x", "y", "z"}); err != nil {
			t.Errorf("primitive %v: %v", p, err)
		}
	}
	if _, err := OpExpr("MatMul", nil, "float", []string{"x", "y"}); err == nil {
		t.Error("MatMul has no elementwise code, want an error")
	}
	if _, err := OpExpr("Exp", nil, "long long", []string{"x"}); err == nil {
		t.Error("Exp has no integer form, want an error")
	}
}

// The rendering keeps each operator's operands together: nested
// primitives are parenthesised, and a negated operand never reads as a
// decrement.
func TestExprCParenthesises(t *testing.T) {
	x := graph.ExprVar(0)
	e := graph.ExprOf(graph.PrimMul, graph.ExprOf(graph.PrimAdd, x, graph.ExprConst(1)), graph.ExprOf(graph.PrimNeg, graph.ExprOf(graph.PrimNeg, x)))
	got, err := ExprC(e, "float", []string{"a0"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "(a0 + (float)1) * (-(-a0))"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// The generator picks 16-byte vectors only where every operand allows them.
func TestEwProgramVectorWidth(t *testing.T) {
	shape := graph.Shape{4, 8, 64}
	buf := func(dt graph.DType, addr uint64) Buffer { return Buffer{Addr: addr, DType: dt, N: shape.Numel()} }
	mul := []graph.FusedStep{{Op: "Mul", Args: []graph.FusedOperand{{Index: 0}, {Index: 1}}}}
	cases := []struct {
		name string
		ins  []Operand
		out  Buffer
		vec  int
	}{
		{"bf16 contiguous", []Operand{BroadcastOperand(buf(graph.BFloat16, 0x1000), shape, shape), BroadcastOperand(buf(graph.BFloat16, 0x2000), shape, shape)}, buf(graph.BFloat16, 0x3000), 8},
		{"f32 contiguous", []Operand{BroadcastOperand(buf(graph.Float32, 0x1000), shape, shape), BroadcastOperand(buf(graph.Float32, 0x2000), shape, shape)}, buf(graph.Float32, 0x3000), 4},
		{"f32 with a row broadcast", []Operand{BroadcastOperand(buf(graph.Float32, 0x1000), shape, shape), BroadcastOperand(buf(graph.Float32, 0x2000), graph.Shape{4, 8, 1}, shape)}, buf(graph.Float32, 0x3000), 4},
		{"f32 misaligned input", []Operand{BroadcastOperand(buf(graph.Float32, 0x1004), shape, shape), BroadcastOperand(buf(graph.Float32, 0x2000), shape, shape)}, buf(graph.Float32, 0x3000), 1},
		{"f32 transposed input", []Operand{{Buf: buf(graph.Float32, 0x1000), Strides: []int64{64, 256, 1}}, BroadcastOperand(buf(graph.Float32, 0x2000), shape, shape)}, buf(graph.Float32, 0x3000), 4},
		{"f32 inner axis strided", []Operand{{Buf: buf(graph.Float32, 0x1000), Strides: []int64{1, 4, 32}}, BroadcastOperand(buf(graph.Float32, 0x2000), shape, shape)}, buf(graph.Float32, 0x3000), 1},
		{"f64 input", []Operand{BroadcastOperand(buf(graph.Float64, 0x1000), shape, shape), BroadcastOperand(buf(graph.Float32, 0x2000), shape, shape)}, buf(graph.Float32, 0x3000), 2},
	}
	for _, tc := range cases {
		p := &Elementwise{Shape: shape, Ins: tc.ins, Steps: mul, Outs: []int{0}, OutBufs: []Buffer{tc.out}}
		k, err := p.Generate()
		src, n, vec := k.Source, k.Threads*int64(k.Vec), k.Vec
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if n != int64(shape.Numel()) || vec != tc.vec {
			t.Errorf("%s: n=%d vec=%d, want n=%d vec=%d\n%s", tc.name, n, vec, shape.Numel(), tc.vec, src)
		}
		wantCT := "float"
		if tc.ins[0].Buf.DType == graph.Float64 {
			wantCT = "double"
		}
		if !strings.Contains(src, "const "+wantCT+" t0 = a0 * a1;") {
			t.Errorf("%s: the step is not computed in %s:\n%s", tc.name, wantCT, src)
		}
	}
}

// Integer work and comparisons are generated too: int64 arithmetic in long
// long (a division reports a zero divisor through the error flag, which the
// kernel then takes), a comparison of floats stored as a bool.
func TestEwProgramIntegerWork(t *testing.T) {
	sh := graph.Shape{16}
	i64 := Buffer{Addr: 0x1000, DType: graph.Int64, N: 16}
	f32 := Buffer{Addr: 0x2000, DType: graph.Float32, N: 16}
	b := Buffer{Addr: 0x3000, DType: graph.Bool, N: 16}
	step := func(op string, n int) []graph.FusedStep {
		st := graph.FusedStep{Op: op}
		for i := range n {
			st.Args = append(st.Args, graph.FusedOperand{Index: i})
		}
		return []graph.FusedStep{st}
	}
	for _, tc := range []struct {
		name string
		p    *Elementwise
		want []string
		flag bool
	}{
		{"int64 Div", &Elementwise{Shape: sh, Ins: []Operand{BroadcastOperand(i64, sh, sh), BroadcastOperand(i64, sh, sh)}, Steps: step("Div", 2), Outs: []int{0}, OutBufs: []Buffer{i64}},
			[]string{"const long long t0 = fg_idiv(a0, a1, flag, code);", "int* __restrict__ flag, int code)"}, true},
		{"int64 Add", &Elementwise{Shape: sh, Ins: []Operand{BroadcastOperand(i64, sh, sh), BroadcastOperand(i64, sh, sh)}, Steps: step("Add", 2), Outs: []int{0}, OutBufs: []Buffer{i64}},
			[]string{"const long long t0 = a0 + a1;"}, false},
		{"float Greater", &Elementwise{Shape: sh, Ins: []Operand{BroadcastOperand(f32, sh, sh), BroadcastOperand(f32, sh, sh)}, Steps: step("Greater", 2), Outs: []int{0}, OutBufs: []Buffer{b}},
			[]string{"const float t0 = (a0 > a1) ? (float)1 : (float)0;", "(unsigned char)((t0) != (float)0)"}, false},
		{"bool copy to float", &Elementwise{Shape: sh, Ins: []Operand{BroadcastOperand(b, sh, sh)}, Steps: step("Identity", 1), Outs: []int{0}, OutBufs: []Buffer{f32}},
			[]string{"const float a0 = (v0[e] != 0);"}, false},
	} {
		k, err := tc.p.Generate()
		src := k.Source
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(src, w) {
				t.Errorf("%s: want %q in\n%s", tc.name, w, src)
			}
		}
		if k.UsesFlag != tc.flag || strings.Contains(src, "int* __restrict__ flag") != tc.flag {
			t.Errorf("%s: usesFlag %v, want %v:\n%s", tc.name, k.UsesFlag, tc.flag, src)
		}
	}
}

// An output written into a slice of a larger tensor (Concat) is addressed
// through its strides, and vectorised only when the slice keeps vectors
// aligned.
func TestEwProgramStridedOutput(t *testing.T) {
	copyStep := []graph.FusedStep{{Op: "Identity", Args: []graph.FusedOperand{{Index: 0}}}}
	for _, tc := range []struct {
		at, cols, row int64
		vec           int
	}{{0, 32, 64, 8}, {32, 32, 64, 8}, {3, 32, 64, 1}, {0, 30, 60, 1}} {
		in := Buffer{Addr: 0x1000, DType: graph.BFloat16, N: int(4 * tc.cols)}
		out := Buffer{Addr: 0x8000, DType: graph.BFloat16, N: int(4 * tc.row)}
		p := &Elementwise{Shape: graph.Shape{4, int(tc.cols)}, Ins: []Operand{{Buf: in, Strides: []int64{tc.cols, 1}}},
			Steps: copyStep, Outs: []int{0}, OutBufs: []Buffer{out}, OutStrides: [][]int64{{tc.row, 1}}, OutOffs: []int64{tc.at}}
		k, err := p.Generate()
		src, vec := k.Source, k.Vec
		if err != nil {
			t.Fatal(err)
		}
		if vec != tc.vec {
			t.Errorf("at %d cols %d row %d: vec %d, want %d", tc.at, tc.cols, tc.row, vec, tc.vec)
		}
		want := fmt.Sprintf("const unsigned q0 = %du + (unsigned)c0 * %du", tc.at, tc.row)
		if !strings.Contains(src, want) {
			t.Errorf("at %d: want %q in\n%s", tc.at, want, src)
		}
	}
}

// Row reductions: lanes per row and vector width follow the row length and
// alignment; the accumulator is float only when 16-bit data is involved.
func TestRowReduceProgram(t *testing.T) {
	for _, tc := range []struct {
		dt         graph.DType
		cols       int64
		addr       uint64
		lanes, vec int
		acc        string
	}{
		{graph.BFloat16, 768, 0x1000, 32, 8, "float"},
		{graph.BFloat16, 64, 0x1000, 8, 8, "float"},
		{graph.Float32, 768, 0x1000, 32, 4, "double"},
		{graph.Float32, 768, 0x1004, 32, 1, "double"},
		{graph.Float32, 7, 0x1000, 4, 1, "double"},
		{graph.Float64, 1, 0x1000, 1, 1, "double"},
	} {
		p := &RowReduce{X: Buffer{Addr: tc.addr, DType: tc.dt}, Y: Buffer{Addr: 0x9000, DType: tc.dt}, Rows: 100, Cols: tc.cols, Divisor: tc.cols}
		k, err := p.Generate()
		src, lanes := k.Source, k.Lanes
		if err != nil {
			t.Fatal(err)
		}
		if lanes != tc.lanes || !strings.Contains(src, fmt.Sprintf("vector %d,", tc.vec)) || !strings.Contains(src, tc.acc+" a = ") {
			t.Errorf("%v cols %d at %#x: lanes %d, want %d, vector %d, acc %s:\n%s", tc.dt, tc.cols, tc.addr, lanes, tc.lanes, tc.vec, tc.acc, src)
		}
	}
}

// A long row's walk is unrolled by 4, not fully: NVRTC spent over a minute
// unrolling a 262144-column sum's 1024 iterations (the AdamW test's roomy
// case, which timed out on the device). Row kernels follow the same rule.
func TestRowWalkUnroll(t *testing.T) {
	walk := regexp.MustCompile(`#pragma unroll( 4)?\n\s*for \(int it = 0; it < (\d+);`)
	for _, tc := range []struct {
		cols  int64
		iters string
		full  bool
	}{{768, "3", true}, {4096, "16", true}, {8192, "32", false}, {1 << 18, "1024", false}} {
		p := &RowReduce{X: Buffer{Addr: 0x1000, DType: graph.BFloat16}, Y: Buffer{Addr: 0x9000, DType: graph.BFloat16}, Rows: 1, Cols: tc.cols, Divisor: 1}
		k, err := p.Generate()
		if err != nil {
			t.Fatal(err)
		}
		m := walk.FindStringSubmatch(k.Source)
		if m == nil || m[2] != tc.iters || (m[1] == "") != tc.full {
			t.Errorf("cols %d: walk %q, want %s iterations, full unroll %v:\n%s", tc.cols, m, tc.iters, tc.full, k.Source)
		}
	}
}

// Column reductions: a thread per 16-byte column group, the block's other
// lanes along rows, a grid of row chunks by column tiles.
func TestColReduceProgram(t *testing.T) {
	for _, tc := range []struct {
		dt                graph.DType
		rows, cols, clen  int64
		grid0, grid1, blk uint32
		vec               int
	}{
		{graph.BFloat16, 8192, 768, 64, 128, 3, 256, 8},
		{graph.BFloat16, 98304, 64, 768, 128, 1, 256, 8},
		{graph.Float32, 128, 768, 128, 1, 6, 256, 4}, // the partials of the first row
		{graph.Float32, 100, 3000, 100, 1, 24, 256, 4},
		{graph.Float64, 10, 5, 10, 1, 1, 255, 1},
	} {
		p := &ColReduce{X: Buffer{Addr: 0x1000, DType: tc.dt}, Y: Buffer{Addr: 0x9000, DType: tc.dt}, Rows: tc.rows, Cols: tc.cols, ChunkLen: tc.clen, Divisor: 1}
		k, err := p.Generate()
		src, grid, block := k.Source, k.Grid, k.Block
		if err != nil {
			t.Fatal(err)
		}
		if grid[0] != tc.grid0 || grid[1] != tc.grid1 || block[0] != tc.blk || block[0] > 256 || !strings.Contains(src, fmt.Sprintf("vector %d,", tc.vec)) {
			t.Errorf("%v [%d,%d]/%d: grid %v block %v, want %d,%d / %d, vector %d:\n%s", tc.dt, tc.rows, tc.cols, tc.clen, grid, block, tc.grid0, tc.grid1, tc.blk, tc.vec, src)
		}
	}
}

// The row generator: an RMSNorm forward in bfloat16 reads 16-byte vectors
// with a warp per 768-element row and writes the residual per element and
// the rsqrt per row; a float32 operand halves the vector; a row length that
// does not split into vectors, or a misaligned operand, reads one element
// at a time; short rows share a warp.
func TestRowProgramGenerate(t *testing.T) {
	buf := func(dt graph.DType, addr uint64, s graph.Shape) Buffer {
		return Buffer{Addr: addr, DType: dt, N: s.Numel()}
	}
	fwd, err := graph.ParseFusedBody("Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3);Reciprocal(t4)", 3)
	if err != nil {
		t.Fatal(err)
	}
	prog := func(full graph.Shape, xdt graph.DType, xaddr uint64, edt graph.DType) *Rows {
		red := append(full[:len(full)-1:len(full)-1], 1)
		p := &Rows{full: full, steps: fwd, red: 2, mean: true, rowLevel: []bool{false, false, true, true, true, true},
			outs: []int{0, 4, 5}}
		x, y, e := buf(xdt, xaddr, full), buf(xdt, 0x20000, full), buf(edt, 0x30000, graph.Shape{})
		p.ElemIns = []Operand{BroadcastOperand(x, full, full), BroadcastOperand(y, full, full), {Buf: e}}
		p.rIns = []Operand{{Buf: x}, {Buf: y}, BroadcastOperand(e, graph.Shape{}, red)}
		p.OutBufs = []Buffer{buf(xdt, 0x40000, full), buf(xdt, 0x50000, red), buf(xdt, 0x60000, red)}
		return p
	}
	cases := []struct {
		name        string
		p           *Rows
		vec, lanes  int
		rows        int64
		mustContain []string
	}{
		{"bf16 rows of 768", prog(graph.Shape{8, 1024, 768}, graph.BFloat16, 0x10000, graph.BFloat16), 8, 32, 8192,
			[]string{"uint4", "a / (float)768", "__shfl_xor_sync(0xffffffffu, a, 16, 32)", "out1[row]", "out0 + q + col"}},
		{"bf16 with a float32 output", func() *Rows {
			p := prog(graph.Shape{8, 1024, 768}, graph.BFloat16, 0x10000, graph.Float32)
			p.OutBufs[0].DType = graph.Float32
			return p
		}(), 4, 32, 8192, []string{"uint2", "uint4"}},
		{"f64 rows of 64", prog(graph.Shape{6, 64}, graph.Float64, 0x10000, graph.Float64), 2, 32, 6, []string{"double a = 0", "a / (double)64"}},
		{"rows of 64 bf16 share a warp", prog(graph.Shape{3, 5, 64}, graph.BFloat16, 0x10000, graph.BFloat16), 8, 8, 15,
			[]string{"% 8u", "__shfl_xor_sync(0xffffffffu, a, 4, 8)"}},
		{"odd row length", prog(graph.Shape{4, 7}, graph.Float32, 0x10000, graph.Float32), 1, 4, 4, []string{"in0[e0 + col * 1ull]"}},
		{"misaligned input", prog(graph.Shape{4, 64}, graph.Float32, 0x10004, graph.Float32), 1, 32, 4, nil},
	}
	for _, tc := range cases {
		k, err := tc.p.Generate()
		src, lanes := k.Source, k.Lanes
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		// Blocks of 8 warps, each warp 32/lanes rows.
		perBlock := int64(8 * 32 / tc.lanes)
		wantThreads := (tc.rows + perBlock - 1) / perBlock * 256
		if !strings.Contains(src, fmt.Sprintf("vector %d, %d lanes per row", tc.vec, tc.lanes)) || k.Threads != wantThreads || lanes != tc.lanes {
			t.Errorf("%s: %d threads, lanes %d; want %d threads (%d rows), vector %d, %d lanes\n%s", tc.name, k.Threads, lanes, wantThreads, tc.rows, tc.vec, tc.lanes, src)
		}
		for _, s := range tc.mustContain {
			if !strings.Contains(src, s) {
				t.Errorf("%s: source lacks %q\n%s", tc.name, s, src)
			}
		}
	}
}

// Bodies with index steps: a rotate-half reads the other half of the row at
// a shifted coordinate under a branch on the position, and its gradient
// recomputes the product under each Concat at the positions it selects;
// shared zero constants are not read.
func TestIndexProgramGenerate(t *testing.T) {
	shape := graph.Shape{2, 3, 16, 64}
	gen := func(body string, ins []graph.Shape, zero []bool, outs []int) string {
		steps, err := graph.ParseFusedBody(body, len(ins))
		if err != nil {
			t.Fatal(err)
		}
		var in []graph.TensorType
		p := &Index{Shape: shape, Steps: steps, InShapes: ins, Zero: zero, Outs: outs}
		for _, s := range ins {
			in = append(in, graph.TensorType{DType: graph.Float32, Shape: s})
			p.Ins = append(p.Ins, Buffer{Addr: 0x1000, DType: graph.Float32, N: s.Numel()})
		}
		if p.Types, err = graph.FusedTypes(steps, in, nil); err != nil {
			t.Fatal(err)
		}
		for range outs {
			p.OutBufs = append(p.OutBufs, Buffer{Addr: 0x9000, DType: graph.BFloat16, N: shape.Numel()})
		}
		k, err := p.Generate()
		src, n := k.Source, k.Threads*int64(k.Vec)
		if err != nil {
			t.Fatal(err)
		}
		if n != int64(shape.Numel()) {
			t.Errorf("%d elements, want %d", n, shape.Numel())
		}
		return src
	}
	fwd := gen("Slice<3,0,32>(i0);Slice<3,32,64>(i0);Neg(t1);Concat<3>(t2,t0);Mul(i0,i1);Mul(t3,i2);Add(t4,t5)",
		[]graph.Shape{shape, {16, 64}, {16, 64}}, []bool{false, false, false}, []int{6})
	for _, s := range []string{"if (c3 < 32u)", "(c3 + 32u)", "(c3 - 32u)", "out0[i] = __float2bfloat16_rn"} {
		if !strings.Contains(fwd, s) {
			t.Errorf("rotate-half: source lacks %q\n%s", s, fwd)
		}
	}
	// Widths: bfloat16 with cuts at multiples of 8 moves 16-byte vectors; a
	// cut inside a vector, or a float32 operand, narrows it.
	width := func(body string, ins []graph.Shape, dt graph.DType) int {
		steps, err := graph.ParseFusedBody(body, len(ins))
		if err != nil {
			t.Fatal(err)
		}
		var in []graph.TensorType
		p := &Index{Shape: shape, Steps: steps, InShapes: ins, Zero: make([]bool, len(ins)), Outs: []int{len(steps) - 1},
			OutBufs: []Buffer{{Addr: 0x9000, DType: graph.BFloat16}}}
		for _, s := range ins {
			in = append(in, graph.TensorType{DType: graph.Float32, Shape: s})
			p.Ins = append(p.Ins, Buffer{Addr: 0x1000, DType: dt, N: s.Numel()})
		}
		if p.Types, err = graph.FusedTypes(steps, in, nil); err != nil {
			t.Fatal(err)
		}
		return p.VectorWidth()
	}
	rope := "Slice<3,0,32>(i0);Slice<3,32,64>(i0);Neg(t1);Concat<3>(t2,t0);Mul(i0,i1);Mul(t3,i2);Add(t4,t5)"
	if w := width(rope, []graph.Shape{shape, {16, 64}, {16, 64}}, graph.BFloat16); w != 8 {
		t.Errorf("bf16 rotate-half: vector %d, want 8", w)
	}
	if w := width(rope, []graph.Shape{shape, {16, 64}, {16, 64}}, graph.Float32); w != 4 {
		t.Errorf("f32 rotate-half: vector %d, want 4", w)
	}
	if w := width("Slice<3,4,64>(i0);Slice<3,0,4>(i0);Concat<3>(t0,t1)", []graph.Shape{shape}, graph.BFloat16); w != 1 {
		t.Errorf("a cut at 4 in bf16: vector %d, want 1", w)
	}
	half := graph.Shape{2, 3, 16, 32}
	bwd := gen("Mul(i0,i1);Mul(i0,i2);Slice<3,0,32>(t0);Slice<3,32,64>(t0);Neg(t2);Concat<3>(i3,t4);Concat<3>(t3,i4);Add(t1,t5);Add(t7,t6)",
		[]graph.Shape{shape, {16, 64}, {16, 64}, half, half}, []bool{false, false, false, true, true}, []int{8})
	if strings.Contains(bwd, "in3[") || strings.Contains(bwd, "in4[") {
		t.Errorf("gradient: zero constants are read\n%s", bwd)
	}
	// The product i0·i1 is computed at the shifted positions inside the
	// branches (the sliced halves), not only at the thread's own.
	if strings.Count(bwd, "in1[") != 2 || !strings.Contains(bwd, "in1[0ull + (unsigned long long)(c2) * 64ull + (unsigned long long)((c3 + 32u))") {
		t.Errorf("gradient: the product under the Concats is not read at the shifted positions\n%s", bwd)
	}
}

// Transpose steps: the index generator reads a transposed input, and writes
// a transposed result, at permuted coordinates, still in 16-byte vectors
// when the last axis stays in place; the row generator reads a head split
// as a second view of the input with permuted row strides, each row one
// contiguous run of vectors. What a row kernel cannot do (a Transpose of a
// step, one that moves the last axis) is an error naming the step.
func TestTransposeProgramsGenerate(t *testing.T) {
	bhsd, bshd := graph.Shape{2, 3, 16, 64}, graph.Shape{2, 16, 3, 64}
	index := func(body string, shape graph.Shape, ins []graph.Shape) *Index {
		steps, err := graph.ParseFusedBody(body, len(ins))
		if err != nil {
			t.Fatal(err)
		}
		var in []graph.TensorType
		p := &Index{Shape: shape, Steps: steps, InShapes: ins, Zero: make([]bool, len(ins)), Outs: []int{len(steps) - 1},
			OutBufs: []Buffer{{Addr: 0x9000, DType: graph.BFloat16, N: shape.Numel()}}}
		for _, s := range ins {
			in = append(in, graph.TensorType{DType: graph.BFloat16, Shape: s})
			p.Ins = append(p.Ins, Buffer{Addr: 0x1000, DType: graph.BFloat16, N: s.Numel()})
		}
		if p.Types, err = graph.FusedTypes(steps, in, nil); err != nil {
			t.Fatal(err)
		}
		p.Vec = p.VectorWidth()
		return p
	}
	for _, tc := range []struct {
		name, body string
		shape      graph.Shape
		ins        []graph.Shape
		vec        int
		want       []string
	}{
		// [B,S,H,D] read as [B,H,S,D]: S (thread coordinate c2) strides
		// 3·64, H (c1) strides 64.
		{"read", "Transpose<0,2,1,3>(i0);Mul(t0,i1)", bhsd, []graph.Shape{bshd, {64}}, 8,
			[]string{"(unsigned long long)(c2) * 192ull", "(unsigned long long)(c1) * 64ull", "uint4"}},
		// [B,H,S,D] computed, written as [B,S,H,D]: the thread walks the
		// output; H (c2) strides 16·64 in the input, S (c1) 64.
		{"write", "Mul(i0,i1);Transpose<0,2,1,3>(t0)", bshd, []graph.Shape{bhsd, {64}}, 8,
			[]string{"(unsigned long long)(c2) * 1024ull", "(unsigned long long)(c1) * 64ull", "out0 + i"}},
		// Both: read and write transposed, the input at the thread's own
		// coordinates again.
		{"read and write", "Transpose<0,2,1,3>(i0);Neg(t0);Transpose<0,2,1,3>(t1)", bshd, []graph.Shape{bshd}, 8,
			[]string{"(unsigned long long)(c1) * 192ull", "(unsigned long long)(c2) * 64ull"}},
		// Moving the last axis reads one element at a time.
		{"last axis moved", "Transpose<0,1,3,2>(i0);Neg(t0)", graph.Shape{2, 3, 64, 16}, []graph.Shape{bhsd}, 1,
			[]string{"(unsigned long long)(c3) * 64ull", "(unsigned long long)(c2)"}},
	} {
		p := index(tc.body, tc.shape, tc.ins)
		k, err := p.Generate()
		src, n := k.Source, k.Threads*int64(k.Vec)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if n != int64(tc.shape.Numel()) || p.Vec != tc.vec {
			t.Errorf("%s: %d elements, vector %d; want %d, %d", tc.name, n, p.Vec, tc.shape.Numel(), tc.vec)
		}
		for _, s := range tc.want {
			if !strings.Contains(src, s) {
				t.Errorf("%s: source lacks %q\n%s", tc.name, s, src)
			}
		}
	}

	// A q_norm over the heads of a [B,S,H,D] projection, in bfloat16.
	rows := func(body string, outs []int64, ins ...graph.Shape) (*Rows, error) {
		n := &graph.Node{Name: "norm", Op: "FusedElementwise", Attrs: graph.Attrs{"body": graph.Str(body),
			"outputs": graph.Ints(outs...), "axes": graph.Ints(-1)}}
		var in []graph.TensorType
		for i, s := range ins {
			tt := graph.TensorType{DType: graph.BFloat16, Shape: s}
			in = append(in, tt)
			n.Inputs = append(n.Inputs, &graph.Value{Name: fmt.Sprintf("x%d", i), Type: tt})
		}
		steps, err := graph.ParseFusedBody(body, len(ins))
		if err != nil {
			t.Fatal(err)
		}
		types, err := graph.FusedTypes(steps, in, n.Attrs)
		if err != nil {
			t.Fatal(err)
		}
		bufs := func(k int) Buffer { return Buffer{Addr: uint64(0x10000 * (k + 1)), DType: graph.BFloat16} }
		return NewRows(n, steps, types, bufs, func(k int) Buffer { return bufs(8 + k) })
	}
	p, err := rows("Transpose<0,2,1,3>(i0);Mul(t0,t0);ReduceMean(t1);Add(t2,i1);Sqrt(t3);Reciprocal(t4)", []int64{0, 5}, bshd, graph.Shape{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.ElemIns) != 3 || p.ElemIns[0].Strides != nil || p.ElemIns[2].Buf != p.ElemIns[0].Buf {
		t.Fatalf("want input 0 unread and a view of it as operand 2; operands %+v", p.ElemIns)
	}
	k, err := p.Generate()
	src, lanes := k.Source, k.Lanes
	if err != nil {
		t.Fatal(err)
	}
	if k.Threads != 3*256 || lanes != 8 || !strings.Contains(src, "vector 8,") {
		t.Errorf("%d threads, lanes %d; want 96 rows of 8 lanes (3 blocks), vector 8\n%s", k.Threads, lanes, src)
	}
	// Row (b,h,s) starts at b·3072 + h·64 + s·192 of the [B,S,H,D] buffer,
	// and the transposed value (an output) is written contiguously.
	for _, s := range []string{"e2 = 0ull + c0 * 3072ull + c1 * 64ull + c2 * 192ull", "in2 + e2 + col", "const void* __restrict__ in0", "out0 + q + col"} {
		if !strings.Contains(src, s) {
			t.Errorf("transposed norm: source lacks %q\n%s", s, src)
		}
	}
	// fuse_qkv's k heads read in place from the merged [B,S,3H,D] product:
	// a Slice of heads 3..6, transposed. The row (b,h,s) starts at
	// 3·64 + b·9216 + h·64 + s·576; the Slice itself (read only by the
	// Transpose) is neither loaded nor computed.
	merged := graph.Shape{bshd[0], bshd[1], 3 * bshd[2], bshd[3]}
	p, err = rows("Slice<2,3,6>(i0);Transpose<0,2,1,3>(t0);Mul(t1,t1);ReduceMean(t2);Add(t3,i1);Sqrt(t4);Reciprocal(t5)", []int64{1, 6}, merged, graph.Shape{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.ElemIns) != 4 || p.ElemIns[0].Strides != nil || p.ElemIns[2].Strides != nil || p.ElemIns[3].Off != 192 {
		t.Fatalf("want inputs 0 and the Slice's view unread, the Transpose's view at offset 192; operands %+v", p.ElemIns)
	}
	k, err = p.Generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"e3 = 192ull + c0 * 9216ull + c1 * 64ull + c2 * 576ull", "in3 + e3 + col", "const void* __restrict__ in2", "vector 8,"} {
		if !strings.Contains(k.Source, s) {
			t.Errorf("sliced transposed norm: source lacks %q\n%s", s, k.Source)
		}
	}
	if strings.Contains(k.Source, "t0 =") {
		t.Errorf("sliced transposed norm: the Slice step is computed\n%s", k.Source)
	}
	for _, tc := range []struct{ body, want string }{
		{"Neg(i0);Transpose<0,2,1,3>(t0);ReduceSum(t1)", "not of step 0"},
		{"Transpose<0,1,3,2>(i0);ReduceSum(t0)", "moves its last axis"},
	} {
		if _, err := rows(tc.body, []int64{1}, bshd); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.body, err, tc.want)
		}
	}
}
