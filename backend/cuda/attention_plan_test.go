package cuda

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Attention tests that need the executor (moved from package attention's
// flash_test.go).

// TestPlanDecodeWorkspace checks that the memory plan gives a fused forward of
// a decode shape the decode forward's workspace (exactly
// FlashForwardWorkspaceBytes), and other forwards none.
func TestPlanDecodeWorkspace(t *testing.T) {
	for _, c := range []struct {
		sq, sk int
		causal bool
	}{{1, 2048, false}, {16, 4096, false}, {16, 4096, true}, {32, 4096, false}, {4, 512, false}} {
		b := graph.NewBuilder("decode")
		q := b.Input("q", graph.BFloat16, 2, 3, c.sq, 64)
		k := b.Input("k", graph.BFloat16, 2, 3, c.sk, 64)
		v := b.Input("v", graph.BFloat16, 2, 3, c.sk, 64)
		attrs := graph.Attrs{"causal": graph.Int(int64(b2i(c.causal))), "scale": graph.Float(0.125)}
		b.Output(b.OpN("FlashAttention", attrs, q, k, v)...)
		p := plan(t, build(t, b), PlanOptions{})
		want := FlashForwardWorkspaceBytes(GemmBF16, 6, c.sq, c.sk, 64, 0.125, c.causal)
		if (want > 0) != (c.sq <= 16 && !c.causal && c.sk >= 1024) {
			t.Errorf("sq %d sk %d causal %v: FlashForwardWorkspaceBytes %d", c.sq, c.sk, c.causal, want)
		}
		got := 0
		for _, tt := range p.Tensors {
			if tt.Scratch && tt.Op == "FlashAttention" {
				if !strings.HasSuffix(tt.Name, "/workspace") {
					t.Errorf("sq %d sk %d: unexpected scratch %s", c.sq, c.sk, tt.Name)
				}
				got += int(tt.Bytes)
			}
		}
		if got != want {
			t.Errorf("sq %d sk %d causal %v: the plan gives the forward %d bytes of workspace, want %d", c.sq, c.sk, c.causal, got, want)
		}
	}
}

// b2i is a kernel's bool argument (as package attention's b2i).
func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
