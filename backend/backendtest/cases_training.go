package backendtest

import (
	"github.com/flashgraph/flashgraph/graph"
)

// trainingCases are the cases of ONNX's training optimizers
// (graph/ops_training.go): one and two optimized tensors, at the first
// step (T = 0, where Adam and Momentum take a special form) and a later
// one; each reference is the op's own Eval.
func trainingCases() []opCase {
	var cs []opCase
	add := func(op, name string, fn func(c *ctx)) { cs = append(cs, opCase{op: op, name: name, fn: fn}) }
	for _, oc := range []struct {
		op     string
		states int
		attrs  graph.Attrs
	}{
		{"Adagrad", 1, graph.Attrs{"decay_factor": graph.Float(0.1), "epsilon": graph.Float(1e-5), "norm_coefficient": graph.Float(0.01)}},
		{"Adam", 2, graph.Attrs{"alpha": graph.Float(0.8), "beta": graph.Float(0.9), "norm_coefficient": graph.Float(0.01), "norm_coefficient_post": graph.Float(0.05)}},
		{"Momentum", 1, graph.Attrs{"alpha": graph.Float(0.9), "beta": graph.Float(0.5), "norm_coefficient": graph.Float(0.01), "mode": graph.Str("standard")}},
		{"Momentum", 1, graph.Attrs{"alpha": graph.Float(0.9), "beta": graph.Float(0.5), "norm_coefficient": graph.Float(0.01), "mode": graph.Str("nesterov")}},
	} {
		for _, sc := range []struct {
			name   string
			step   float64
			shapes [][]int
		}{
			{"first_step", 0, [][]int{{4, 3}}},
			{"step5_two_tensors", 5, [][]int{{4, 3}, {7}}},
		} {
			name := sc.name
			if m := oc.attrs.String("mode", ""); m != "" {
				name = m + "_" + name
			}
			add(oc.op, name, func(c *ctx) {
				r, rr := c.input(c.dt, constGen(0.1))
				t, rt := c.input(graph.Int64, constGen(sc.step))
				ins, refs := []*graph.Value{r, t}, []*graph.Tensor{f64(rr), tensorFrom(graph.Int64, rt)}
				// The optimized tensors, their gradients, then each state
				// (the squared-gradient sums non-negative).
				for k := range 2 + oc.states {
					g := normal
					if oc.op == "Adagrad" && k == 2 || oc.op == "Adam" && k == 3 {
						g = positive
					}
					for _, shape := range sc.shapes {
						v, rv := c.input(c.dt, g, shape...)
						ins, refs = append(ins, v), append(refs, f64(rv))
					}
				}
				outs := c.opN(oc.op, oc.attrs, ins...)
				want := refN(oc.op, oc.attrs, refs...)
				for i, o := range outs {
					c.expect(o, want[i])
				}
			})
		}
	}
	return cs
}
