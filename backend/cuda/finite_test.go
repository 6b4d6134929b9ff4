package cuda

import (
	"errors"
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// With CheckFinite, the CUDA executor names the node the CPU backend names:
// the first to make a non-finite value from inputs without one (here the
// Sqrt of a negative number, not the ops after it that pass the NaN on, nor
// the Add that reads an infinity the graph was given), in float32 and with
// bf16 storage; with finite data the checked run gives the plain run's
// outputs.
func TestCheckFiniteNamesTheCPUsNode(t *testing.T) {
	for _, compute := range []graph.DType{graph.Float32, graph.BFloat16} {
		t.Run(compute.String(), func(t *testing.T) {
			be := newTestBackend(t, Options{Compute: compute})
			defer be.Close()
			b := graph.NewBuilder("nan")
			x := b.Input("x", graph.Float32, 4)
			mask := b.Input("mask", graph.Float32, 4)
			w := b.Param("w", graph.Float32, graph.Shape{4}, graph.Literal(1, 2, 3, 4))
			masked := b.Add(x, mask)
			root := b.Sqrt(b.Neg(b.Mul(w, x)))
			b.Output(b.Add(b.Mul(root, w), masked))
			g, err := b.Build()
			if err != nil {
				t.Fatal(err)
			}
			feeds := map[string]*graph.Tensor{"x": graph.NewTensor(graph.Float32, graph.Shape{4}), "mask": graph.NewTensor(graph.Float32, graph.Shape{4})}
			for i, v := range []float64{-1, -2, 3, -4} {
				feeds["x"].Set(i, v)
			}
			feeds["mask"].Set(1, math.Inf(-1))

			var want *backend.NonFiniteError
			if _, err := compileOn(t, cpu.New(), g, backend.Options{CheckFinite: true}).Run(feeds); !errors.As(err, &want) {
				t.Fatalf("CPU: %v, want a NonFiniteError", err)
			}
			_, err = compileOn(t, be, g, backend.Options{CheckFinite: true}).Run(feeds)
			var got *backend.NonFiniteError
			if !errors.As(err, &got) {
				t.Fatalf("CUDA: %v, want a NonFiniteError", err)
			}
			if got.Node != want.Node || got.Op != "Sqrt" || got.Out != want.Out {
				t.Errorf("CUDA named %s (%s) with %+v; the CPU %s (%s) with %+v", got.Node, got.Op, got.Out, want.Node, want.Op, want.Out)
			}

			feeds["x"].Set(2, -3)
			plain, err := compileOn(t, be, g, backend.Options{}).Run(feeds)
			if err != nil {
				t.Fatal(err)
			}
			checked, err := compileOn(t, be, g, backend.Options{CheckFinite: true}).Run(feeds)
			if err != nil {
				t.Fatalf("finite data, checked: %v", err)
			}
			name := g.Outputs[0].Name
			for i := range 4 {
				if p, c := plain[name].At(i), checked[name].At(i); p != c && !(math.IsInf(p, -1) && math.IsInf(c, -1)) {
					t.Errorf("output[%d]: checked %v, plain %v", i, c, p)
				}
			}
		})
	}
}
