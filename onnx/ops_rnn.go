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
	*rewrite // the node's steps, which keep the first error
	c        *opCtx
	op       string
	gates    int // 1, 3 or 4
	hidden   int
	batch    int
	steps    int
	dt       graph.DType
	acts     []string // the activations of one direction
	clip     float64  // 0: none
	lbr      bool     // GRU's linear_before_reset
	lens     *graph.Value
	zeros    *graph.Value // [batch, hidden]
}

func importRecurrent(c *opCtx) error {
	r := &recurrent{rewrite: c.rewrite(), c: c, op: c.n.OpType, gates: map[string]int{"RNN": 1, "GRU": 3, "LSTM": 4}[c.n.OpType]}
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
	x, w, rw := r.need(0), r.need(1), r.need(2)
	if r.err != nil {
		return r.err
	}
	xs := x.Type.Shape
	if xs.Rank() != 3 || !x.Type.DType.IsFloat() {
		return c.errf("X %v: want a float [seq, batch, input] (or [batch, seq, input] with layout 1)", x.Type)
	}
	if layout == 1 {
		if x = r.sub("Transpose", graph.Attrs{"perm": graph.Ints(1, 0, 2)}, x); r.err != nil {
			return r.err
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
		y, hT, cT := r.direction(d, rev, x, w, rw, b, h0, c0, p)
		if r.err != nil {
			return r.err
		}
		ys, hs, cs = append(ys, y), append(hs, hT), append(cs, cT)
	}
	return r.outputs(layout, ys, hs, cs)
}

// slice is v[lo:hi] along axis.
func (r *recurrent) slice(v *graph.Value, axis, lo, hi int) *graph.Value {
	s, _ := r.rewrite.slice(v, int64(axis), int64(lo), int64(hi))
	return s
}

func (r *recurrent) reshape(v *graph.Value, dims ...int64) *graph.Value {
	return r.sub("Reshape", nil, v, r.ints("shape", dims))
}

// of is direction d's part of a [dirs, ...] operand, as [rest...].
func (r *recurrent) of(v *graph.Value, d int, dims ...int64) *graph.Value {
	if v == nil {
		return nil
	}
	return r.reshape(r.slice(v, 0, d, d+1), dims...)
}

func (r *recurrent) act(i int, v *graph.Value) *graph.Value {
	return r.sub(r.acts[i], nil, v)
}

// clipped applies the clip attribute (to each gate's input).
func (r *recurrent) clipped(v *graph.Value) *graph.Value {
	if r.clip == 0 {
		return v
	}
	hi := r.scalar("clip", r.dt, r.clip)
	lo := r.scalar("neg_clip", r.dt, -r.clip)
	return r.sub("Max", nil, r.sub("Min", nil, v, hi), lo)
}

// direction writes one direction's steps and returns Y [seq, 1, batch,
// hidden] and the final H and C as [1, batch, hidden] (C nil but for LSTM).
func (r *recurrent) direction(d int, rev bool, x, w, rw, b, h0, c0, p *graph.Value) (y, hT, cT *graph.Value) {
	g, h, n := r.gates, int64(r.hidden), r.batch
	in := int64(x.Type.Shape[2])
	reverse := graph.Attrs{"batch_axis": graph.Int(1), "time_axis": graph.Int(0)}
	if rev {
		if r.lens != nil {
			x = r.sub("ReverseSequence", reverse, x, r.lens)
		} else {
			x = r.reverseSteps(x)
		}
	}
	wt := r.sub("Transpose", nil, r.of(w, d, int64(g)*h, in))
	rt := r.sub("Transpose", nil, r.of(rw, d, int64(g)*h, h)) // [hidden, gates·hidden]
	// The input projection of every step at once: [seq, batch, gates·hidden].
	xw := r.sub("MatMul", nil, x, wt)
	var rb *graph.Value // the recurrent bias, added to H·Rᵀ
	if b != nil {
		bd := r.of(b, d, 2*int64(g)*h)
		wb := r.slice(bd, 0, 0, g*r.hidden)
		rb = r.slice(bd, 0, g*r.hidden, 2*g*r.hidden)
		xw = r.sub("Add", nil, xw, wb)
	}
	hPrev, cPrev := r.zeros, r.zeros
	if h0 != nil {
		hPrev = r.of(h0, d, int64(n), h)
	}
	if c0 != nil {
		cPrev = r.of(c0, d, int64(n), h)
	}
	var peep []*graph.Value // LSTM's P: i, o, f
	if p != nil {
		pd := r.of(p, d, 3*h)
		for k := range 3 {
			peep = append(peep, r.slice(pd, 0, k*r.hidden, (k+1)*r.hidden))
		}
	}
	var steps []*graph.Value
	for t := range r.steps {
		if r.err != nil {
			return nil, nil, nil
		}
		xt := r.reshape(r.slice(xw, 0, t, t+1), int64(n), int64(g)*h)
		hNew, cNew := r.step(xt, hPrev, cPrev, rt, rb, peep)
		out := hNew
		if r.lens != nil {
			// Entries whose sequence has ended keep their state; their output is 0.
			tv := r.scalar(fmt.Sprintf("step%d", t), graph.Int64, float64(t))
			live := r.reshape(r.sub("Greater", nil, r.lens, tv), int64(n), 1)
			out = r.sub("Where", nil, live, hNew, r.zeros)
			hNew = r.sub("Where", nil, live, hNew, hPrev)
			if cNew != nil {
				cNew = r.sub("Where", nil, live, cNew, cPrev)
			}
		}
		steps = append(steps, r.reshape(out, 1, 1, int64(n), h))
		hPrev, cPrev = hNew, cNew
	}
	y = r.sub("Concat", graph.Attrs{"axis": graph.Int(0)}, steps...)
	if rev {
		if r.lens != nil {
			y3 := r.sub("ReverseSequence", reverse, r.reshape(y, int64(r.steps), int64(n), h), r.lens)
			y = r.reshape(y3, int64(r.steps), 1, int64(n), h)
		} else {
			y = r.reverseSteps(y)
		}
	}
	hT = r.reshape(hPrev, 1, int64(n), h)
	if r.op == "LSTM" {
		cT = r.reshape(cPrev, 1, int64(n), h)
	}
	return y, hT, cT
}

// reverseSteps reverses axis 0 (every entry runs the whole sequence).
func (r *recurrent) reverseSteps(v *graph.Value) *graph.Value {
	idx := make([]int64, r.steps)
	for i := range idx {
		idx[i] = int64(r.steps - 1 - i)
	}
	return r.sub("Gather", graph.Attrs{"axis": graph.Int(0)}, v, r.ints("reversed", idx))
}

// step is one time step: the new H (and C for LSTM) from the step's input
// projection xt [batch, gates·hidden] and the previous state.
func (r *recurrent) step(xt, hPrev, cPrev, rt, rb *graph.Value, peep []*graph.Value) (hNew, cNew *graph.Value) {
	hd := r.hidden
	rec := r.sub("MatMul", nil, hPrev, rt)
	if rb != nil {
		rec = r.sub("Add", nil, rec, rb)
	}
	gate := func(v *graph.Value, k int) *graph.Value { return r.slice(v, 1, k*hd, (k+1)*hd) }
	// pre is gate k's input: its input projection plus its recurrent term.
	pre := func(k int) *graph.Value { return r.sub("Add", nil, gate(xt, k), gate(rec, k)) }
	activate := func(i int, v *graph.Value) *graph.Value { return r.act(i, r.clipped(v)) }
	switch r.op {
	case "RNN":
		return activate(0, pre(0)), nil
	case "GRU": // gates z, r, h
		z := activate(0, pre(0))
		rg := activate(0, pre(1))
		xh := gate(xt, 2)
		var hh *graph.Value
		if r.lbr { // xh + r ⊙ (H·Rhᵀ + Rbh)
			hh = r.sub("Mul", nil, rg, gate(rec, 2))
		} else { // xh + (r ⊙ H)·Rhᵀ + Rbh
			rhT := r.slice(rt, 1, 2*hd, 3*hd)
			hh = r.sub("MatMul", nil, r.sub("Mul", nil, rg, hPrev), rhT)
			if rb != nil {
				hh = r.sub("Add", nil, hh, r.slice(rb, 0, 2*hd, 3*hd))
			}
		}
		ht := activate(1, r.sub("Add", nil, xh, hh))
		// H = (1 − z) ⊙ h + z ⊙ H_prev = h + z ⊙ (H_prev − h)
		return r.sub("Add", nil, ht, r.sub("Mul", nil, z, r.sub("Sub", nil, hPrev, ht))), nil
	}
	// LSTM: gates i, o, f, c; peepholes i, o, f.
	withPeep := func(v *graph.Value, k int, cs *graph.Value) *graph.Value {
		if peep == nil {
			return v
		}
		return r.sub("Add", nil, v, r.sub("Mul", nil, peep[k], cs))
	}
	ig := activate(0, withPeep(pre(0), 0, cPrev))
	fg := activate(0, withPeep(pre(2), 2, cPrev))
	cg := activate(1, pre(3))
	cNew = r.sub("Add", nil, r.sub("Mul", nil, fg, cPrev), r.sub("Mul", nil, ig, cg))
	og := activate(0, withPeep(pre(1), 1, cNew))
	return r.sub("Mul", nil, og, r.act(2, cNew)), cNew
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
		switch {
		case layout == 1:
			v := o.parts[0]
			if len(o.parts) > 1 {
				v = r.sub("Concat", concat, o.parts...)
			}
			r.emitOutput(i, "Transpose", graph.Attrs{"perm": graph.Ints(o.perm...)}, v)
		case len(o.parts) > 1:
			r.emitOutput(i, "Concat", concat, o.parts...)
		default:
			r.emitOutput(i, "Identity", nil, o.parts[0])
		}
		if r.err != nil {
			return r.err
		}
	}
	return nil
}
