package autodiff

import (
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// handAdamW is AdamW written out here, in PyTorch's form
// p ← p·(1 − lr·wd) − lr·m̂/(√v̂ + eps), independently of the backend kernel.
func handAdamW(p, g, m, v []float64, lr, t, b1, b2, eps, wd float64) {
	for i := range p {
		m[i] = b1*m[i] + (1-b1)*g[i]
		v[i] = b2*v[i] + (1-b2)*g[i]*g[i]
		mh := m[i] / (1 - math.Pow(b1, t))
		vh := v[i] / (1 - math.Pow(b2, t))
		p[i] = p[i]*(1-lr*wd) - lr*mh/(math.Sqrt(vh)+eps)
	}
}

func scalarF64(v float64) *graph.Tensor {
	t := graph.NewTensor(graph.Float64, graph.Shape{})
	t.F64[0] = v
	return t
}

// TestTrainingStepMatchesHandAdamW runs two steps of the tiny model's
// training graph on the CPU backend, weights and moments kept inside the
// executable by the Updates map, and checks params and moments against
// AdamW computed here on the gradients of the plain gradient graph.
func TestTrainingStepMatchesHandAdamW(t *testing.T) {
	cfg := tinyConfig(t, graph.Float64)
	g := buildModel(t, cfg)
	const b1, b2, eps, wd = 0.8, 0.9, 1e-7, 0.1
	ts, err := TrainingGraph(g, TrainOptions{Beta1: b1, Beta2: b2, Eps: eps, WeightDecay: wd})
	if err != nil {
		t.Fatal(err)
	}
	train := compile(t, ts.Graph, backend.Options{Updates: ts.Updates})
	gg, grads, err := Gradients(g, "loss", paramNames(g))
	if err != nil {
		t.Fatal(err)
	}
	gexe := compile(t, gg, backend.Options{})

	// Each step starts the hand computation from the executable's own
	// params and moments (read back through Initializer), so that a step is
	// checked on exactly the gradients it used; step 1 checks the moments
	// it wrote, step 2 that they were kept and used.
	type state struct{ p, m, v []float64 }
	read := func(name string) []float64 {
		x, err := train.Initializer(name)
		if err != nil {
			t.Fatal(err)
		}
		return x.F64
	}
	for step, lr := range []float64{1e-2, 3e-3} {
		feeds := tinyFeeds(cfg, uint64(10+step))
		hand := map[string]*state{}
		for _, p := range g.Params {
			s := &state{read(p.Name), read(ts.Moments[p.Name][0]), read(ts.Moments[p.Name][1])}
			hand[p.Name] = s
			x := graph.NewTensor(graph.Float64, p.Type.Shape)
			copy(x.F64, s.p)
			if err := gexe.SetInitializer(p.Name, x); err != nil {
				t.Fatal(err)
			}
		}
		gout := run(t, gexe, feeds)
		tf := map[string]*graph.Tensor{"tokens": feeds["tokens"], "targets": feeds["targets"],
			ts.LR: scalarF64(lr), ts.Step: scalarF64(float64(step + 1))}
		tout := run(t, train, tf)
		if len(tout) != 1 {
			t.Errorf("step %d: Run returned %d outputs, want only the loss", step+1, len(tout))
		}
		if l, want := tout[ts.Loss].At(0), gout["loss"].At(0); l != want {
			t.Errorf("step %d: loss %v, gradient graph says %v", step+1, l, want)
		}
		worst := 0.0
		for _, p := range g.Params {
			s := hand[p.Name]
			w := wd
			if p.Type.Shape.Rank() == 1 {
				w = 0 // norms are not decayed by default
			}
			old := append([]float64(nil), s.p...)
			handAdamW(s.p, gout[grads[p.Name]].F64, s.m, s.v, lr, float64(step+1), b1, b2, eps, w)
			got := map[string][]float64{"p": read(p.Name), "m": read(ts.Moments[p.Name][0]), "v": read(ts.Moments[p.Name][1])}
			for i := range s.p {
				// The kernel writes p − lr·(u + wd·p), this test
				// p·(1 − lr·wd) − lr·u: equal up to a few roundings of p, p'
				// and the update.
				dp := math.Abs(got["p"][i] - s.p[i])
				if dp > 4e-16*(math.Abs(old[i])+math.Abs(s.p[i])+math.Abs(s.p[i]-old[i])) || math.Abs(got["m"][i]-s.m[i]) > 1e-15*math.Abs(s.m[i]) ||
					math.Abs(got["v"][i]-s.v[i]) > 1e-15*math.Abs(s.v[i]) {
					t.Fatalf("step %d, %s[%d]: got p %v m %v v %v, want %v %v %v", step+1, p.Name, i,
						got["p"][i], got["m"][i], got["v"][i], s.p[i], s.m[i], s.v[i])
				}
				if move := math.Abs(s.p[i] - old[i]); move > 0 {
					worst = math.Max(worst, dp/move)
				}
			}
		}
		t.Logf("step %d (lr %g): loss %.6f; params differ from hand AdamW by at most %.2g of their update", step+1, lr, tout[ts.Loss].At(0), worst)
	}
	// Param sanity: training moved the loss down on a repeated batch.
	feeds := tinyFeeds(cfg, 99)
	tf := map[string]*graph.Tensor{"tokens": feeds["tokens"], "targets": feeds["targets"], ts.LR: scalarF64(1e-2)}
	var losses []float64
	for step := 3; step <= 6; step++ {
		tf[ts.Step] = scalarF64(float64(step))
		losses = append(losses, run(t, train, tf)[ts.Loss].At(0))
	}
	if !(losses[3] < losses[0]) {
		t.Errorf("loss on a repeated batch did not go down: %v", losses)
	}
}

// TestTrainingStepFloat32: the default model (float32), unfused and fused,
// trains on the CPU backend: float32 lr and step inputs, a finite loss that
// goes down on a repeated batch.
func TestTrainingStepFloat32(t *testing.T) {
	cfg := tinyConfig(t, graph.Float32)
	for _, fused := range []bool{false, true} {
		g := buildModel(t, cfg)
		if fused {
			g = fuse(t, g)
		}
		ts, err := TrainingGraph(g, TrainOptions{WeightDecay: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		exe := compile(t, ts.Graph, backend.Options{Updates: ts.Updates})
		feeds := tinyFeeds(cfg, 7)
		var losses []float64
		for step := 1; step <= 5; step++ {
			lr, st := graph.NewTensor(graph.Float32, graph.Shape{}), graph.NewTensor(graph.Float32, graph.Shape{})
			lr.F32[0], st.F32[0] = 3e-3, float32(step)
			out := run(t, exe, map[string]*graph.Tensor{"tokens": feeds["tokens"], "targets": feeds["targets"], ts.LR: lr, ts.Step: st})
			losses = append(losses, out[ts.Loss].At(0))
		}
		for _, l := range losses {
			if math.IsNaN(l) || math.IsInf(l, 0) {
				t.Fatalf("fused=%v: losses %v", fused, losses)
			}
		}
		if !(losses[4] < losses[0]-0.1) {
			t.Errorf("fused=%v: float32 training did not reduce the loss on a repeated batch: %v", fused, losses)
		}
		t.Logf("fused=%v: float32 losses over 5 steps on one batch: %.4f", fused, losses)
	}
}
