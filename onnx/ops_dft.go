package onnx

import (
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

// DFT and STFT (opset 17) are imported as matrix products: the transform
// of a length-N signal to K frequencies is the signal times an [N, K]
// matrix of cos(2πkn/L) and one of sin(2πkn/L), L the DFT length (the
// signal cut or zero-padded to it), K = L or L/2 + 1 (onesided). The
// matrices are constants, so their size is bounded (maxDFTMatrix); there
// is no FFT. STFT gathers the frames first and multiplies by the window.

func init() {
	handlers["DFT"] = importDFT
	handlers["STFT"] = importSTFT
	introduced["DFT"] = 17
	introduced["STFT"] = 17
}

// maxDFTMatrix bounds the elements of each constant DFT matrix.
const maxDFTMatrix = 1 << 22

// dftMatrices returns the [n, k] cos and sin matrices of a length-l DFT of an
// n-sample input (rows past l are zero: the input is cut to l).
func (c *opCtx) dftMatrices(dt graph.DType, n, l, k int) (cosM, sinM *graph.Value, err error) {
	if n*k > maxDFTMatrix {
		return nil, nil, c.errf("a DFT of %d samples to %d frequencies needs [%d, %d] matrices, past %d elements (no FFT here)", n, k, n, k, maxDFTMatrix)
	}
	cm, sm := newCval(onnxType(dt), graph.Shape{n, k}), newCval(onnxType(dt), graph.Shape{n, k})
	for i := range min(n, l) {
		for j := range k {
			// kn mod l keeps the angle below 2π, where it is exact.
			th := 2 * math.Pi * float64((i*j)%l) / float64(l)
			cm.set(i*k+j, math.Cos(th))
			sm.set(i*k+j, math.Sin(th))
		}
	}
	if cosM, err = c.im.val(c.im.constant(c.nodeBase()+"/cos", cm)); err != nil {
		return nil, nil, c.errf("%v", err)
	}
	if sinM, err = c.im.val(c.im.constant(c.nodeBase()+"/sin", sm)); err != nil {
		return nil, nil, c.errf("%v", err)
	}
	return cosM, sinM, nil
}

// transform applies the DFT along the last axis of re (and im, nil for a
// real signal): forward re·C + im·S, im·C − re·S; inverse re·C − im·S,
// im·C + re·S, divided by l. It returns the real and imaginary parts.
func (c *opCtx) transform(re, im *graph.Value, l, k int, inverse bool) (*graph.Value, *graph.Value, error) {
	n := re.Type.Shape[re.Type.Shape.Rank()-1]
	cosM, sinM, err := c.dftMatrices(re.Type.DType, n, l, k)
	if err != nil {
		return nil, nil, err
	}
	mm := func(a, b *graph.Value) (*graph.Value, error) { return c.sub("MatMul", nil, a, b) }
	rc, err := mm(re, cosM)
	if err != nil {
		return nil, nil, err
	}
	rs, err := mm(re, sinM)
	if err != nil {
		return nil, nil, err
	}
	outRe, outIm := rc, rs // a real signal: re·C and ∓re·S
	if im == nil && !inverse {
		if outIm, err = c.sub("Neg", nil, rs); err != nil {
			return nil, nil, err
		}
	}
	if im != nil {
		ic, err := mm(im, cosM)
		if err != nil {
			return nil, nil, err
		}
		is, err := mm(im, sinM)
		if err != nil {
			return nil, nil, err
		}
		reOp, imOp := "Add", "Sub" // forward: re·C + im·S, im·C − re·S
		if inverse {
			reOp, imOp = "Sub", "Add"
		}
		if outRe, err = c.sub(reOp, nil, rc, is); err != nil {
			return nil, nil, err
		}
		if outIm, err = c.sub(imOp, nil, ic, rs); err != nil {
			return nil, nil, err
		}
	}
	if inverse {
		inv, err := c.scalar("inv_length", re.Type.DType, 1/float64(l))
		if err != nil {
			return nil, nil, err
		}
		if outRe, err = c.sub("Mul", nil, outRe, inv); err != nil {
			return nil, nil, err
		}
		if outIm, err = c.sub("Mul", nil, outIm, inv); err != nil {
			return nil, nil, err
		}
	}
	return outRe, outIm, nil
}

// complexParts splits [..., 1 or 2] into its real and imaginary parts
// (imaginary nil for a real signal), each without the last axis.
func (c *opCtx) complexParts(x *graph.Value) (re, im *graph.Value, err error) {
	s := x.Type.Shape
	last := s[s.Rank()-1]
	if last != 1 && last != 2 {
		return nil, nil, c.errf("input %v: the last axis must hold 1 (real) or 2 (complex) values", s)
	}
	part := func(i int) (*graph.Value, error) {
		st, err := c.ints("starts", []int64{int64(i)})
		if err != nil {
			return nil, err
		}
		en, err := c.ints("ends", []int64{int64(i + 1)})
		if err != nil {
			return nil, err
		}
		ax, err := c.ints("axes", []int64{-1})
		if err != nil {
			return nil, err
		}
		v, err := c.sub("Slice", nil, x, st, en, ax)
		if err != nil {
			return nil, err
		}
		return c.sub("Squeeze", nil, v, ax)
	}
	if re, err = part(0); err != nil {
		return nil, nil, err
	}
	if last == 2 {
		if im, err = part(1); err != nil {
			return nil, nil, err
		}
	}
	return re, im, nil
}

// emitComplex writes the node's output: re and im stacked on a new last axis.
func (c *opCtx) emitComplex(re, im *graph.Value) error {
	ax, err := c.ints("axes", []int64{-1})
	if err != nil {
		return err
	}
	r, err := c.sub("Unsqueeze", nil, re, ax)
	if err != nil {
		return err
	}
	i, err := c.sub("Unsqueeze", nil, im, ax)
	if err != nil {
		return err
	}
	c.outNames = c.n.Output[:1]
	_, err = c.emit("Concat", graph.Attrs{"axis": graph.Int(-1)}, r, i)
	return err
}

// constScalar reads optional input i as one integer (absent: def).
func (c *opCtx) constScalar(i int, what string, def int64) (int64, error) {
	v, err := c.constInput(i, what)
	if err != nil || v == nil {
		return def, err
	}
	vals, err := v.ints()
	if err != nil || len(vals) != 1 {
		return 0, c.errf("%s: want one integer", what)
	}
	return vals[0], nil
}

func importDFT(c *opCtx) error {
	inverse, err := c.attrInt("inverse", 0)
	if err != nil {
		return err
	}
	onesided, err := c.attrInt("onesided", 0)
	if err != nil {
		return err
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	if !x.Type.DType.IsFloat() {
		return c.errf("input %v: want a float signal", x.Type)
	}
	r := x.Type.Shape.Rank()
	var axis int64
	if c.ver < 20 {
		if axis, err = c.attrInt("axis", 1); err != nil {
			return err
		}
	} else if axis, err = c.constScalar(2, "axis", -2); err != nil {
		return err
	}
	// The axis counts among the signal axes, not the last (complex) one.
	if axis < 0 {
		axis += int64(r)
	}
	if axis < 1 || axis >= int64(r-1) {
		return c.errf("axis %d of input %v: want a signal axis", axis, x.Type.Shape)
	}
	n := x.Type.Shape[axis]
	l, err := c.constScalar(1, "dft_length", int64(n))
	if err != nil {
		return err
	}
	if l < 1 {
		return c.errf("dft_length %d", l)
	}
	if onesided != 0 && inverse != 0 {
		return c.errf("onesided with inverse is not supported")
	}
	k := int(l)
	if onesided != 0 {
		k = int(l)/2 + 1
	}
	re, im, err := c.complexParts(x)
	if err != nil {
		return err
	}
	// Move the axis last, transform, move it back.
	perm := make([]int64, 0, r-1)
	for i := range r - 1 {
		if int64(i) != axis {
			perm = append(perm, int64(i))
		}
	}
	perm = append(perm, axis)
	back := make([]int64, r-1)
	for i, p := range perm {
		back[p] = int64(i)
	}
	move := func(v *graph.Value, p []int64) (*graph.Value, error) {
		if v == nil {
			return nil, nil
		}
		return c.sub("Transpose", graph.Attrs{"perm": graph.Ints(p...)}, v)
	}
	if re, err = move(re, perm); err != nil {
		return err
	}
	if im, err = move(im, perm); err != nil {
		return err
	}
	yr, yi, err := c.transform(re, im, int(l), k, inverse != 0)
	if err != nil {
		return err
	}
	if yr, err = move(yr, back); err != nil {
		return err
	}
	if yi, err = move(yi, back); err != nil {
		return err
	}
	return c.emitComplex(yr, yi)
}

// importSTFT: frames of frame_length samples every frame_step, each times
// the window, transformed (onesided by default).
func importSTFT(c *opCtx) error {
	onesided, err := c.attrInt("onesided", 1)
	if err != nil {
		return err
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	s := x.Type.Shape
	if s.Rank() != 3 || !x.Type.DType.IsFloat() {
		return c.errf("signal %v: want a float [batch, length, 1 or 2]", x.Type)
	}
	step, err := c.constScalar(1, "frame_step", 0)
	if err != nil {
		return err
	}
	if step < 1 {
		return c.errf("frame_step %d: want a positive step", step)
	}
	window, err := c.value(2)
	if err != nil {
		return err
	}
	flen := int64(-1)
	if window != nil {
		if window.Type.Shape.Rank() != 1 || window.Type.DType != x.Type.DType {
			return c.errf("window %v: want %v[frame_length]", window.Type, x.Type.DType)
		}
		flen = int64(window.Type.Shape[0])
	}
	if c.input(3) != nil {
		fl, err := c.constScalar(3, "frame_length", 0)
		if err != nil {
			return err
		}
		if flen >= 0 && fl != flen {
			return c.errf("frame_length %d disagrees with the window's %d", fl, flen)
		}
		flen = fl
	}
	if flen < 1 || flen > int64(s[1]) {
		return c.errf("frame_length %d for a signal of %d samples", flen, s[1])
	}
	frames := (int64(s[1])-flen)/step + 1
	idx := make([]int64, 0, frames*flen)
	for f := range frames {
		for j := range flen {
			idx = append(idx, f*step+j)
		}
	}
	iv, err := c.ints("frame_positions", idx)
	if err != nil {
		return err
	}
	shape, err := c.ints("frames", []int64{frames, flen})
	if err != nil {
		return err
	}
	if iv, err = c.sub("Reshape", nil, iv, shape); err != nil {
		return err
	}
	re, im, err := c.complexParts(x)
	if err != nil {
		return err
	}
	if im != nil && onesided != 0 {
		return c.errf("onesided with a complex signal is not supported")
	}
	frame := func(v *graph.Value) (*graph.Value, error) { // [batch, frames, frame_length]
		if v == nil {
			return nil, nil
		}
		f, err := c.sub("Gather", graph.Attrs{"axis": graph.Int(1)}, v, iv)
		if err != nil || window == nil {
			return f, err
		}
		return c.sub("Mul", nil, f, window)
	}
	if re, err = frame(re); err != nil {
		return err
	}
	if im, err = frame(im); err != nil {
		return err
	}
	k := int(flen)
	if onesided != 0 {
		k = int(flen)/2 + 1
	}
	yr, yi, err := c.transform(re, im, int(flen), k, false)
	if err != nil {
		return err
	}
	return c.emitComplex(yr, yi)
}
