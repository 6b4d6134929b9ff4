package passes

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Head transposes (last axis kept) around elementwise bodies become index
// steps: one read by a norm body and an elementwise body is read by both
// through Transpose steps; one that alone reads a body's result is written
// by the body. One also read by a MatMul, one that moves the last axis, and
// one after a body with another result stay copies, and -explain says why.
// The fused graph computes bit for bit what the graph did.
func TestFuseElementwiseTransposes(t *testing.T) {
	b := graph.NewBuilder("heads")
	x := b.Input("x", graph.Float32, 2, 5, 3, 8) // [B,S,H,D]
	w := b.Input("w", graph.Float32, 8)
	a := b.Input("a", graph.Float32, 2, 3, 5, 8) // [B,H,S,D]
	m := b.Input("m", graph.Float32, 8, 4)
	// Read side: an RMSNorm of the heads.
	q := b.Transpose(x, 0, 2, 1, 3)
	r := b.Op("Reciprocal", nil, b.Sqrt(b.Add(b.ReduceMean(b.Mul(q, q), true, -1), b.Scalar(graph.Float32, 1e-5))))
	qn := b.Mul(b.Mul(q, r), w) // joins the norm's body: a second walk over each row
	g0 := b.MatMul(qn, m)
	// Write side: an elementwise result merged back to [B,S,H,D] for a GEMM.
	dq := b.Transpose(b.Add(b.Mul(b.Mul(q, w), a), a), 0, 2, 1, 3)
	g1 := b.MatMul(dq, m)
	// Stays: also read by a MatMul.
	k := b.Transpose(x, 0, 2, 1, 3)
	g2 := b.MatMul(k, m)
	k2 := b.Mul(b.Neg(k), w)
	// Stays: moves the last axis.
	v := b.Transpose(x, 0, 3, 2, 1)
	v2 := b.Mul(b.Neg(v), v)
	// Stays: the body has another result that is read untransposed.
	s := b.Sigmoid(b.Add(a, a))
	st := b.Transpose(s, 0, 2, 1, 3)
	g3 := b.MatMul(st, m)
	s2 := b.MatMul(s, m)
	b.Output(g0, g1, g2, k2, v2, g3, s2)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	log := &Log{}
	fused, err := (FuseElementwise{}).Run(g, log)
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]bool{}
	var bodies []string
	for _, n := range fused.Nodes {
		switch n.Op {
		case "Transpose":
			kept[n.Outputs[0].Name] = true
		case "FusedElementwise":
			bodies = append(bodies, n.Attrs["body"].S)
		}
	}
	for _, v := range []*graph.Value{k, v, st} {
		if !kept[v.Name] {
			t.Errorf("Transpose %s was absorbed; it should stay", v.Name)
		}
	}
	if len(kept) != 3 {
		t.Errorf("%d Transposes left, want 3; bodies %q", len(kept), bodies)
	}
	want := []string{
		// The norm reads q, and scales it by the row's value.
		"Transpose<0,2,1,3>(i0);Mul(t0,t0);ReduceMean(t1);Add(t2,i1);Sqrt(t3);Reciprocal(t4);Mul(t0,t5);Mul(t6,i2)",
		// The elementwise ops on q (one group) write dq transposed.
		"Transpose<0,2,1,3>(i0);Mul(t0,i1);Mul(t1,i2);Add(t2,i2);Transpose<0,2,1,3>(t3)",
	}
	for _, w := range want {
		found := false
		for _, body := range bodies {
			found = found || strings.Contains(body, w)
		}
		if !found {
			t.Errorf("no body contains %q; bodies %q", w, bodies)
		}
	}
	text := log.String()
	for _, w := range []string{"transpose_read", "transpose_write", "which is in no elementwise body", "is also read by"} {
		if !strings.Contains(text, w) {
			t.Errorf("the log does not say %q:\n%s", w, text)
		}
	}
	back, err := graph.Parse(graph.Format(fused))
	if err != nil || graph.Format(back) != graph.Format(fused) {
		t.Fatalf("the fused graph does not round-trip: %v", err)
	}
	feeds := map[string]*graph.Tensor{}
	for i, in := range g.Inputs {
		f := graph.NewTensor(in.Type.DType, in.Type.Shape)
		for j := range f.Len() {
			f.Set(j, float64((j*7+i*3)%23)/11-1)
		}
		feeds[in.Name] = f
	}
	sameOutputs(t, "transposes", fzCPU(t, fused, feeds), fzCPU(t, g, feeds))
}
