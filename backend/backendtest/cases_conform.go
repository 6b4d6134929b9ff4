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
	for _, ec := range []struct {
		name, eq string
		shapes   [][]int
	}{
		{"matmul", "ij,jk->ik", [][]int{{3, 4}, {4, 5}}},
		{"batch_diagonal", "...ii->...i", [][]int{{2, 3, 3}}},
		{"implicit_sum_transpose", "kji", [][]int{{2, 3, 4}}},
		{"inner_three", "i,i,ij", [][]int{{4}, {4}, {4, 2}}},
	} {
		add("Einsum", ec.name, func(c *ctx) {
			attrs := graph.Attrs{"equation": graph.Str(ec.eq)}
			var ins []*graph.Value
			var refs []*graph.Tensor
			for _, s := range ec.shapes {
				x, rx := c.x(s...)
				ins, refs = append(ins, x), append(refs, f64(rx))
			}
			c.expect(c.op("Einsum", attrs, ins...), ref("Einsum", attrs, refs...))
		})
	}
	return append(append(append(cs, convCases()...), indexCases()...), tensorCases()...)
}

// indexCases are the cases of ScatterElements, Pad, TopK and OneHot.
func indexCases() []opCase {
	var cs []opCase
	add := func(op, name string, fn func(c *ctx)) { cs = append(cs, opCase{op: op, name: name, fn: fn}) }
	addDT := func(op, name string, dts []graph.DType, fn func(c *ctx)) {
		cs = append(cs, opCase{op: op, name: name, dts: dts, fn: fn})
	}
	for _, red := range []string{"none", "add", "mul", "max", "min"} {
		add("ScatterElements", "axis1_"+red, func(c *ctx) {
			x, rx := c.x(3, 5)
			// Distinct positions per row when reduction is none: the result
			// of writing twice depends on the order.
			idx := c.b.Const("idx", graph.Int64, graph.Shape{3, 2}, graph.Literal(0, 4, -1, 2, 1, 3))
			ri := tensorFrom(graph.Int64, &arr{shape: []int{3, 2}, data: []float64{0, 4, -1, 2, 1, 3}})
			u, ru := c.x(3, 2)
			attrs := graph.Attrs{"axis": graph.Int(1), "reduction": graph.Str(red)}
			c.expect(c.op("ScatterElements", attrs, x, idx, u), ref("ScatterElements", attrs, f64(rx), ri, f64(ru)))
		})
	}
	addDT("ScatterElements", "int64_add_repeats", onlyInt64, func(c *ctx) {
		x, rx := c.input(graph.Int64, ints(-50, 50), 4, 2)
		idx, ri := c.input(graph.Int64, ints(-4, 4), 3, 2)
		u, ru := c.input(graph.Int64, ints(-50, 50), 3, 2)
		attrs := graph.Attrs{"axis": graph.Int(0), "reduction": graph.Str("add")}
		c.expect(c.op("ScatterElements", attrs, x, idx, u), ref("ScatterElements", attrs, tensorFrom(graph.Int64, rx), tensorFrom(graph.Int64, ri), tensorFrom(graph.Int64, ru)))
	})
	for _, pc := range []struct {
		name, mode string
		pads       []int
		value      bool
	}{
		{"constant_value", "constant", []int{1, 0, 2, 3}, true},
		{"constant_zero_crop", "constant", []int{0, -1, 2, 1}, false},
		{"reflect", "reflect", []int{2, 1, 1, 3}, false},
		{"edge", "edge", []int{3, 0, 0, 2}, false},
	} {
		add("Pad", pc.name, func(c *ctx) {
			x, rx := c.x(3, 4)
			attrs := graph.Attrs{"mode": graph.Str(pc.mode)}
			ins, refs := []*graph.Value{x, c.b.Ints(pc.pads...)}, []*graph.Tensor{f64(rx), i64(pc.pads...)}
			if pc.value {
				v, rv := c.x(1)
				ins, refs = append(ins, v), append(refs, f64(rv))
			}
			c.expect(c.op("Pad", attrs, ins...), ref("Pad", attrs, refs...))
		})
	}
	for _, tc := range []struct {
		name          string
		shape         []int
		k             int
		axis, largest int64
		g             gen
	}{
		{"largest_axis1", []int{3, 6}, 3, 1, 1, normal},
		{"smallest_axis0_ties", []int{7, 2}, 4, 0, 0, fewValues},
		{"all_last", []int{2, 3, 5}, 5, -1, 1, fewValues},
	} {
		add("TopK", tc.name, func(c *ctx) {
			x, rx := c.input(c.dt, tc.g, tc.shape...)
			attrs := graph.Attrs{"axis": graph.Int(tc.axis), "largest": graph.Int(tc.largest)}
			outs := c.opN("TopK", attrs, x, c.b.Ints(tc.k))
			want := refN("TopK", attrs, f64(rx), i64(tc.k))
			c.expect(outs[0], want[0])
			c.expect(outs[1], want[1])
		})
	}
	for _, oc := range []struct {
		name  string
		shape []int
		axis  int64
	}{
		{"last_axis", []int{2, 3}, -1},
		{"axis0", []int{4}, 0},
		{"axis1_rank3", []int{2, 2, 3}, 1},
	} {
		add("OneHot", oc.name, func(c *ctx) {
			idx, ri := c.input(graph.Int64, ints(-6, 7), oc.shape...)
			vals, rv := c.x(2)
			attrs := graph.Attrs{"axis": graph.Int(oc.axis)}
			c.expect(c.op("OneHot", attrs, idx, c.b.Ints(5), vals), ref("OneHot", attrs, tensorFrom(graph.Int64, ri), i64(5), f64(rv)))
		})
	}
	return cs
}

// convCases are the cases of Conv, MaxPool and AveragePool.
func convCases() []opCase {
	var cs []opCase
	add := func(op, name string, fn func(c *ctx)) { cs = append(cs, opCase{op: op, name: name, fn: fn}) }
	for _, cc := range []struct {
		name  string
		x, w  []int
		attrs graph.Attrs
		bias  bool
	}{
		{"2d_pad1", []int{1, 2, 5, 5}, []int{3, 2, 3, 3}, graph.Attrs{"pads": graph.Ints(1, 1, 1, 1)}, true},
		{"2d_stride2_dil2", []int{2, 1, 7, 6}, []int{2, 1, 2, 2}, graph.Attrs{"strides": graph.Ints(2, 2), "dilations": graph.Ints(2, 1)}, false},
		{"1d_group2", []int{1, 4, 9}, []int{6, 2, 3}, graph.Attrs{"group": graph.Int(2), "pads": graph.Ints(0, 2)}, true},
		{"3d", []int{1, 1, 3, 4, 4}, []int{1, 1, 2, 2, 2}, graph.Attrs{}, false},
	} {
		add("Conv", cc.name, func(c *ctx) {
			x, rx := c.x(cc.x...)
			w, rw := c.x(cc.w...)
			ins, refs := []*graph.Value{x, w}, []*graph.Tensor{f64(rx), f64(rw)}
			if cc.bias {
				b, rb := c.x(cc.w[0])
				ins, refs = append(ins, b), append(refs, f64(rb))
			}
			c.expect(c.op("Conv", cc.attrs, ins...), ref("Conv", cc.attrs, refs...))
		})
	}
	for _, tc := range []struct {
		name  string
		x, w  []int
		attrs graph.Attrs
		bias  bool
	}{
		{"2d_stride2_pad", []int{1, 2, 3, 4}, []int{2, 3, 3, 3}, graph.Attrs{"strides": graph.Ints(2, 2), "pads": graph.Ints(1, 0, 0, 1)}, true},
		{"1d_group2_outpad_dil", []int{2, 4, 5}, []int{4, 1, 2}, graph.Attrs{"group": graph.Int(2), "strides": graph.Ints(3), "output_padding": graph.Ints(1), "dilations": graph.Ints(2)}, false},
	} {
		add("ConvTranspose", tc.name, func(c *ctx) {
			x, rx := c.x(tc.x...)
			w, rw := c.x(tc.w...)
			ins, refs := []*graph.Value{x, w}, []*graph.Tensor{f64(rx), f64(rw)}
			if tc.bias {
				b, rb := c.x(tc.w[1])
				ins, refs = append(ins, b), append(refs, f64(rb))
			}
			c.expect(c.op("ConvTranspose", tc.attrs, ins...), ref("ConvTranspose", tc.attrs, refs...))
		})
	}
	for _, op := range []string{"MaxPool", "AveragePool"} {
		for _, pc := range []struct {
			name  string
			x     []int
			attrs graph.Attrs
		}{
			{"2d_k3_pad1", []int{1, 2, 5, 5}, graph.Attrs{"kernel_shape": graph.Ints(3, 3), "pads": graph.Ints(1, 1, 1, 1)}},
			{"2d_ceil_stride2", []int{2, 1, 6, 7}, graph.Attrs{"kernel_shape": graph.Ints(3, 2), "strides": graph.Ints(2, 2), "ceil_mode": graph.Int(1)}},
			{"1d_dil2_pad", []int{1, 3, 8}, graph.Attrs{"kernel_shape": graph.Ints(2), "dilations": graph.Ints(2), "pads": graph.Ints(1, 0)}},
		} {
			attrs := graph.Attrs{}
			for k, v := range pc.attrs {
				attrs[k] = v
			}
			if op == "AveragePool" && pc.name == "2d_k3_pad1" {
				attrs["count_include_pad"] = graph.Int(1)
			}
			add(op, pc.name, func(c *ctx) {
				x, rx := c.x(pc.x...)
				c.expect(c.op(op, attrs, x), ref(op, attrs, f64(rx)))
			})
		}
	}
	for _, rc := range []struct {
		name  string
		shape []int
		attrs graph.Attrs
	}{
		{"nearest_half_pixel_up", []int{1, 2, 3, 4}, graph.Attrs{"sizes": graph.Ints(1, 2, 7, 9), "scales": graph.Floats(1, 1, 7.0/3, 9.0/4)}},
		{"nearest_floor_asymmetric_down", []int{2, 6, 5}, graph.Attrs{"sizes": graph.Ints(2, 3, 2), "scales": graph.Floats(1, 0.5, 0.4),
			"coordinate_transformation_mode": graph.Str("asymmetric"), "nearest_mode": graph.Str("floor")}},
		{"linear_align_corners", []int{1, 1, 4, 4}, graph.Attrs{"sizes": graph.Ints(1, 1, 7, 3), "scales": graph.Floats(1, 1, 1.75, 0.75),
			"mode": graph.Str("linear"), "coordinate_transformation_mode": graph.Str("align_corners")}},
		{"cubic_exclude_outside", []int{1, 1, 5, 4}, graph.Attrs{"sizes": graph.Ints(1, 1, 8, 3), "scales": graph.Floats(1, 1, 1.6, 0.75),
			"mode": graph.Str("cubic"), "exclude_outside": graph.Int(1), "cubic_coeff_a": graph.Float(-0.5)}},
		{"linear_tf_crop_and_resize", []int{1, 1, 4, 4}, graph.Attrs{"sizes": graph.Ints(1, 1, 3, 3), "scales": graph.Floats(1, 1, 0.75, 0.75),
			"mode": graph.Str("linear"), "coordinate_transformation_mode": graph.Str("tf_crop_and_resize"),
			"roi": graph.Floats(0, 0, 0.4, -0.2, 1, 1, 1.3, 0.7), "extrapolation_value": graph.Float(10)}},
	} {
		add("Interpolate", rc.name, func(c *ctx) {
			x, rx := c.x(rc.shape...)
			c.expect(c.op("Interpolate", rc.attrs, x), ref("Interpolate", rc.attrs, f64(rx)))
		})
	}
	return cs
}
