package cpu

import (
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// ramp is a [rows, cols] float32 tensor of small distinct values.
func ramp(dt graph.DType, rows, cols int) *graph.Tensor {
	x := graph.NewTensor(dt, graph.Shape{rows, cols})
	for i := range x.F32 {
		x.F32[i] = float32(i%7)/8 - 0.25
	}
	return x
}

// sameData reports whether two float32 tensors share their backing array.
func sameData(a, b *graph.Tensor) bool {
	return len(a.F32) > 0 && len(b.F32) > 0 && &a.F32[0] == &b.F32[0]
}

// A Reshape is a view of its input: no copy, no bytes of its own in the
// plan, and its input's buffer lives until the view's last reader. Neg(x)
// would take Exp(x)'s buffer (same class) were it released at the Reshape.
func TestViewKeepsItsBufferLive(t *testing.T) {
	b := graph.NewBuilder("view")
	x := b.Input("x", graph.Float32, 4, 8)
	e := b.Op("Exp", nil, x)
	r := b.Reshape(e, 8, 4)
	m := b.Neg(x)
	y := b.Add(b.Reshape(r, 4, 8), m)
	b.Output(y)
	exe := compile(t, mustBuild(t, b), backend.Options{PoisonOutputs: true})
	ex := exe.(*executable)
	views := 0
	for _, st := range ex.steps {
		if st.view {
			views++
		}
	}
	if views != 2 {
		t.Errorf("%d view steps, want 2 (the Reshapes)", views)
	}
	one := int64(4 * 8 * 4)
	// Exp's buffer (viewed by both Reshapes), Neg's, and Add's.
	if got := exe.Stats().PeakActivationBytes; got != 3*one {
		t.Errorf("planned peak %d, want %d: views hold no bytes", got, 3*one)
	}
	in := ramp(graph.Float32, 4, 8)
	for run := range 2 {
		out, err := exe.Run(map[string]*graph.Tensor{"x": in})
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range out[y.Name].F32 {
			xi := in.F32[i]
			if want := float32(math.Exp(float64(xi))) + -xi; v != want {
				t.Fatalf("run %d: y[%d] = %v, want %v", run, i, v, want)
			}
		}
		if ex.runPeak != 3*one || ex.runHeld > ex.hostPeak {
			t.Errorf("run %d: measured peak %d (planned %d), held %d (bound %d)", run, ex.runPeak, 3*one, ex.runHeld, ex.hostPeak)
		}
	}
}

// Whatever shares a buffer inside a run, the tensors Run returns and the
// initializers it updates share data with nothing: not with each other, a
// feed, an initializer, or a later run's buffers.
func TestViewsNeverAliasWhatRunHandsOut(t *testing.T) {
	b := graph.NewBuilder("aliases")
	w := b.Param("w", graph.Float32, graph.Shape{2, 3}, graph.Literal(1, 2, 3, 4, 5, 6))
	x := b.Input("x", graph.Float32, 2, 3)
	a := b.Add(w, x)
	ra := b.Reshape(a, 6)     // returned view of a returned value
	nw := b.Reshape(ra, 2, 3) // the update: a view of a view of a
	rw := b.Reshape(w, 3, 2)  // a view of the param
	ix := b.Op("Identity", nil, x)
	b.Output(a, ra, nw, rw, ix)
	exe := compile(t, mustBuild(t, b), backend.Options{Updates: map[string]string{nw.Name: "w"}, PoisonOutputs: true})
	feed := graph.NewTensor(graph.Float32, graph.Shape{2, 3})
	for i := range feed.F32 {
		feed.F32[i] = 10
	}
	ex := exe.(*executable)
	out, err := exe.Run(map[string]*graph.Tensor{"x": feed})
	if err != nil {
		t.Fatal(err)
	}
	got := []*graph.Tensor{out[a.Name], out[ra.Name], out[rw.Name], out[ix.Name], ex.inits[ex.initByName["w"]], feed}
	for i := range got {
		for j := range i {
			if sameData(got[i], got[j]) {
				t.Errorf("tensors %d and %d share data", j, i)
			}
		}
	}
	for i, want := range []float32{11, 12, 13, 14, 15, 16} {
		if out[a.Name].F32[i] != want || out[ra.Name].F32[i] != want || out[rw.Name].F32[i] != float32(i+1) || out[ix.Name].F32[i] != 10 {
			t.Fatalf("element %d: a %v, ra %v, rw %v, ix %v", i, out[a.Name].F32, out[ra.Name].F32, out[rw.Name].F32, out[ix.Name].F32)
		}
	}
	// Scribbling over what was returned changes neither w nor the next run.
	for _, o := range out {
		for i := range o.F32 {
			o.F32[i] = -1
		}
	}
	out2, err := exe.Run(map[string]*graph.Tensor{"x": feed})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float32{21, 22, 23, 24, 25, 26} {
		if out2[a.Name].F32[i] != want || out2[rw.Name].F32[i] != want-10 {
			t.Fatalf("second run, element %d: a %v, rw %v", i, out2[a.Name].F32, out2[rw.Name].F32)
		}
	}
}

// A bfloat16 feed's float32 values need not be rounded; Identity of it gives
// the rounded values, so it stays a copy (the executor rounds outputs).
func TestNarrowFeedIsNotViewed(t *testing.T) {
	b := graph.NewBuilder("narrow")
	x := b.Input("x", graph.BFloat16, 1, 2)
	y := b.Op("Identity", nil, x)
	z := b.Reshape(b.Neg(x), 2) // a step's output is rounded: a view is exact
	b.Output(y, z)
	exe := compile(t, mustBuild(t, b), backend.Options{PoisonOutputs: true})
	var views []string
	for _, st := range exe.(*executable).steps {
		if st.view {
			views = append(views, st.node.Op)
		}
	}
	if len(views) != 1 || views[0] != "Reshape" {
		t.Errorf("views %v, want the Reshape alone", views)
	}
	in := graph.NewTensor(graph.BFloat16, graph.Shape{1, 2})
	in.F32[0], in.F32[1] = 1+1.0/1024, -3
	out, err := exe.Run(map[string]*graph.Tensor{"x": in})
	if err != nil {
		t.Fatal(err)
	}
	if got := out[y.Name].F32; got[0] != 1 || got[1] != -3 {
		t.Errorf("Identity of a bfloat16 feed = %v, want [1 -3] (rounded)", got)
	}
	if got := out[z.Name].F32; got[0] != -1 || got[1] != 3 {
		t.Errorf("Reshape(Neg) = %v, want [-1 3]", got)
	}
}

// A chain of same-shaped ops runs in two buffers, reused in turn, and never
// holds more than the plan's peak.
func TestPoolReusesReleasedBuffers(t *testing.T) {
	b := graph.NewBuilder("chain")
	x := b.Input("x", graph.Float32, 16, 16)
	v := x
	for i := range 8 {
		if i%2 == 0 {
			v = b.Op("Exp", nil, v)
		} else {
			v = b.Neg(v)
		}
	}
	b.Output(v)
	exe := compile(t, mustBuild(t, b), backend.Options{PoisonOutputs: true})
	ex := exe.(*executable)
	in := ramp(graph.Float32, 16, 16)
	want, err := exe.Run(map[string]*graph.Tensor{"x": in})
	if err != nil {
		t.Fatal(err)
	}
	one := int64(16 * 16 * 4)
	if ex.hostPeak != 2*one || ex.runHeld != 2*one {
		t.Errorf("held %d bytes at most, plan's bound %d; want both %d", ex.runHeld, ex.hostPeak, 2*one)
	}
	// The same result from fresh zeroed buffers (the plain allocator).
	v2 := in
	for i := range 8 {
		y := graph.NewTensor(graph.Float32, graph.Shape{16, 16})
		op := "Exp"
		if i%2 != 0 {
			op = "Neg"
		}
		if err := kernels[op](&graph.Node{Op: op}, []*graph.Tensor{v2}, []*graph.Tensor{y}); err != nil {
			t.Fatal(err)
		}
		v2 = y
	}
	for i, g := range want[v.Name].F32 {
		if math.Float32bits(g) != math.Float32bits(v2.F32[i]) {
			t.Fatalf("element %d: %v through the pool, %v without", i, g, v2.F32[i])
		}
	}
}

// The pool gives a released buffer only to a kernel that overwrites it, of
// the same storage and length; others get zeros. It drops pooled buffers
// rather than hold more than its limit.
func TestBufferPool(t *testing.T) {
	f32 := graph.TensorType{DType: graph.Float32, Shape: graph.Shape{4}}
	bf16 := graph.TensorType{DType: graph.BFloat16, Shape: graph.Shape{2, 2}}
	p := &bufferPool{limit: 40}
	a, err := p.get(f32, true)
	if err != nil {
		t.Fatal(err)
	}
	a.F32[0] = 7
	p.put(a, true)
	z, _ := p.get(f32, false)
	if sameData(z, a) || z.F32[0] != 0 {
		t.Errorf("a kernel that needs zeros got the released buffer %v", z.F32)
	}
	r, _ := p.get(bf16, true)
	if !sameData(r, a) || r.DType != graph.BFloat16 || !r.Shape.Equal(graph.Shape{2, 2}) {
		t.Errorf("released float32[4] not reused as bfloat16[2,2]: %v %v", r.DType, r.Shape)
	}
	if p.held != 32 || len(p.free) != 0 {
		t.Errorf("held %d, %d pooled; want 32, 0", p.held, len(p.free))
	}
	p.put(r, true)
	p.put(z, false) // dropped
	if p.held != 16 || len(p.free) != 1 {
		t.Errorf("held %d, %d pooled; want 16, 1", p.held, len(p.free))
	}
	// 16 pooled + 32 new > 40: the pooled buffer is dropped first.
	if _, err := p.get(graph.TensorType{DType: graph.Float64, Shape: graph.Shape{4}}, true); err != nil {
		t.Fatal(err)
	}
	if p.held != 32 || len(p.free) != 0 || p.peak > p.limit {
		t.Errorf("held %d, %d pooled, peak %d; want 32, 0, at most %d", p.held, len(p.free), p.peak, p.limit)
	}
}

// Every op said to overwrite its outputs is one whose kernel is native, not
// the op table's Eval (which may rely on zeros).
func TestOverwritingOpsHaveNativeKernels(t *testing.T) {
	for _, op := range evalKernelOps {
		if overwrites(op) {
			t.Errorf("%s runs its Eval but is listed as overwriting its outputs", op)
		}
	}
	for op := range overwriting {
		if _, ok := kernels[op]; !ok {
			t.Errorf("%s is listed as overwriting but has no kernel", op)
		}
	}
	for _, op := range []string{"AllReduce", "ReduceScatter", "AllGather", "ScatterND"} {
		if overwrites(op) {
			t.Errorf("%s gets reused buffers; it should get zeros", op)
		}
	}
}
