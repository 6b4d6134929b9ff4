package cuda

// GPU tests of the executor as a whole: training matches the CPU backend,
// device memory stays flat over many runs, kernel-detected errors name their
// node. Without a GPU they skip with the reason Available gives.

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

// TestNewBackendWithoutGPU: where there is no GPU, NewBackend fails with
// Available's reason instead of panicking.
func TestNewBackendWithoutGPU(t *testing.T) {
	if Available() == nil {
		t.Skip("a GPU is present")
	}
	b, err := NewBackend(Options{})
	if err == nil || b != nil {
		t.Fatalf("NewBackend without a GPU: %v, %v", b, err)
	}
	if err.Error() != Available().Error() {
		t.Errorf("NewBackend says %q, Available %q", err, Available())
	}
	if _, err := NewBackend(Options{Compute: graph.Float16}); err == nil {
		t.Error("float16 compute accepted")
	}
}

// tinyTraining builds the tiny model's training step, fused or not.
func tinyTraining(t *testing.T, fuse bool) (*autodiff.TrainStep, model.Config) {
	t.Helper()
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fuse {
		if g, err = passes.Default(true).Run(g, &passes.Log{}); err != nil {
			t.Fatal(err)
		}
		if g.CountOps()["FlashAttention"] == 0 {
			t.Fatal("the fusion pipeline left no FlashAttention")
		}
	}
	ts, err := autodiff.TrainingGraph(g, autodiff.TrainOptions{WeightDecay: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	return ts, cfg
}

// stepFeeds is step k's batch: random bytes, the same for every backend.
func stepFeeds(ts *autodiff.TrainStep, cfg model.Config, k int, lr float64) map[string]*graph.Tensor {
	rng := rand.New(rand.NewPCG(uint64(k), 11))
	feeds := map[string]*graph.Tensor{}
	for _, name := range []string{"tokens", "targets"} {
		x := graph.NewTensor(graph.Int64, graph.Shape{cfg.Batch, cfg.Seq})
		for i := range x.I64 {
			x.I64[i] = rng.Int64N(int64(cfg.Vocab))
		}
		feeds[name] = x
	}
	for name, v := range map[string]float64{ts.LR: lr, ts.Step: float64(k)} {
		x := graph.NewTensor(graph.Float32, graph.Shape{})
		x.F32[0] = float32(v)
		feeds[name] = x
	}
	return feeds
}

func compileOn(t *testing.T, be backend.Backend, g *graph.Graph, opts backend.Options) backend.Executable {
	t.Helper()
	exe, err := be.Compile(g, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exe.Close() })
	return exe
}

// TestExecTrainingMatchesCPU: 20 AdamW steps of the tiny model in float32 on
// the GPU and on the CPU reference, unfused (cuBLAS + row kernels), fused
// (FlashAttention kernels) and fused with the step's elementwise chains fused
// too (FusedElementwise kernels, values recomputed in the backward, as train
// builds the step for CUDA): every step's loss and the final weights agree to
// 1e-4 relative.
func TestExecTrainingMatchesCPU(t *testing.T) {
	be := newTestBackend(t, Options{})
	defer be.Close()
	for _, variant := range []string{"unfused", "fused", "fused+elementwise"} {
		fuse := variant != "unfused"
		name := variant
		t.Run(name, func(t *testing.T) {
			ts, cfg := tinyTraining(t, fuse)
			if variant == "fused+elementwise" {
				g, err := (passes.FuseElementwise{}).Run(ts.Graph, nil)
				if err != nil {
					t.Fatal(err)
				}
				if g.CountOps()["FusedElementwise"] == 0 {
					t.Fatal("fuse_elementwise left no FusedElementwise node")
				}
				ts.Graph = g
			}
			opts := backend.Options{Updates: ts.Updates}
			ref := compileOn(t, cpu.New(), ts.Graph, opts)
			gpu := compileOn(t, be, ts.Graph, opts)
			var worst float64
			start := time.Now()
			var gpuTime time.Duration
			for k := 1; k <= 20; k++ {
				feeds := stepFeeds(ts, cfg, k, 3e-3)
				want, err := ref.Run(feeds)
				if err != nil {
					t.Fatal(err)
				}
				t0 := time.Now()
				got, err := gpu.Run(feeds)
				gpuTime += time.Since(t0)
				if err != nil {
					t.Fatal(err)
				}
				l, r := got[ts.Loss].At(0), want[ts.Loss].At(0)
				worst = math.Max(worst, math.Abs(l-r)/math.Abs(r))
				if math.Abs(l-r) > 1e-4*math.Abs(r) {
					t.Errorf("step %d: loss %.7f on the GPU, %.7f on the CPU", k, l, r)
				}
				if k == 1 || k == 20 {
					t.Logf("step %d: loss GPU %.7f CPU %.7f", k, l, r)
				}
			}
			// Params are compared in relative L2 norm. An elementwise bound
			// is ill-posed after AdamW: where a gradient is near eps the update
			// g/(|g|+eps)·lr turns a 1e-7 relative difference in g into a
			// visible one. The CPU's own float32 run differs from its float64
			// run by up to 2e-4 of the max in single tok_emb elements, but by
			// ~1.5e-5 in L2 norm.
			var worstP, worstElem float64
			for _, p := range ts.Params {
				g, err := gpu.Initializer(p)
				if err != nil {
					t.Fatal(err)
				}
				c, err := ref.Initializer(p)
				if err != nil {
					t.Fatal(err)
				}
				var d2, r2, maxDiff, maxRef float64
				for i := range c.Len() {
					d := g.At(i) - c.At(i)
					d2 += d * d
					r2 += c.At(i) * c.At(i)
					maxDiff = math.Max(maxDiff, math.Abs(d))
					maxRef = math.Max(maxRef, math.Abs(c.At(i)))
				}
				rel := math.Sqrt(d2 / r2)
				worstP = math.Max(worstP, rel)
				worstElem = math.Max(worstElem, maxDiff/maxRef)
				if rel > 1e-4 {
					t.Errorf("%s after 20 steps: |GPU − CPU| / |CPU| = %.3g in L2 norm", p, rel)
				}
			}
			t.Logf("20 steps (%v total, GPU %v): worst loss rel diff %.2g; params: worst L2 rel diff %.2g, worst element diff %.2g of the max",
				time.Since(start).Round(time.Millisecond), gpuTime.Round(time.Millisecond), worst, worstP, worstElem)
			st := gpu.Stats()
			p, err := PlanMemoryWith(ts.Graph, PlanOptions{Updates: ts.Updates})
			if err != nil {
				t.Fatal(err)
			}
			if st.PeakActivationBytes != p.PeakBytes {
				t.Errorf("Stats.PeakActivationBytes %d, plan says %d", st.PeakActivationBytes, p.PeakBytes)
			}
			t.Logf("activation arena %s, initializers %s", FormatBytes(st.PeakActivationBytes), FormatBytes(st.InitializerBytes))
		})
	}
}

// TestExecBF16Training: mixed precision trains the tiny model like float32:
// every step's loss within 1% of the CPU's float32 loss, and the loss on a
// repeated batch goes down.
func TestExecBF16Training(t *testing.T) {
	be := newTestBackend(t, Options{Compute: graph.BFloat16})
	defer be.Close()
	for _, fuse := range []bool{false, true} {
		ts, cfg := tinyTraining(t, fuse)
		opts := backend.Options{Updates: ts.Updates}
		ref := compileOn(t, cpu.New(), ts.Graph, opts)
		gpu := compileOn(t, be, ts.Graph, opts)
		var worst float64
		for k := 1; k <= 20; k++ {
			feeds := stepFeeds(ts, cfg, k, 3e-3)
			want, err := ref.Run(feeds)
			if err != nil {
				t.Fatal(err)
			}
			got, err := gpu.Run(feeds)
			if err != nil {
				t.Fatal(err)
			}
			l, r := got[ts.Loss].At(0), want[ts.Loss].At(0)
			worst = math.Max(worst, math.Abs(l-r)/r)
			if math.Abs(l-r) > 1e-2*r {
				t.Errorf("fuse=%v step %d: bf16 loss %.5f, float32 CPU %.5f", fuse, k, l, r)
			}
		}
		var losses []float64
		for k := 21; k <= 30; k++ {
			feeds := stepFeeds(ts, cfg, 1, 1e-2) // one batch, again and again
			feeds[ts.Step].F32[0] = float32(k)
			out, err := gpu.Run(feeds)
			if err != nil {
				t.Fatal(err)
			}
			losses = append(losses, out[ts.Loss].At(0))
		}
		if !(losses[9] < losses[0]-0.05) {
			t.Errorf("fuse=%v: bf16 loss on a repeated batch did not go down: %v", fuse, losses)
		}
		st := gpu.Stats()
		t.Logf("fuse=%v: worst loss rel diff vs float32 CPU %.2g; repeated batch %.4f → %.4f; arena %s", fuse, worst,
			losses[0], losses[9], FormatBytes(st.PeakActivationBytes))
	}
}

// TestExecMemoryFlat: a run allocates nothing on the device, so free memory
// is the same after 1000 runs of a small graph and 1000 training steps; a
// closed executable gives all its memory back.
func TestExecMemoryFlat(t *testing.T) {
	be := newTestBackend(t, Options{})
	defer be.Close()
	d := be.Device()
	free := func() uint64 {
		if err := d.Synchronize(); err != nil {
			t.Fatal(err)
		}
		f, _, err := d.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}

	b := graph.NewBuilder("small")
	x := b.Input("x", graph.Float32, 16, 32)
	w := b.Param("w", graph.Float32, graph.Shape{32, 8}, graph.Normal(0.1, 1))
	y := b.Softmax(b.MatMul(b.Op("Tanh", nil, x), w), -1)
	b.Output(b.ReduceSum(y, false, 0))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	feeds := map[string]*graph.Tensor{"x": graph.NewTensor(graph.Float32, graph.Shape{16, 32})}
	base := free()
	exe, err := be.Compile(g, backend.Options{PoisonOutputs: true})
	if err != nil {
		t.Fatal(err)
	}
	// Warm-up: the first run lets cuBLAS make its workspace, the second
	// captures the CUDA graph that later runs replay (instantiating it may
	// take device memory: 2 MiB in one H200 run, when that fell inside the
	// measured loop).
	for range 2 {
		if _, err := exe.Run(feeds); err != nil {
			t.Fatal(err)
		}
	}
	before := free()
	for range 1000 {
		if _, err := exe.Run(feeds); err != nil {
			t.Fatal(err)
		}
	}
	if after := free(); after != before {
		t.Errorf("free device memory %d before 1000 runs, %d after", before, after)
	}
	if err := exe.Close(); err != nil {
		t.Fatal(err)
	}
	closed := free()
	for range 20 {
		exe, err := be.Compile(g, backend.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := exe.Run(feeds); err != nil {
			t.Fatal(err)
		}
		if err := exe.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The driver may keep a partly used 2 MiB page of small allocations.
	if after := free(); after+(2<<20) < closed {
		t.Errorf("free device memory %d after closing one executable, %d after 20 more compile/run/close cycles", closed, after)
	}
	t.Logf("free device memory: %d MiB at the start, %d MiB warm, %d MiB after the cycles", base>>20, before>>20, closed>>20)

	ts, cfg := tinyTraining(t, true)
	train := compileOn(t, be, ts.Graph, backend.Options{Updates: ts.Updates})
	feedsT := stepFeeds(ts, cfg, 1, 1e-3)
	for k := 1; k <= 2; k++ { // warm-up and graph capture, as above
		feedsT[ts.Step].F32[0] = float32(k)
		if _, err := train.Run(feedsT); err != nil {
			t.Fatal(err)
		}
	}
	before = free()
	start := time.Now()
	for k := 3; k <= 1002; k++ {
		feedsT[ts.Step].F32[0] = float32(k)
		if _, err := train.Run(feedsT); err != nil {
			t.Fatal(err)
		}
	}
	el := time.Since(start)
	if after := free(); after != before {
		t.Errorf("free device memory %d before 1000 training steps, %d after", before, after)
	}
	t.Logf("1000 fused tiny training steps in %v (%v/step), device memory flat", el.Round(time.Millisecond), (el / 1000).Round(time.Microsecond))
}

// TestExecKernelErrors: bad indices, labels and steps found by kernels come
// back as errors naming the node; the executable keeps working after.
func TestExecKernelErrors(t *testing.T) {
	be := newTestBackend(t, Options{})
	defer be.Close()
	b := graph.NewBuilder("errs")
	data := b.Input("data", graph.Float32, 5, 3)
	idx := b.Input("idx", graph.Int64, 4)
	b.Output(b.Rename(b.Gather(data, idx, 0), "gathered"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	exe := compileOn(t, be, g, backend.Options{})
	feeds := map[string]*graph.Tensor{"data": graph.NewTensor(graph.Float32, graph.Shape{5, 3}), "idx": graph.NewTensor(graph.Int64, graph.Shape{4})}
	for i := range feeds["data"].F32 {
		feeds["data"].F32[i] = float32(i)
	}
	feeds["idx"].I64[2] = 5
	if _, err := exe.Run(feeds); err == nil || !strings.Contains(err.Error(), "Gather") || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("index 5 of 5 rows: %v", err)
	}
	feeds["idx"].I64[2] = -5 // the first row, counted from the end
	out, err := exe.Run(feeds)
	if err != nil {
		t.Fatalf("valid indices after a bad run: %v", err)
	}
	if got := out["gathered"].F32[6:9]; got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Errorf("row of index -5: %v", got)
	}

	b = graph.NewBuilder("adam")
	p := b.Param("p", graph.Float32, graph.Shape{3}, graph.Ones())
	gr := b.Input("g", graph.Float32, 3)
	lr := b.Input("lr", graph.Float32)
	step := b.Input("step", graph.Float32)
	b.Output(b.OpN("AdamW", nil, p, gr, p, p, lr, step)...)
	g, err = b.Build()
	if err != nil {
		t.Fatal(err)
	}
	exe = compileOn(t, be, g, backend.Options{})
	af := map[string]*graph.Tensor{"g": graph.NewTensor(graph.Float32, graph.Shape{3}),
		"lr": graph.NewTensor(graph.Float32, graph.Shape{}), "step": graph.NewTensor(graph.Float32, graph.Shape{})}
	if _, err := exe.Run(af); err == nil || !strings.Contains(err.Error(), "step must be >= 1") {
		t.Errorf("AdamW at step 0: %v", err)
	}
	if err := exe.SetInitializer("p", graph.NewTensor(graph.Float64, graph.Shape{3})); err == nil {
		t.Error("SetInitializer with the wrong dtype succeeded")
	}
	if _, err := exe.Initializer("nope"); err == nil {
		t.Error("Initializer of an unknown name succeeded")
	}

	// Broadcasting that cannot be merged below rank 7: float and integer
	// work alike go through generated code, which indexes any rank.
	for _, dt := range []graph.DType{graph.Float32, graph.Int64} {
		b = graph.NewBuilder("rank7")
		a7 := b.Input("a", dt, 2, 1, 2, 1, 2, 1, 2)
		b7 := b.Input("b", dt, 1, 2, 1, 2, 1, 2, 1)
		b.Output(b.Add(a7, b7))
		g, err = b.Build()
		if err != nil {
			t.Fatal(err)
		}
		exe, err := be.Compile(g, backend.Options{})
		if err != nil {
			t.Fatalf("rank-7 %v broadcast: %v", dt, err)
		}
		ta, tb := graph.NewTensor(dt, graph.Shape{2, 1, 2, 1, 2, 1, 2}), graph.NewTensor(dt, graph.Shape{1, 2, 1, 2, 1, 2, 1})
		for i := range ta.Len() {
			ta.Set(i, float64(i))
		}
		for i := range tb.Len() {
			tb.Set(i, float64(100*i))
		}
		out, err := exe.Run(map[string]*graph.Tensor{"a": ta, "b": tb})
		exe.Close()
		if err != nil {
			t.Fatal(err)
		}
		got := out[g.Outputs[0].Name]
		// Output index (i0..i6) over [2,2,2,2,2,2,2]: a reads the even axes,
		// b the odd ones.
		for i := range got.Len() {
			var ia, ib, mul int
			for k, rem := 6, i; k >= 0; k-- {
				bit := rem % 2
				rem /= 2
				if k%2 == 0 {
					ia += bit << (mul / 2)
				} else {
					ib += bit << (mul / 2)
				}
				mul++
			}
			if want := float64(ia) + float64(100*ib); got.At(i) != want {
				t.Fatalf("rank-7 %v broadcast: element %d = %v, want %v", dt, i, got.At(i), want)
			}
		}
	}
}

// TestExecUpdatesInPlace: the tiny training step with its AdamW outputs
// written over the weights gives the bits of the step that copies them
// after the run, step after step (plain, captured and replayed runs), and a
// run that fails (a token out of range, found by the forward's Gather)
// leaves every weight and moment as it was.
func TestExecUpdatesInPlace(t *testing.T) {
	for _, compute := range []graph.DType{graph.Float32, graph.BFloat16} {
		t.Run(compute.String(), func(t *testing.T) {
			be := newTestBackend(t, Options{Compute: compute})
			defer be.Close()
			ts, cfg := tinyTraining(t, true)
			opts := backend.Options{Updates: ts.Updates}
			t.Setenv("FLASHGRAPH_CUDA_INPLACE_UPDATES", "0")
			copied := compileOn(t, be, ts.Graph, opts)
			t.Setenv("FLASHGRAPH_CUDA_INPLACE_UPDATES", "1")
			inPlace := compileOn(t, be, ts.Graph, opts)
			if n := inPlace.(*executable).plan.InPlace; n != len(ts.Updates) {
				t.Fatalf("%d of %d updates in place", n, len(ts.Updates))
			}
			if n := copied.(*executable).plan.InPlace; n != 0 {
				t.Fatalf("FLASHGRAPH_CUDA_INPLACE_UPDATES=0: %d updates in place", n)
			}
			state := func(exe backend.Executable) map[string]*graph.Tensor {
				st := map[string]*graph.Tensor{}
				for _, target := range ts.Updates {
					v, err := exe.Initializer(target)
					if err != nil {
						t.Fatal(err)
					}
					st[target] = v
				}
				return st
			}
			for k := 1; k <= 4; k++ {
				feeds := stepFeeds(ts, cfg, k, 3e-3)
				a, err := inPlace.Run(feeds)
				if err != nil {
					t.Fatal(err)
				}
				b, err := copied.Run(feeds)
				if err != nil {
					t.Fatal(err)
				}
				if a[ts.Loss].At(0) != b[ts.Loss].At(0) {
					t.Errorf("step %d: loss %v in place, %v copied", k, a[ts.Loss].At(0), b[ts.Loss].At(0))
				}
				want := state(copied)
				for name, got := range state(inPlace) {
					if !sameData(got, want[name]) {
						t.Fatalf("step %d: %s differs between in-place and copied updates", k, name)
					}
				}
			}
			before := state(inPlace)
			bad := stepFeeds(ts, cfg, 5, 3e-3)
			bad["tokens"].I64[3] = int64(cfg.Vocab)
			for k := range 2 {
				if _, err := inPlace.Run(bad); err == nil || !strings.Contains(err.Error(), "out of range") {
					t.Fatalf("bad run %d: %v; want the Gather's out-of-range error", k, err)
				}
			}
			after := state(inPlace)
			for name, was := range before {
				if !sameData(after[name], was) {
					t.Errorf("%s changed in a run that failed", name)
				}
			}
		})
	}
}

// gqaTraining builds the fused training step of a model with grouped-query
// attention on the tensor-core kernels' head dim (64): 4 query heads on kv
// K/V heads.
func gqaTraining(t *testing.T, kv int) (*autodiff.TrainStep, model.Config) {
	t.Helper()
	cfg := model.Config{Name: "gqa", Vocab: 256, Dim: 128, Layers: 2, Heads: 4, KVHeads: kv, HeadDim: 64, FFN: 256, Seq: 128, Batch: 2}
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if g, err = passes.Default(true).Run(g, &passes.Log{}); err != nil {
		t.Fatal(err)
	}
	if g.CountOps()["FlashAttention"] != cfg.Layers {
		t.Fatalf("the fusion pipeline left %d FlashAttention nodes, want %d", g.CountOps()["FlashAttention"], cfg.Layers)
	}
	ts, err := autodiff.TrainingGraph(g, autodiff.TrainOptions{WeightDecay: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	return ts, cfg
}

// TestExecGQABF16Training: gqaTraining's models (1 and 2 K/V heads) train
// in mixed precision like the float32 CPU reference (every step's loss
// within 1%), with the fused backward run as multi-head attention on
// repeated K/V (what the rule picks for so small a grid;
// TestPlanGQATrainingWorkspace checks the plan holds it) and, with
// FLASHGRAPH_FLASH_GQA_BWD=grouped, on the grouped kernels; the two runs'
// losses agree within 1e-3 relative.
func TestExecGQABF16Training(t *testing.T) {
	be := newTestBackend(t, Options{Compute: graph.BFloat16})
	defer be.Close()
	for _, kv := range []int{1, 2} {
		ts, cfg := gqaTraining(t, kv)
		opts := backend.Options{Updates: ts.Updates}
		ref := compileOn(t, cpu.New(), ts.Graph, opts)
		var want []float64
		for k := 1; k <= 10; k++ {
			out, err := ref.Run(stepFeeds(ts, cfg, k, 3e-3))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, out[ts.Loss].At(0))
		}
		losses := map[string][]float64{}
		for _, env := range []string{"", "grouped"} {
			t.Setenv(FlashGQABwdEnv, env)
			gpu := compileOn(t, be, ts.Graph, opts)
			for k := 1; k <= 10; k++ {
				out, err := gpu.Run(stepFeeds(ts, cfg, k, 3e-3))
				if err != nil {
					t.Fatal(err)
				}
				l, r := out[ts.Loss].At(0), want[k-1]
				losses[env] = append(losses[env], l)
				if math.Abs(l-r) > 1e-2*r {
					t.Errorf("H_kv %d %s=%q step %d: bf16 loss %.5f, float32 CPU %.5f", kv, FlashGQABwdEnv, env, k, l, r)
				}
			}
		}
		for k := range losses[""] {
			if a, b := losses[""][k], losses["grouped"][k]; math.Abs(a-b) > 1e-3*math.Abs(b) {
				t.Errorf("H_kv %d step %d: loss %.6f with the repeat, %.6f with the grouped kernels", kv, k+1, a, b)
			}
		}
		t.Logf("H_kv %d: losses (repeat) %.5f → %.5f, grouped %.5f → %.5f, CPU %.5f → %.5f", kv,
			losses[""][0], losses[""][9], losses["grouped"][0], losses["grouped"][9], want[0], want[9])
	}
}
