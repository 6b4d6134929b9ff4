package cpu

import (
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
	exe, err := New().Compile(g, backend.Options{})
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
		want := roundF32(-(roundF32(roundF32(roundF32(xv*roundF32(sigmoid(xv)))*wv)*rv) + xv))
		if yv.At(i) != want {
			t.Fatalf("element %d = %v, want %v", i, yv.At(i), want)
		}
	}
}

func roundF32(v float64) float64 { return float64(float32(v)) }
