package backendtest

import (
	"github.com/flashgraph/flashgraph/graph"
)

// conformCases are the cases of the ops the ONNX backend test suite added
// (graph/ops_conform.go); each reference is the op's own Eval.
func conformCases() []opCase {
	var cs []opCase
	add := func(op, name string, fn func(c *ctx)) { cs = append(cs, opCase{op: op, name: name, fn: fn}) }

	for _, gc := range []struct {
		name      string
		data, idx []int
		axis      int
	}{
		{"axis0", []int{4, 3}, []int{2, 3}, 0},
		{"axis1_narrower", []int{3, 5}, []int{2, 4}, 1},
		{"axis-1_rank3", []int{2, 3, 4}, []int{2, 3, 6}, -1},
	} {
		dim := gc.data[normAxis(gc.axis, len(gc.data))]
		add("GatherElements", gc.name, func(c *ctx) {
			x, rx := c.x(gc.data...)
			idx, ri := c.input(graph.Int64, ints(-dim, dim), gc.idx...)
			attrs := graph.Attrs{"axis": graph.Int(int64(gc.axis))}
			c.expect(c.op("GatherElements", attrs, x, idx), ref("GatherElements", attrs, f64(rx), tensorFrom(graph.Int64, ri)))
		})
	}
	for _, ac := range []struct {
		name       string
		shape      []int
		axis, keep int64
		last       int64
		g          gen
	}{
		{"axis1_keep", []int{3, 5}, 1, 1, 0, normal},
		{"axis0_drop", []int{4, 3, 2}, 0, 0, 0, normal},
		{"ties_last", []int{2, 7}, -1, 1, 1, fewValues},
		{"ties_first", []int{6, 3}, 0, 0, 0, fewValues},
	} {
		add("ArgMax", ac.name, func(c *ctx) {
			x, rx := c.input(c.dt, ac.g, ac.shape...)
			attrs := graph.Attrs{"axis": graph.Int(ac.axis), "keepdims": graph.Int(ac.keep), "select_last_index": graph.Int(ac.last)}
			c.expect(c.op("ArgMax", attrs, x), ref("ArgMax", attrs, f64(rx)))
		})
	}
	for _, rc := range []struct {
		name  string
		shape []int
		axes  []int
		keep  int64
	}{
		{"all", []int{2, 3}, nil, 1},
		{"axis1_drop", []int{3, 4, 2}, []int{1}, 0},
		{"axes02_keep", []int{2, 3, 2}, []int{0, -1}, 1},
	} {
		add("ReduceProd", rc.name, func(c *ctx) {
			x, rx := c.input(c.dt, scaled(0.5, normal), rc.shape...)
			attrs := graph.Attrs{"keepdims": graph.Int(rc.keep)}
			ins, refs := []*graph.Value{x}, []*graph.Tensor{f64(rx)}
			if rc.axes != nil {
				ins, refs = append(ins, c.b.Ints(rc.axes...)), append(refs, i64(rc.axes...))
			}
			c.expect(c.op("ReduceProd", attrs, ins...), ref("ReduceProd", attrs, refs...))
		})
	}
	return cs
}
