package cpu

import (
	"math"
	"runtime"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// A FusedElementwise node runs through its output in chunks: its
// intermediates are never held at full size, so running it allocates about
// its output and not one tensor per step.
func TestFusedElementwiseDoesNotMaterialiseSteps(t *testing.T) {
	const rows, cols = 256, 4096 // 4 MiB per float32 tensor
	b := graph.NewBuilder("fused")
	x := b.Input("x", graph.Float32, rows, cols)
	w := b.Input("w", graph.Float32, cols)
	r := b.Input("r", graph.Float32, rows, 1)
	y := b.OpN("FusedElementwise", graph.Attrs{
		"body":    graph.Str("Sigmoid(i0);Mul(i0,t0);Mul(t1,i1);Mul(t2,i2);Add(t3,i0);Neg(t4)"),
		"outputs": graph.Ints(5),
	}, x, w, r)
	b.Output(y...)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := New().Compile(g, backend.Options{PoisonOutputs: true})
	if err != nil {
		t.Fatal(err)
	}
	feeds := map[string]*graph.Tensor{
		"x": graph.NewTensor(graph.Float32, graph.Shape{rows, cols}),
		"w": graph.NewTensor(graph.Float32, graph.Shape{cols}),
		"r": graph.NewTensor(graph.Float32, graph.Shape{rows, 1}),
	}
	for name, f := range feeds {
		for i := range f.Len() {
			f.Set(i, float64(i%97)/97-float64(len(name))/4)
		}
	}
	if _, err := exe.Run(feeds); err != nil { // warm up
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	out, err := exe.Run(feeds)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	const tensor = rows * cols * 4
	if got := after.TotalAlloc - before.TotalAlloc; got > tensor+tensor/2 {
		t.Errorf("a run allocated %d bytes; the output is %d, six steps materialised would be %d", got, tensor, 6*tensor)
	}
	// And the values are the body's, element by element.
	yv := out[g.Outputs[0].Name]
	for _, i := range []int{0, 1, cols - 1, cols, rows*cols/2 + 17, rows*cols - 1} {
		xv, wv, rv := feeds["x"].At(i), feeds["w"].At(i%cols), feeds["r"].At(i/cols)
		want := roundF32(-(roundF32(roundF32(roundF32(xv*roundF32(graph.Sigmoid(xv)))*wv)*rv) + xv))
		if yv.At(i) != want {
			t.Fatalf("element %d = %v, want %v", i, yv.At(i), want)
		}
	}
}

func roundF32(v float64) float64 { return float64(float32(v)) }

// Bodies with a row reduction or last-axis index steps run over chunks of
// rows: the result equals the op-by-op reference bit for bit, and a run
// allocates about its outputs, not a tensor per step.
func TestFusedRowsChunks(t *testing.T) {
	const rows, cols = 512, 256 // 512 KiB per float32 tensor
	for _, tc := range []struct {
		name, body string
		outs       []int64
		attrs      graph.Attrs
		ins        []graph.Shape
		outShapes  int // elements written per output, summed
	}{
		{"rmsnorm", "Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3);Reciprocal(t4)", []int64{0, 5},
			graph.Attrs{"axes": graph.Ints(-1)}, []graph.Shape{{2, rows / 2, cols}, {2, rows / 2, cols}, {}}, rows*cols + rows},
		{"norm backward", "Mul(i2,i2);Mul(i0,i1);ReduceSum(t1);Mul(t2,t0);Neg(t3)", []int64{4},
			graph.Attrs{"axes": graph.Ints(-1)}, []graph.Shape{{rows, cols}, {cols}, {rows, 1}}, rows},
		{"rotate-half", "Slice<2,0,128>(i0);Slice<2,128,256>(i0);Neg(t1);Concat<2>(t2,t0);Mul(i0,i1);Mul(t3,i2);Add(t4,t5)", []int64{6},
			graph.Attrs{}, []graph.Shape{{4, rows / 4, cols}, {rows / 4, cols}, {rows / 4, cols}}, rows * cols},
		// A head split read by an RMSNorm: rows gathered in the transposed
		// order, the transposed input also an output.
		{"transposed rmsnorm", "Transpose<0,2,1,3>(i0);Mul(t0,t0);ReduceMean(t1);Add(t2,i1);Sqrt(t3);Reciprocal(t4)", []int64{0, 5},
			graph.Attrs{"axes": graph.Ints(-1)}, []graph.Shape{{2, rows / 8, 4, cols}, {}}, rows*cols + rows},
		{"transposed norm backward", "Transpose<0,2,1,3>(i0);Mul(i1,t0);ReduceSum(t1);Mul(t2,i2)", []int64{3},
			graph.Attrs{"axes": graph.Ints(-1)}, []graph.Shape{{2, rows / 8, 4, cols}, {2, 4, rows / 8, cols}, {2, 4, rows / 8, 1}}, rows},
		// A head merge written transposed (rows scattered), the step before
		// it an output too.
		{"transposed write", "Transpose<0,2,1,3>(i0);Mul(t0,i1);Add(t1,i1);Transpose<0,2,1,3>(t2)", []int64{3, 2},
			graph.Attrs{}, []graph.Shape{{2, rows / 8, 4, cols}, {2, 4, rows / 8, cols}}, 2 * rows * cols},
	} {
		b := graph.NewBuilder("rows")
		var ins []*graph.Value
		feeds := map[string]*graph.Tensor{}
		for i, s := range tc.ins {
			name := string(rune('a' + i))
			ins = append(ins, b.Input(name, graph.Float32, s...))
			f := graph.NewTensor(graph.Float32, s)
			for j := range f.Len() {
				f.Set(j, float64((j*7+i*3)%101)/50-1+float64(i))
			}
			feeds[name] = f
		}
		attrs := graph.Attrs{"body": graph.Str(tc.body), "outputs": graph.Ints(tc.outs...)}
		for k, v := range tc.attrs {
			attrs[k] = v
		}
		ys := b.OpN("FusedElementwise", attrs, ins...)
		b.Output(ys...)
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		exe, err := New().Compile(g, backend.Options{PoisonOutputs: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := exe.Run(feeds); err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		got, err := exe.Run(feeds)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		if alloc, limit := after.TotalAlloc-before.TotalAlloc, uint64(4*tc.outShapes)*3/2+(256<<10); alloc > limit {
			// One step materialised whole would be rows·cols·4 = 512 KiB.
			t.Errorf("%s: a run allocated %d bytes, the outputs hold %d", tc.name, alloc, 4*tc.outShapes)
		}
		var args []*graph.Tensor
		for i := range tc.ins {
			args = append(args, feeds[string(rune('a'+i))])
		}
		want, err := graph.Eval("FusedElementwise", attrs, args...)
		if err != nil {
			t.Fatal(err)
		}
		for k, y := range ys {
			if !sameBitsF32(got[y.Name], want[k]) {
				t.Errorf("%s: output %d differs from the op-by-op reference", tc.name, k)
			}
		}
	}
}

func sameBitsF32(a, b *graph.Tensor) bool {
	if a == nil || b == nil || a.Len() != b.Len() {
		return false
	}
	for i := range a.Len() {
		if math.Float64bits(a.At(i)) != math.Float64bits(b.At(i)) {
			return false
		}
	}
	return true
}

// Transpose steps that move values between rows (a transposed result, a
// Transpose of a step, one that moves the last axis) run step by step, each
// whole: bit for bit the op-by-op reference.
func TestFusedTransposeWhole(t *testing.T) {
	for _, tc := range []struct {
		body string
		ins  []graph.Shape
	}{
		{"Transpose<0,2,1,3>(i0);Mul(t0,i1);Add(t1,i1);Transpose<0,2,1,3>(t2)", []graph.Shape{{2, 5, 3, 8}, {2, 3, 5, 8}}},
		{"Mul(i0,i1);Transpose<0,2,1,3>(t0)", []graph.Shape{{2, 5, 3, 8}, {8}}},
		{"Transpose<1,0>(i0);Sigmoid(t0);Mul(t1,i1)", []graph.Shape{{6, 4}, {4, 6}}},
	} {
		b := graph.NewBuilder("tr")
		var ins []*graph.Value
		var args []*graph.Tensor
		feeds := map[string]*graph.Tensor{}
		for i, s := range tc.ins {
			name := string(rune('a' + i))
			ins = append(ins, b.Input(name, graph.Float32, s...))
			f := graph.NewTensor(graph.Float32, s)
			for j := range f.Len() {
				f.Set(j, float64((j*13+i*5)%97)/40-1)
			}
			feeds[name] = f
			args = append(args, f)
		}
		steps, err := graph.ParseFusedBody(tc.body, len(ins))
		if err != nil {
			t.Fatal(err)
		}
		attrs := graph.Attrs{"body": graph.Str(tc.body), "outputs": graph.Ints(int64(len(steps) - 1))}
		ys := b.OpN("FusedElementwise", attrs, ins...)
		b.Output(ys...)
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		exe, err := New().Compile(g, backend.Options{PoisonOutputs: true})
		if err != nil {
			t.Fatal(err)
		}
		got, err := exe.Run(feeds)
		if err != nil {
			t.Fatal(err)
		}
		want, err := graph.Eval("FusedElementwise", attrs, args...)
		if err != nil {
			t.Fatal(err)
		}
		if !got[ys[0].Name].Shape.Equal(want[0].Shape) || !sameBitsF32(got[ys[0].Name], want[0]) {
			t.Errorf("%s: differs from the op-by-op reference", tc.body)
		}
	}
}

// Transposes that keep the last axis run over chunks of rows (fusedRows
// takes them: a read gathers rows, a write scatters them) and equal the
// op-by-op reference; one that moves the last axis does not.
func TestFusedRowsTakesTransposes(t *testing.T) {
	for _, tc := range []struct {
		body  string
		attrs graph.Attrs
		ins   []graph.Shape
		rows  bool
	}{
		{"Transpose<0,2,1,3>(i0);Mul(t0,t0);ReduceSum(t1)", graph.Attrs{"axes": graph.Ints(-1)}, []graph.Shape{{2, 5, 3, 8}}, true},
		{"Mul(i0,i1);Transpose<0,2,1,3>(i2);Mul(i3,t1);Add(t0,t2);Transpose<0,2,1,3>(t3)", graph.Attrs{},
			[]graph.Shape{{2, 3, 5, 8}, {2, 3, 5, 1}, {2, 5, 3, 8}, {2, 3, 5, 1}}, true},
		{"Neg(i0);Transpose<0,2,1>(t0)", graph.Attrs{}, []graph.Shape{{2, 5, 8}}, false},
	} {
		steps, err := graph.ParseFusedBody(tc.body, len(tc.ins))
		if err != nil {
			t.Fatal(err)
		}
		attrs := graph.Attrs{"body": graph.Str(tc.body), "outputs": graph.Ints(int64(len(steps) - 1))}
		for k, v := range tc.attrs {
			attrs[k] = v
		}
		var in []*graph.Tensor
		var types []graph.TensorType
		for i, s := range tc.ins {
			x := graph.NewTensor(graph.Float32, s)
			for j := range x.Len() {
				x.Set(j, float64((j*11+i*7)%31)/15-1)
			}
			in = append(in, x)
			types = append(types, x.Type())
		}
		stepTypes, err := graph.FusedTypes(steps, types, attrs)
		if err != nil {
			t.Fatal(err)
		}
		out := graph.NewTensor(graph.Float32, stepTypes[len(steps)-1].Shape)
		n := &graph.Node{Name: "f", Op: "FusedElementwise", Attrs: attrs}
		ok, err := fusedRows(n, steps, stepTypes, attrs["outputs"].Ints, in, []*graph.Tensor{out})
		if err != nil || ok != tc.rows {
			t.Fatalf("%s: fusedRows took it %v (error %v), want %v", tc.body, ok, err, tc.rows)
		}
		if !ok {
			continue
		}
		want, err := graph.Eval("FusedElementwise", attrs, in...)
		if err != nil {
			t.Fatal(err)
		}
		if !sameBitsF32(out, want[0]) {
			t.Errorf("%s: differs from the op-by-op reference", tc.body)
		}
	}
}
