package backendtest

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

// fusedCases check FusedElementwise: bodies like the ones fuse_elementwise
// makes of a training step (SiLU·up, RMSNorm scaling, rsqrt of a mean, a
// masked exponential), with broadcasting operands, several outputs, shapes
// whose innermost axis allows 16-byte vectors and shapes that do not. The
// reference applies each step's own definition in float64 and rounds its
// result to the step's dtype, as a chain of separate nodes would.
func fusedCases() []opCase {
	var cs []opCase
	add := func(name string, fn func(c *ctx)) {
		cs = append(cs, opCase{op: "FusedElementwise", name: name, fn: fn})
	}
	// rnd rounds a step's reference result to the case's dtype.
	rnd := func(c *ctx, a *arr) *arr { return mapArr(a, func(v float64) float64 { return roundTo(c.dt, v) }) }
	fused := func(c *ctx, body string, outs []int64, ins ...*graph.Value) []*graph.Value {
		return c.opN("FusedElementwise", graph.Attrs{"body": graph.Str(body), "outputs": graph.Ints(outs...)}, ins...)
	}
	for _, sh := range [][]int{{3, 5, 7}, {4, 16, 64}} {
		add("silu_mul_"+shapeName(sh), func(c *ctx) {
			x, rx := c.input(c.dt, normal, sh...)
			u, ru := c.input(c.dt, normal, sh...)
			ys := fused(c, "Sigmoid(i0);Mul(i0,t0);Mul(t1,i1)", []int64{2, 0}, x, u)
			s := rnd(c, refElem("Sigmoid", rx))
			c.expect(ys[0], refElem("Mul", rnd(c, refElem("Mul", rx, s)), ru))
			c.expect(ys[1], s)
		})
	}
	add("rmsnorm_scale_[4,6,16]_[4,6,1]_[16]", func(c *ctx) {
		x, rx := c.input(c.dt, normal, 4, 6, 16)
		r, rr := c.input(c.dt, positive, 4, 6, 1)
		w, rw := c.input(c.dt, normal, 16)
		ys := fused(c, "Mul(i0,i1);Mul(t0,i2)", []int64{0, 1}, x, r, w)
		t0 := rnd(c, refElem("Mul", rx, rr))
		c.expect(ys[0], t0)
		c.expect(ys[1], refElem("Mul", t0, rw))
	})
	add("rsqrt_of_mean_[4,32,1]_[]", func(c *ctx) {
		m, rm := c.input(c.dt, positive, 4, 32, 1)
		e, re := c.input(c.dt, constGen(1e-5))
		ys := fused(c, "Add(i0,i1);Sqrt(t0);Reciprocal(t1)", []int64{2}, m, e)
		t1 := rnd(c, refElem("Sqrt", rnd(c, refElem("Add", rm, re))))
		c.expect(ys[0], mapArr(t1, func(x float64) float64 { return 1 / x }))
	})
	add("where_exp_add_c[5,1]_x[5,8]_y[]_z[8]", func(c *ctx) {
		cond, rc := c.input(graph.Bool, coin, 5, 1)
		x, rx := c.input(c.dt, scaled(2, normal), 5, 8)
		y, ry := c.input(c.dt, scaled(2, normal))
		z, rz := c.input(c.dt, normal, 8)
		ys := fused(c, "Where(i0,i1,i2);Exp(t0);Add(t1,i3)", []int64{2}, cond, x, y, z)
		w := newArr(5, 8)
		for i := range 5 {
			for j := range 8 {
				if rc.data[i] != 0 {
					w.data[i*8+j] = rx.data[i*8+j]
				} else {
					w.data[i*8+j] = ry.data[0]
				}
			}
		}
		c.expect(ys[0], refElem("Add", rnd(c, mapArr(w, math.Exp)), rz))
	})
	add("transposed_operand_[2,3,4,8]", func(c *ctx) {
		// An operand that reaches the body through a Transpose node is read
		// as its own (contiguous) tensor; the body sees values, not layouts.
		x, rx := c.input(c.dt, normal, 2, 4, 3, 8)
		xt := c.op("Transpose", graph.Attrs{"perm": graph.Ints(0, 2, 1, 3)}, x)
		y, ry := c.input(c.dt, normal, 2, 3, 4, 8)
		ys := fused(c, "Sub(i0,i1);Abs(t0);Neg(t1)", []int64{2}, xt, y)
		rt := &arr{shape: []int{2, 3, 4, 8}, data: make([]float64, len(rx.data))}
		for a := range 2 {
			for b := range 3 {
				for k := range 4 {
					for d := range 8 {
						rt.data[((a*3+b)*4+k)*8+d] = rx.data[((a*4+k)*3+b)*8+d]
					}
				}
			}
		}
		c.expect(ys[0], mapArr(rnd(c, refElem("Sub", rt, ry)), func(a float64) float64 { return -math.Abs(a) }))
	})
	// Bodies with a row reduction (axes [-1]): the element steps, the
	// reduction and the row steps after it, as fuse_elementwise makes of an
	// RMSNorm forward and a norm backward's row sum.
	red := func(c *ctx, op string, keepdims int, x *arr) *arr {
		return rnd(c, ref(op, graph.Attrs{"keepdims": graph.Int(int64(keepdims))}, f64(x), i64(-1)))
	}
	fusedRed := func(c *ctx, body string, keepdims int64, outs []int64, ins ...*graph.Value) []*graph.Value {
		return c.opN("FusedElementwise", graph.Attrs{"body": graph.Str(body), "outputs": graph.Ints(outs...),
			"axes": graph.Ints(-1), "keepdims": graph.Int(keepdims)}, ins...)
	}
	for _, sh := range [][]int{{4, 6, 64}, {3, 2, 768}, {5, 40}} {
		add("rmsnorm_rows_"+shapeName(sh), func(c *ctx) {
			x, rx := c.input(c.dt, normal, sh...)
			y, ry := c.input(c.dt, normal, sh...)
			e, re := c.input(c.dt, constGen(1e-5))
			ys := fusedRed(c, "Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3);Reciprocal(t4)", 1, []int64{0, 4, 5}, x, y, e)
			t0 := rnd(c, refElem("Add", rx, ry))
			t2 := red(c, "ReduceMean", 1, rnd(c, refElem("Mul", t0, t0)))
			t4 := rnd(c, refElem("Sqrt", rnd(c, refElem("Add", t2, re))))
			c.expect(ys[0], t0)
			c.expect(ys[1], t4)
			c.expect(ys[2], mapArr(t4, func(v float64) float64 { return 1 / v }))
		})
	}
	// Element steps after the reduction, reading the row values broadcast
	// along the row and element values from before it (a generated kernel
	// walks each row twice): a whole RMSNorm forward, and a norm
	// backward's dx with a per-row input read per element too.
	for _, sh := range [][]int{{4, 6, 64}, {3, 2, 768}, {5, 40}, {3, 37}} {
		add("rmsnorm_two_walks_"+shapeName(sh), func(c *ctx) {
			last := sh[len(sh)-1]
			x, rx := c.input(c.dt, normal, sh...)
			y, ry := c.input(c.dt, normal, sh...)
			e, re := c.input(c.dt, constGen(1e-5))
			w, rw := c.input(c.dt, normal, last)
			ys := fusedRed(c, "Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3);Reciprocal(t4);Mul(t0,t5);Mul(t6,i3)", 1,
				[]int64{0, 5, 7, 6}, x, y, e, w)
			t0 := rnd(c, refElem("Add", rx, ry))
			t2 := red(c, "ReduceMean", 1, rnd(c, refElem("Mul", t0, t0)))
			t4 := rnd(c, refElem("Sqrt", rnd(c, refElem("Add", t2, re))))
			t5 := rnd(c, mapArr(t4, func(v float64) float64 { return 1 / v }))
			t6 := rnd(c, refElem("Mul", t0, t5))
			c.expect(ys[0], t0)
			c.expect(ys[1], t5)
			c.expect(ys[2], refElem("Mul", t6, rw))
			c.expect(ys[3], t6)
		})
	}
	add("norm_backward_two_walks_[4,6,48]_[48]_[4,6,1]", func(c *ctx) {
		dy, rdy := c.input(c.dt, normal, 4, 6, 48)
		w, rw := c.input(c.dt, normal, 48)
		x, rx := c.input(c.dt, normal, 4, 6, 48)
		r, rr := c.input(c.dt, positive, 4, 6, 1)
		d, rd := c.input(c.dt, constGen(48))
		ys := fusedRed(c, "Mul(i0,i1);Mul(t0,i2);ReduceSum(t1);Mul(i3,i3);Mul(t3,i3);Mul(t2,t4);Div(t5,i4);Mul(t0,i3);Mul(i2,t6);Sub(t7,t8)", 1,
			[]int64{9}, dy, w, x, r, d)
		t0 := rnd(c, refElem("Mul", rdy, rw))
		t2 := red(c, "ReduceSum", 1, rnd(c, refElem("Mul", t0, rx)))
		t4 := rnd(c, refElem("Mul", rnd(c, refElem("Mul", rr, rr)), rr))
		t6 := rnd(c, refElem("Div", rnd(c, refElem("Mul", t2, t4)), rd))
		c.expect(ys[0], refElem("Sub", rnd(c, refElem("Mul", t0, rr)), rnd(c, refElem("Mul", rx, t6))))
	})
	// A whole attention/MLP norm backward: dy·x̂ an output before the
	// reduction (the weight gradient's column sum reads it), dy·w·rstd an
	// element step before it that only a late step reads, dx summed with the
	// residual's gradient.
	add("norm_backward_whole_[4,6,48]_[48]_[4,6,1]", func(c *ctx) {
		d0, rd0 := c.input(c.dt, normal, 4, 6, 48)
		d1, rd1 := c.input(c.dt, normal, 4, 6, 48)
		w, rw := c.input(c.dt, normal, 48)
		xh, rxh := c.input(c.dt, normal, 4, 6, 48)
		r, rr := c.input(c.dt, positive, 4, 6, 1)
		x, rx := c.input(c.dt, normal, 4, 6, 48)
		d, rd := c.input(c.dt, constGen(-48))
		up, rup := c.input(c.dt, normal, 4, 6, 48)
		ys := fusedRed(c, "Add(i0,i1);Mul(t0,i2);Mul(t0,i3);Mul(t1,i4);Mul(t1,i5);ReduceSum(t4);Mul(i4,i4);Mul(t6,i4);Mul(t5,t7);Div(t8,i6);Add(i7,t3);Mul(t9,i5);Add(t10,t11)", 1,
			[]int64{2, 12}, d0, d1, w, xh, r, x, d, up)
		t0 := rnd(c, refElem("Add", rd0, rd1))
		t1 := rnd(c, refElem("Mul", t0, rw))
		t3 := rnd(c, refElem("Mul", t1, rr))
		t5 := red(c, "ReduceSum", 1, rnd(c, refElem("Mul", t1, rx)))
		t7 := rnd(c, refElem("Mul", rnd(c, refElem("Mul", rr, rr)), rr))
		t9 := rnd(c, refElem("Div", rnd(c, refElem("Mul", t5, t7)), rd))
		c.expect(ys[0], refElem("Mul", t0, rxh))
		c.expect(ys[1], refElem("Add", rnd(c, refElem("Add", rup, t3)), rnd(c, refElem("Mul", t9, rx))))
	})
	add("norm_backward_rowsum_[4,6,48]_[48]_[4,6,1]", func(c *ctx) {
		g, rg := c.input(c.dt, normal, 4, 6, 48)
		w, rw := c.input(c.dt, normal, 48)
		r, rr := c.input(c.dt, positive, 4, 6, 1)
		// A row step before the reduction (r·r), as merged groups give.
		ys := fusedRed(c, "Mul(i2,i2);Mul(i0,i1);ReduceSum(t1);Mul(t2,t0);Neg(t3)", 1, []int64{4, 1}, g, w, r)
		t0 := rnd(c, refElem("Mul", rr, rr))
		t1 := rnd(c, refElem("Mul", rg, rw))
		t3 := rnd(c, refElem("Mul", red(c, "ReduceSum", 1, t1), t0))
		c.expect(ys[0], mapArr(t3, func(v float64) float64 { return -v }))
		c.expect(ys[1], t1)
	})
	add("rows_keepdims0_[5,7]_[5]", func(c *ctx) {
		x, rx := c.input(c.dt, scaled(0.5, normal), 5, 7)
		y, ry := c.input(c.dt, normal, 5)
		ys := fusedRed(c, "Exp(i0);ReduceSum(t0);Mul(t1,i1)", 0, []int64{2, 0}, x, y)
		t0 := rnd(c, refElem("Exp", rx))
		c.expect(ys[0], rnd(c, refElem("Mul", red(c, "ReduceSum", 0, t0), ry)))
		c.expect(ys[1], t0)
	})
	// Bodies with index steps, as fuse_elementwise absorbs a rotate-half
	// (RoPE) and its gradient: the Slices and Concats are positions, the
	// elementwise steps under them are computed where they select.
	slice := func(a *arr, axis, start, end int) *arr {
		return ref("Slice", nil, f64(a), i64(start), i64(end), i64(axis))
	}
	concat := func(axis int, xs ...*arr) *arr {
		ts := make([]*graph.Tensor, len(xs))
		for i, x := range xs {
			ts[i] = f64(x)
		}
		return ref("Concat", graph.Attrs{"axis": graph.Int(int64(axis))}, ts...)
	}
	for _, d := range []int{8, 16} { // 16: whole 16-byte vectors of bf16 on each side of the cut
		h := d / 2
		add(fmt.Sprintf("rope_rotate_half_[2,3,5,%d]", d), func(c *ctx) {
			x, rx := c.input(c.dt, normal, 2, 3, 5, d)
			cos, rc := c.input(c.dt, normal, 5, d)
			sin, rs := c.input(c.dt, normal, 5, d)
			body := fmt.Sprintf("Slice<3,0,%d>(i0);Slice<3,%d,%d>(i0);Neg(t1);Concat<3>(t2,t0);Mul(i0,i1);Mul(t3,i2);Add(t4,t5)", h, h, d)
			ys := fused(c, body, []int64{6}, x, cos, sin)
			rot := concat(3, rnd(c, mapArr(slice(rx, 3, h, d), func(v float64) float64 { return -v })), slice(rx, 3, 0, h))
			c.expect(ys[0], rnd(c, refElem("Add", rnd(c, refElem("Mul", rx, rc)), rnd(c, refElem("Mul", rot, rs)))))
		})
	}
	add("rope_gradient_[2,3,5,8]", func(c *ctx) {
		g, rg := c.input(c.dt, normal, 2, 3, 5, 8)
		sin, rs := c.input(c.dt, normal, 5, 8)
		cos, rc := c.input(c.dt, normal, 5, 8)
		z0, rz0 := c.input(c.dt, constGen(0), 2, 3, 5, 4)
		z1, rz1 := c.input(c.dt, constGen(0), 2, 3, 5, 4)
		ys := fused(c, "Mul(i0,i1);Mul(i0,i2);Slice<3,0,4>(t0);Slice<3,4,8>(t0);Neg(t2);Concat<3>(i3,t4);Concat<3>(t3,i4);Add(t1,t5);Add(t7,t6)",
			[]int64{8, 0}, g, sin, cos, z0, z1)
		m := rnd(c, refElem("Mul", rg, rs))
		t5 := concat(3, rz0, mapArr(slice(m, 3, 0, 4), func(v float64) float64 { return -v }))
		t6 := concat(3, slice(m, 3, 4, 8), rz1)
		t7 := rnd(c, refElem("Add", rnd(c, refElem("Mul", rg, rc)), t5))
		c.expect(ys[0], rnd(c, refElem("Add", t7, t6)))
		c.expect(ys[1], m)
	})
	add("roll_middle_axis_[4,6,8]", func(c *ctx) {
		// Index steps on an axis that is not the last: the branch is on a
		// middle coordinate and vectors along the last axis stay whole.
		x, rx := c.input(c.dt, normal, 4, 6, 8)
		w, rw := c.input(c.dt, normal, 4, 6, 8)
		ys := fused(c, "Slice<1,3,6>(i0);Neg(t0);Slice<1,0,3>(i0);Concat<1>(t1,t2);Add(t3,i1);Mul(t4,i1)", []int64{5}, x, w)
		roll := concat(1, mapArr(slice(rx, 1, 3, 6), func(v float64) float64 { return -v }), slice(rx, 1, 0, 3))
		c.expect(ys[0], rnd(c, refElem("Mul", rnd(c, refElem("Add", roll, rw)), rw)))
	})
	add("concat_three_[4,3]_[4,1]_[4,2]_axis1", func(c *ctx) {
		a, ra := c.input(c.dt, normal, 4, 3)
		b, rb := c.input(c.dt, normal, 4, 1)
		d, rd := c.input(c.dt, normal, 4, 2)
		w, rw := c.input(c.dt, normal, 6)
		ys := fused(c, "Exp(i1);Concat<1>(i0,t0,i2);Mul(t1,i3)", []int64{2}, a, b, d, w)
		c.expect(ys[0], rnd(c, refElem("Mul", concat(1, ra, rnd(c, mapArr(rb, math.Exp)), rd), rw)))
	})
	// Transpose steps, as fuse_elementwise absorbs a head split ([B,S,H,D]
	// to [B,H,S,D]) read by a norm and its merge written by the norm
	// backward: row kernels read each row at its permuted start, index
	// kernels read and write at permuted coordinates. A Transpose that moves
	// the last axis is read element by element.
	transpose := func(a *arr, perm ...int64) *arr {
		return ref("Transpose", graph.Attrs{"perm": graph.Ints(perm...)}, f64(a))
	}
	for _, d := range []int{64, 10} { // 64: 16-byte vectors along each row
		add(fmt.Sprintf("head_split_rmsnorm_rows_[2,5,3,%d]", d), func(c *ctx) {
			x, rx := c.input(c.dt, normal, 2, 5, 3, d)
			e, re := c.input(c.dt, constGen(1e-5))
			ys := fusedRed(c, "Transpose<0,2,1,3>(i0);Mul(t0,t0);ReduceMean(t1);Add(t2,i1);Sqrt(t3);Reciprocal(t4)", 1, []int64{0, 5}, x, e)
			t0 := transpose(rx, 0, 2, 1, 3)
			t2 := red(c, "ReduceMean", 1, rnd(c, refElem("Mul", t0, t0)))
			t4 := rnd(c, refElem("Sqrt", rnd(c, refElem("Add", t2, re))))
			c.expect(ys[0], t0)
			c.expect(ys[1], mapArr(t4, func(v float64) float64 { return 1 / v }))
		})
	}
	add("head_split_norm_backward_rows_[2,3,5,16]", func(c *ctx) {
		g, rg := c.input(c.dt, normal, 2, 3, 5, 16)
		x, rx := c.input(c.dt, normal, 2, 5, 3, 16)
		r, rr := c.input(c.dt, positive, 2, 3, 5, 1)
		ys := fusedRed(c, "Transpose<0,2,1,3>(i1);Mul(i0,t0);ReduceSum(t1);Mul(t2,i2)", 1, []int64{3}, g, x, r)
		t1 := rnd(c, refElem("Mul", rg, transpose(rx, 0, 2, 1, 3)))
		c.expect(ys[0], rnd(c, refElem("Mul", red(c, "ReduceSum", 1, t1), rr)))
	})
	add("head_merge_read_and_write_[2,3,5,16]", func(c *ctx) {
		g, rg := c.input(c.dt, normal, 2, 3, 5, 16)
		r, rr := c.input(c.dt, positive, 2, 3, 5, 1)
		x, rx := c.input(c.dt, normal, 2, 5, 3, 16)
		m, rm := c.input(c.dt, normal, 2, 3, 5, 1)
		ys := fused(c, "Mul(i0,i1);Transpose<0,2,1,3>(i2);Mul(t1,i3);Add(t0,t2);Transpose<0,2,1,3>(t3)", []int64{4}, g, r, x, m)
		t0 := rnd(c, refElem("Mul", rg, rr))
		t2 := rnd(c, refElem("Mul", transpose(rx, 0, 2, 1, 3), rm))
		c.expect(ys[0], transpose(rnd(c, refElem("Add", t0, t2)), 0, 2, 1, 3))
	})
	add("transpose_last_axis_[6,10]_[10,6]", func(c *ctx) {
		x, rx := c.input(c.dt, normal, 6, 10)
		w, rw := c.input(c.dt, normal, 10, 6)
		ys := fused(c, "Transpose<1,0>(i0);Neg(t0);Mul(t1,i1)", []int64{2}, x, w)
		c.expect(ys[0], rnd(c, refElem("Mul", mapArr(transpose(rx, 1, 0), func(v float64) float64 { return -v }), rw)))
	})
	return cs
}
