package passes

import (
	"fmt"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// fzDeep builds the model with n layers (tiny's widths: building and
// compiling do not depend on widths, and this keeps memory small).
func fzDeep(tb testing.TB, n int) *graph.Graph {
	tb.Helper()
	cfg, err := model.Lookup("tiny")
	if err != nil {
		tb.Fatal(err)
	}
	cfg.Name = fmt.Sprintf("deep%d", n)
	cfg.Layers = n
	g, err := model.Build(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// BenchmarkFusePipeline: Default(true) on 25, 50 and 100 layers; the time
// per layer should stay flat (linear in the graph).
func BenchmarkFusePipeline(b *testing.B) {
	for _, n := range []int{25, 50, 100} {
		g := fzDeep(b, n)
		b.Run(fmt.Sprintf("layers=%d", n), func(b *testing.B) {
			p := Default(true)
			b.ReportAllocs()
			for b.Loop() {
				out, err := p.Run(g, nil)
				if err != nil {
					b.Fatal(err)
				}
				if out.CountOps()["FlashAttention"] != n {
					b.Fatal("not fused")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n)/1e3, "µs/layer")
		})
	}
}

// TestFusePipelineScales: 100 layers compile with fusion well under a
// second, and 4× the layers cost well under 16× the time (linear: 4×).
// Best of three runs, since the machine is shared.
func TestFusePipelineScales(t *testing.T) {
	best := func(n int) time.Duration {
		g := fzDeep(t, n)
		d := time.Duration(1 << 62)
		for range 3 {
			t0 := time.Now()
			out, err := Default(true).Run(g, nil)
			if err != nil {
				t.Fatal(err)
			}
			d = min(d, time.Since(t0))
			if out.CountOps()["FlashAttention"] != n {
				t.Fatalf("%d layers: not fused", n)
			}
		}
		return d
	}
	t25, t100 := best(25), best(100)
	t.Logf("Default(true): 25 layers %v, 100 layers %v (ratio %.2f)", t25, t100, float64(t100)/float64(t25))
	if t100 > 500*time.Millisecond {
		t.Errorf("100 layers took %v", t100)
	}
	if t100 > 10*t25 {
		t.Errorf("100 layers took %v, 25 layers %v: not linear", t100, t25)
	}
}
