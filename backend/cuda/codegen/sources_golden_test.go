package codegen

// A sweep of every generator over the choices it makes (dtypes, compute
// type, vector width, 32- or 64-bit offsets and indices, broadcast and
// strided operands, integer work with the error flag, row lengths, reduce
// ops), a sha256 per kernel compared with testdata/sources.golden. The
// training-step golden of package cuda pins what real models generate; this
// one pins the corners they do not reach (the row reductions, float64 and
// integer kernels, indices past 2^31), so that restructuring the generator
// is shown to change no kernel.

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

var updateSources = flag.Bool("update", false, "rewrite testdata/sources.golden")

func TestGeneratorSourcesGolden(t *testing.T) {
	var lines []string
	// Each line: the case, the launch (entry point, threads in blocks of
	// 256 or a fixed grid and block, the buffer arguments, the error flag)
	// and what the generator chose, and the source's hash.
	type launch struct {
		entry       string
		threads     int64
		grid, block [3]uint32
		args        int
		flag        bool
	}
	add := func(name string, k Kernel, err error, chose ...any) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		l := launch{k.Entry, k.Threads, k.Grid, k.Block, len(k.Args), k.UsesFlag}
		lines = append(lines, fmt.Sprintf("%s %+v %v %x", name, l, chose, sha256.Sum256([]byte(k.Source))))
	}
	dts := []graph.DType{graph.Float32, graph.BFloat16, graph.Float16, graph.Float64}

	// Elementwise: one step or a body, over broadcast, transposed,
	// misaligned, scalar and offset operands, into contiguous or strided
	// outputs.
	step := func(op string, n int) graph.FusedStep {
		st := graph.FusedStep{Op: op, Attrs: graph.ExprStepAttrs(op, nil)}
		for i := range n {
			st.Args = append(st.Args, graph.FusedOperand{Index: i})
		}
		return st
	}
	for _, dt := range append(dts, graph.Int64, graph.Bool) {
		for _, shape := range []graph.Shape{{4, 8, 64}, {3, 5, 7}, {}, {1 << 16, 1 << 16}} {
			buf := func(addr uint64) Buffer { return Buffer{Addr: addr, DType: dt, N: shape.Numel()} }
			rowB := append(append(graph.Shape{}, shape...), 1)[:shape.Rank()]
			if len(rowB) > 0 {
				rowB[len(rowB)-1] = 1
			}
			ins := map[string][]Operand{
				"contiguous": {BroadcastOperand(buf(0x1000), shape, shape), BroadcastOperand(buf(0x2000), shape, shape)},
				"row-bcast":  {BroadcastOperand(buf(0x1000), shape, shape), BroadcastOperand(buf(0x2000), rowB, shape)},
				"scalar":     {BroadcastOperand(buf(0x1000), shape, shape), BroadcastOperand(buf(0x2000), graph.Shape{}, shape)},
				"misaligned": {BroadcastOperand(buf(0x1004), shape, shape), BroadcastOperand(buf(0x2000), shape, shape)},
				"offset":     {{Buf: buf(0x1000), Off: 3 << 30, Strides: ContiguousStrides(shape)}, BroadcastOperand(buf(0x2000), shape, shape)},
			}
			if shape.Rank() == 3 {
				ins["transposed"] = []Operand{{Buf: buf(0x1000), Strides: []int64{int64(shape[2]), int64(shape[0] * shape[2]), 1}}, BroadcastOperand(buf(0x2000), shape, shape)}
				ins["strided-inner"] = []Operand{{Buf: buf(0x1000), Strides: []int64{1, int64(shape[0]), int64(shape[0] * shape[1])}}, BroadcastOperand(buf(0x2000), shape, shape)}
			}
			for _, name := range []string{"contiguous", "row-bcast", "scalar", "misaligned", "offset", "transposed", "strided-inner"} {
				in, ok := ins[name]
				if !ok {
					continue
				}
				for _, op := range []string{"Add", "Div", "Max", "Identity"} {
					if dt == graph.Bool && op == "Div" {
						continue
					}
					n := 2
					if op == "Identity" {
						n = 1
					}
					p := &Elementwise{Shape: shape, Ins: in[:n], Steps: []graph.FusedStep{step(op, n)}, Outs: []int{0}, OutBufs: []Buffer{buf(0x9000)}}
					k, err := p.Generate()
					add(fmt.Sprintf("ew/%v/%v/%s/%s", dt, shape, name, op), k, err, k.Vec)
				}
			}
		}
	}
	// A body with narrowed steps and two outputs of other types; an output
	// into a slice of a larger tensor; a float64 operand among float32.
	body, err := graph.ParseFusedBody("Add(i0,i1);Mul(t0,t0);Sqrt(t1);Neg(t2)", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range []graph.DType{graph.BFloat16, graph.Float16, graph.Float32} {
		sh := graph.Shape{8, 256}
		b := func(addr uint64, dt graph.DType) Buffer { return Buffer{Addr: addr, DType: dt, N: sh.Numel()} }
		p := &Elementwise{Shape: sh, Ins: []Operand{BroadcastOperand(b(0x1000, nd), sh, sh), BroadcastOperand(b(0x2000, graph.Float32), graph.Shape{256}, sh)},
			Steps: body, Outs: []int{0, 3}, OutBufs: []Buffer{b(0x4000, nd), b(0x8000, graph.Float32)},
			Narrow: []graph.DType{nd, nd, graph.Float32, nd}}
		k, err := p.Generate()
		add(fmt.Sprintf("ew-body/%v", nd), k, err, k.Vec)
		p.Ins[1].Buf.DType = graph.Float64
		k, err = p.Generate()
		add(fmt.Sprintf("ew-body-f64/%v", nd), k, err, k.Vec)
	}
	for _, tc := range []struct{ at, cols, row int64 }{{0, 32, 64}, {32, 32, 64}, {3, 32, 64}, {0, 30, 60}, {1 << 31, 32, 64}} {
		for _, dt := range dts {
			in := Buffer{Addr: 0x1000, DType: dt, N: int(4 * tc.cols)}
			out := Buffer{Addr: 0x8000, DType: dt, N: int(4 * tc.row)}
			p := &Elementwise{Shape: graph.Shape{4, int(tc.cols)}, Ins: []Operand{{Buf: in, Strides: []int64{tc.cols, 1}}},
				Steps: []graph.FusedStep{step("Identity", 1)}, Outs: []int{0}, OutBufs: []Buffer{out}, OutStrides: [][]int64{{tc.row, 1}}, OutOffs: []int64{tc.at}}
			k, err := p.Generate()
			add(fmt.Sprintf("ew-strided-out/%v/%d/%d/%d", dt, tc.at, tc.cols, tc.row), k, err, k.Vec)
		}
	}

	// Rows: an RMSNorm forward over several row lengths, types, alignments.
	fwd, err := graph.ParseFusedBody("Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3);Reciprocal(t4)", 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range dts {
		for _, full := range []graph.Shape{{8, 1024, 768}, {6, 64}, {3, 5, 64}, {4, 7}, {2, 8192}, {5, 1}} {
			for _, addr := range []uint64{0x10000, 0x10004} {
				for _, mean := range []bool{true, false} {
					buf := func(dt graph.DType, addr uint64, s graph.Shape) Buffer {
						return Buffer{Addr: addr, DType: dt, N: s.Numel()}
					}
					red := append(full[:len(full)-1:len(full)-1], 1)
					p := &Rows{full: full, steps: fwd, red: 2, mean: mean, rowLevel: []bool{false, false, true, true, true, true},
						outs: []int{0, 4, 5}, narrow: []graph.DType{dt, dt, dt, dt, dt, dt}}
					x, y, e := buf(dt, addr, full), buf(dt, 0x20000, full), buf(graph.Float32, 0x30000, graph.Shape{})
					p.ElemIns = []Operand{BroadcastOperand(x, full, full), BroadcastOperand(y, graph.Shape{full[len(full)-1]}, full), {Buf: e}}
					p.rIns = []Operand{{Buf: x}, {Buf: y}, BroadcastOperand(e, graph.Shape{}, red)}
					p.OutBufs = []Buffer{buf(dt, 0x40000, full), buf(dt, 0x50000, red), buf(graph.Float32, 0x60000, red)}
					k, err := p.Generate()
					add(fmt.Sprintf("rows/%v/%v/%#x/mean=%v", dt, full, addr, mean), k, err, k.Lanes)
				}
			}
		}
	}
	// Rows through NewRows: a head split read as a view, a row broadcast.
	bshd := graph.Shape{2, 16, 3, 64}
	merged := graph.Shape{2, 16, 9, 64} // q, k and v heads of one GEMM
	for _, dt := range dts {
		for _, tc := range []struct {
			body string
			outs []int64
			ins  []graph.Shape
		}{
			{"Transpose<0,2,1,3>(i0);Mul(t0,t0);ReduceMean(t1);Add(t2,i1);Sqrt(t3);Reciprocal(t4)", []int64{0, 5}, []graph.Shape{bshd, {}}},
			{"Mul(i0,i1);ReduceSum(t0);Mul(t1,i2)", []int64{0, 2}, []graph.Shape{{4, 96}, {96}, {4, 1}}},
			{"Mul(i0,i1);ReduceSum(t0)", []int64{1}, []graph.Shape{{4, 30}, {4, 30}}},
			// fuse_qkv's k heads read in place from the merged product, by
			// the norm forward and the backward's row sum.
			{"Slice<2,3,6>(i0);Transpose<0,2,1,3>(t0);Mul(t1,t1);ReduceMean(t2);Add(t3,i1);Sqrt(t4);Reciprocal(t5)", []int64{1, 6}, []graph.Shape{merged, {}}},
			{"Slice<2,0,3>(i1);Transpose<0,2,1,3>(t0);Mul(i0,t1);ReduceSum(t2)", []int64{3}, []graph.Shape{{2, 3, 16, 64}, merged}},
		} {
			n := &graph.Node{Name: "norm", Op: "FusedElementwise", Attrs: graph.Attrs{"body": graph.Str(tc.body),
				"outputs": graph.Ints(tc.outs...), "axes": graph.Ints(-1)}}
			var in []graph.TensorType
			for i, s := range tc.ins {
				tt := graph.TensorType{DType: dt, Shape: s}
				in = append(in, tt)
				n.Inputs = append(n.Inputs, &graph.Value{Name: fmt.Sprintf("x%d", i), Type: tt})
			}
			steps, err := graph.ParseFusedBody(tc.body, len(tc.ins))
			if err != nil {
				t.Fatal(err)
			}
			types, err := graph.FusedTypes(steps, in, n.Attrs)
			if err != nil {
				t.Fatal(err)
			}
			bufs := func(k int) Buffer { return Buffer{Addr: uint64(0x10000 * (k + 1)), DType: dt} }
			p, err := NewRows(n, steps, types, bufs, func(k int) Buffer { return bufs(8 + k) })
			if err != nil {
				t.Fatal(err)
			}
			k, err := p.Generate()
			add(fmt.Sprintf("rows-node/%v/%s", dt, tc.body), k, err, k.Lanes)
		}
	}

	// Index: rotate-half forward and gradient, transposes, cuts inside a
	// vector, zeros, each in several types and widths.
	shape := graph.Shape{2, 3, 16, 64}
	half := graph.Shape{2, 3, 16, 32}
	bhsd := graph.Shape{2, 3, 16, 64}
	for _, dt := range dts {
		for _, tc := range []struct {
			body  string
			shape graph.Shape
			ins   []graph.Shape
			zero  []bool
		}{
			{"Slice<3,0,32>(i0);Slice<3,32,64>(i0);Neg(t1);Concat<3>(t2,t0);Mul(i0,i1);Mul(t3,i2);Add(t4,t5)", shape, []graph.Shape{shape, {16, 64}, {16, 64}}, nil},
			{"Mul(i0,i1);Mul(i0,i2);Slice<3,0,32>(t0);Slice<3,32,64>(t0);Neg(t2);Concat<3>(i3,t4);Concat<3>(t3,i4);Add(t1,t5);Add(t7,t6)", shape,
				[]graph.Shape{shape, {16, 64}, {16, 64}, half, half}, []bool{false, false, false, true, true}},
			{"Slice<3,4,64>(i0);Slice<3,0,4>(i0);Concat<3>(t0,t1)", shape, []graph.Shape{shape}, nil},
			{"Slice<-1,-32,64>(i0);Neg(t0)", half, []graph.Shape{shape}, nil},
			{"Transpose<0,2,1,3>(i0);Mul(t0,i1)", bhsd, []graph.Shape{bshd, {64}}, nil},
			{"Mul(i0,i1);Transpose<0,2,1,3>(t0)", bshd, []graph.Shape{bhsd, {64}}, nil},
			{"Transpose<0,2,1,3>(i0);Neg(t0);Transpose<0,2,1,3>(t1)", bshd, []graph.Shape{bshd}, nil},
			{"Transpose<0,1,3,2>(i0);Neg(t0)", graph.Shape{2, 3, 64, 16}, []graph.Shape{bhsd}, nil},
			{"Concat<2>(i0,i1);Neg(t0)", graph.Shape{2, 3, 32, 64}, []graph.Shape{shape, shape}, nil},
			// fuse_qkv: v's heads cut from the merged product and
			// transposed in one copy; gradients written into the merged
			// gradient by the Concat that selects them.
			{"Slice<2,6,9>(i0);Transpose<0,2,1,3>(t0)", bhsd, []graph.Shape{merged}, nil},
			{"Transpose<0,2,1,3>(i0);Neg(i1);Transpose<0,2,1,3>(t1);Transpose<0,2,1,3>(i2);Concat<2>(t0,t2,t3)", merged, []graph.Shape{bhsd, bhsd, bhsd}, nil},
		} {
			for _, odt := range []graph.DType{dt, graph.Float32} {
				steps, err := graph.ParseFusedBody(tc.body, len(tc.ins))
				if err != nil {
					t.Fatal(err)
				}
				var in []graph.TensorType
				zero := tc.zero
				if zero == nil {
					zero = make([]bool, len(tc.ins))
				}
				for _, s := range tc.ins {
					in = append(in, graph.TensorType{DType: dt, Shape: s})
				}
				types, err := graph.FusedTypes(steps, in, nil)
				if err != nil {
					t.Fatal(err)
				}
				p := &Index{Shape: tc.shape, Steps: NormalizeIndexSteps(steps, types, tc.ins), Types: types, InShapes: tc.ins, Zero: zero,
					Outs: []int{len(steps) - 1}, OutBufs: []Buffer{{Addr: 0x90000, DType: odt, N: tc.shape.Numel()}}}
				for k, s := range tc.ins {
					p.Ins = append(p.Ins, Buffer{Addr: uint64(0x10000 * (k + 1)), DType: dt, N: s.Numel()})
				}
				p.Vec = p.VectorWidth()
				k, err := p.Generate()
				add(fmt.Sprintf("ix/%v/%v/%s", dt, odt, tc.body), k, err, k.Vec)
			}
		}
	}

	// Row and column reductions.
	for _, xdt := range dts {
		for _, ydt := range []graph.DType{xdt, graph.Float32} {
			for _, cols := range []int64{1, 7, 64, 768, 8192} {
				for _, addr := range []uint64{0x1000, 0x1004} {
					for _, op := range []int32{0, 2} {
						for _, div := range []int64{1, cols} {
							p := &RowReduce{X: Buffer{Addr: addr, DType: xdt}, Y: Buffer{Addr: 0x9000, DType: ydt}, Rows: 100, Cols: cols, Op: op, Divisor: div}
							k, err := p.Generate()
							add(fmt.Sprintf("red/%v/%v/%d/%#x/op%d/div%d", xdt, ydt, cols, addr, op, div), k, err, k.Lanes)
						}
					}
				}
			}
			for _, tc := range []struct{ rows, cols, clen int64 }{{8192, 768, 64}, {98304, 64, 768}, {128, 768, 128}, {100, 3000, 100}, {10, 5, 10}} {
				for _, op := range []int32{0, 2} {
					for _, part := range []bool{false, true} {
						p := &ColReduce{X: Buffer{Addr: 0x1000, DType: xdt}, Y: Buffer{Addr: 0x9000, DType: ydt}, Rows: tc.rows, Cols: tc.cols, ChunkLen: tc.clen, Op: op, Divisor: tc.rows, PartialsF32: part}
						k, err := p.Generate()
						add(fmt.Sprintf("cols/%v/%v/%d/%d/%d/op%d/part=%v", xdt, ydt, tc.rows, tc.cols, tc.clen, op, part), k, err)
					}
				}
			}
		}
	}

	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join("testdata", "sources.golden")
	if *updateSources {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if string(want) != got {
		wl := strings.Split(string(want), "\n")
		gl := strings.Split(got, "\n")
		for i := range min(len(wl), len(gl)) {
			if wl[i] != gl[i] {
				t.Fatalf("%d kernels; line %d differs:\n got %s\nwant %s", len(lines), i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("%d kernels, %d lines in the golden", len(lines), len(wl)-1)
	}
	t.Logf("%d generated kernels pinned", len(lines))
}
