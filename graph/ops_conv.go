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
	get := func(name string, def, size int) ([]int, error) { return windowInts(a, name, def, size) }
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

// windowInts reads a window attribute of size values (def for each when
// absent), each in [0, 2^31).
func windowInts(a Attrs, name string, def, size int) ([]int, error) {
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

// inferMaxPool is inferPool for int64 data too (a maximum is exact), with
// the Indices output.
func inferMaxPool(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
	x := *in[0]
	if x.DType == Int64 {
		x.DType = Float64 // checked as a float; the output keeps int64
	}
	if so := a.Int("storage_order", 0); so != 0 && so != 1 {
		return nil, fmt.Errorf("storage_order %d: want 0 or 1", so)
	}
	out, err := inferPool([]*TensorType{&x}, a, c)
	if err != nil {
		return nil, err
	}
	out[0].DType = in[0].DType
	return append(out, TensorType{Int64, out[0].Shape.Clone()}), nil
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
		Name: "MaxPool", Doc: "maximum over each window of the spatial axes (pads never win), and its flat int64 index in X (the first maximum; storage_order 1: spatial axes numbered column-major)",
		Inputs: []string{"X"}, Outputs: []string{"Y", "Indices?"}, Infer: inferMaxPool, Eval: evalMaxPool,
		Attrs: append([]AttrSpec{
			{Name: "ceil_mode", Kind: AttrInt, Default: Int(0)},
			{Name: "storage_order", Kind: AttrInt, Default: Int(0)},
		}, windowAttrs...),
	})
	register(&OpSpec{
		Name: "AveragePool", Doc: "mean over each window of the spatial axes (pads counted when count_include_pad)",
		Inputs: []string{"X"}, Outputs: []string{"Y"}, Infer: inferPool, Eval: evalAveragePool,
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

// evalMaxPool takes the first maximum of each window (a NaN wins) and
// copies it, so int64 data stays exact; its index counts
// from the start of X.
func evalMaxPool(in []*Tensor, a Attrs, out []*Tensor) error {
	x, y := in[0], out[0]
	w, err := newWindow(a, spatial(x.Shape), toInts(a.IntList("kernel_shape")), a.Int("ceil_mode", 0) != 0)
	if err != nil {
		return err
	}
	colMajor := a.Int("storage_order", 0) == 1
	planes := x.Shape[0] * x.Shape[1]
	inN, outN := Shape(w.in).Numel(), Shape(w.out).Numel()
	op := make([]int, len(w.out))
	ip := make([]int, len(w.in))
	for pl := range planes {
		for o := range outN {
			unravel(o, Shape(w.out), op)
			best := -1
			w.each(op, func(_, p int, _ bool) {
				if p < 0 {
					return
				}
				if best < 0 {
					best = p
					return
				}
				v, b := x.At(pl*inN+p), x.At(pl*inN+best)
				if !math.IsNaN(b) && (v > b || math.IsNaN(v)) {
					best = p
				}
			})
			q := pl*outN + o
			if best < 0 { // a window of padding alone: −∞, no index
				if y.I64 != nil {
					return fmt.Errorf("the window at %v holds no element of X", op)
				}
				y.Set(q, math.Inf(-1))
				if len(out) > 1 && out[1] != nil {
					out[1].I64[q] = -1
				}
				continue
			}
			copyElem(y, q, x, pl*inN+best)
			if len(out) > 1 && out[1] != nil {
				idx := best
				if colMajor {
					unravel(best, Shape(w.in), ip)
					idx = 0
					for d := len(ip) - 1; d >= 0; d-- {
						idx = idx*w.in[d] + ip[d]
					}
				}
				out[1].I64[q] = int64(pl*inN + idx)
			}
		}
	}
	return nil
}

// evalAveragePool is the mean over each window (the padding counted when
// count_include_pad).
func evalAveragePool(in []*Tensor, a Attrs, out []*Tensor) error {
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
			acc, cnt := 0.0, 0
			w.each(op, func(_, ip int, inPad bool) {
				if ip < 0 {
					if withPad && inPad {
						cnt++
					}
					return
				}
				acc += x.At(pl*inN + ip)
				cnt++
			})
			y.Set(pl*outN+o, acc/float64(cnt))
		}
	}
	return nil
}

func init() {
	register(&OpSpec{
		Name: "ConvTranspose", Doc: "N-D transposed convolution of X [N, C, D...] with W [C, M/group, K...], plus B",
		Inputs: []string{"X", "W", "B?"}, Outputs: []string{"Y"}, Infer: inferConvTranspose, Eval: evalConvTranspose,
		Attrs: append([]AttrSpec{
			{Name: "group", Kind: AttrInt, Default: Int(1)},
			{Name: "output_padding", Kind: AttrInts},
		}, windowAttrs...),
	})
}

// transposedWindow resolves ConvTranspose's attributes: the output's spatial
// dims are s·(in − 1) + output_padding + d·(k − 1) + 1 − pads.
func transposedWindow(a Attrs, in, k []int) (w *window, out []int, err error) {
	n := len(in)
	w = &window{in: in, k: k}
	if w.stride, err = windowInts(a, "strides", 1, n); err != nil {
		return nil, nil, err
	}
	if w.dil, err = windowInts(a, "dilations", 1, n); err != nil {
		return nil, nil, err
	}
	for i := range n {
		if w.stride[i] == 0 || w.dil[i] == 0 || k[i] == 0 {
			return nil, nil, fmt.Errorf("strides, dilations and kernel dims must be positive")
		}
	}
	pads := a.IntList("pads")
	if pads == nil {
		pads = make([]int64, 2*n)
	}
	op := a.IntList("output_padding")
	if op == nil {
		op = make([]int64, n)
	}
	if len(pads) != 2*n || len(op) != n {
		return nil, nil, fmt.Errorf("pads %v or output_padding %v for %d spatial axes", pads, op, n)
	}
	w.pb, w.pe = toInts(pads[:n]), toInts(pads[n:])
	out = make([]int, n)
	for i := range n {
		if w.pb[i] < 0 || w.pe[i] < 0 || op[i] < 0 {
			return nil, nil, fmt.Errorf("negative pads %v or output_padding %v", pads, op)
		}
		out[i] = w.stride[i]*(in[i]-1) + int(op[i]) + w.dil[i]*(k[i]-1) + 1 - w.pb[i] - w.pe[i]
		if out[i] < 0 || in[i] == 0 {
			return nil, nil, fmt.Errorf("pads %v leave no output for input %v", pads, in)
		}
	}
	return w, out, nil
}

func inferConvTranspose(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
	x, wt := in[0], in[1]
	if !x.DType.IsFloat() || wt.DType != x.DType || (in[2] != nil && in[2].DType != x.DType) {
		return nil, fmt.Errorf("X, W and B must share a float type")
	}
	if x.Shape.Rank() < 3 || wt.Shape.Rank() != x.Shape.Rank() {
		return nil, fmt.Errorf("X %v and W %v: want [N, C, D...] and [C, M/group, K...]", x.Shape, wt.Shape)
	}
	g := int(a.Int("group", 1))
	c := x.Shape[1]
	if g <= 0 || wt.Shape[0] != c || c%g != 0 {
		return nil, fmt.Errorf("group %d does not fit X %v and W %v", g, x.Shape, wt.Shape)
	}
	m := wt.Shape[1] * g
	if ks := a.IntList("kernel_shape"); ks != nil && !Shape(toInts(ks)).Equal(wt.Shape[2:]) {
		return nil, fmt.Errorf("kernel_shape %v differs from W %v", ks, wt.Shape)
	}
	if in[2] != nil && !in[2].Shape.Equal(Shape{m}) {
		return nil, fmt.Errorf("B %v: want [%d]", in[2].Shape, m)
	}
	_, out, err := transposedWindow(a, spatial(x.Shape), spatial(wt.Shape))
	if err != nil {
		return nil, err
	}
	return []TensorType{{x.DType, append(Shape{x.Shape[0], m}, out...)}}, nil
}

// evalConvTranspose: each X[n, c, i] adds X·W[c, m, k] to Y[n, m, i·s − pb
// + k·d] (where that lies in Y) for the m of c's group; Y starts at B.
func evalConvTranspose(in []*Tensor, a Attrs, out []*Tensor) error {
	x, wt, b, y := in[0], in[1], at(in, 2), out[0]
	w, os, err := transposedWindow(a, spatial(x.Shape), spatial(wt.Shape))
	if err != nil {
		return err
	}
	g := int(a.Int("group", 1))
	nb, c := x.Shape[0], x.Shape[1]
	cg, mg := c/g, wt.Shape[1]
	m := mg * g
	oshape := Shape(os)
	inN, kN, outN := Shape(w.in).Numel(), Shape(w.k).Numel(), oshape.Numel()
	acc := make([]float64, y.Len())
	for n := range nb {
		for mi := range m {
			if b != nil {
				for o := range outN {
					acc[(n*m+mi)*outN+o] = b.At(mi)
				}
			}
		}
	}
	ii := make([]int, len(w.in))
	kk := make([]int, len(w.k))
	oi := make([]int, len(w.in))
	for n := range nb {
		for ci := range c {
			grp := ci / cg
			for p := range inN {
				unravel(p, Shape(w.in), ii)
				xv := x.At((n*c+ci)*inN + p)
				for kp := range kN {
					unravel(kp, Shape(w.k), kk)
					inside := true
					for d := range ii {
						oi[d] = ii[d]*w.stride[d] - w.pb[d] + kk[d]*w.dil[d]
						inside = inside && oi[d] >= 0 && oi[d] < os[d]
					}
					if !inside {
						continue
					}
					o := ravel(oi, oshape)
					for mj := range mg {
						mi := grp*mg + mj
						acc[(n*m+mi)*outN+o] += xv * wt.At((ci*mg+mj)*kN+kp)
					}
				}
			}
		}
	}
	for i, v := range acc {
		y.Set(i, v)
	}
	return nil
}

// SpatialWindow is a resolved window of Conv, ConvTranspose, MaxPool or
// AveragePool, for a backend that computes the op itself: the spatial dims
// of the input (In), kernel (K) and output (Out), and per axis the stride,
// dilation and the begin and end pads.
type SpatialWindow struct {
	In, K, Out, Stride, Dil, PadBegin, PadEnd []int
}

func exportWindow(w *window, out []int) *SpatialWindow {
	return &SpatialWindow{In: w.in, K: w.k, Out: out, Stride: w.stride, Dil: w.dil, PadBegin: w.pb, PadEnd: w.pe}
}

// ConvWindow is the window evalConv slides for X of shape x and W of shape wt.
func ConvWindow(a Attrs, x, wt Shape) (*SpatialWindow, error) {
	if x.Rank() < 3 || wt.Rank() != x.Rank() {
		return nil, fmt.Errorf("X %v and W %v: want [N, C, D...] and [M, C/group, K...]", x, wt)
	}
	w, err := newWindow(a, spatial(x), spatial(wt), false)
	if err != nil {
		return nil, err
	}
	return exportWindow(w, w.out), nil
}

// PoolWindow is the window evalMaxPool and evalAveragePool slide over X of
// shape x (kernel_shape and ceil_mode from the attributes).
func PoolWindow(a Attrs, x Shape) (*SpatialWindow, error) {
	ks := a.IntList("kernel_shape")
	if x.Rank() < 3 || len(ks) != x.Rank()-2 {
		return nil, fmt.Errorf("kernel_shape %v for X %v", ks, x)
	}
	w, err := newWindow(a, spatial(x), toInts(ks), a.Int("ceil_mode", 0) != 0)
	if err != nil {
		return nil, err
	}
	return exportWindow(w, w.out), nil
}

// ConvTransposeWindow is evalConvTranspose's window for X of shape x and W
// of shape wt; Out is the output's spatial dims.
func ConvTransposeWindow(a Attrs, x, wt Shape) (*SpatialWindow, error) {
	if x.Rank() < 3 || wt.Rank() != x.Rank() {
		return nil, fmt.Errorf("X %v and W %v: want [N, C, D...] and [C, M/group, K...]", x, wt)
	}
	w, out, err := transposedWindow(a, spatial(x), spatial(wt))
	if err != nil {
		return nil, err
	}
	return exportWindow(w, out), nil
}
