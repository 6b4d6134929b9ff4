package cpu

import (
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// FuzzFusedBody: any body text, with any reduction attributes, over three
// inputs of fixed shapes is either refused with an error (when the graph is
// built, compiled or run) or computed, never a panic; what is computed equals
// the op-by-op reference bit for bit.
func FuzzFusedBody(f *testing.F) {
	for _, seed := range []struct {
		body     string
		axis     int64
		keepdims int64
	}{
		{"Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3)", -1, 1},
		{"Slice<2,0,2>(i0);Slice<2,2,4>(i0);Neg(t1);Concat<2>(t2,t0);Mul(t3,i1)", -1, 1},
		{"Mul(i2,i2);Mul(i0,i1);ReduceSum(t1);Mul(t2,t0)", -1, 0},
		{"Slice<1,-2,9>(i0);Concat<0>(t0,t0);Exp(t1)", 0, 1},
		{"ReduceSum(i0);Slice<2,0,1>(t0)", 1, 1},
		{"Transpose<1,0,2>(i0);Mul(t0,t0);ReduceSum(t1)", -1, 1},
		{"Transpose<1,0,2>(i0);Transpose<1,0,2>(t0);Mul(t1,i1)", -1, 1},
		{"Transpose<2,0,1>(i0);Neg(t0)", 0, 1},
		{"LeakyRelu{alpha=0.3}(i0);Selu{alpha=1.5,gamma=2}(t0);Mul(t1,i1);Gelu{approximate=tanh}(t2)", -1, 1},
	} {
		f.Add(seed.body, seed.axis, seed.keepdims)
	}
	f.Fuzz(func(t *testing.T, body string, axis, keepdims int64) {
		if len(body) > 400 {
			return
		}
		b := graph.NewBuilder("fz")
		x := b.Input("x", graph.Float32, 2, 3, 4)
		y := b.Input("y", graph.Float32, 2, 3, 4)
		r := b.Input("r", graph.Float32, 2, 3, 1)
		attrs := graph.Attrs{"body": graph.Str(body), "outputs": graph.Ints(0), "axes": graph.Ints(axis), "keepdims": graph.Int(keepdims)}
		outs := b.OpN("FusedElementwise", attrs, x, y, r)
		if len(outs) == 0 {
			return
		}
		b.Output(outs...)
		g, err := b.Build()
		if err != nil {
			return // refused with a reason
		}
		exe, err := New().Compile(g, backend.Options{PoisonOutputs: true})
		if err != nil {
			return
		}
		defer exe.Close()
		feeds := map[string]*graph.Tensor{}
		for _, v := range g.Inputs {
			t := graph.NewTensor(v.Type.DType, v.Type.Shape)
			for i := range t.Len() {
				t.Set(i, float64(i%5)/2-1)
			}
			feeds[v.Name] = t
		}
		got, err := exe.Run(feeds)
		if err != nil {
			return
		}
		want, err := graph.Eval("FusedElementwise", g.Nodes[0].Attrs, feeds["x"], feeds["y"], feeds["r"])
		if err != nil {
			t.Fatalf("the CPU ran %q but the reference refuses it: %v", body, err)
		}
		a, w := got[g.Outputs[0].Name], want[0]
		for i := range w.Len() {
			av, wv := a.At(i), w.At(i)
			if av != wv && !(av != av && wv != wv) {
				t.Fatalf("%q: element %d = %v, reference %v", body, i, av, wv)
			}
		}
	})
}
