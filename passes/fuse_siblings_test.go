package passes

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Two elementwise chains that only share inputs (a SwiGLU backward's d(up)
// and d(gate)) become one node with both outputs, computing what the
// unfused graph did bit for bit; a chain whose input is made after the
// first chain, or one too far away, stays apart.
func TestFuseElementwiseMergesSiblings(t *testing.T) {
	build := func(between func(b *graph.Builder, x *graph.Value) *graph.Value) *graph.Graph {
		b := graph.NewBuilder("siblings")
		gate := b.Input("gate", graph.Float32, 4, 8)
		up := b.Input("up", graph.Float32, 4, 8)
		dact := b.Input("dact", graph.Float32, 4, 8)
		w := b.Input("w", graph.Float32, 8, 8)
		sg := b.Sigmoid(gate)
		b.Output(b.Rename(b.Mul(b.Mul(gate, sg), dact), "dup"))
		other := up
		if between != nil {
			other = between(b, b.MatMul(up, w))
		}
		sg2 := b.Sigmoid(gate)
		b.Output(b.Rename(b.Mul(b.Mul(dact, other), b.Add(sg2, gate)), "dgate"))
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	for _, c := range []struct {
		name    string
		between func(b *graph.Builder, x *graph.Value) *graph.Value
		merged  bool
	}{
		{"siblings", nil, true},
		{"second chain reads a later value", func(b *graph.Builder, x *graph.Value) *graph.Value { return x }, false},
		{"too far apart", func(b *graph.Builder, x *graph.Value) *graph.Value {
			w := b.Input("w2", graph.Float32, 8, 8)
			for range siblingMaxGap {
				x = b.MatMul(x, w)
			}
			return x
		}, false},
	} {
		g := build(c.between)
		log := &Log{}
		fused, err := (FuseElementwise{}).Run(g, log)
		if err != nil {
			t.Fatal(err)
		}
		nodes := fzNodes(fused, "FusedElementwise")
		fired := strings.Contains(log.String(), "sibling_merge")
		switch {
		case c.merged && (len(nodes) != 1 || len(nodes[0].Outputs) != 2 || !fired):
			t.Errorf("%s: %d fused nodes (want one with both outputs), sibling_merge logged %v:\n%s", c.name, len(nodes), fired, graph.Format(fused))
		case !c.merged && (len(nodes) != 2 || fired):
			t.Errorf("%s: %d fused nodes (want 2, apart), sibling_merge logged %v", c.name, len(nodes), fired)
		}
		feeds := fzFeeds(g, 3)
		sameOutputs(t, c.name, fzCPU(t, fused, feeds), fzCPU(t, g, feeds))
		back, err := graph.Parse(graph.Format(fused))
		if err != nil || graph.Format(back) != graph.Format(fused) {
			t.Errorf("%s: the fused graph does not round-trip: %v", c.name, err)
		}
	}
}
