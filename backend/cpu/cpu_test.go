package cpu

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

func TestEveryOpHasKernel(t *testing.T) {
	for _, s := range graph.Ops() {
		if _, ok := kernels[s.Name]; !ok {
			t.Errorf("op %s (%s) has no CPU kernel", s.QualifiedName(), s.Doc)
		}
	}
	for name := range kernels {
		if _, ok := graph.LookupOp(name); !ok {
			t.Errorf("kernel %s is for an op the op table does not have", name)
		}
	}
}

func mustBuild(t *testing.T, b *graph.Builder) *graph.Graph {
	t.Helper()
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func compile(t *testing.T, g *graph.Graph, opts backend.Options) backend.Executable {
	t.Helper()
	exe, err := New().Compile(g, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exe.Close() })
	return exe
}

func tensorOf(dt graph.DType, shape graph.Shape, vals ...float64) *graph.Tensor {
	x := graph.NewTensor(dt, shape)
	for i, v := range vals {
		x.Set(i, v)
	}
	return x
}

// A chain x → Exp → Neg → Exp → ... → y: each intermediate dies at the next
// node, so at most two are live at once.
func TestLivenessFreesIntermediates(t *testing.T) {
	b := graph.NewBuilder("chain")
	x := b.Input("x", graph.Float32, 64, 32)
	const depth = 10
	v := x
	for i := range depth {
		if i%2 == 0 {
			v = b.Op("Exp", nil, v)
		} else {
			v = b.Neg(v)
		}
	}
	b.Output(v)
	g := mustBuild(t, b)
	exe := compile(t, g, backend.Options{PoisonOutputs: true})
	one := int64(64 * 32 * 4)
	st := exe.Stats()
	if all := depth * one; st.PeakActivationBytes >= all {
		t.Fatalf("peak %d is not below the sum of all intermediates %d: nothing is freed", st.PeakActivationBytes, all)
	}
	if st.PeakActivationBytes != 2*one {
		t.Errorf("peak %d, want %d (producer's input and output)", st.PeakActivationBytes, 2*one)
	}
	in := graph.NewTensor(graph.Float32, graph.Shape{64, 32})
	if _, err := exe.Run(map[string]*graph.Tensor{"x": in}); err != nil {
		t.Fatal(err)
	}
	if got := exe.(*executable).runPeak; got != st.PeakActivationBytes {
		t.Errorf("measured peak %d differs from planned %d", got, st.PeakActivationBytes)
	}
}

func TestUpdatesAndInitializers(t *testing.T) {
	b := graph.NewBuilder("counter")
	w := b.Param("w", graph.Float64, graph.Shape{3}, graph.Literal(1, 2, 3))
	x := b.Input("x", graph.Float64, 3)
	nw := b.Add(w, x)
	y := b.Mul(w, x)
	b.Output(nw, y)
	g := mustBuild(t, b)
	exe := compile(t, g, backend.Options{Updates: map[string]string{nw.Name: "w"}, PoisonOutputs: true})
	if st := exe.Stats(); st.InitializerBytes != 3*8 {
		t.Errorf("InitializerBytes %d, want 24", st.InitializerBytes)
	}
	feed := map[string]*graph.Tensor{"x": tensorOf(graph.Float64, graph.Shape{3}, 10, 20, 30)}
	for step, want := range [][]float64{{10, 40, 90}, {110, 440, 990}} {
		out, err := exe.Run(feed)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := out[nw.Name]; ok {
			t.Errorf("update output %s returned by Run", nw.Name)
		}
		for i, v := range want {
			if out[y.Name].F64[i] != v {
				t.Errorf("step %d: y = %v, want %v", step, out[y.Name].F64, want)
				break
			}
		}
	}
	got, err := exe.Initializer("w")
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{21, 42, 63}; got.F64[0] != want[0] || got.F64[1] != want[1] || got.F64[2] != want[2] {
		t.Errorf("w after two updates = %v, want %v", got.F64, want)
	}
	got.F64[0] = 1e9 // a copy: must not change the executable's w
	set := tensorOf(graph.Float64, graph.Shape{3}, -1, -2, -3)
	if err := exe.SetInitializer("w", set); err != nil {
		t.Fatal(err)
	}
	set.F64[0] = 7 // SetInitializer copies too
	back, _ := exe.Initializer("w")
	if back.F64[0] != -1 || back.F64[1] != -2 || back.F64[2] != -3 {
		t.Errorf("round trip gave %v", back.F64)
	}
	if err := exe.SetInitializer("w", tensorOf(graph.Float32, graph.Shape{3})); err == nil {
		t.Error("SetInitializer accepted a float32 tensor for a float64 param")
	}
	if err := exe.SetInitializer("nope", set); err == nil {
		t.Error("SetInitializer accepted an unknown name")
	}
	if _, err := exe.Initializer("x"); err == nil {
		t.Error("Initializer returned a graph input")
	}
}

func TestBadFeeds(t *testing.T) {
	b := graph.NewBuilder("f")
	x := b.Input("tokens", graph.Float32, 2, 3)
	b.Output(b.Neg(x))
	exe := compile(t, mustBuild(t, b), backend.Options{})
	cases := map[string]map[string]*graph.Tensor{
		"missing":     {},
		"dtype":       {"tokens": graph.NewTensor(graph.Float64, graph.Shape{2, 3})},
		"shape":       {"tokens": graph.NewTensor(graph.Float32, graph.Shape{3, 2})},
		"storage":     {"tokens": {DType: graph.Float32, Shape: graph.Shape{2, 3}, F32: make([]float32, 5)}},
		"nil":         {"tokens": nil},
		"extra input": {"tokens": graph.NewTensor(graph.Float32, graph.Shape{2, 3}), "other": graph.NewTensor(graph.Float32, nil)},
	}
	for name, feeds := range cases {
		_, err := exe.Run(feeds)
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		want := "tokens"
		if name == "extra input" {
			want = "other"
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %q does not name %s", name, err, want)
		}
	}
}

func TestKernelErrorsNameTheNode(t *testing.T) {
	b := graph.NewBuilder("g")
	data := b.Param("table", graph.Float32, graph.Shape{4, 2}, graph.Ones())
	idx := b.Input("idx", graph.Int64, 3)
	b.Output(b.Gather(data, idx, 0))
	g := mustBuild(t, b)
	exe := compile(t, g, backend.Options{})
	_, err := exe.Run(map[string]*graph.Tensor{"idx": tensorOf(graph.Int64, graph.Shape{3}, 0, 4, 1)})
	if err == nil || !strings.Contains(err.Error(), g.Nodes[0].Name) || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("out-of-range gather: %v", err)
	}
	out, err := exe.Run(map[string]*graph.Tensor{"idx": tensorOf(graph.Int64, graph.Shape{3}, -4, -1, 1)})
	if err != nil || out[g.Outputs[0].Name].Len() != 6 {
		t.Errorf("negative indices: %v", err)
	}
}

func TestKernelPanicBecomesError(t *testing.T) {
	n := &graph.Node{Name: "boom_7", Op: "Neg"}
	st := step{node: n, k: func(*graph.Node, []*graph.Tensor, []*graph.Tensor) error {
		var s []float32
		_ = s[3] // index out of range
		return nil
	}}
	_, err := runKernel(st, nil, false, &bufferPool{})
	if err == nil || !strings.Contains(err.Error(), "boom_7") {
		t.Fatalf("got %v", err)
	}
	// A panic on a worker goroutine is carried back too.
	st.k = func(*graph.Node, []*graph.Tensor, []*graph.Tensor) error {
		parallelFor(1<<20, 1, func(lo, hi int) {
			panic(errors.New("worker failed"))
		})
		return nil
	}
	if _, err := runKernel(st, nil, false, &bufferPool{}); err == nil || !strings.Contains(err.Error(), "boom_7") {
		t.Fatalf("worker panic: got %v", err)
	}
}

// A value the host cannot hold (the IR allows 2^48 elements) is an error
// naming it, not a makeslice panic out of Run or Compile.
func TestHugeValuesAreErrors(t *testing.T) {
	b := graph.NewBuilder("huge")
	x := b.Input("x", graph.Float32, 1)
	b.Output(b.Op("Expand", nil, x, b.Ints(1<<24, 1<<24)))
	exe := compile(t, mustBuild(t, b), backend.Options{})
	_, err := exe.Run(map[string]*graph.Tensor{"x": tensorOf(graph.Float32, graph.Shape{1}, 1)})
	if err == nil || !strings.Contains(err.Error(), "node Expand_0 (Expand): output Expand_0: cannot allocate float32[16777216,16777216]") {
		t.Fatalf("got %v", err)
	}
	b = graph.NewBuilder("huge param")
	w := b.Param("w", graph.Float32, graph.Shape{1 << 24, 1 << 24}, graph.Zeros())
	b.Output(b.Neg(w))
	_, err = New().Compile(mustBuild(t, b), backend.Options{})
	if err == nil || !strings.Contains(err.Error(), "initializer w: zeros initializer of type float32[16777216,16777216]: runtime error: makeslice") {
		t.Fatalf("huge param: got %v", err)
	}
}

func TestSmallAttentionBlock(t *testing.T) {
	// Softmax(Q·Kᵀ)·V on a 2×2 example computed by hand.
	b := graph.NewBuilder("attn")
	q := b.Input("q", graph.Float64, 2, 2)
	k := b.Input("k", graph.Float64, 2, 2)
	v := b.Input("v", graph.Float64, 2, 2)
	p := b.Softmax(b.MatMul(q, b.Transpose(k, 1, 0)), -1)
	b.Output(b.MatMul(p, v))
	g := mustBuild(t, b)
	exe := compile(t, g, backend.Options{PoisonOutputs: true})
	out, err := exe.Run(map[string]*graph.Tensor{
		"q": tensorOf(graph.Float64, graph.Shape{2, 2}, 1, 0, 0, 1),
		"k": tensorOf(graph.Float64, graph.Shape{2, 2}, 1, 0, 0, 0),
		"v": tensorOf(graph.Float64, graph.Shape{2, 2}, 1, 2, 3, 4),
	})
	if err != nil {
		t.Fatal(err)
	}
	y := out[g.Outputs[0].Name].F64
	e := math.E
	p0 := e / (e + 1) // row 0 scores (1, 0)
	want := []float64{p0*1 + (1-p0)*3, p0*2 + (1-p0)*4, 2, 3}
	for i := range want {
		if math.Abs(y[i]-want[i]) > 1e-15 {
			t.Fatalf("y = %v, want %v", y, want)
		}
	}
}

func TestUnsupportedOpRefused(t *testing.T) {
	b := graph.NewBuilder("u")
	x := b.Input("x", graph.Float32, 2)
	b.Output(b.Neg(x))
	g := mustBuild(t, b)
	saved := kernels["Neg"]
	delete(kernels, "Neg")
	defer func() { kernels["Neg"] = saved }()
	if _, err := New().Compile(g, backend.Options{}); err == nil || !strings.Contains(err.Error(), "Neg") {
		t.Errorf("compile without a Neg kernel: %v", err)
	}
}

func TestClosedExecutable(t *testing.T) {
	b := graph.NewBuilder("c")
	w := b.Param("w", graph.Float32, graph.Shape{2}, graph.Ones())
	b.Output(b.Neg(w))
	exe := compile(t, mustBuild(t, b), backend.Options{})
	exe.Close()
	if _, err := exe.Run(map[string]*graph.Tensor{}); err == nil {
		t.Error("Run after Close succeeded")
	}
	if _, err := exe.Initializer("w"); err == nil {
		t.Error("Initializer after Close succeeded")
	}
	if err := exe.SetInitializer("w", graph.NewTensor(graph.Float32, graph.Shape{2})); err == nil {
		t.Error("SetInitializer after Close succeeded")
	}
}

// Int64 arithmetic (shape computations) is CPU-only; the conformance suite
// covers float dtypes.
func TestInt64Arithmetic(t *testing.T) {
	b := graph.NewBuilder("i")
	x := b.Input("x", graph.Int64, 2, 3)
	y := b.Input("y", graph.Int64, 3)
	b.Output(b.Add(x, y), b.Sub(x, y), b.Mul(x, y), b.Div(x, y), b.Op("Pow", nil, x, y))
	g := mustBuild(t, b)
	exe := compile(t, g, backend.Options{PoisonOutputs: true})
	feeds := map[string]*graph.Tensor{
		"x": tensorOf(graph.Int64, graph.Shape{2, 3}, 7, -7, 5, 2, 3, -4),
		"y": tensorOf(graph.Int64, graph.Shape{3}, 2, 2, 3),
	}
	out, err := exe.Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int64{
		{9, -5, 8, 4, 5, -1},
		{5, -9, 2, 0, 1, -7},
		{14, -14, 15, 4, 6, -12},
		{3, -3, 1, 1, 1, -1}, // truncation toward zero
		{49, 49, 125, 4, 9, -64},
	}
	for i, w := range want {
		got := out[g.Outputs[i].Name].I64
		for j := range w {
			if got[j] != w[j] {
				t.Errorf("%s: got %v, want %v", g.Outputs[i].Producer.Op, got, w)
				break
			}
		}
	}
	feeds["y"] = tensorOf(graph.Int64, graph.Shape{3}, 1, 0, 1)
	if _, err := exe.Run(feeds); err == nil || !strings.Contains(err.Error(), "division by zero") {
		t.Errorf("integer division by zero: %v", err)
	}
}

// Big enough that every kernel splits its work over goroutines: the result
// must be bitwise the same as with one goroutine (ranges are split mid-row,
// which the small conformance cases never do).
func TestParallelMatchesSerial(t *testing.T) {
	b := graph.NewBuilder("big")
	x := b.Input("x", graph.Float32, 7, 67, 129)
	y := b.Input("y", graph.Float32, 67, 1)
	idx := b.Input("idx", graph.Int64, 300)
	s := b.Mul(b.Add(x, y), b.Op("Exp", nil, y))
	p := b.Softmax(s, 1)
	r := b.ReduceSum(p, false, 0, 2)
	mm := b.MatMul(b.Transpose(s, 0, 2, 1), s)
	g := b.Gather(b.Reshape(s, 7*67, 129), idx, 0)
	gg := b.Op("GatherGrad", graph.Attrs{"axis": graph.Int(0), "shape": graph.Ints(7*67, 129)}, g, idx)
	w := b.Op("Where", nil, b.Op("Equal", nil, b.Op("Relu", nil, x), x), x, b.Neg(x))
	b.Output(p, r, mm, gg, w, b.Op("LogSoftmax", graph.Attrs{"axis": graph.Int(-1)}, s))
	gr := mustBuild(t, b)
	feeds := map[string]*graph.Tensor{
		"x":   graph.NewTensor(graph.Float32, graph.Shape{7, 67, 129}),
		"y":   graph.NewTensor(graph.Float32, graph.Shape{67, 1}),
		"idx": graph.NewTensor(graph.Int64, graph.Shape{300}),
	}
	for i := range feeds["x"].F32 {
		feeds["x"].F32[i] = float32(math.Sin(float64(i)))
	}
	for i := range feeds["y"].F32 {
		feeds["y"].F32[i] = float32(math.Cos(float64(i))) / 4
	}
	for i := range feeds["idx"].I64 {
		feeds["idx"].I64[i] = int64(i*7%(7*67)) - 100
	}
	run := func(procs int) map[string]*graph.Tensor {
		old := runtime.GOMAXPROCS(procs)
		defer runtime.GOMAXPROCS(old)
		out, err := compile(t, gr, backend.Options{PoisonOutputs: true}).Run(feeds)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	serial, par := run(1), run(5)
	for name, a := range serial {
		bb := par[name]
		for i := range a.F32 {
			if math.Float32bits(a.F32[i]) != math.Float32bits(bb.F32[i]) {
				t.Fatalf("%s[%d]: serial %v, parallel %v", name, i, a.F32[i], bb.F32[i])
			}
		}
	}
}
