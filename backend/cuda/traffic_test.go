package cuda

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Traffic counts each operand of a launching node once, in its storage
// type; views and transposes folded into a GEMM launch nothing and are left
// out, and the report totals what it lists.
func TestTraffic(t *testing.T) {
	b := graph.NewBuilder("traffic")
	x := b.Input("x", graph.Float32, 1024)
	y := b.Add(x, x)                         // reads x once: 4 KiB in, 4 KiB out
	r := b.Reshape(y, 32, 32)                // a view
	a := b.Input("a", graph.Float32, 32, 64) // 8 KiB
	m := b.MatMul(b.Transpose(a, 1, 0), r)   // the transpose folds into the GEMM: [64,32]·[32,32]
	b.Output(b.Rename(b.Neg(m), "out"))      // 8 KiB in, 8 KiB out
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	p, err := PlanMemoryWith(g, PlanOptions{Compute: graph.Float32})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := p.Traffic(g)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]OpTraffic{
		"Add":    {Op: "Add", Nodes: 1, Bytes: 2 * 4096},
		"MatMul": {Op: "MatMul", Nodes: 1, Bytes: 8192 + 4096 + 8192},
		"Neg":    {Op: "Neg", Nodes: 1, Bytes: 2 * 8192},
	}
	if len(rows) != len(want) {
		t.Fatalf("traffic %+v, want the three launching ops %v", rows, want)
	}
	for i, r := range rows {
		if r != want[r.Op] {
			t.Errorf("%s: %+v, want %+v", r.Op, r, want[r.Op])
		}
		if i > 0 && r.Bytes > rows[i-1].Bytes {
			t.Errorf("not most bytes first: %+v", rows)
		}
	}
	var sb strings.Builder
	if err := p.ReportTraffic(&sb, g, 2); err != nil {
		t.Fatal(err)
	}
	// 45056 bytes at 2 TB/s: 2.2528e-05 ms.
	if !strings.Contains(sb.String(), "44.0 KiB") || !strings.Contains(sb.String(), "0.000") || strings.Contains(sb.String(), "Reshape") {
		t.Errorf("report:\n%s", sb.String())
	}
	// A graph the plan was not made for is refused, not miscounted.
	if _, err := p.Traffic(otherGraph(t)); err == nil {
		t.Error("traffic of another graph: no error")
	}
}

// otherGraph is a graph no plan of the test was made for.
func otherGraph(t *testing.T) *graph.Graph {
	b := graph.NewBuilder("other")
	b.Output(b.Rename(b.Neg(b.Input("z", graph.Float32, 4)), "out"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}
