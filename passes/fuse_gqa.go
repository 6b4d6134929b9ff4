package passes

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// Grouped-query attention as exporters write it: K and V of H_kv heads
// repeated to Q's H heads before the attention (LLaMA's repeat_kv), so that
// the attention pattern sees equal head counts. FlashAttention takes the
// H_kv heads themselves (query head h reads K/V head h/(H/H_kv)), so the
// fusion reads K and V from before the repeat, and the repeat dies with the
// composed attention: no repeated K/V is materialised, forward or backward
// (FlashAttentionGrad sums dK, dV over each group).
//
// A repeat is recognised by what it does, not by how it is spelled: K (or
// V) is followed back through ops that only view or broadcast their input —
// Reshape, Unsqueeze, Squeeze, Expand and Concat of copies of one value
// (ONNX Tile imports as Reshape, Expand, Reshape) — as a strided view of
// the value they start from (kvView). That covers repeat_kv
// (x[:, :, None].expand(...).reshape(...)), the built-in model's
// Reshape/Expand/Reshape, Tile of an unsqueezed axis, a Concat of copies,
// and multi-query attention broadcasting one head. The view is grouped when
// the head axis is the K/V heads with an innermost broadcast of g copies
// (head h reads head h/g) and nothing else is broadcast. A Tile or Concat
// of whole head sets (head h reads head h mod H_kv) is not FlashAttention's
// grouping: that repeat stays, and the attention fuses over the repeated
// heads.

// viewFactor is one index of a strided view: size positions stride elements
// apart in the source (stride 0: broadcast copies).
type viewFactor struct{ size, stride int }

// stridedView is a value's elements as a view of src: per axis, its factors
// outermost first (size-1 factors dropped).
type stridedView struct {
	src  *graph.Value
	axes [][]viewFactor
}

// viewStep is one value of the chain from src up to the K or V operand,
// with its view of src.
type viewStep struct {
	v    *graph.Value
	view stridedView
}

// contiguous is the view of x as itself.
func contiguous(x *graph.Value) stridedView {
	s := x.Type.Shape
	axes := make([][]viewFactor, s.Rank())
	stride := 1
	for a := s.Rank() - 1; a >= 0; a-- {
		if s[a] > 1 {
			axes[a] = []viewFactor{{s[a], stride}}
		}
		stride *= s[a]
	}
	return stridedView{src: x, axes: axes}
}

// maxViewDepth bounds the walk: repeats are a few ops deep.
const maxViewDepth = 16

// viewChain follows x back through view and broadcast ops and returns the
// chain, source first, x last.
func viewChain(x *graph.Value, depth int) []viewStep {
	p := x.Producer
	if p == nil || depth >= maxViewDepth || len(p.Inputs) == 0 || p.Inputs[0] == nil {
		return []viewStep{{x, contiguous(x)}}
	}
	in := p.Inputs[0]
	out := x.Type.Shape
	var chain []viewStep
	var view stridedView
	ok := false
	switch p.Op {
	case "Reshape", "Unsqueeze", "Squeeze", "Flatten":
		chain = viewChain(in, depth+1)
		view, ok = regroup(chain[len(chain)-1].view, out)
	case "Expand":
		chain = viewChain(in, depth+1)
		view, ok = expandView(chain[len(chain)-1].view, in.Type.Shape, out)
	case "Concat":
		ax, err := graph.NormAxis(int(p.Attrs.Int("axis", 0)), out.Rank())
		same := err == nil
		for _, u := range p.Inputs {
			same = same && u == in
		}
		if same {
			chain = viewChain(in, depth+1)
			view, ok = concatCopiesView(chain[len(chain)-1].view, len(p.Inputs), ax)
		}
	}
	if !ok {
		return []viewStep{{x, contiguous(x)}}
	}
	return append(chain, viewStep{x, view})
}

// regroup is the view v reshaped to shape (row-major, as Reshape): its
// factors in order, split where an axis needs part of one.
func regroup(v stridedView, shape graph.Shape) (stridedView, bool) {
	var flat []viewFactor
	for _, fs := range v.axes {
		flat = append(flat, fs...)
	}
	axes := make([][]viewFactor, shape.Rank())
	for a, n := range shape {
		for n > 1 {
			if len(flat) == 0 {
				return stridedView{}, false
			}
			f := flat[0]
			switch {
			case n%f.size == 0:
				axes[a] = append(axes[a], f)
				flat = flat[1:]
				n /= f.size
			case f.size%n == 0:
				// The outer part of f fills the axis; its inner part is left.
				axes[a] = append(axes[a], viewFactor{n, f.stride * (f.size / n)})
				flat[0] = viewFactor{f.size / n, f.stride}
				n = 1
			default:
				return stridedView{}, false
			}
		}
	}
	if len(flat) != 0 {
		return stridedView{}, false
	}
	return stridedView{src: v.src, axes: axes}, true
}

// expandView broadcasts v (of shape in) to out, numpy style.
func expandView(v stridedView, in, out graph.Shape) (stridedView, bool) {
	pad := out.Rank() - in.Rank()
	if pad < 0 {
		return stridedView{}, false
	}
	axes := make([][]viewFactor, out.Rank())
	for a, n := range out {
		d := 1
		if a >= pad {
			d = in[a-pad]
			axes[a] = v.axes[a-pad]
		}
		switch {
		case d == n:
		case d == 1:
			axes[a] = []viewFactor{{n, 0}}
		default:
			return stridedView{}, false
		}
	}
	return stridedView{src: v.src, axes: axes}, true
}

// concatCopiesView is c copies of v concatenated along axis: the copy is the
// axis's outermost index.
func concatCopiesView(v stridedView, c, axis int) (stridedView, bool) {
	axes := make([][]viewFactor, len(v.axes))
	copy(axes, v.axes)
	if c > 1 {
		axes[axis] = append([]viewFactor{{c, 0}}, v.axes[axis]...)
	}
	return stridedView{src: v.src, axes: axes}, true
}

// kvRepeat is a K or V operand that repeats the heads of a smaller tensor:
// head h of the operand is head h/group of [.., H/group, S, D] read from src.
type kvRepeat struct {
	src   *graph.Value // the K/V heads, or a value that is them reshaped
	shape graph.Shape  // [.., H/group, S, D]
	group int
}

// repeatedHeads says how x [.., H, S, D] repeats the heads of a smaller
// tensor, or why it does not.
func repeatedHeads(x *graph.Value) (kvRepeat, string) {
	s := x.Type.Shape
	r := s.Rank()
	if r != 3 && r != 4 {
		return kvRepeat{}, fmt.Sprintf("%s is rank %d", x.Name, r)
	}
	chain := viewChain(x, 0)
	v := chain[len(chain)-1].view
	a := r - 3 // the head axis: H of [B,H,S,D], BH of [BH,S,D]
	head := v.axes[a]
	for b, fs := range v.axes {
		for i, f := range fs {
			if f.stride == 0 && (b != a || i != len(fs)-1) {
				if b == a {
					return kvRepeat{}, fmt.Sprintf("%s repeats whole sets of heads (head h reads head h mod %d), not each head for its group", x.Name, s[a]/f.size)
				}
				return kvRepeat{}, fmt.Sprintf("%s broadcasts axis %d", x.Name, b)
			}
		}
	}
	if len(head) == 0 || head[len(head)-1].stride != 0 {
		return kvRepeat{}, fmt.Sprintf("%s repeats no heads", x.Name)
	}
	g := head[len(head)-1].size
	// Without the broadcast, the view must be the source in its own order:
	// then the K/V heads are the source's elements reshaped.
	var flat []viewFactor
	for b, fs := range v.axes {
		if b == a {
			fs = fs[:len(fs)-1]
		}
		flat = append(flat, fs...)
	}
	stride := 1
	for i := len(flat) - 1; i >= 0; i-- {
		if flat[i].stride != stride {
			return kvRepeat{}, fmt.Sprintf("%s reads its K/V heads out of order", x.Name)
		}
		stride *= flat[i].size
	}
	if stride != v.src.Type.Shape.Numel() {
		return kvRepeat{}, fmt.Sprintf("%s reads part of %s", x.Name, v.src.Name)
	}
	kv := s.Clone()
	kv[a] /= g
	rep := kvRepeat{src: v.src, shape: kv, group: g}
	// Prefer a value of the chain that already is the K/V heads.
	for i := len(chain) - 1; i >= 0; i-- {
		if c := chain[i]; c.v.Type.Shape.Equal(kv) && !broadcasts(c.view) {
			rep.src = c.v
			break
		}
	}
	return rep, ""
}

func broadcasts(v stridedView) bool {
	for _, fs := range v.axes {
		for _, f := range fs {
			if f.stride == 0 {
				return true
			}
		}
	}
	return false
}

// unrepeatKV returns the K and V FlashAttention reads for the attention's
// k and v: the K/V heads from before their repeat when both repeat heads of
// the same shape in groups of the same size, else k and v themselves. note
// says what was done, or why a repeat stays ("" for plain attention).
func (e *Edit) unrepeatKV(k, v *graph.Value) (kk, vv *graph.Value, group int, note string, err error) {
	rk, whyK := repeatedHeads(k)
	rv, whyV := repeatedHeads(v)
	switch {
	case whyK != "" && whyV != "":
		if kr, vr := broadcasts(lastView(k)), broadcasts(lastView(v)); kr || vr {
			return k, v, 1, fmt.Sprintf("K/V repeats kept: %s; %s", whyK, whyV), nil
		}
		return k, v, 1, "", nil // plain multi-head attention
	case whyK != "" || whyV != "":
		return k, v, 1, fmt.Sprintf("K/V repeats kept: %s", whyK+whyV), nil
	case rk.group != rv.group || !rk.shape.Equal(rv.shape):
		return k, v, 1, fmt.Sprintf("K/V repeats kept: K repeats %v in groups of %d, V %v in groups of %d", rk.shape, rk.group, rv.shape, rv.group), nil
	}
	heads := func(r kvRepeat) (*graph.Value, error) {
		if r.src.Type.Shape.Equal(r.shape) {
			return r.src, nil
		}
		dims := make([]float64, len(r.shape))
		for i, d := range r.shape {
			dims[i] = float64(d)
		}
		return e.Op("Reshape", nil, r.src, e.Literal(graph.Int64, graph.Shape{len(r.shape)}, dims...))
	}
	if kk, err = heads(rk); err != nil {
		return nil, nil, 0, "", err
	}
	if vv, err = heads(rv); err != nil {
		return nil, nil, 0, "", err
	}
	return kk, vv, rk.group, fmt.Sprintf("K, V read before their repeat (%s, %s)", kk.Name, vv.Name), nil
}

func lastView(x *graph.Value) stridedView {
	c := viewChain(x, 0)
	return c[len(c)-1].view
}
