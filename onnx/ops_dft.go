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
func (r *rewrite) transform(re, im *graph.Value, l, k int, inverse bool) (outRe, outIm *graph.Value) {
	if r.err != nil {
		return nil, nil
	}
	n := re.Type.Shape[re.Type.Shape.Rank()-1]
	cosM, sinM, err := r.c.dftMatrices(re.Type.DType, n, l, k)
	if err != nil {
		r.fail(err)
		return nil, nil
	}
	rc, rs := r.sub("MatMul", nil, re, cosM), r.sub("MatMul", nil, re, sinM)
	outRe, outIm = rc, rs // a real signal: re·C and ∓re·S
	if im == nil && !inverse {
		outIm = r.sub("Neg", nil, rs)
	}
	if im != nil {
		ic, is := r.sub("MatMul", nil, im, cosM), r.sub("MatMul", nil, im, sinM)
		reOp, imOp := "Add", "Sub" // forward: re·C + im·S, im·C − re·S
		if inverse {
			reOp, imOp = "Sub", "Add"
		}
		outRe, outIm = r.sub(reOp, nil, rc, is), r.sub(imOp, nil, ic, rs)
	}
	if inverse {
		inv := r.scalar("inv_length", re.Type.DType, 1/float64(l))
		outRe, outIm = r.sub("Mul", nil, outRe, inv), r.sub("Mul", nil, outIm, inv)
	}
	return outRe, outIm
}

// complexParts splits [..., 1 or 2] into its real and imaginary parts
// (imaginary nil for a real signal), each without the last axis.
func (r *rewrite) complexParts(x *graph.Value) (re, im *graph.Value) {
	if r.err != nil {
		return nil, nil
	}
	s := x.Type.Shape
	last := s[s.Rank()-1]
	if last != 1 && last != 2 {
		r.fail(r.c.errf("input %v: the last axis must hold 1 (real) or 2 (complex) values", s))
		return nil, nil
	}
	re = r.pick(x, 0, -1)
	if last == 2 {
		im = r.pick(x, 1, -1)
	}
	return re, im
}

// emitComplex writes the node's output: re and im stacked on a new last axis.
func (r *rewrite) emitComplex(re, im *graph.Value) {
	ax := r.ints("axes", []int64{-1})
	ur, ui := r.sub("Unsqueeze", nil, re, ax), r.sub("Unsqueeze", nil, im, ax)
	r.c.outNames = r.c.n.Output[:1]
	r.emit("Concat", graph.Attrs{"axis": graph.Int(-1)}, ur, ui)
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

func (r *rewrite) constScalar(i int, what string, def int64) int64 {
	if r.err != nil {
		return def
	}
	v, err := r.c.constScalar(i, what, def)
	r.err = err
	return v
}

func importDFT(c *opCtx) error {
	r := c.rewrite()
	inverse := r.attrInt("inverse", 0)
	onesided := r.attrInt("onesided", 0)
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	if !x.Type.DType.IsFloat() {
		return c.errf("input %v: want a float signal", x.Type)
	}
	rank := x.Type.Shape.Rank()
	var axis int64
	if c.ver < 20 {
		axis = r.attrInt("axis", 1)
	} else {
		axis = r.constScalar(2, "axis", -2)
	}
	if r.err != nil {
		return r.err
	}
	// The axis counts among the signal axes, not the last (complex) one.
	if axis < 0 {
		axis += int64(rank)
	}
	if axis < 1 || axis >= int64(rank-1) {
		return c.errf("axis %d of input %v: want a signal axis", axis, x.Type.Shape)
	}
	n := x.Type.Shape[axis]
	l := r.constScalar(1, "dft_length", int64(n))
	if r.err != nil {
		return r.err
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
	re, im := r.complexParts(x)
	// Move the axis last, transform, move it back.
	perm := make([]int64, 0, rank-1)
	for i := range rank - 1 {
		if int64(i) != axis {
			perm = append(perm, int64(i))
		}
	}
	perm = append(perm, axis)
	back := make([]int64, rank-1)
	for i, p := range perm {
		back[p] = int64(i)
	}
	move := func(v *graph.Value, p []int64) *graph.Value {
		if v == nil {
			return nil
		}
		return r.sub("Transpose", graph.Attrs{"perm": graph.Ints(p...)}, v)
	}
	re, im = move(re, perm), move(im, perm)
	yr, yi := r.transform(re, im, int(l), k, inverse != 0)
	r.emitComplex(move(yr, back), move(yi, back))
	return r.err
}

// importSTFT: frames of frame_length samples every frame_step, each times
// the window, transformed (onesided by default).
func importSTFT(c *opCtx) error {
	r := c.rewrite()
	onesided := r.attrInt("onesided", 1)
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	s := x.Type.Shape
	if s.Rank() != 3 || !x.Type.DType.IsFloat() {
		return c.errf("signal %v: want a float [batch, length, 1 or 2]", x.Type)
	}
	step := r.constScalar(1, "frame_step", 0)
	if r.err != nil {
		return r.err
	}
	if step < 1 {
		return c.errf("frame_step %d: want a positive step", step)
	}
	window := r.value(2)
	if r.err != nil {
		return r.err
	}
	flen := int64(-1)
	if window != nil {
		if window.Type.Shape.Rank() != 1 || window.Type.DType != x.Type.DType {
			return c.errf("window %v: want %v[frame_length]", window.Type, x.Type.DType)
		}
		flen = int64(window.Type.Shape[0])
	}
	if c.input(3) != nil {
		fl := r.constScalar(3, "frame_length", 0)
		if r.err != nil {
			return r.err
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
	iv := r.ints("frame_positions", idx)
	iv = r.sub("Reshape", nil, iv, r.ints("frames", []int64{frames, flen}))
	re, im := r.complexParts(x)
	if r.err != nil {
		return r.err
	}
	if im != nil && onesided != 0 {
		return c.errf("onesided with a complex signal is not supported")
	}
	frame := func(v *graph.Value) *graph.Value { // [batch, frames, frame_length]
		if v == nil {
			return nil
		}
		f := r.sub("Gather", graph.Attrs{"axis": graph.Int(1)}, v, iv)
		if window == nil {
			return f
		}
		return r.sub("Mul", nil, f, window)
	}
	re, im = frame(re), frame(im)
	k := int(flen)
	if onesided != 0 {
		k = int(flen)/2 + 1
	}
	r.emitComplex(r.transform(re, im, int(flen), k, false))
	return r.err
}
