package passes

import (
	"errors"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Every registered pass, called directly, refuses a nil graph with an error.
func TestPassesRefuseNilGraph(t *testing.T) {
	for _, name := range Names() {
		p, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Run(nil, &Log{}); !errors.Is(err, errNilGraph) {
			t.Errorf("%s.Run(nil): %v", name, err)
		}
	}
	if _, err := Default(true).Run(nil, nil); !errors.Is(err, errNilGraph) {
		t.Errorf("pipeline on nil: %v", err)
	}
}

// Attention with an empty axis: empty query or key lengths fuse and agree
// with the composed graph; 0-wide heads are not fused (the kernels tile over
// D) and say so.
func TestFusionZeroSizedAttention(t *testing.T) {
	for _, c := range []struct {
		sq, sk, d int
		causal    bool
		fused     bool
	}{
		{0, 3, 4, false, true},
		{3, 0, 4, false, true},
		{0, 0, 4, true, true},
		{3, 3, 0, false, false},
		{3, 3, 0, true, false},
	} {
		b := graph.NewBuilder("attention")
		q := b.Input("q", graph.Float64, 2, c.sq, c.d)
		k := b.Input("k", graph.Float64, 2, c.sk, c.d)
		v := b.Input("v", graph.Float64, 2, c.sk, c.d)
		s := b.Mul(b.MatMul(q, b.Transpose(k, 0, 2, 1)), b.Scalar(graph.Float64, 0.5))
		if c.causal {
			s = b.Add(s, b.Const("mask", graph.Float64, graph.Shape{c.sq, c.sk}, graph.CausalMask()))
		}
		b.Output(b.MatMul(b.Softmax(s, -1), v))
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		fused, log := fzRun(t, Default(true), g)
		x := ExplainLog(g, log)
		if len(x) != 1 || x[0].Fused != c.fused || fzCount(fused, "FlashAttention") != boolCount(c.fused) {
			t.Errorf("%+v: want fused=%v, got %v", c, c.fused, x)
			continue
		}
		if !c.fused && !strings.Contains(x[0].Reason, "head dim D is 0") {
			t.Errorf("%+v: reason %q does not name the 0-wide head", c, x[0].Reason)
		}
		fzSameOutputs(t, g, fused, graph.Float64)
	}
}

func boolCount(b bool) int {
	if b {
		return 1
	}
	return 0
}
