package train

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/graph"
)

// TestTrainFuseQKV: with Hyper.FuseQKV the tiny model (float32, CPU,
// attention and elementwise chains fused) trains 20 steps to losses within
// 1e-6 relative of the unmerged step's; the step has one MatMul per layer
// for q, k and v, still a FlashAttention per layer, the merged product's
// gradient as one Concat (no zero-padded blocks read), and the
// checkpoint holds the same tensors under the same names; the model FLOPs
// (MFU's numerator) are the same; recomputing the merged step changes no bit.
func TestTrainFuseQKV(t *testing.T) {
	const steps = 20
	cfg := testConfig(t, graph.Float32)
	corpus := testCorpus(t)
	var losses [2][]float64
	var names [2][]string
	var zeroReads [2]int // reads of zero-filled consts (RoPE's gradient has some)
	var flops [2]FLOPs
	for k, q := range []bool{false, true} {
		h := testHyper(steps)
		h.FuseQKV = q
		tr, err := NewTrainer(cpu.New(), cfg, true, h, corpus)
		if err != nil {
			t.Fatal(err)
		}
		step := tr.Graphs.Step.Graph
		flops[k] = GraphFLOPs(step)
		if err := graph.Verify(step); err != nil {
			t.Fatal(err)
		}
		if n := tr.Graphs.Forward.CountOps()["FlashAttention"]; n != cfg.Layers {
			t.Errorf("fuse_qkv=%v: %d FlashAttention in the forward, want %d", q, n, cfg.Layers)
		}
		merged := 0
		for _, n := range step.Nodes {
			if n.Op == "MatMul" && len(n.Inputs) == 2 && n.Inputs[1].Producer != nil && n.Inputs[1].Producer.Op == "Concat" && strings.Contains(n.Inputs[1].Name, "/attn/") && !strings.HasPrefix(n.Name, "grad/") {
				merged++
			}
			for _, in := range n.Inputs {
				if in != nil && in.Kind == graph.Const && in.Init != nil && in.Init.Fn == "zeros" {
					zeroReads[k]++
				}
			}
		}
		if want := map[bool]int{false: 0, true: cfg.Layers}[q]; merged != want {
			t.Errorf("fuse_qkv=%v: %d forward MatMuls against concatenated attention weights, want %d", q, merged, want)
		}
		for range steps {
			if _, err := tr.Step(); err != nil {
				t.Fatal(err)
			}
		}
		losses[k] = tr.Losses()
		st, err := tr.State()
		if err != nil {
			t.Fatal(err)
		}
		for n := range st.Tensors {
			names[k] = append(names[k], n)
		}
		slices.Sort(names[k])
		tr.Close()
	}
	// One GEMM of N = 3D does the work of three of N = D: MFU's numerator
	// (train and bench -train) is the same with the pass.
	if flops[0] != flops[1] {
		t.Errorf("step FLOPs %+v, with fuse_qkv %+v", flops[0], flops[1])
	}
	if zeroReads[1] != zeroReads[0] {
		t.Errorf("the step reads zero blocks %d times with fuse_qkv, %d without: the merged product's gradient is still a sum of zero-padded blocks", zeroReads[1], zeroReads[0])
	}
	if !slices.Equal(names[0], names[1]) {
		t.Errorf("checkpoint tensors differ:\n%v\n%v", names[0], names[1])
	}
	worst := 0.0
	for i := range losses[0] {
		worst = math.Max(worst, math.Abs(losses[1][i]-losses[0][i])/math.Abs(losses[0][i]))
	}
	// Recomputation clones the merged product like any other forward node:
	// the same bits as the merged step that keeps its activations.
	h := testHyper(steps).WithRecompute(RecomputeFull)
	h.FuseQKV = true
	tr, err := NewTrainer(cpu.New(), cfg, true, h, corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for range steps {
		if _, err := tr.Step(); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(tr.Losses(), losses[1]) {
		t.Errorf("fuse_qkv with -recompute: losses %v, without recompute %v", tr.Losses(), losses[1])
	}
	t.Logf("20 steps: max relative loss difference %.3g (last %.6f vs %.6f)", worst, losses[1][steps-1], losses[0][steps-1])
	if !(worst <= 1e-6) {
		t.Errorf("losses with fuse_qkv differ by %.3g relative (tolerance 1e-6):\n%v\n%v", worst, losses[0], losses[1])
	}
}

// TestTrainFuseQKVCUDA (needs a GPU): the merged step compiles and trains
// on the CUDA backend. In float32 (cuBLAS without TF32: only the summation
// order differs) 10 steps stay within 1e-5 relative of the unmerged step's
// losses; in bf16 mixed precision the first loss, before any update, is
// within 1e-2 relative (a few bf16 roundings of logits ~ ln 256) and every
// loss is finite.
func TestTrainFuseQKVCUDA(t *testing.T) {
	if why := cuda.Available(); why != nil {
		t.Skipf("no CUDA: %v", why)
	}
	for _, bf16 := range []bool{false, true} {
		cfg := testConfig(t, graph.Float32)
		cfg.Batch, cfg.Seq = 4, 64
		var losses [2][]float64
		for k, q := range []bool{false, true} {
			be, err := cuda.NewMixedBackend(bf16)
			if err != nil {
				t.Fatal(err)
			}
			h := testHyper(10)
			h.FuseQKV = q
			tr, err := NewTrainer(be, cfg, true, h, testCorpus(t))
			if err != nil {
				be.Close()
				t.Fatalf("bf16=%v fuse_qkv=%v: %v", bf16, q, err)
			}
			for range 10 {
				if _, err := tr.Step(); err != nil {
					t.Fatalf("bf16=%v fuse_qkv=%v: %v", bf16, q, err)
				}
			}
			losses[k] = tr.Losses()
			tr.Close()
			be.Close()
		}
		tol, n := 1e-5, 10
		if bf16 {
			tol, n = 1e-2, 1
		}
		for i := range n {
			if d := math.Abs(losses[1][i]-losses[0][i]) / math.Abs(losses[0][i]); !(d <= tol) {
				t.Errorf("bf16=%v step %d: loss %v with fuse_qkv, %v without (relative %.3g, tolerance %g)", bf16, i+1, losses[1][i], losses[0][i], d, tol)
			}
		}
		t.Logf("bf16=%v: losses %v, with fuse_qkv %v", bf16, losses[0], losses[1])
	}
}
