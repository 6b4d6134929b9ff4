package backendtest

import (
	"fmt"
	"math/rand/v2"

	"github.com/flashgraph/flashgraph/graph"
)

// tensorCases are the cases of the tensor ops of graph/ops_tensor.go:
// CumSum, GatherND, ScatterND, ReverseSequence, MaxUnpool, LRN and Det.
// Each reference is the op's own Eval.
func tensorCases() []opCase {
	var cs []opCase
	add := func(op, name string, fn func(c *ctx)) { cs = append(cs, opCase{op: op, name: name, fn: fn}) }
	addDT := func(op, name string, dts []graph.DType, fn func(c *ctx)) {
		cs = append(cs, opCase{op: op, name: name, dts: dts, fn: fn})
	}
	for _, cc := range []struct {
		name      string
		shape     []int
		axis      int
		excl, rev int64
	}{
		{"axis0", []int{5, 3}, 0, 0, 0},
		{"axis-1_exclusive", []int{2, 3, 6}, -1, 1, 0},
		{"axis1_reverse", []int{3, 7}, 1, 0, 1},
		{"axis1_reverse_exclusive_rank3", []int{2, 4, 3}, 1, 1, 1},
	} {
		add("CumSum", cc.name, func(c *ctx) {
			x, rx := c.x(cc.shape...)
			attrs := graph.Attrs{"exclusive": graph.Int(cc.excl), "reverse": graph.Int(cc.rev)}
			c.expect(c.op("CumSum", attrs, x, c.b.Ints(cc.axis)), ref("CumSum", attrs, f64(rx), i64(cc.axis)))
		})
	}
	addDT("CumSum", "int64_exclusive", onlyInt64, func(c *ctx) {
		x, rx := c.input(graph.Int64, ints(-1000, 1000), 4, 5)
		attrs := graph.Attrs{"exclusive": graph.Int(1)}
		c.expect(c.op("CumSum", attrs, x, c.b.Ints(1)), ref("CumSum", attrs, tensorFrom(graph.Int64, rx), i64(1)))
	})
	for _, gc := range []struct {
		name      string
		data, idx []int
		batch     int64
	}{
		{"k2_slices", []int{4, 4, 3}, []int{5, 2}, 0},
		{"k1_rank3_indices", []int{4, 2}, []int{2, 3, 1}, 0},
		{"batch1_k1", []int{3, 4, 2}, []int{3, 2, 1}, 1},
		{"full_coordinates", []int{4, 4}, []int{6, 2}, 0},
	} {
		add("GatherND", gc.name, func(c *ctx) {
			x, rx := c.x(gc.data...)
			// Every addressed axis has 4 elements: coordinates in [-4, 4).
			idx, ri := c.input(graph.Int64, ints(-4, 4), gc.idx...)
			attrs := graph.Attrs{"batch_dims": graph.Int(gc.batch)}
			c.expect(c.op("GatherND", attrs, x, idx), ref("GatherND", attrs, f64(rx), tensorFrom(graph.Int64, ri)))
		})
	}
	for _, red := range []string{"none", "add", "mul", "max", "min"} {
		add("ScatterND", "rows_"+red, func(c *ctx) {
			x, rx := c.x(4, 3, 2)
			// Distinct rows for reduction none: writing one twice depends on the order.
			idx := c.b.Const("idx", graph.Int64, graph.Shape{2, 2, 1}, graph.Literal(3, 0, -3, 2))
			ri := tensorFrom(graph.Int64, &arr{shape: []int{2, 2, 1}, data: []float64{3, 0, -3, 2}})
			u, ru := c.x(2, 2, 3, 2)
			attrs := graph.Attrs{"reduction": graph.Str(red)}
			c.expect(c.op("ScatterND", attrs, x, idx, u), ref("ScatterND", attrs, f64(rx), ri, f64(ru)))
		})
	}
	addDT("ScatterND", "int64_add_repeats", onlyInt64, func(c *ctx) {
		x, rx := c.input(graph.Int64, ints(-50, 50), 3, 3)
		idx, ri := c.input(graph.Int64, ints(-3, 3), 5, 2)
		u, ru := c.input(graph.Int64, ints(-50, 50), 5)
		attrs := graph.Attrs{"reduction": graph.Str("add")}
		c.expect(c.op("ScatterND", attrs, x, idx, u), ref("ScatterND", attrs, tensorFrom(graph.Int64, rx), tensorFrom(graph.Int64, ri), tensorFrom(graph.Int64, ru)))
	})
	for _, rc := range []struct {
		name        string
		shape       []int
		batch, time int64
	}{
		{"time0", []int{5, 3, 2}, 1, 0},
		{"batch0", []int{4, 6}, 0, 1},
	} {
		add("ReverseSequence", rc.name, func(c *ctx) {
			x, rx := c.x(rc.shape...)
			nb, nt := rc.shape[rc.batch], rc.shape[rc.time]
			lens, rl := c.input(graph.Int64, ints(0, nt+1), nb)
			attrs := graph.Attrs{"batch_axis": graph.Int(rc.batch), "time_axis": graph.Int(rc.time)}
			c.expect(c.op("ReverseSequence", attrs, x, lens), ref("ReverseSequence", attrs, f64(rx), tensorFrom(graph.Int64, rl)))
		})
	}
	for _, withShape := range []bool{false, true} {
		name := "default_shape"
		if withShape {
			name = "output_shape"
		}
		add("MaxUnpool", name, func(c *ctx) {
			x, rx := c.x(1, 2, 2, 2)
			// The positions a 2×2 stride-2 MaxPool of [1, 2, 4, 4] could pick.
			pos := []float64{5, 2, 8, 15, 16, 19, 29, 30}
			idx := c.b.Const("idx", graph.Int64, graph.Shape{1, 2, 2, 2}, graph.Literal(pos...))
			ri := tensorFrom(graph.Int64, &arr{shape: []int{1, 2, 2, 2}, data: pos})
			attrs := graph.Attrs{"kernel_shape": graph.Ints(2, 2), "strides": graph.Ints(2, 2)}
			ins, refs := []*graph.Value{x, idx}, []*graph.Tensor{f64(rx), ri}
			if withShape {
				ins, refs = append(ins, c.b.Ints(1, 2, 5, 6)), append(refs, i64(1, 2, 5, 6))
			}
			c.expect(c.op("MaxUnpool", attrs, ins...), ref("MaxUnpool", attrs, refs...))
		})
	}
	for _, lc := range []struct {
		name  string
		shape []int
		attrs graph.Attrs
	}{
		{"size3", []int{2, 5, 3, 2}, graph.Attrs{"size": graph.Int(3)}},
		{"size2_params", []int{1, 4, 6}, graph.Attrs{"size": graph.Int(2), "alpha": graph.Float(0.02), "beta": graph.Float(0.5), "bias": graph.Float(2)}},
	} {
		add("LRN", lc.name, func(c *ctx) {
			x, rx := c.x(lc.shape...)
			c.expect(c.op("LRN", lc.attrs, x), ref("LRN", lc.attrs, f64(rx)))
		})
	}
	for _, dc := range []struct {
		name  string
		shape []int
	}{{"2x2", []int{2, 2}}, {"batch_4x4", []int{3, 4, 4}}} {
		add("Det", dc.name, func(c *ctx) {
			x, rx := c.x(dc.shape...)
			c.expect(c.op("Det", nil, x), ref("Det", nil, f64(rx)))
		})
	}
	for _, mode := range []string{"bilinear", "nearest", "bicubic"} {
		for _, pad := range []string{"zeros", "border", "reflection"} {
			for _, align := range []int64{0, 1} {
				add("GridSample", fmt.Sprintf("%s_%s_align%d", mode, pad, align), func(c *ctx) {
					x, rx := c.x(2, 2, 4, 5)
					// Points past the edges too, where the padding decides.
					grid, rg := c.input(c.dt, scaled(1.3, inUnit), 2, 3, 4, 2)
					attrs := graph.Attrs{"mode": graph.Str(mode), "padding_mode": graph.Str(pad), "align_corners": graph.Int(align)}
					c.expect(c.op("GridSample", attrs, x, grid), ref("GridSample", attrs, f64(rx), f64(rg)))
				})
			}
		}
	}
	for _, rc := range []struct {
		name  string
		attrs graph.Attrs
	}{
		{"avg_half_pixel", graph.Attrs{"output_height": graph.Int(3), "output_width": graph.Int(2), "spatial_scale": graph.Float(0.5)}},
		{"max_ratio2", graph.Attrs{"mode": graph.Str("max"), "output_height": graph.Int(2), "output_width": graph.Int(2), "sampling_ratio": graph.Int(2)}},
		{"avg_output_half_pixel", graph.Attrs{"coordinate_transformation_mode": graph.Str("output_half_pixel"), "output_height": graph.Int(2), "output_width": graph.Int(3)}},
	} {
		add("RoiAlign", rc.name, func(c *ctx) {
			x, rx := c.x(2, 3, 6, 7)
			// Corners anywhere in the image and a little past it.
			rois, rr := c.input(c.dt, func(r *rand.Rand) float64 { return 8*r.Float64() - 1 }, 4, 4)
			idx := c.b.Const("batch", graph.Int64, graph.Shape{4}, graph.Literal(0, 1, 1, 0))
			ri := tensorFrom(graph.Int64, &arr{shape: []int{4}, data: []float64{0, 1, 1, 0}})
			c.expect(c.op("RoiAlign", rc.attrs, x, rois, idx), ref("RoiAlign", rc.attrs, f64(rx), f64(rr), ri))
		})
	}
	for _, mode := range []string{"TF", "IDF", "TFIDF"} {
		addDT("TfIdfVectorizer", mode, onlyInt64, func(c *ctx) {
			x, rx := c.input(graph.Int64, ints(0, 4), 3, 9)
			attrs := graph.Attrs{
				"mode": graph.Str(mode), "min_gram_length": graph.Int(1), "max_gram_length": graph.Int(3), "max_skip_count": graph.Int(2),
				"ngram_counts": graph.Ints(0, 3, 7), "ngram_indexes": graph.Ints(0, 1, 2, 3, 5, 4), "pool_int64s": graph.Ints(0, 1, 3, 0, 1, 2, 2, 1, 0, 3),
				"weights": graph.Floats(0.5, 1.5, 2, 0.25, 1, 3),
			}
			c.expect(c.op("TfIdfVectorizer", attrs, x), ref("TfIdfVectorizer", attrs, tensorFrom(graph.Int64, rx)))
		})
	}
	return append(append(cs, bitShiftCases()...), maxPoolIndexCases()...)
}

// maxPoolIndexCases check MaxPool's Indices output in both storage orders
// (on values with ties: the first maximum's index), and MaxPool on int64.
func maxPoolIndexCases() []opCase {
	var cs []opCase
	for _, so := range []int64{0, 1} {
		cs = append(cs, opCase{op: "MaxPool", name: fmt.Sprintf("indices_storage_order%d", so), fn: func(c *ctx) {
			x, rx := c.input(c.dt, fewValues, 2, 2, 5, 4)
			attrs := graph.Attrs{"kernel_shape": graph.Ints(2, 3), "strides": graph.Ints(2, 1), "pads": graph.Ints(1, 1, 0, 1), "storage_order": graph.Int(so)}
			outs := c.opN("MaxPool", attrs, x)
			want := refN("MaxPool", attrs, f64(rx))
			c.expect(outs[0], want[0])
			c.expect(outs[1], want[1])
		}})
	}
	cs = append(cs, opCase{op: "MaxPool", name: "int64", dts: onlyInt64, fn: func(c *ctx) {
		x, rx := c.input(graph.Int64, ints(-1000, 1000), 1, 3, 4, 4)
		attrs := graph.Attrs{"kernel_shape": graph.Ints(2, 2), "strides": graph.Ints(2, 2)}
		c.expect(c.op("MaxPool", attrs, x), ref("MaxPool", attrs, tensorFrom(graph.Int64, rx)))
	}})
	return cs
}

// bitShiftCases shift non-negative int64 values (the unsigned values the
// graph holds) both ways, by amounts up to 70 (a right shift of 63 or more
// gives 0; a left shift wraps as a 64-bit shift does).
func bitShiftCases() []opCase {
	var cs []opCase
	for _, dir := range []string{"LEFT", "RIGHT"} {
		cs = append(cs, opCase{op: "BitShift", name: dir, dts: onlyInt64, fn: func(c *ctx) {
			x, rx := c.input(graph.Int64, ints(0, 1<<20), 3, 5)
			n, rn := c.input(graph.Int64, ints(0, 70), 5)
			attrs := graph.Attrs{"direction": graph.Str(dir)}
			c.expect(c.op("BitShift", attrs, x, n), ref("BitShift", attrs, tensorFrom(graph.Int64, rx), tensorFrom(graph.Int64, rn)))
		}})
	}
	return cs
}
