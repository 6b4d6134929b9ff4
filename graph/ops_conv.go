package graph

import (
	"fmt"
	"math"
)

// Convolution and pooling over the spatial axes of [N, C, D1, ...] inputs:
// the ONNX operators with their padding spelled out (auto_pad is resolved
// into pads at import). pads holds the begin pads of every spatial axis, then
// the end pads; strides and dilations default to 1.

var windowAttrs = []AttrSpec{
	{Name: "kernel_shape", Kind: AttrInts},
	{Name: "strides", Kind: AttrInts},
	{Name: "pads", Kind: AttrInts},
	{Name: "dilations", Kind: AttrInts},
}

// window is a resolved sliding window over n spatial axes.
type window struct {
	in, k, out          []int
	stride, dil, pb, pe []int
	ceil                bool
}

// newWindow checks and resolves the window attributes for spatial input dims
// in and kernel dims k.
func newWindow(a Attrs, in, k []int, ceil bool) (*window, error) {
	n := len(in)
	w := &window{in: in, k: k, ceil: ceil}
	get := func(name string, def, size int) ([]int, error) {
		v := a.IntList(name)
		if v == nil {
			out := make([]int, size)
			for i := range out {
				out[i] = def
			}
			return out, nil
		}
		if len(v) != size {
			return nil, fmt.Errorf("%s %v: want %d values", name, v, size)
		}
		out := make([]int, size)
		for i, x := range v {
			if x < 0 || x > math.MaxInt32 {
				return nil, fmt.Errorf("%s %v: bad value", name, v)
			}
			out[i] = int(x)
		}
		return out, nil
	}
	var err error
	if w.stride, err = get("strides", 1, n); err != nil {
		return nil, err
	}
	if w.dil, err = get("dilations", 1, n); err != nil {
		return nil, err
	}
	pads, err := get("pads", 0, 2*n)
	if err != nil {
		return nil, err
	}
	w.pb, w.pe = pads[:n], pads[n:]
	w.out = make([]int, n)
	for i := range n {
		if w.stride[i] == 0 || w.dil[i] == 0 || k[i] == 0 {
			return nil, fmt.Errorf("strides, dilations and kernel dims must be positive")
		}
		span := w.dil[i]*(k[i]-1) + 1
		full := in[i] + w.pb[i] + w.pe[i] - span
		if full < 0 {
			return nil, fmt.Errorf("kernel %v (dilations %v) does not fit input %v with pads %v", k, w.dil, in, pads)
		}
		o := full/w.stride[i] + 1
		if ceil && full%w.stride[i] != 0 {
			o++
			// The last window must start inside the input or its begin pad.
			if (o-1)*w.stride[i] >= in[i]+w.pb[i] {
				o--
			}
		}
		w.out[i] = o
	}
	return w, nil
}

// each calls fn for every kernel offset of output position op (spatial
// multi-index) with the input position, or -1 where the offset falls in a
// pad; inPad says whether it lies within the explicit pads (not beyond them,
// where a ceil_mode window may reach).
func (w *window) each(op []int, fn func(kpos, inpos int, inPad bool)) {
	n := len(w.in)
	kk := make([]int, n)
	kn := Shape(w.k).Numel()
	for kp := range kn {
		unravel(kp, Shape(w.k), kk)
		pos, valid, inPad := 0, true, true
		for i := range n {
			c := op[i]*w.stride[i] - w.pb[i] + kk[i]*w.dil[i]
			if c < -w.pb[i] || c >= w.in[i]+w.pe[i] {
				inPad = false
			}
			if c < 0 || c >= w.in[i] {
				valid = false
			}
			pos = pos*w.in[i] + c
		}
		if !valid {
			pos = -1
		}
		fn(kp, pos, inPad)
	}
}

func spatial(s Shape) []int { return []int(s[2:].Clone()) }

func inferConv(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
	x, wt := in[0], in[1]
	if !x.DType.IsFloat() || wt.DType != x.DType || (in[2] != nil && in[2].DType != x.DType) {
		return nil, fmt.Errorf("X, W and B must share a float type")
	}
	if x.Shape.Rank() < 3 || wt.Shape.Rank() != x.Shape.Rank() {
		return nil, fmt.Errorf("X %v and W %v: want [N, C, D...] and [M, C/group, K...]", x.Shape, wt.Shape)
	}
	g := int(a.Int("group", 1))
	m, c := wt.Shape[0], x.Shape[1]
	if g <= 0 || c%g != 0 || m%g != 0 || wt.Shape[1]*g != c {
		return nil, fmt.Errorf("group %d does not fit X %v and W %v", g, x.Shape, wt.Shape)
	}
	if ks := a.IntList("kernel_shape"); ks != nil && !Shape(toInts(ks)).Equal(wt.Shape[2:]) {
		return nil, fmt.Errorf("kernel_shape %v differs from W %v", ks, wt.Shape)
	}
	if in[2] != nil && !in[2].Shape.Equal(Shape{m}) {
		return nil, fmt.Errorf("B %v: want [%d]", in[2].Shape, m)
	}
	w, err := newWindow(a, spatial(x.Shape), spatial(wt.Shape), false)
	if err != nil {
		return nil, err
	}
	return []TensorType{{x.DType, append(Shape{x.Shape[0], m}, w.out...)}}, nil
}

func toInts(v []int64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

func inferPool(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
	x := in[0]
	if !x.DType.IsFloat() || x.Shape.Rank() < 3 {
		return nil, fmt.Errorf("X %v: want a float [N, C, D...]", *x)
	}
	ks := a.IntList("kernel_shape")
	if len(ks) != x.Shape.Rank()-2 {
		return nil, fmt.Errorf("kernel_shape %v for X %v", ks, x.Shape)
	}
	w, err := newWindow(a, spatial(x.Shape), toInts(ks), a.Int("ceil_mode", 0) != 0)
	if err != nil {
		return nil, err
	}
	return []TensorType{{x.DType, append(x.Shape[:2].Clone(), w.out...)}}, nil
}

func init() {
	register(&OpSpec{
		Name: "Conv", Doc: "N-D convolution (cross-correlation) of X [N, C, D...] with W [M, C/group, K...], plus B",
		Inputs: []string{"X", "W", "B?"}, Outputs: []string{"Y"}, Infer: inferConv, Eval: evalConv,
		Attrs: append([]AttrSpec{{Name: "group", Kind: AttrInt, Default: Int(1)}}, windowAttrs...),
	})
	register(&OpSpec{
		Name: "MaxPool", Doc: "maximum over each window of the spatial axes (pads never win)",
		Inputs: []string{"X"}, Outputs: []string{"Y"}, Infer: inferPool, Eval: evalPool(false),
		Attrs: append([]AttrSpec{{Name: "ceil_mode", Kind: AttrInt, Default: Int(0)}}, windowAttrs...),
	})
	register(&OpSpec{
		Name: "AveragePool", Doc: "mean over each window of the spatial axes (pads counted when count_include_pad)",
		Inputs: []string{"X"}, Outputs: []string{"Y"}, Infer: inferPool, Eval: evalPool(true),
		Attrs: append([]AttrSpec{
			{Name: "ceil_mode", Kind: AttrInt, Default: Int(0)},
			{Name: "count_include_pad", Kind: AttrInt, Default: Int(0)},
		}, windowAttrs...),
	})
}

// evalConv: Y[n, m, o] = B[m] + Σ_{c in m's group, k} X[n, c, o·s − pb + k·d]·W[m, c, k].
func evalConv(in []*Tensor, a Attrs, out []*Tensor) error {
	x, wt, b, y := in[0], in[1], at(in, 2), out[0]
	w, err := newWindow(a, spatial(x.Shape), spatial(wt.Shape), false)
	if err != nil {
		return err
	}
	g := int(a.Int("group", 1))
	nb, c, m := x.Shape[0], x.Shape[1], wt.Shape[0]
	cg, mg := c/g, m/g
	inN, kN, outN := Shape(w.in).Numel(), Shape(w.k).Numel(), Shape(w.out).Numel()
	op := make([]int, len(w.out))
	for n := range nb {
		for mi := range m {
			grp := mi / mg
			for o := range outN {
				unravel(o, Shape(w.out), op)
				var s float64
				if b != nil {
					s = b.At(mi)
				}
				for ci := range cg {
					xc := (n*c + grp*cg + ci) * inN
					wc := (mi*cg + ci) * kN
					w.each(op, func(kp, ip int, _ bool) {
						if ip >= 0 {
							s += x.At(xc+ip) * wt.At(wc+kp)
						}
					})
				}
				y.Set((n*m+mi)*outN+o, s)
			}
		}
	}
	return nil
}

// evalPool is MaxPool (avg false) or AveragePool over each window.
func evalPool(avg bool) EvalFunc {
	return func(in []*Tensor, a Attrs, out []*Tensor) error {
		x, y := in[0], out[0]
		w, err := newWindow(a, spatial(x.Shape), toInts(a.IntList("kernel_shape")), a.Int("ceil_mode", 0) != 0)
		if err != nil {
			return err
		}
		withPad := a.Int("count_include_pad", 0) != 0
		planes := x.Shape[0] * x.Shape[1]
		inN, outN := Shape(w.in).Numel(), Shape(w.out).Numel()
		op := make([]int, len(w.out))
		for pl := range planes {
			for o := range outN {
				unravel(o, Shape(w.out), op)
				acc, cnt := math.Inf(-1), 0
				if avg {
					acc = 0
				}
				w.each(op, func(_, ip int, inPad bool) {
					if ip < 0 {
						if avg && withPad && inPad {
							cnt++
						}
						return
					}
					v := x.At(pl*inN + ip)
					if avg {
						acc += v
						cnt++
					} else if v > acc || math.IsNaN(v) {
						acc = v
					}
				})
				if avg {
					acc /= float64(cnt)
				}
				y.Set(pl*outN+o, acc)
			}
		}
		return nil
	}
}
