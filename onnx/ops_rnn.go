package onnx

import (
	"fmt"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// RNN, GRU and LSTM are imported unrolled over their static sequence
// length: each step is the ONNX definition's formula written in table ops
// (MatMul, Add, Mul, Sigmoid, Tanh, ...), so the layers run on every
// backend and train with the table's gradient rules. The input projection
// of all steps is one MatMul; each step then adds H·Rᵀ. A graph grows by a
// few dozen nodes per step and direction, so a long sequence makes a large
// graph. sequence_lens masks each batch entry's steps past its length
// (its state holds, its outputs are 0); a reverse direction runs on the
// input reversed within each entry's length (ReverseSequence).

func init() {
	for _, op := range []string{"RNN", "GRU", "LSTM"} {
		handlers[op] = importRecurrent
	}
}

// recurrent is one RNN, GRU or LSTM node being written out.
type recurrent struct {
	c      *opCtx
	op     string
	gates  int // 1, 3 or 4
	hidden int
	batch  int
	steps  int
	dt     graph.DType
	acts   []string // the activations of one direction
	clip   float64  // 0: none
	lbr    bool     // GRU's linear_before_reset
	lens   *graph.Value
	zeros  *graph.Value // [batch, hidden]
}

func importRecurrent(c *opCtx) error {
	r := &recurrent{c: c, op: c.n.OpType, gates: map[string]int{"RNN": 1, "GRU": 3, "LSTM": 4}[c.n.OpType]}
	direction, err := c.attrString("direction", "forward")
	if err != nil {
		return err
	}
	dirs := map[string][]bool{"forward": {false}, "reverse": {true}, "bidirectional": {false, true}}[direction]
	if dirs == nil {
		return c.errf("direction %q is not forward, reverse or bidirectional", direction)
	}
	layout, err := c.attrInt("layout", 0)
	if err != nil {
		return err
	}
	if r.clip, err = c.attrFloat("clip", 0); err != nil {
		return err
	}
	if r.clip < 0 {
		return c.errf("clip %v is negative", r.clip)
	}
	for _, name := range []string{"activation_alpha", "activation_beta"} {
		if c.has(name) {
			return c.errf("%s (parameters of activations) is not supported", name)
		}
	}
	defaults := map[string][]string{"RNN": {"Tanh"}, "GRU": {"Sigmoid", "Tanh"}, "LSTM": {"Sigmoid", "Tanh", "Tanh"}}[r.op]
	acts := slices.Clone(defaults)
	if a, err := c.attr("activations", onnxpb.AttrStrings); err != nil {
		return err
	} else if a != nil {
		acts = nil
		for _, s := range a.Strings {
			acts = append(acts, string(s))
		}
	}
	if r.op == "RNN" && len(acts) == 2*len(defaults)-1 {
		acts = acts[:1] // RNN's default is listed once for both directions
	}
	if len(acts) != len(defaults) && len(acts) != len(defaults)*len(dirs) {
		return c.errf("activations %v: want %d per direction", acts, len(defaults))
	}
	for _, a := range acts {
		if !slices.Contains([]string{"Tanh", "Sigmoid", "Relu", "Softsign", "Softplus"}, a) {
			return c.errf("activation %q is not supported", a)
		}
	}
	if r.op == "GRU" {
		lbr, err := c.attrInt("linear_before_reset", 0)
		if err != nil {
			return err
		}
		r.lbr = lbr != 0
	}
	if r.op == "LSTM" {
		if f, err := c.attrInt("input_forget", 0); err != nil {
			return err
		} else if f != 0 {
			return c.errf("input_forget=1 is not supported")
		}
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	w, err := c.need(1)
	if err != nil {
		return err
	}
	rw, err := c.need(2)
	if err != nil {
		return err
	}
	xs := x.Type.Shape
	if xs.Rank() != 3 || !x.Type.DType.IsFloat() {
		return c.errf("X %v: want a float [seq, batch, input] (or [batch, seq, input] with layout 1)", x.Type)
	}
	if layout == 1 {
		if x, err = c.sub("Transpose", graph.Attrs{"perm": graph.Ints(1, 0, 2)}, x); err != nil {
			return err
		}
	} else if layout != 0 {
		return c.errf("layout %d: want 0 or 1", layout)
	}
	r.dt, r.steps, r.batch = x.Type.DType, x.Type.Shape[0], x.Type.Shape[1]
	nd, g := len(dirs), r.gates
	if r.steps*nd > maxUnroll {
		return c.errf("%d steps in %d directions: past the %d steps an unrolled graph may have", r.steps, nd, maxUnroll)
	}
	if ws := w.Type.Shape; ws.Rank() != 3 || ws[0] != nd || ws[1]%g != 0 || ws[2] != x.Type.Shape[2] {
		return c.errf("W %v: want [%d, %d·hidden, %d]", ws, nd, g, x.Type.Shape[2])
	}
	r.hidden = w.Type.Shape[1] / g
	if hs, err := c.attrInt("hidden_size", int64(r.hidden)); err != nil {
		return err
	} else if int(hs) != r.hidden {
		return c.errf("hidden_size %d disagrees with W %v", hs, w.Type.Shape)
	}
	h := r.hidden
	if !rw.Type.Shape.Equal(graph.Shape{nd, g * h, h}) {
		return c.errf("R %v: want [%d, %d, %d]", rw.Type.Shape, nd, g*h, h)
	}
	opt := func(i int, want graph.Shape, what string) (*graph.Value, error) {
		v, err := c.value(i)
		if err != nil || v == nil {
			return nil, err
		}
		if v.Type.DType != r.dt || !v.Type.Shape.Equal(want) {
			return nil, c.errf("%s %v: want %v%v", what, v.Type, r.dt, want)
		}
		return v, nil
	}
	b, err := opt(3, graph.Shape{nd, 2 * g * h}, "B")
	if err != nil {
		return err
	}
	if r.lens, err = c.value(4); err != nil {
		return err
	}
	if r.lens != nil && (r.lens.Type.DType != graph.Int64 || !r.lens.Type.Shape.Equal(graph.Shape{r.batch})) {
		return c.errf("sequence_lens %v: want integers [%d]", r.lens.Type, r.batch)
	}
	h0, err := opt(5, graph.Shape{nd, r.batch, h}, "initial_h")
	if err != nil {
		return err
	}
	var c0, p *graph.Value
	if r.op == "LSTM" {
		if c0, err = opt(6, graph.Shape{nd, r.batch, h}, "initial_c"); err != nil {
			return err
		}
		if p, err = opt(7, graph.Shape{nd, 3 * h}, "P"); err != nil {
			return err
		}
	}
	zc := newCval(onnxType(r.dt), graph.Shape{r.batch, h})
	if r.zeros, err = c.im.val(c.im.constant(c.nodeBase()+"/zeros", zc)); err != nil {
		return c.errf("%v", err)
	}

	var ys, hs, cs []*graph.Value // per direction: [seq, 1, batch, hidden], [1, batch, hidden]
	for d, rev := range dirs {
		a := acts
		if len(acts) > len(defaults) {
			a = acts[d*len(defaults) : (d+1)*len(defaults)]
		}
		r.acts = a
		y, hT, cT, err := r.direction(d, rev, x, w, rw, b, h0, c0, p)
		if err != nil {
			return err
		}
		ys, hs, cs = append(ys, y), append(hs, hT), append(cs, cT)
	}
	return r.outputs(layout, ys, hs, cs)
}

// slice is v[lo:hi] along axis.
func (r *recurrent) slice(v *graph.Value, axis, lo, hi int) (*graph.Value, error) {
	c := r.c
	st, err := c.ints("starts", []int64{int64(lo)})
	if err != nil {
		return nil, err
	}
	en, err := c.ints("ends", []int64{int64(hi)})
	if err != nil {
		return nil, err
	}
	ax, err := c.ints("axes", []int64{int64(axis)})
	if err != nil {
		return nil, err
	}
	return c.sub("Slice", nil, v, st, en, ax)
}

func (r *recurrent) reshape(v *graph.Value, dims ...int64) (*graph.Value, error) {
	s, err := r.c.ints("shape", dims)
	if err != nil {
		return nil, err
	}
	return r.c.sub("Reshape", nil, v, s)
}

// of is direction d's part of a [dirs, ...] operand, as [rest...].
func (r *recurrent) of(v *graph.Value, d int, dims ...int64) (*graph.Value, error) {
	if v == nil {
		return nil, nil
	}
	s, err := r.slice(v, 0, d, d+1)
	if err != nil {
		return nil, err
	}
	return r.reshape(s, dims...)
}

func (r *recurrent) act(i int, v *graph.Value) (*graph.Value, error) {
	return r.c.sub(r.acts[i], nil, v)
}

// clipped applies the clip attribute (to each gate's input).
func (r *recurrent) clipped(v *graph.Value) (*graph.Value, error) {
	if r.clip == 0 {
		return v, nil
	}
	hi, err := r.c.scalar("clip", r.dt, r.clip)
	if err != nil {
		return nil, err
	}
	lo, err := r.c.scalar("neg_clip", r.dt, -r.clip)
	if err != nil {
		return nil, err
	}
	if v, err = r.c.sub("Min", nil, v, hi); err != nil {
		return nil, err
	}
	return r.c.sub("Max", nil, v, lo)
}

// direction writes one direction's steps and returns Y [seq, 1, batch,
// hidden] and the final H and C as [1, batch, hidden] (C nil but for LSTM).
func (r *recurrent) direction(d int, rev bool, x, w, rw, b, h0, c0, p *graph.Value) (y, hT, cT *graph.Value, err error) {
	c, g, h, n := r.c, r.gates, int64(r.hidden), r.batch
	sub := c.sub
	if rev {
		if r.lens != nil {
			x, err = sub("ReverseSequence", graph.Attrs{"batch_axis": graph.Int(1), "time_axis": graph.Int(0)}, x, r.lens)
		} else {
			x, err = r.reverseSteps(x)
		}
		if err != nil {
			return nil, nil, nil, err
		}
	}
	wd, err := r.of(w, d, int64(g)*h, int64(x.Type.Shape[2]))
	if err != nil {
		return nil, nil, nil, err
	}
	wt, err := sub("Transpose", nil, wd)
	if err != nil {
		return nil, nil, nil, err
	}
	rd, err := r.of(rw, d, int64(g)*h, h)
	if err != nil {
		return nil, nil, nil, err
	}
	rt, err := sub("Transpose", nil, rd) // [hidden, gates·hidden]
	if err != nil {
		return nil, nil, nil, err
	}
	// The input projection of every step at once: [seq, batch, gates·hidden].
	xw, err := sub("MatMul", nil, x, wt)
	if err != nil {
		return nil, nil, nil, err
	}
	var rb *graph.Value // the recurrent bias, added to H·Rᵀ
	if b != nil {
		bd, err := r.of(b, d, 2*int64(g)*h)
		if err != nil {
			return nil, nil, nil, err
		}
		wb, err := r.slice(bd, 0, 0, g*r.hidden)
		if err != nil {
			return nil, nil, nil, err
		}
		if rb, err = r.slice(bd, 0, g*r.hidden, 2*g*r.hidden); err != nil {
			return nil, nil, nil, err
		}
		if xw, err = sub("Add", nil, xw, wb); err != nil {
			return nil, nil, nil, err
		}
	}
	hPrev, cPrev := r.zeros, r.zeros
	if h0 != nil {
		if hPrev, err = r.of(h0, d, int64(n), h); err != nil {
			return nil, nil, nil, err
		}
	}
	if c0 != nil {
		if cPrev, err = r.of(c0, d, int64(n), h); err != nil {
			return nil, nil, nil, err
		}
	}
	var peep []*graph.Value // LSTM's P: i, o, f
	if p != nil {
		pd, err := r.of(p, d, 3*h)
		if err != nil {
			return nil, nil, nil, err
		}
		for k := range 3 {
			pk, err := r.slice(pd, 0, k*r.hidden, (k+1)*r.hidden)
			if err != nil {
				return nil, nil, nil, err
			}
			peep = append(peep, pk)
		}
	}
	var steps []*graph.Value
	for t := range r.steps {
		xt, err := r.slice(xw, 0, t, t+1)
		if err != nil {
			return nil, nil, nil, err
		}
		if xt, err = r.reshape(xt, int64(n), int64(g)*h); err != nil {
			return nil, nil, nil, err
		}
		hNew, cNew, err := r.step(xt, hPrev, cPrev, rt, rb, peep)
		if err != nil {
			return nil, nil, nil, err
		}
		out := hNew
		if r.lens != nil {
			// Entries whose sequence has ended keep their state; their output is 0.
			tv, err := c.scalar(fmt.Sprintf("step%d", t), graph.Int64, float64(t))
			if err != nil {
				return nil, nil, nil, err
			}
			live, err := sub("Greater", nil, r.lens, tv)
			if err != nil {
				return nil, nil, nil, err
			}
			if live, err = r.reshape(live, int64(n), 1); err != nil {
				return nil, nil, nil, err
			}
			if out, err = sub("Where", nil, live, hNew, r.zeros); err != nil {
				return nil, nil, nil, err
			}
			if hNew, err = sub("Where", nil, live, hNew, hPrev); err != nil {
				return nil, nil, nil, err
			}
			if cNew != nil {
				if cNew, err = sub("Where", nil, live, cNew, cPrev); err != nil {
					return nil, nil, nil, err
				}
			}
		}
		if out, err = r.reshape(out, 1, 1, int64(n), h); err != nil {
			return nil, nil, nil, err
		}
		steps = append(steps, out)
		hPrev, cPrev = hNew, cNew
	}
	if y, err = sub("Concat", graph.Attrs{"axis": graph.Int(0)}, steps...); err != nil {
		return nil, nil, nil, err
	}
	if rev {
		if r.lens != nil {
			y3, err := r.reshape(y, int64(r.steps), int64(n), h)
			if err != nil {
				return nil, nil, nil, err
			}
			if y3, err = sub("ReverseSequence", graph.Attrs{"batch_axis": graph.Int(1), "time_axis": graph.Int(0)}, y3, r.lens); err != nil {
				return nil, nil, nil, err
			}
			y, err = r.reshape(y3, int64(r.steps), 1, int64(n), h)
		} else {
			y, err = r.reverseSteps(y)
		}
		if err != nil {
			return nil, nil, nil, err
		}
	}
	if hT, err = r.reshape(hPrev, 1, int64(n), h); err != nil {
		return nil, nil, nil, err
	}
	if r.op == "LSTM" {
		if cT, err = r.reshape(cPrev, 1, int64(n), h); err != nil {
			return nil, nil, nil, err
		}
	}
	return y, hT, cT, nil
}

// reverseSteps reverses axis 0 (every entry runs the whole sequence).
func (r *recurrent) reverseSteps(v *graph.Value) (*graph.Value, error) {
	idx := make([]int64, r.steps)
	for i := range idx {
		idx[i] = int64(r.steps - 1 - i)
	}
	iv, err := r.c.ints("reversed", idx)
	if err != nil {
		return nil, err
	}
	return r.c.sub("Gather", graph.Attrs{"axis": graph.Int(0)}, v, iv)
}

// step is one time step: the new H (and C for LSTM) from the step's input
// projection xt [batch, gates·hidden] and the previous state.
func (r *recurrent) step(xt, hPrev, cPrev, rt, rb *graph.Value, peep []*graph.Value) (hNew, cNew *graph.Value, err error) {
	c, hd := r.c, r.hidden
	sub := c.sub
	rec, err := sub("MatMul", nil, hPrev, rt)
	if err != nil {
		return nil, nil, err
	}
	if rb != nil {
		if rec, err = sub("Add", nil, rec, rb); err != nil {
			return nil, nil, err
		}
	}
	gate := func(v *graph.Value, k int) (*graph.Value, error) { return r.slice(v, 1, k*hd, (k+1)*hd) }
	// pre is gate k's input: its input projection plus its recurrent term.
	pre := func(k int) (*graph.Value, error) {
		a, err := gate(xt, k)
		if err != nil {
			return nil, err
		}
		b, err := gate(rec, k)
		if err != nil {
			return nil, err
		}
		return sub("Add", nil, a, b)
	}
	activate := func(i int, v *graph.Value) (*graph.Value, error) {
		v, err := r.clipped(v)
		if err != nil {
			return nil, err
		}
		return r.act(i, v)
	}
	switch r.op {
	case "RNN":
		v, err := pre(0)
		if err != nil {
			return nil, nil, err
		}
		hNew, err = activate(0, v)
		return hNew, nil, err
	case "GRU": // gates z, r, h
		zp, err := pre(0)
		if err != nil {
			return nil, nil, err
		}
		z, err := activate(0, zp)
		if err != nil {
			return nil, nil, err
		}
		rp, err := pre(1)
		if err != nil {
			return nil, nil, err
		}
		rg, err := activate(0, rp)
		if err != nil {
			return nil, nil, err
		}
		xh, err := gate(xt, 2)
		if err != nil {
			return nil, nil, err
		}
		var hh *graph.Value
		if r.lbr { // xh + r ⊙ (H·Rhᵀ + Rbh)
			rh, err := gate(rec, 2)
			if err != nil {
				return nil, nil, err
			}
			if hh, err = sub("Mul", nil, rg, rh); err != nil {
				return nil, nil, err
			}
		} else { // xh + (r ⊙ H)·Rhᵀ + Rbh
			rhT, err := r.slice(rt, 1, 2*hd, 3*hd)
			if err != nil {
				return nil, nil, err
			}
			m, err := sub("Mul", nil, rg, hPrev)
			if err != nil {
				return nil, nil, err
			}
			if hh, err = sub("MatMul", nil, m, rhT); err != nil {
				return nil, nil, err
			}
			if rb != nil {
				bh, err := r.slice(rb, 0, 2*hd, 3*hd)
				if err != nil {
					return nil, nil, err
				}
				if hh, err = sub("Add", nil, hh, bh); err != nil {
					return nil, nil, err
				}
			}
		}
		hp, err := sub("Add", nil, xh, hh)
		if err != nil {
			return nil, nil, err
		}
		ht, err := activate(1, hp)
		if err != nil {
			return nil, nil, err
		}
		// H = (1 − z) ⊙ h + z ⊙ H_prev = h + z ⊙ (H_prev − h)
		diff, err := sub("Sub", nil, hPrev, ht)
		if err != nil {
			return nil, nil, err
		}
		zd, err := sub("Mul", nil, z, diff)
		if err != nil {
			return nil, nil, err
		}
		hNew, err = sub("Add", nil, ht, zd)
		return hNew, nil, err
	}
	// LSTM: gates i, o, f, c; peepholes i, o, f.
	withPeep := func(v *graph.Value, k int, cs *graph.Value) (*graph.Value, error) {
		if peep == nil {
			return v, nil
		}
		pc, err := sub("Mul", nil, peep[k], cs)
		if err != nil {
			return nil, err
		}
		return sub("Add", nil, v, pc)
	}
	ip, err := pre(0)
	if err != nil {
		return nil, nil, err
	}
	if ip, err = withPeep(ip, 0, cPrev); err != nil {
		return nil, nil, err
	}
	ig, err := activate(0, ip)
	if err != nil {
		return nil, nil, err
	}
	fp, err := pre(2)
	if err != nil {
		return nil, nil, err
	}
	if fp, err = withPeep(fp, 2, cPrev); err != nil {
		return nil, nil, err
	}
	fg, err := activate(0, fp)
	if err != nil {
		return nil, nil, err
	}
	cp, err := pre(3)
	if err != nil {
		return nil, nil, err
	}
	cg, err := activate(1, cp)
	if err != nil {
		return nil, nil, err
	}
	kept, err := sub("Mul", nil, fg, cPrev)
	if err != nil {
		return nil, nil, err
	}
	added, err := sub("Mul", nil, ig, cg)
	if err != nil {
		return nil, nil, err
	}
	if cNew, err = sub("Add", nil, kept, added); err != nil {
		return nil, nil, err
	}
	op, err := pre(1)
	if err != nil {
		return nil, nil, err
	}
	if op, err = withPeep(op, 1, cNew); err != nil {
		return nil, nil, err
	}
	og, err := activate(0, op)
	if err != nil {
		return nil, nil, err
	}
	hc, err := r.act(2, cNew)
	if err != nil {
		return nil, nil, err
	}
	hNew, err = sub("Mul", nil, og, hc)
	return hNew, cNew, err
}

// outputs writes Y [seq, dirs, batch, hidden], Y_h and Y_c [dirs, batch,
// hidden] (layout 1: [batch, seq, dirs, hidden] and [batch, dirs, hidden])
// where the model reads them.
func (r *recurrent) outputs(layout int64, ys, hs, cs []*graph.Value) error {
	c := r.c
	for i, o := range []struct {
		parts []*graph.Value
		axis  int64
		perm  []int64
	}{{ys, 1, []int64{2, 0, 1, 3}}, {hs, 0, []int64{1, 0, 2}}, {cs, 0, []int64{1, 0, 2}}} {
		if !c.outputUsed(i) {
			continue
		}
		if i == 2 && r.op != "LSTM" {
			return c.errf("%s has no output %d", r.op, i)
		}
		concat := graph.Attrs{"axis": graph.Int(o.axis)}
		var err error
		switch {
		case layout == 1:
			v := o.parts[0]
			if len(o.parts) > 1 {
				if v, err = c.sub("Concat", concat, o.parts...); err != nil {
					return err
				}
			}
			err = c.emitOutput(i, "Transpose", graph.Attrs{"perm": graph.Ints(o.perm...)}, v)
		case len(o.parts) > 1:
			err = c.emitOutput(i, "Concat", concat, o.parts...)
		default:
			err = c.emitOutput(i, "Identity", nil, o.parts[0])
		}
		if err != nil {
			return err
		}
	}
	return nil
}
