package cuda

import (
	"errors"
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/backendtest"
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
			g, _, err := backendtest.NonFiniteGraph()
			if err != nil {
				t.Fatal(err)
			}
			feeds := backendtest.NonFiniteFeeds()

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
