package autodiff

import (
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// TestClipNormMatchesHandAdamW: with ClipNorm half the gradient's global
// norm, the step outputs that norm and updates as AdamW on the gradients
// scaled by ClipNorm/norm (computed here from the plain gradient graph);
// with a bound above the norm, as AdamW on the gradients themselves.
func TestClipNormMatchesHandAdamW(t *testing.T) {
	cfg := tinyConfig(t, graph.Float64)
	g := buildModel(t, cfg)
	// A large eps makes the update depend on the gradient's scale (AdamW's
	// first step is otherwise nearly scale-invariant), so that the test
	// sees the clipping.
	const b1, b2, eps, lr = 0.8, 0.9, 1e-2, 1e-2
	gg, grads, err := Gradients(g, "loss", paramNames(g))
	if err != nil {
		t.Fatal(err)
	}
	feeds := tinyFeeds(cfg, 5)
	gout := run(t, compile(t, gg, backend.Options{}), feeds)
	var sq float64
	for _, p := range g.Params {
		for _, x := range gout[grads[p.Name]].F64 {
			sq += x * x
		}
	}
	norm := math.Sqrt(sq)
	for _, c := range []float64{norm / 2, 2 * norm} {
		ts, err := TrainingGraph(g, TrainOptions{Beta1: b1, Beta2: b2, Eps: eps, ClipNorm: c})
		if err != nil {
			t.Fatal(err)
		}
		if ts.GradNorm != TrainGradNormOutput {
			t.Fatalf("GradNorm = %q", ts.GradNorm)
		}
		exe := compile(t, ts.Graph, backend.Options{Updates: ts.Updates})
		fresh := compile(t, ts.Graph, backend.Options{Updates: ts.Updates})
		tf := map[string]*graph.Tensor{"tokens": feeds["tokens"], "targets": feeds["targets"], ts.LR: scalarF64(lr), ts.Step: scalarF64(1)}
		out := run(t, exe, tf)
		if got := out[ts.GradNorm].At(0); math.Abs(got-norm) > 1e-12*norm {
			t.Fatalf("clip %g: grad_norm %v, want %v", c, got, norm)
		}
		scale := math.Min(1, c/norm)
		for _, p := range g.Params {
			n := len(gout[grads[p.Name]].F64)
			gs := make([]float64, n)
			for i, x := range gout[grads[p.Name]].F64 {
				gs[i] = x * scale
			}
			w, err := fresh.Initializer(p.Name) // the weights before the step
			if err != nil {
				t.Fatal(err)
			}
			want := append([]float64(nil), w.F64...)
			handAdamW(want, gs, make([]float64, n), make([]float64, n), lr, 1, b1, b2, eps, 0)
			got, err := exe.Initializer(p.Name)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Abs(got.F64[i]-want[i]) > 1e-12*(math.Abs(want[i])+lr) {
					t.Fatalf("clip %g (scale %.3g): %s[%d] = %v, want %v", c, scale, p.Name, i, got.F64[i], want[i])
				}
			}
		}
	}
	if _, err := TrainingGraph(g, TrainOptions{ClipNorm: -1}); err == nil {
		t.Error("a negative clip bound was accepted")
	}
}
