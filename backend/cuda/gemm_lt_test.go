package cuda

import (
	"math"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
)

func TestCublasLtEnv(t *testing.T) {
	for _, c := range []struct {
		env  string
		want bool
		bad  bool
	}{{"", false, false}, {"0", false, false}, {"off", false, false}, {"false", false, false},
		{"1", true, false}, {"on", true, false}, {"true", true, false},
		{"yes", false, true}, {"2", false, true}, {" 1", false, true}} {
		t.Setenv(CublasLtEnv, c.env)
		got, err := cublasLtEnabled()
		if c.bad {
			if err == nil || !strings.Contains(err.Error(), CublasLtEnv) {
				t.Errorf("%q: %v, %v; want an error naming %s", c.env, got, err, CublasLtEnv)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %v, %v; want %v", c.env, got, err, c.want)
		}
	}
}

// TestExecCublasLt: with FLASHGRAPH_CUBLASLT=1 every GEMM runs the kernel
// tuned for its shape at Compile (also inside the step's CUDA graph), and
// the tiny model still trains as on the CPU in float32 and as the CPU's
// float32 in bf16; the compiled step tuned its GEMM shapes once each.
func TestExecCublasLt(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	t.Setenv(CublasLtEnv, "1")
	t.Run("float32", TestExecTrainingMatchesCPU)
	t.Run("bf16", TestExecBF16Training)
	t.Run("replay", TestRunsReplayAsGraphs)
	t.Run("plans", func(t *testing.T) {
		be := newTestBackend(t, Options{})
		defer be.Close()
		ts, cfg := tinyTraining(t, true)
		opts := backend.Options{Updates: ts.Updates}
		exe := compileOn(t, be, ts.Graph, opts)
		plans := be.Device().GemmPlans()
		if len(plans) == 0 {
			t.Fatal("Compile tuned no GEMM")
		}
		lt := 0
		for _, p := range plans {
			t.Logf("%v", p)
			if p.UsesLt() {
				lt++
			}
			if c := p.Candidates[0]; p.Note == "" && !(c.Ms > 0 && !math.IsInf(c.Ms, 1)) {
				t.Errorf("%v: default kernel timed at %v ms", p.Shape(), c.Ms)
			}
		}
		t.Logf("%d GEMM shapes, %d on a cuBLASLt kernel", len(plans), lt)
		// A second compile of the same graph finds every shape tuned.
		compileOn(t, be, ts.Graph, opts)
		if n := len(be.Device().GemmPlans()); n != len(plans) {
			t.Errorf("second Compile: %d plans, want the first's %d", n, len(plans))
		}
		ref := compileOn(t, cpu.New(), ts.Graph, opts)
		feeds := stepFeeds(ts, cfg, 1, 3e-3)
		got, err := exe.Run(feeds)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ref.Run(feeds)
		if err != nil {
			t.Fatal(err)
		}
		if l, r := got[ts.Loss].At(0), want[ts.Loss].At(0); math.Abs(l-r) > 1e-4*math.Abs(r) {
			t.Errorf("loss %.7f on the GPU, %.7f on the CPU", l, r)
		}
	})
}
