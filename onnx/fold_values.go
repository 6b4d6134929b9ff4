package onnx

import (
	"cmp"
	"math"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// ONNX ops whose output shape depends on their input's values (the window
// functions' size, Unique's and NonZero's data) or only on its shape
// (EyeLike). A static graph cannot hold them as nodes: each folds at import
// when its inputs are known (a graph input they need is named in a
// BindError, so that binding it specialises the model), and EyeLike folds
// whenever its input's shape is known, which is always.

func init() {
	for op, f := range map[string]folder{
		"HannWindow": foldWindow, "HammingWindow": foldWindow, "BlackmanWindow": foldWindow,
		"Unique": foldUnique, "NonZero": foldNonZero, "MelWeightMatrix": foldMelWeightMatrix,
		"NonMaxSuppression": foldNMS,
	} {
		folders[op] = f
	}
	shapeOnly["EyeLike"] = foldEyeLike
	for op, v := range map[string]int64{"HannWindow": 17, "HammingWindow": 17, "BlackmanWindow": 17, "Unique": 11, "NonZero": 9, "EyeLike": 9, "MelWeightMatrix": 17, "NonMaxSuppression": 10} {
		introduced[op] = v
	}
}

// windowTerms are the cosine coefficients a_j of each window, w(k) = Σ_j
// (−1)^j a_j cos(2πjk/N): Hann 0.5, 0.5; Hamming 25/46, 21/46; Blackman
// 0.42, 0.5, 0.08 (ONNX's definitions).
var windowTerms = map[string][]float64{
	"HannWindow":     {0.5, 0.5},
	"HammingWindow":  {25.0 / 46, 21.0 / 46},
	"BlackmanWindow": {0.42, 0.5, 0.08},
}

// foldWindow computes a window of size values: N = size when periodic (the
// default), size − 1 when symmetric.
func foldWindow(c *opCtx, in []*cval) ([]*cval, error) {
	periodic, err := c.attrInt("periodic", 1)
	if err != nil {
		return nil, err
	}
	odt, err := c.attrInt("output_datatype", int64(onnxpb.Float))
	if err != nil {
		return nil, err
	}
	dt := onnxpb.DataType(odt)
	if !numericType(dt) || dt == onnxpb.Bool {
		return nil, c.errf("output_datatype %v is not supported", dt)
	}
	if in[0] == nil || in[0].n() != 1 || !isIntType(in[0].dt) {
		return nil, c.errf("size: want one integer")
	}
	size := in[0].i[0]
	if size < 0 || size > int64(c.foldCap()) {
		return nil, c.errf("size %d out of range", size)
	}
	n := float64(size)
	if periodic == 0 {
		n--
	}
	terms := windowTerms[c.n.OpType]
	out := newCval(dt, graph.Shape{int(size)})
	for k := range int(size) {
		var w float64
		for j, a := range terms {
			if j%2 == 1 {
				a = -a
			}
			w += a * math.Cos(2*math.Pi*float64(j)*float64(k)/n)
		}
		if size == 1 {
			w = 1 // N = 0 in the symmetric window of one: the window is [1].
		}
		out.set(k, w)
	}
	return []*cval{out}, nil
}

// foldEyeLike is a 2-D tensor of its input's shape with ones on diagonal k.
func foldEyeLike(c *opCtx) ([]*cval, error) {
	e := c.input(0)
	if e == nil {
		return nil, c.errf("needs an input")
	}
	dt, shape := e.typ()
	if c.has("dtype") {
		v, err := c.attrInt("dtype", 0)
		if err != nil {
			return nil, err
		}
		dt = onnxpb.DataType(v)
	}
	k, err := c.attrInt("k", 0)
	if err != nil {
		return nil, err
	}
	if !numericType(dt) {
		return nil, c.errf("dtype %v is not supported", dt)
	}
	if len(shape) != 2 {
		return nil, c.errf("input of shape %v: want 2-D", shape)
	}
	if c.foldTooBig(shape) {
		return nil, c.errf("an identity of shape %v is too large to fold", shape)
	}
	out := newCval(dt, shape)
	for i := range shape[0] {
		if j := int64(i) + k; j >= 0 && j < int64(shape[1]) {
			out.set(i*shape[1]+int(j), 1)
		}
	}
	return []*cval{out}, nil
}

// foldUnique lists the distinct elements (or slices along axis) of X, sorted
// ascending (lexicographically for slices) or in order of first occurrence,
// with the first index of each, each element's index in the list, and the
// counts.
func foldUnique(c *opCtx, in []*cval) ([]*cval, error) {
	sorted, err := c.attrInt("sorted", 1)
	if err != nil {
		return nil, err
	}
	x := in[0]
	if x == nil {
		return nil, c.errf("needs an input")
	}
	// Slices along axis: [outer, n, inner] with slice s the elements
	// (o, s, i) for every o and i. Without axis: the flattened elements.
	shape := x.shape
	ax := -1
	outer, n, inner := 1, x.n(), 1
	if c.has("axis") {
		a, err := c.attrInt("axis", 0)
		if err != nil {
			return nil, err
		}
		if ax, err = graph.NormAxis(int(a), shape.Rank()); err != nil {
			return nil, c.errf("%v", err)
		}
		outer, n, inner = shape[:ax].Numel(), shape[ax], shape[ax+1:].Numel()
	}
	pos := func(s, j int) int { // flat position of element j of slice s
		o, i := j/inner, j%inner
		return (o*n+s)*inner + i
	}
	width := outer * inner
	compare := func(a, b int) int {
		for j := range width {
			p, q := pos(a, j), pos(b, j)
			d := 0
			if x.i != nil { // integers exactly, not through float64
				d = cmp.Compare(x.i[p], x.i[q])
			} else {
				d = cmp.Compare(x.f[p], x.f[q])
			}
			if d != 0 {
				return d
			}
		}
		return 0
	}
	var firsts []int // the first slice of each distinct value
	inverse := make([]int64, n)
	for s := range n {
		k := slices.IndexFunc(firsts, func(f int) bool { return compare(f, s) == 0 })
		if k < 0 {
			k = len(firsts)
			firsts = append(firsts, s)
		}
		inverse[s] = int64(k)
	}
	order := make([]int, len(firsts)) // positions in firsts, in output order
	for i := range order {
		order[i] = i
	}
	if sorted != 0 {
		slices.SortStableFunc(order, func(a, b int) int { return compare(firsts[a], firsts[b]) })
	}
	rank := make([]int64, len(order)) // output position of each entry of firsts
	for p, k := range order {
		rank[k] = int64(p)
	}
	u := len(firsts)
	yShape := graph.Shape{u}
	if ax >= 0 {
		yShape = shape.Clone()
		yShape[ax] = u
	}
	y := newCval(x.dt, yShape)
	idx, cnt := newCval(onnxpb.Int64, graph.Shape{u}), newCval(onnxpb.Int64, graph.Shape{u})
	for p, k := range order {
		s := firsts[k]
		idx.i[p] = int64(s)
		for j := range width {
			o, i := j/inner, j%inner
			if y.i != nil {
				y.i[(o*u+p)*inner+i] = x.i[pos(s, j)]
			} else {
				y.f[(o*u+p)*inner+i] = x.f[pos(s, j)]
			}
		}
	}
	inv := newCval(onnxpb.Int64, graph.Shape{n})
	for s, k := range inverse {
		inv.i[s] = rank[k]
		cnt.i[rank[k]]++
	}
	return []*cval{y, idx, inv, cnt}, nil
}

// foldNonZero gives the coordinates of the non-zero elements, one row per
// axis, in row-major order.
func foldNonZero(c *opCtx, in []*cval) ([]*cval, error) {
	x := in[0]
	if x == nil {
		return nil, c.errf("needs an input")
	}
	if x.shape.Rank() == 0 {
		return nil, c.errf("NonZero of a scalar is not supported")
	}
	var nz []int
	for k := range x.n() {
		if x.at(k) != 0 {
			nz = append(nz, k)
		}
	}
	r := x.shape.Rank()
	out := newCval(onnxpb.Int64, graph.Shape{r, len(nz)})
	for j, k := range nz {
		for d := r - 1; d >= 0; d-- {
			out.i[d*len(nz)+j] = int64(k % x.shape[d])
			k /= x.shape[d]
		}
	}
	return []*cval{out}, nil
}

// foldMelWeightMatrix is the [dft_length/2 + 1, num_mel_bins] matrix of
// triangular filters, as ONNX defines it: num_mel_bins + 2 points evenly
// spaced on the mel scale (mel = 2595·log10(1 + f/700)) between the edge
// frequencies, each mapped to the spectrogram bin ⌊(dft_length + 1)·f /
// sample_rate⌋; filter i rises from point i to point i + 1 and falls to
// point i + 2.
func foldMelWeightMatrix(c *opCtx, in []*cval) ([]*cval, error) {
	odt, err := c.attrInt("output_datatype", int64(onnxpb.Float))
	if err != nil {
		return nil, err
	}
	dt := onnxpb.DataType(odt)
	if !isFloatType(dt) {
		return nil, c.errf("output_datatype %v is not supported", dt)
	}
	var v [5]float64
	for i := range v {
		if in[i] == nil || in[i].n() != 1 {
			return nil, c.errf("input %d: want one value", i)
		}
		v[i] = in[i].at(0)
	}
	bins, length, rate, lo, hi := int(v[0]), int(v[1]), v[2], v[3], v[4]
	spec := length/2 + 1
	if bins < 1 || length < 1 || rate <= 0 || spec*bins > c.foldCap() {
		return nil, c.errf("num_mel_bins %d, dft_length %d, sample_rate %v: out of range", bins, length, rate)
	}
	mel := func(f float64) float64 { return 2595 * math.Log10(1+f/700) }
	lm, hm := mel(lo), mel(hi)
	step := (hm - lm) / float64(bins+2)
	pts := make([]int, bins+2)
	for i := range pts {
		f := 700 * (math.Pow(10, (float64(i)*step+lm)/2595) - 1)
		pts[i] = int(math.Floor(float64(length+1) * f / rate))
	}
	out := newCval(dt, graph.Shape{spec, bins})
	set := func(row, col int, w float64) {
		if row >= 0 && row < spec {
			out.set(row*bins+col, w)
		}
	}
	for i := range bins {
		lower, center, upper := pts[i], pts[i+1], pts[i+2]
		if center == lower {
			set(center, i, 1)
		} else {
			for j := lower; j <= center; j++ {
				set(j, i, float64(j-lower)/float64(center-lower))
			}
		}
		for j := center; j < upper; j++ {
			set(j, i, float64(upper-j)/float64(upper-center))
		}
	}
	return []*cval{out}, nil
}

// foldNMS selects, per batch entry and class, the boxes of highest score
// greedily, dropping a box whose IoU with one already selected is above
// iou_threshold and boxes of score not above score_threshold, at most
// max_output_boxes_per_class of them (absent: 0, none). Each selected box
// is a row [batch, class, box] of the output, by batch, class, then
// selection order.
func foldNMS(c *opCtx, in []*cval) ([]*cval, error) {
	center, err := c.attrInt("center_point_box", 0)
	if err != nil {
		return nil, err
	}
	boxes, scores := in[0], in[1]
	if boxes == nil || scores == nil || boxes.shape.Rank() != 3 || boxes.shape[2] != 4 || scores.shape.Rank() != 3 ||
		scores.shape[0] != boxes.shape[0] || scores.shape[2] != boxes.shape[1] {
		return nil, c.errf("want boxes [batch, n, 4] and scores [batch, classes, n]")
	}
	if !boxes.isFloat() {
		return nil, c.errf("boxes must be floats, got %v", boxes.dt)
	}
	scalar := func(i int, def float64) (float64, error) {
		if i >= len(in) || in[i] == nil {
			return def, nil
		}
		if in[i].n() != 1 {
			return 0, c.errf("input %d: want one value", i)
		}
		return in[i].at(0), nil
	}
	maxOut, err := scalar(2, 0)
	if err != nil {
		return nil, err
	}
	iouMax, err := scalar(3, 0)
	if err != nil {
		return nil, err
	}
	minScore, err := scalar(4, math.Inf(-1))
	if err != nil {
		return nil, err
	}
	nb, nc, n := boxes.shape[0], scores.shape[1], boxes.shape[1]
	// corners gives box i of batch b as y1 ≤ y2, x1 ≤ x2.
	corners := func(b, i int) (y1, x1, y2, x2 float64) {
		p := (b*n + i) * 4
		v := boxes.f[p : p+4]
		if center != 0 {
			return v[1] - v[3]/2, v[0] - v[2]/2, v[1] + v[3]/2, v[0] + v[2]/2
		}
		return min(v[0], v[2]), min(v[1], v[3]), max(v[0], v[2]), max(v[1], v[3])
	}
	iou := func(b, i, j int) float64 {
		ay1, ax1, ay2, ax2 := corners(b, i)
		by1, bx1, by2, bx2 := corners(b, j)
		areaA, areaB := (ay2-ay1)*(ax2-ax1), (by2-by1)*(bx2-bx1)
		if areaA <= 0 || areaB <= 0 {
			return 0
		}
		ih, iw := min(ay2, by2)-max(ay1, by1), min(ax2, bx2)-max(ax1, bx1)
		if ih <= 0 || iw <= 0 {
			return 0
		}
		inter := ih * iw
		return inter / (areaA + areaB - inter)
	}
	var rows []int64
	for b := range nb {
		for cl := range nc {
			var cand []int
			for i := range n {
				if scores.at((b*nc+cl)*n+i) > minScore {
					cand = append(cand, i)
				}
			}
			slices.SortStableFunc(cand, func(i, j int) int {
				return cmp.Compare(scores.at((b*nc+cl)*n+j), scores.at((b*nc+cl)*n+i))
			})
			var kept []int
			for _, i := range cand {
				if float64(len(kept)) >= maxOut {
					break
				}
				if !slices.ContainsFunc(kept, func(j int) bool { return iou(b, i, j) > iouMax }) {
					kept = append(kept, i)
					rows = append(rows, int64(b), int64(cl), int64(i))
				}
			}
		}
	}
	out := newCval(onnxpb.Int64, graph.Shape{len(rows) / 3, 3})
	copy(out.i, rows)
	return []*cval{out}, nil
}
