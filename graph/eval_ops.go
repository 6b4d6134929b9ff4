package graph

import (
	"fmt"
	"math"
)

// The reference evaluations of the non-elementwise ops (see eval.go). Each is
// named in its op's table row.

// evalMatMul is numpy matmul by the definition: promote rank-1 operands,
// broadcast batch dims, sum over k.
func evalMatMul(in []*Tensor, _ Attrs, out []*Tensor) error {
	as, bs := in[0].Shape, in[1].Shape
	if as.Rank() == 1 {
		as = Shape{1, as[0]}
	}
	if bs.Rank() == 1 {
		bs = Shape{bs[0], 1}
	}
	m, k, n := as[as.Rank()-2], as[as.Rank()-1], bs[bs.Rank()-1]
	batch, err := Broadcast(as[:as.Rank()-2], bs[:bs.Rank()-2])
	if err != nil {
		return err
	}
	full := append(batch.Clone(), m, n) // the output before rank-1 demotion
	nb := len(batch)
	idx := make([]int, len(full))
	ai := make([]int, nb+2)
	bi := make([]int, nb+2)
	for p := range full.Numel() {
		unravel(p, full, idx)
		copy(ai, idx[:nb])
		copy(bi, idx[:nb])
		var s float64
		for t := range k {
			ai[nb], ai[nb+1] = idx[nb], t
			bi[nb], bi[nb+1] = t, idx[nb+1]
			s += in[0].At(bcastPos(ai, as)) * in[1].At(bcastPos(bi, bs))
		}
		out[0].Set(p, s)
	}
	return nil
}

// evalGemm is alpha·op(A)·op(B) + beta·C (C broadcast to [M, N]).
func evalGemm(in []*Tensor, a Attrs, out []*Tensor) error {
	alpha, beta := a.Float("alpha", 1), a.Float("beta", 1)
	tA, tB := a.Int("transA", 0) != 0, a.Int("transB", 0) != 0
	A, B, C := in[0], in[1], at(in, 2)
	m, k := A.Shape[0], A.Shape[1]
	if tA {
		m, k = k, m
	}
	n := out[0].Shape[1]
	elemA := func(i, t int) float64 {
		if tA {
			return A.At(t*m + i)
		}
		return A.At(i*k + t)
	}
	elemB := func(t, j int) float64 {
		if tB {
			return B.At(j*k + t)
		}
		return B.At(t*n + j)
	}
	for i := range m {
		for j := range n {
			var s float64
			for t := range k {
				s += elemA(i, t) * elemB(t, j)
			}
			y := alpha * s
			if C != nil {
				y += beta * C.At(bcastPos([]int{i, j}, C.Shape))
			}
			out[0].Set(i*n+j, y)
		}
	}
	return nil
}

// evalReduce reduces over the axes input (all axes when omitted, unless
// noop_with_empty_axes) with keepdims: kind is sum, mean, max or prod (the
// empty product is 1).
func evalReduce(kind string) EvalFunc {
	return func(in []*Tensor, a Attrs, out []*Tensor) error {
		x := in[0]
		axes, err := intsOf(at(in, 1), "axes")
		if err != nil {
			return err
		}
		ax, err := ReduceAxes(x.Shape, axes, a.Int("noop_with_empty_axes", 0) != 0)
		if err != nil {
			return err
		}
		if ax == nil { // noop: the input unchanged
			return evalCopy(in, a, out)
		}
		red := make([]bool, x.Shape.Rank())
		for _, d := range ax {
			red[d] = true
		}
		keep := a.Int("keepdims", 1) != 0
		o := out[0]
		acc := make([]float64, o.Len())
		count := make([]int, o.Len())
		switch kind {
		case "max":
			for i := range acc {
				acc[i] = math.Inf(-1)
			}
		case "prod":
			for i := range acc {
				acc[i] = 1
			}
		}
		idx := make([]int, x.Shape.Rank())
		oi := make([]int, 0, len(idx))
		for i := range x.Len() {
			unravel(i, x.Shape, idx)
			oi = oi[:0]
			for d := range idx {
				switch {
				case !red[d]:
					oi = append(oi, idx[d])
				case keep:
					oi = append(oi, 0)
				}
			}
			p := ravel(oi, o.Shape)
			count[p]++
			switch kind {
			case "max":
				acc[p] = math.Max(acc[p], x.At(i))
			case "prod":
				acc[p] *= x.At(i)
			default:
				acc[p] += x.At(i)
			}
		}
		for p, v := range acc {
			if kind == "mean" {
				v /= float64(count[p])
			}
			o.Set(p, v)
		}
		return nil
	}
}

// lines calls fn with the flat positions of every 1-D line of shape along
// axis.
func lines(shape Shape, axis int, fn func(pos []int)) {
	rest := append(shape[:axis].Clone(), shape[axis+1:]...)
	ri := make([]int, len(rest))
	idx := make([]int, len(shape))
	for r := range rest.Numel() {
		unravel(r, rest, ri)
		pos := make([]int, shape[axis])
		for j := range pos {
			copy(idx, ri[:axis])
			idx[axis] = j
			copy(idx[axis+1:], ri[axis:])
			pos[j] = ravel(idx, shape)
		}
		fn(pos)
	}
}

// evalSoftmax is exp(x − max) / Σ exp(x − max) along axis (its log when log).
func evalSoftmax(log bool) EvalFunc {
	return func(in []*Tensor, a Attrs, out []*Tensor) error {
		x := in[0]
		axis, err := NormAxis(int(a.Int("axis", -1)), x.Shape.Rank())
		if err != nil {
			return err
		}
		lines(x.Shape, axis, func(pos []int) {
			mx := math.Inf(-1)
			for _, p := range pos {
				mx = math.Max(mx, x.At(p))
			}
			var s float64
			for _, p := range pos {
				s += math.Exp(x.At(p) - mx)
			}
			for _, p := range pos {
				if log {
					out[0].Set(p, x.At(p)-mx-math.Log(s))
				} else {
					out[0].Set(p, math.Exp(x.At(p)-mx)/s)
				}
			}
		})
		return nil
	}
}

// evalSoftmaxGrad is Y·(dY − Σ(dY·Y, axis)).
func evalSoftmaxGrad(in []*Tensor, a Attrs, out []*Tensor) error {
	y, dy := in[0], in[1]
	axis, err := NormAxis(int(a.Int("axis", -1)), y.Shape.Rank())
	if err != nil {
		return err
	}
	lines(y.Shape, axis, func(pos []int) {
		var s float64
		for _, p := range pos {
			s += dy.At(p) * y.At(p)
		}
		for _, p := range pos {
			out[0].Set(p, y.At(p)*(dy.At(p)-s))
		}
	})
	return nil
}

// label reads row i's class of a cross-entropy, checked against C classes.
func label(labels *Tensor, i, c int) (int, error) {
	l := labels.I64[i]
	if l < 0 || l >= int64(c) {
		return 0, fmt.Errorf("label %d of row %d is out of range [0, %d)", l, i, c)
	}
	return int(l), nil
}

// evalSCE is Σ_rows −log softmax(scores)[label], divided by N for "mean".
func evalSCE(in []*Tensor, a Attrs, out []*Tensor) error {
	scores, labels := in[0], in[1]
	n, c := scores.Shape[0], scores.Shape[1]
	var total float64
	for i := range n {
		l, err := label(labels, i, c)
		if err != nil {
			return err
		}
		mx := math.Inf(-1)
		for j := range c {
			mx = math.Max(mx, scores.At(i*c+j))
		}
		var s float64
		for j := range c {
			s += math.Exp(scores.At(i*c+j) - mx)
		}
		total += -(scores.At(i*c+l) - mx - math.Log(s))
	}
	if a.String("reduction", "mean") == "mean" {
		total /= float64(n)
	}
	out[0].Set(0, total)
	return nil
}

// evalSCEGrad is dLoss·(softmax(scores) − onehot(labels)), divided by N for
// "mean".
func evalSCEGrad(in []*Tensor, a Attrs, out []*Tensor) error {
	scores, labels := in[1], in[2]
	n, c := scores.Shape[0], scores.Shape[1]
	p := NewTensor(Float64, scores.Shape)
	if err := evalSoftmax(false)([]*Tensor{scores}, Attrs{"axis": Int(1)}, []*Tensor{p}); err != nil {
		return err
	}
	f := in[0].At(0)
	if a.String("reduction", "mean") == "mean" {
		f /= float64(n)
	}
	for i := range n {
		l, err := label(labels, i, c)
		if err != nil {
			return err
		}
		for j := range c {
			out[0].Set(i*c+j, f*(p.At(i*c+j)-b2f(j == l)))
		}
	}
	return nil
}

func evalTranspose(in []*Tensor, a Attrs, out []*Tensor) error {
	x := in[0]
	perm, err := TransposePerm(a, x.Shape.Rank())
	if err != nil {
		return err
	}
	o := out[0]
	idx := make([]int, len(perm))
	src := make([]int, len(perm))
	for i := range o.Len() {
		unravel(i, o.Shape, idx)
		for d, p := range perm {
			src[p] = idx[d]
		}
		copyElem(o, i, x, ravel(src, x.Shape))
	}
	return nil
}

func evalConcat(in []*Tensor, a Attrs, out []*Tensor) error {
	o := out[0]
	ax, err := NormAxis(int(a.Int("axis", 0)), o.Shape.Rank())
	if err != nil {
		return err
	}
	idx := make([]int, o.Shape.Rank())
	for i := range o.Len() {
		unravel(i, o.Shape, idx)
		k := idx[ax]
		for _, x := range in {
			if k < x.Shape[ax] {
				idx[ax] = k
				copyElem(o, i, x, ravel(idx, x.Shape))
				break
			}
			k -= x.Shape[ax]
		}
	}
	return nil
}

// evalSlice follows the ONNX Slice text: negative starts/ends add the dim,
// then clamp to [0, dim] (step > 0) or [0, dim−1] / [−1, dim−1] (step < 0).
func evalSlice(in []*Tensor, _ Attrs, out []*Tensor) error {
	x := in[0]
	var operands [4][]int
	for i, what := range []string{"starts", "ends", "axes", "steps"} {
		v, err := intsOf(at(in, i+1), what)
		if err != nil {
			return err
		}
		operands[i] = v
	}
	starts, ends, axes, steps := operands[0], operands[1], operands[2], operands[3]
	if len(ends) != len(starts) || (axes != nil && len(axes) != len(starts)) || (steps != nil && len(steps) != len(starts)) {
		return fmt.Errorf("starts %v, ends %v, axes %v and steps %v differ in length", starts, ends, axes, steps)
	}
	picks := make([][]int, x.Shape.Rank())
	for d, n := range x.Shape {
		for i := range n {
			picks[d] = append(picks[d], i)
		}
	}
	for i := range starts {
		axis := i
		if axes != nil {
			axis = axes[i]
		}
		d, err := NormAxis(axis, x.Shape.Rank())
		if err != nil {
			return err
		}
		n := x.Shape[d]
		step := 1
		if steps != nil {
			step = steps[i]
		}
		if step == 0 {
			return fmt.Errorf("slice step is 0")
		}
		s, e := starts[i], ends[i]
		if s < 0 {
			s += n
		}
		if e < 0 {
			e += n
		}
		pick := []int{}
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
	o := out[0]
	for d := range picks {
		if len(picks[d]) != o.Shape[d] {
			return fmt.Errorf("slice gives %d elements on axis %d, the output declares %v", len(picks[d]), d, o.Shape)
		}
	}
	idx := make([]int, o.Shape.Rank())
	src := make([]int, len(idx))
	for i := range o.Len() {
		unravel(i, o.Shape, idx)
		for d := range idx {
			src[d] = picks[d][idx[d]]
		}
		copyElem(o, i, x, ravel(src, x.Shape))
	}
	return nil
}

// evalExpand broadcasts the input to the output's shape.
func evalExpand(in []*Tensor, _ Attrs, out []*Tensor) error {
	o := out[0]
	idx := make([]int, o.Shape.Rank())
	for i := range o.Len() {
		unravel(i, o.Shape, idx)
		copyElem(o, i, in[0], bcastPos(idx, in[0].Shape))
	}
	return nil
}

// gatherIndex reads index k of a Gather along a dim of size n (negative
// counts from the end).
func gatherIndex(idx *Tensor, k, n int) (int, error) {
	j := idx.I64[k]
	if j < -int64(n) || j >= int64(n) {
		return 0, fmt.Errorf("index %d out of range for an axis of size %d", j, n)
	}
	if j < 0 {
		j += int64(n)
	}
	return int(j), nil
}

func evalGather(in []*Tensor, a Attrs, out []*Tensor) error {
	data, ind, o := in[0], in[1], out[0]
	ax, err := NormAxis(int(a.Int("axis", 0)), data.Shape.Rank())
	if err != nil {
		return err
	}
	ir := ind.Shape.Rank()
	oi := make([]int, o.Shape.Rank())
	src := make([]int, data.Shape.Rank())
	for i := range o.Len() {
		unravel(i, o.Shape, oi)
		k, err := gatherIndex(ind, ravel(oi[ax:ax+ir], ind.Shape), data.Shape[ax])
		if err != nil {
			return err
		}
		copy(src, oi[:ax])
		src[ax] = k
		copy(src[ax+1:], oi[ax+ir:])
		copyElem(o, i, data, ravel(src, data.Shape))
	}
	return nil
}

// evalGatherGrad scatter-adds dY's slices into zeros of data's shape.
func evalGatherGrad(in []*Tensor, a Attrs, out []*Tensor) error {
	dy, ind, o := in[0], in[1], out[0]
	ax, err := NormAxis(int(a.Int("axis", 0)), o.Shape.Rank())
	if err != nil {
		return err
	}
	ir := ind.Shape.Rank()
	acc := make([]float64, o.Len())
	di := make([]int, dy.Shape.Rank())
	dst := make([]int, o.Shape.Rank())
	for i := range dy.Len() {
		unravel(i, dy.Shape, di)
		k, err := gatherIndex(ind, ravel(di[ax:ax+ir], ind.Shape), o.Shape[ax])
		if err != nil {
			return err
		}
		copy(dst, di[:ax])
		dst[ax] = k
		copy(dst[ax+1:], di[ax+ir:])
		acc[ravel(dst, o.Shape)] += dy.At(i)
	}
	for i, v := range acc {
		o.Set(i, v)
	}
	return nil
}

// evalTrilu keeps the elements with col − row ≥ k (upper) or ≤ k (lower) of
// the last two axes and zeroes the others.
func evalTrilu(in []*Tensor, a Attrs, out []*Tensor) error {
	x, o := in[0], out[0]
	k := 0
	if kt := at(in, 1); kt != nil {
		if kt.Len() != 1 {
			return fmt.Errorf("k must be a scalar")
		}
		k = int(intAt(kt, 0))
	}
	upper := a.Int("upper", 1) != 0
	r := x.Shape.Rank()
	idx := make([]int, r)
	for i := range o.Len() {
		unravel(i, x.Shape, idx)
		row, col := idx[r-2], idx[r-1]
		if (upper && col >= row+k) || (!upper && col <= row+k) {
			copyElem(o, i, x, i)
		} else {
			o.Set(i, 0)
		}
	}
	return nil
}

// attentionRow computes the scores of query row i of query head h against
// every key of K/V head kh: scale·q·k (−Inf where the causal mask hides the
// key) and their max.
func attentionRow(q, k *Tensor, h, kh, i, sq, sk, d int, scale float64, causal bool) (s []float64, mx float64) {
	s = make([]float64, sk)
	mx = math.Inf(-1)
	for j := range sk {
		if causal && j > i {
			s[j] = math.Inf(-1)
			continue
		}
		var dot float64
		for t := range d {
			dot += q.At((h*sq+i)*d+t) * k.At((kh*sk+j)*d+t)
		}
		s[j] = scale * dot
		mx = math.Max(mx, s[j])
	}
	return s, mx
}

// evalAttention is softmax(scale·Q·Kᵀ + causal mask)·V per head, with an
// explicit Sq×Sk score row, and the row logsumexp L. A row with no visible
// key gives Y = 0 and L = +Inf (so that the backward's exp(S − L) is 0).
// Query head h reads K/V head h/Group (grouped-query attention).
func evalAttention(in []*Tensor, a Attrs, out []*Tensor) error {
	q, k, v := in[0], in[1], in[2]
	as, err := AttentionShape(q.Shape, k.Shape, v.Shape)
	if err != nil {
		return err
	}
	bh, sq, sk, d := as.BH, as.Sq, as.Sk, as.D
	scale, causal := a.Float("scale", 1), a.Int("causal", 0) != 0
	y, lse := out[0], out[1]
	for h := range bh {
		kh := h / as.Group
		for i := range sq {
			s, mx := attentionRow(q, k, h, kh, i, sq, sk, d, scale, causal)
			acc := make([]float64, d)
			if math.IsInf(mx, -1) {
				lse.Set(h*sq+i, math.Inf(1))
			} else {
				var sum float64
				for j := range sk {
					sum += math.Exp(s[j] - mx)
				}
				lse.Set(h*sq+i, mx+math.Log(sum))
				for j := range sk {
					p := math.Exp(s[j]-mx) / sum
					for t := range d {
						acc[t] += p * v.At((kh*sk+j)*d+t)
					}
				}
			}
			for t := range d {
				y.Set((h*sq+i)*d+t, acc[t])
			}
		}
	}
	return nil
}

// evalAttentionGrad is FlashAttentionGrad by its definition from the given
// forward results: P = exp(scale·Q·Kᵀ − L) (masked entries 0),
// D = rowsum(dY∘Y), dS = P∘(dY·Vᵀ − D), dQ = scale·dS·K, dK = scale·dSᵀ·Q,
// dV = Pᵀ·dY. With grouped K/V heads the dK and dV of K/V head kh are the
// sums over its group of query heads h (h/Group = kh).
func evalAttentionGrad(in []*Tensor, a Attrs, out []*Tensor) error {
	q, k, v, y, lse, dy := in[0], in[1], in[2], in[3], in[4], in[5]
	as, err := AttentionShape(q.Shape, k.Shape, v.Shape)
	if err != nil {
		return err
	}
	bh, sq, sk, d := as.BH, as.Sq, as.Sk, as.D
	scale, causal := a.Float("scale", 1), a.Int("causal", 0) != 0
	dq, dk, dv := make([]float64, q.Len()), make([]float64, k.Len()), make([]float64, v.Len())
	for h := range bh {
		kh := h / as.Group
		for i := range sq {
			var di float64
			for t := range d {
				di += dy.At((h*sq+i)*d+t) * y.At((h*sq+i)*d+t)
			}
			for j := range sk {
				if causal && j > i {
					continue
				}
				var s, dp float64
				for t := range d {
					s += q.At((h*sq+i)*d+t) * k.At((kh*sk+j)*d+t)
					dp += dy.At((h*sq+i)*d+t) * v.At((kh*sk+j)*d+t)
				}
				p := math.Exp(scale*s - lse.At(h*sq+i))
				ds := p * (dp - di)
				for t := range d {
					dv[(kh*sk+j)*d+t] += p * dy.At((h*sq+i)*d+t)
					dq[(h*sq+i)*d+t] += scale * ds * k.At((kh*sk+j)*d+t)
					dk[(kh*sk+j)*d+t] += scale * ds * q.At((h*sq+i)*d+t)
				}
			}
		}
	}
	for o, vals := range [][]float64{dq, dk, dv} {
		for i, x := range vals {
			out[o].Set(i, x)
		}
	}
	return nil
}

// evalAdamW is one AdamW step: m' = β1·m + (1−β1)·g, v' = β2·v + (1−β2)·g²,
// p' = p − lr·(m̂/(√v̂ + ε) + wd·p) with m̂, v̂ bias-corrected at step t.
func evalAdamW(in []*Tensor, a Attrs, out []*Tensor) error {
	p, g, m, v := in[0], in[1], in[2], in[3]
	lr, t := in[4].At(0), in[5].At(0)
	b1, b2 := a.Float("beta1", 0.9), a.Float("beta2", 0.95)
	eps, wd := a.Float("eps", 1e-8), a.Float("weight_decay", 0)
	for i := range p.Len() {
		mo := b1*m.At(i) + (1-b1)*g.At(i)
		vo := b2*v.At(i) + (1-b2)*g.At(i)*g.At(i)
		mh := mo / (1 - math.Pow(b1, t))
		vh := vo / (1 - math.Pow(b2, t))
		out[0].Set(i, p.At(i)-lr*(mh/(math.Sqrt(vh)+eps)+wd*p.At(i)))
		out[1].Set(i, mo)
		out[2].Set(i, vo)
	}
	return nil
}
