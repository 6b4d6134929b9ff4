package backendtest

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

// The reference: every op written again as plain float64 index loops over
// multi-indices, deliberately unlike any backend's code (no strides tricks,
// no blocking, no BLAS), so that a shared misreading of the op table cannot
// hide. Speed is irrelevant: test sizes are small.

// arr is a float64 array (ints and bools as their values).
type arr struct {
	shape []int
	data  []float64
}

func newArr(shape ...int) *arr {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return &arr{shape: append([]int{}, shape...), data: make([]float64, n)}
}

func fromTensor(t *graph.Tensor) *arr {
	a := newArr(t.Shape...)
	for i := range a.data {
		a.data[i] = t.At(i)
	}
	return a
}

func (a *arr) rank() int { return len(a.shape) }

// unravel turns a flat row-major position into a multi-index.
func unravel(i int, shape []int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = i % shape[d]
			i /= shape[d]
		}
	}
	return idx
}

// ravel is unravel's inverse.
func ravel(idx, shape []int) int {
	p := 0
	for d := range shape {
		p = p*shape[d] + idx[d]
	}
	return p
}

func (a *arr) at(idx ...int) float64 { return a.data[ravel(idx, a.shape)] }

// bcastAt reads a at the output multi-index idx under numpy broadcasting:
// a's dims align to the right, size-1 dims read index 0.
func (a *arr) bcastAt(idx []int) float64 {
	sub := make([]int, a.rank())
	off := len(idx) - a.rank()
	for d := range sub {
		if a.shape[d] != 1 {
			sub[d] = idx[off+d]
		}
	}
	return a.at(sub...)
}

func bcastShape(shapes ...[]int) []int {
	r := 0
	for _, s := range shapes {
		r = max(r, len(s))
	}
	out := make([]int, r)
	for d := range out {
		out[d] = 1
	}
	for _, s := range shapes {
		for d, n := range s {
			o := r - len(s) + d
			if n != 1 {
				out[o] = n
			}
		}
	}
	return out
}

func refMap(fn func(vals []float64) float64, ins ...*arr) *arr {
	shapes := make([][]int, len(ins))
	for i, a := range ins {
		shapes[i] = a.shape
	}
	out := newArr(bcastShape(shapes...)...)
	vals := make([]float64, len(ins))
	for i := range out.data {
		idx := unravel(i, out.shape)
		for k, a := range ins {
			vals[k] = a.bcastAt(idx)
		}
		out.data[i] = fn(vals)
	}
	return out
}

func refBinary(a, b *arr, fn func(x, y float64) float64) *arr {
	return refMap(func(v []float64) float64 { return fn(v[0], v[1]) }, a, b)
}

func refUnary(a *arr, fn func(x float64) float64) *arr {
	return refMap(func(v []float64) float64 { return fn(v[0]) }, a)
}

// refMatMul is numpy matmul by the definition: promote rank-1 operands,
// broadcast batch dims, sum over k.
func refMatMul(a, b *arr) *arr {
	as, bs := a.shape, b.shape
	if len(as) == 1 {
		as = []int{1, as[0]}
	}
	if len(bs) == 1 {
		bs = []int{bs[0], 1}
	}
	A, B := &arr{as, a.data}, &arr{bs, b.data}
	m, k, n := as[len(as)-2], as[len(as)-1], bs[len(bs)-1]
	batch := bcastShape(as[:len(as)-2], bs[:len(bs)-2])
	out := newArr(append(append([]int{}, batch...), m, n)...)
	for p := range out.data {
		idx := unravel(p, out.shape)
		bi := idx[:len(batch)]
		var s float64
		for t := range k {
			ai := append(append([]int{}, bi...), idx[len(batch)], t)
			bj := append(append([]int{}, bi...), t, idx[len(batch)+1])
			s += A.bcastAt(ai) * B.bcastAt(bj)
		}
		out.data[p] = s
	}
	shape := append([]int{}, batch...)
	if len(a.shape) > 1 {
		shape = append(shape, m)
	}
	if len(b.shape) > 1 {
		shape = append(shape, n)
	}
	out.shape = shape
	return out
}

func refTranspose(a *arr, perm []int) *arr {
	shape := make([]int, len(perm))
	for i, p := range perm {
		shape[i] = a.shape[p]
	}
	out := newArr(shape...)
	for i := range out.data {
		idx := unravel(i, shape)
		src := make([]int, len(perm))
		for d, p := range perm {
			src[p] = idx[d]
		}
		out.data[i] = a.at(src...)
	}
	return out
}

func refGemm(a, b, c *arr, alpha, beta float64, tA, tB bool) *arr {
	if tA {
		a = refTranspose(a, []int{1, 0})
	}
	if tB {
		b = refTranspose(b, []int{1, 0})
	}
	y := refMatMul(a, b)
	for i := range y.data {
		y.data[i] *= alpha
	}
	if c != nil {
		y = refBinary(y, c, func(x, z float64) float64 { return x + beta*z })
	}
	return y
}

func normAxis(ax, rank int) int {
	if ax < 0 {
		return ax + rank
	}
	return ax
}

// refReduce reduces over axes (all when empty) with keepdims.
func refReduce(a *arr, axes []int, keepdims bool, kind string) *arr {
	red := make([]bool, a.rank())
	for _, ax := range axes {
		red[normAxis(ax, a.rank())] = true
	}
	if len(axes) == 0 {
		for d := range red {
			red[d] = true
		}
	}
	var shape []int
	for d, n := range a.shape {
		switch {
		case !red[d]:
			shape = append(shape, n)
		case keepdims:
			shape = append(shape, 1)
		}
	}
	out := newArr(shape...)
	count := make([]int, len(out.data))
	for i := range out.data {
		if kind == "max" {
			out.data[i] = math.Inf(-1)
		}
	}
	for i, v := range a.data {
		idx := unravel(i, a.shape)
		var oi []int
		for d := range idx {
			switch {
			case !red[d]:
				oi = append(oi, idx[d])
			case keepdims:
				oi = append(oi, 0)
			}
		}
		p := ravel(oi, shape)
		count[p]++
		if kind == "max" {
			out.data[p] = math.Max(out.data[p], v)
		} else {
			out.data[p] += v
		}
	}
	if kind == "mean" {
		for i := range out.data {
			out.data[i] /= float64(count[i])
		}
	}
	return out
}

// lines calls fn with the flat positions of every 1-D line of a along axis.
func lines(shape []int, axis int, fn func(pos []int)) {
	rest := append(append([]int{}, shape[:axis]...), shape[axis+1:]...)
	n := 1
	for _, d := range rest {
		n *= d
	}
	for r := range n {
		ri := unravel(r, rest)
		pos := make([]int, shape[axis])
		for j := range pos {
			idx := append(append(append([]int{}, ri[:axis]...), j), ri[axis:]...)
			pos[j] = ravel(idx, shape)
		}
		fn(pos)
	}
}

func refSoftmax(a *arr, axis int, log bool) *arr {
	out := newArr(a.shape...)
	lines(a.shape, normAxis(axis, a.rank()), func(pos []int) {
		mx := math.Inf(-1)
		for _, p := range pos {
			mx = math.Max(mx, a.data[p])
		}
		var s float64
		for _, p := range pos {
			s += math.Exp(a.data[p] - mx)
		}
		for _, p := range pos {
			if log {
				out.data[p] = a.data[p] - mx - math.Log(s)
			} else {
				out.data[p] = math.Exp(a.data[p]-mx) / s
			}
		}
	})
	return out
}

// refSoftmaxGrad is SoftmaxGrad's Doc formula: Y·(dY − sum(dY·Y, axis)).
func refSoftmaxGrad(y, dy *arr, axis int) *arr {
	out := newArr(y.shape...)
	lines(y.shape, normAxis(axis, y.rank()), func(pos []int) {
		var s float64
		for _, p := range pos {
			s += dy.data[p] * y.data[p]
		}
		for _, p := range pos {
			out.data[p] = y.data[p] * (dy.data[p] - s)
		}
	})
	return out
}

func refSCE(scores, labels *arr, reduction string) *arr {
	n, c := scores.shape[0], scores.shape[1]
	var total float64
	for i := range n {
		mx := math.Inf(-1)
		for j := range c {
			mx = math.Max(mx, scores.at(i, j))
		}
		var s float64
		for j := range c {
			s += math.Exp(scores.at(i, j) - mx)
		}
		total += -(scores.at(i, int(labels.data[i])) - mx - math.Log(s))
	}
	if reduction == "mean" {
		total /= float64(n)
	}
	return &arr{shape: []int{}, data: []float64{total}}
}

func refSCEGrad(dLoss float64, scores, labels *arr, reduction string) *arr {
	p := refSoftmax(scores, 1, false)
	n, c := scores.shape[0], scores.shape[1]
	out := newArr(n, c)
	f := dLoss
	if reduction == "mean" {
		f /= float64(n)
	}
	for i := range n {
		for j := range c {
			oh := 0.0
			if int(labels.data[i]) == j {
				oh = 1
			}
			out.data[i*c+j] = f * (p.at(i, j) - oh)
		}
	}
	return out
}

func refGather(data, idx *arr, axis int) *arr {
	ax := normAxis(axis, data.rank())
	shape := append(append(append([]int{}, data.shape[:ax]...), idx.shape...), data.shape[ax+1:]...)
	out := newArr(shape...)
	for i := range out.data {
		oi := unravel(i, shape)
		ii := oi[ax : ax+idx.rank()]
		k := int(idx.at(ii...))
		if k < 0 {
			k += data.shape[ax]
		}
		src := append(append(append([]int{}, oi[:ax]...), k), oi[ax+idx.rank():]...)
		out.data[i] = data.at(src...)
	}
	return out
}

func refGatherGrad(dy, idx *arr, axis int, shape []int) *arr {
	ax := normAxis(axis, len(shape))
	out := newArr(shape...)
	for i, v := range dy.data {
		oi := unravel(i, dy.shape)
		k := int(idx.at(oi[ax : ax+idx.rank()]...))
		if k < 0 {
			k += shape[ax]
		}
		dst := append(append(append([]int{}, oi[:ax]...), k), oi[ax+idx.rank():]...)
		out.data[ravel(dst, shape)] += v
	}
	return out
}

// refSlice follows the ONNX Slice text: negative starts/ends add the dim,
// then clamp to [0, dim] (step > 0) or [0, dim−1] / [−1, dim−1] (step < 0).
func refSlice(a *arr, starts, ends, axes, steps []int) *arr {
	picks := make([][]int, a.rank())
	for d, n := range a.shape {
		for i := range n {
			picks[d] = append(picks[d], i)
		}
	}
	if axes == nil {
		for i := range starts {
			axes = append(axes, i)
		}
	}
	for i, axis := range axes {
		d := normAxis(axis, a.rank())
		n := a.shape[d]
		step := 1
		if steps != nil {
			step = steps[i]
		}
		s, e := starts[i], ends[i]
		if s < 0 {
			s += n
		}
		if e < 0 {
			e += n
		}
		var pick []int
		if step > 0 {
			s, e = min(max(s, 0), n), min(max(e, 0), n)
			for j := s; j < e; j += step {
				pick = append(pick, j)
			}
		} else {
			s, e = min(max(s, 0), n-1), min(max(e, -1), n-1)
			for j := s; j > e; j += step {
				pick = append(pick, j)
			}
		}
		picks[d] = pick
	}
	shape := make([]int, a.rank())
	for d := range shape {
		shape[d] = len(picks[d])
	}
	out := newArr(shape...)
	for i := range out.data {
		oi := unravel(i, shape)
		src := make([]int, len(oi))
		for d := range oi {
			src[d] = picks[d][oi[d]]
		}
		out.data[i] = a.at(src...)
	}
	return out
}

func refConcat(axis int, xs ...*arr) *arr {
	ax := normAxis(axis, xs[0].rank())
	shape := append([]int{}, xs[0].shape...)
	shape[ax] = 0
	for _, x := range xs {
		shape[ax] += x.shape[ax]
	}
	out := newArr(shape...)
	for i := range out.data {
		oi := unravel(i, shape)
		k := oi[ax]
		for _, x := range xs {
			if k < x.shape[ax] {
				src := append([]int{}, oi...)
				src[ax] = k
				out.data[i] = x.at(src...)
				break
			}
			k -= x.shape[ax]
		}
	}
	return out
}

func refExpand(a *arr, shape []int) *arr {
	out := newArr(bcastShape(a.shape, shape)...)
	for i := range out.data {
		out.data[i] = a.bcastAt(unravel(i, out.shape))
	}
	return out
}

func refTrilu(a *arr, k int, upper bool) *arr {
	out := newArr(a.shape...)
	r := a.rank()
	for i := range out.data {
		idx := unravel(i, a.shape)
		row, col := idx[r-2], idx[r-1]
		if (upper && col >= row+k) || (!upper && col <= row+k) {
			out.data[i] = a.data[i]
		}
	}
	return out
}

func reshaped(a *arr, shape ...int) *arr {
	return &arr{shape: append([]int{}, shape...), data: append([]float64{}, a.data...)}
}

// roundTo rounds float64 values the way a value of dtype dt holds them.
func roundTo(dt graph.DType, v float64) float64 {
	switch dt {
	case graph.Float32:
		return float64(float32(v))
	case graph.BFloat16:
		return float64(graph.RoundBF16(float32(v)))
	case graph.Float16:
		return float64(graph.RoundF16(float32(v)))
	case graph.Int64:
		return math.Trunc(v)
	case graph.Bool:
		if v != 0 {
			return 1
		}
		return 0
	}
	return v
}

// refAttention is softmax(scale·Q·Kᵀ + causal mask)·V by the definition, per
// head, with an explicit Sq×Sk score matrix; it also returns the row
// logsumexp. q is [..., Sq, D], k and v [..., Sk, D].
func refAttention(q, k, v *arr, scale float64, causal bool) (y, lse, probs *arr) {
	r := q.rank()
	sq, d, sk := q.shape[r-2], q.shape[r-1], k.shape[r-2]
	heads := graph.Shape(q.shape[:r-2]).Numel() // not len(q.data)/(Sq·D): Sq may be 0
	y = newArr(q.shape...)
	lse = newArr(q.shape[:r-1]...)
	probs = newArr(heads, sq, sk)
	for h := range heads {
		for i := range sq {
			s := make([]float64, sk)
			mx := math.Inf(-1)
			for j := range sk {
				if causal && j > i {
					s[j] = math.Inf(-1)
					continue
				}
				var dot float64
				for t := range d {
					dot += q.data[(h*sq+i)*d+t] * k.data[(h*sk+j)*d+t]
				}
				s[j] = scale * dot
				mx = math.Max(mx, s[j])
			}
			if math.IsInf(mx, -1) {
				// No visible key: Y = 0 and, by the op's definition, L = +inf
				// (so that the backward's exp(S − L) is 0, not NaN).
				lse.data[h*sq+i] = math.Inf(1)
				continue
			}
			var sum float64
			for j := range sk {
				sum += math.Exp(s[j] - mx)
			}
			lse.data[h*sq+i] = mx + math.Log(sum)
			for j := range sk {
				p := math.Exp(s[j]-mx) / sum
				probs.data[(h*sq+i)*sk+j] = p
				for t := range d {
					y.data[(h*sq+i)*d+t] += p * v.data[(h*sk+j)*d+t]
				}
			}
		}
	}
	return y, lse, probs
}

// refAttentionGrad differentiates refAttention by hand:
// dV = Pᵀ·dY, dP = dY·Vᵀ, dS = P∘(dP − rowsum(dP∘P)), dQ = scale·dS·K,
// dK = scale·dSᵀ·Q.
func refAttentionGrad(q, k, v, dy *arr, scale float64, causal bool) (dq, dk, dv *arr) {
	_, _, p := refAttention(q, k, v, scale, causal)
	r := q.rank()
	sq, d, sk := q.shape[r-2], q.shape[r-1], k.shape[r-2]
	heads := graph.Shape(q.shape[:r-2]).Numel() // not len(q.data)/(Sq·D): Sq may be 0
	dq, dk, dv = newArr(q.shape...), newArr(k.shape...), newArr(v.shape...)
	for h := range heads {
		for i := range sq {
			dp := make([]float64, sk)
			var rs float64
			for j := range sk {
				for t := range d {
					dp[j] += dy.data[(h*sq+i)*d+t] * v.data[(h*sk+j)*d+t]
				}
				rs += dp[j] * p.data[(h*sq+i)*sk+j]
			}
			for j := range sk {
				pij := p.data[(h*sq+i)*sk+j]
				ds := pij * (dp[j] - rs)
				for t := range d {
					dv.data[(h*sk+j)*d+t] += pij * dy.data[(h*sq+i)*d+t]
					dq.data[(h*sq+i)*d+t] += scale * ds * k.data[(h*sk+j)*d+t]
					dk.data[(h*sk+j)*d+t] += scale * ds * q.data[(h*sq+i)*d+t]
				}
			}
		}
	}
	return dq, dk, dv
}

// refAdamW is the AdamW step of the op's documentation, in float64.
func refAdamW(p, g, m, v *arr, lr, t, b1, b2, eps, wd float64) (po, mo, vo *arr) {
	po, mo, vo = newArr(p.shape...), newArr(p.shape...), newArr(p.shape...)
	for i := range p.data {
		mo.data[i] = b1*m.data[i] + (1-b1)*g.data[i]
		vo.data[i] = b2*v.data[i] + (1-b2)*g.data[i]*g.data[i]
		mh := mo.data[i] / (1 - math.Pow(b1, t))
		vh := vo.data[i] / (1 - math.Pow(b2, t))
		po.data[i] = p.data[i] - lr*(mh/(math.Sqrt(vh)+eps)+wd*p.data[i])
	}
	return po, mo, vo
}

func (a *arr) String() string { return fmt.Sprintf("%v%v", a.shape, a.data) }

// refAttentionGradFrom is FlashAttentionGrad by its definition from the
// given forward results: P = exp(scale·Q·Kᵀ − L) (masked entries 0),
// D = rowsum(dY∘Y), dS = P∘(dY·Vᵀ − D), dQ = scale·dS·K, dK = scale·dSᵀ·Q,
// dV = Pᵀ·dY. With Y and L exact it equals refAttentionGrad.
func refAttentionGradFrom(q, k, v, y, lse, dy *arr, scale float64, causal bool) (dq, dk, dv *arr) {
	r := q.rank()
	sq, d, sk := q.shape[r-2], q.shape[r-1], k.shape[r-2]
	heads := graph.Shape(q.shape[:r-2]).Numel() // not len(q.data)/(Sq·D): Sq may be 0
	dq, dk, dv = newArr(q.shape...), newArr(k.shape...), newArr(v.shape...)
	for h := range heads {
		for i := range sq {
			var di float64
			for t := range d {
				di += dy.data[(h*sq+i)*d+t] * y.data[(h*sq+i)*d+t]
			}
			for j := range sk {
				if causal && j > i {
					continue
				}
				var s, dp float64
				for t := range d {
					s += q.data[(h*sq+i)*d+t] * k.data[(h*sk+j)*d+t]
					dp += dy.data[(h*sq+i)*d+t] * v.data[(h*sk+j)*d+t]
				}
				p := math.Exp(scale*s - lse.data[h*sq+i])
				ds := p * (dp - di)
				for t := range d {
					dv.data[(h*sk+j)*d+t] += p * dy.data[(h*sq+i)*d+t]
					dq.data[(h*sq+i)*d+t] += scale * ds * k.data[(h*sk+j)*d+t]
					dk.data[(h*sk+j)*d+t] += scale * ds * q.data[(h*sq+i)*d+t]
				}
			}
		}
	}
	return dq, dk, dv
}
