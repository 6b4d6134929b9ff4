package graph

import (
	"fmt"
	"math"
	"slices"
)

// Tensor ops of the ONNX backend test suite that are ordinary index or
// window math: CumSum (opset 14), GatherND and ScatterND (opset 13/18: batch
// dimensions, reductions), ReverseSequence (10), MaxUnpool (11), LRN (13) and
// Det (11). Each is the ONNX operator of the same name; integers stay exact
// (int64 arithmetic), floats are computed in float64 and rounded once.

func init() {
	register(&OpSpec{
		Name: "CumSum", Doc: "running sum along axis (exclusive: each element left out of its own sum; reverse: from the end)",
		Inputs: []string{"x", "axis"}, Outputs: []string{"y"}, Eval: evalCumSum,
		Attrs: []AttrSpec{
			{Name: "exclusive", Kind: AttrInt, Default: Int(0)},
			{Name: "reverse", Kind: AttrInt, Default: Int(0)},
		},
		Infer: func(in []*TensorType, _ Attrs, c []*Tensor) ([]TensorType, error) {
			if in[0].DType == Bool {
				return nil, fmt.Errorf("x must be numeric, got %v", in[0].DType)
			}
			if _, err := cumSumAxis(c[1], in[0].Shape.Rank()); err != nil {
				return nil, err
			}
			return []TensorType{*in[0]}, nil
		},
	})
	register(&OpSpec{
		Name: "GatherND", Doc: "slices of data at the leading coordinates the last axis of indices holds (after batch_dims shared axes)",
		Inputs: []string{"data", "indices"}, Outputs: []string{"output"}, Eval: evalGatherND,
		Attrs: []AttrSpec{{Name: "batch_dims", Kind: AttrInt, Default: Int(0)}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			g, err := newNDIndex(in[0].Shape, in[1], int(a.Int("batch_dims", 0)))
			if err != nil {
				return nil, err
			}
			return []TensorType{{in[0].DType, g.outShape()}}, nil
		},
	})
	register(&OpSpec{
		Name: "ScatterND", Doc: "data with updates written (or reduced) at the slices the last axis of indices addresses",
		Inputs: []string{"data", "indices", "updates"}, Outputs: []string{"output"}, Eval: evalScatterND,
		Attrs: []AttrSpec{{Name: "reduction", Kind: AttrString, Default: Str("none")}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			g, err := newNDIndex(in[0].Shape, in[1], 0)
			if err != nil {
				return nil, err
			}
			if want := g.outShape(); in[2].DType != in[0].DType || !in[2].Shape.Equal(want) {
				return nil, fmt.Errorf("updates %v: want %v%v", *in[2], in[0].DType, want)
			}
			if r := a.String("reduction", "none"); !slices.Contains([]string{"none", "add", "mul", "max", "min"}, r) {
				return nil, fmt.Errorf("reduction %q is not one of none, add, mul, max, min", r)
			}
			return []TensorType{*in[0]}, nil
		},
	})
	register(&OpSpec{
		Name: "ReverseSequence", Doc: "the first sequence_lens[b] elements along time_axis reversed in each batch entry b, the rest kept",
		Inputs: []string{"input", "sequence_lens"}, Outputs: []string{"Y"}, Eval: evalReverseSequence,
		Attrs: []AttrSpec{
			{Name: "batch_axis", Kind: AttrInt, Default: Int(1)},
			{Name: "time_axis", Kind: AttrInt, Default: Int(0)},
		},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			ba, _, err := reverseSequenceAxes(a, in[0].Shape.Rank())
			if err != nil {
				return nil, err
			}
			if in[1].DType != Int64 || !in[1].Shape.Equal(Shape{in[0].Shape[ba]}) {
				return nil, fmt.Errorf("sequence_lens %v: want int64[%d]", *in[1], in[0].Shape[ba])
			}
			return []TensorType{*in[0]}, nil
		},
	})
	register(&OpSpec{
		Name: "MaxUnpool", Doc: "zeros of the unpooled shape with each X written at its flat index in I (MaxPool's Indices)",
		Inputs: []string{"X", "I", "output_shape?"}, Outputs: []string{"output"}, Eval: evalMaxUnpool,
		Attrs: []AttrSpec{
			{Name: "kernel_shape", Kind: AttrInts, Required: true},
			{Name: "strides", Kind: AttrInts},
			{Name: "pads", Kind: AttrInts},
		},
		Infer: func(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
			x := in[0]
			if !x.DType.IsFloat() || x.Shape.Rank() < 3 {
				return nil, fmt.Errorf("X %v: want a float [N, C, D...]", *x)
			}
			if in[1].DType != Int64 || !in[1].Shape.Equal(x.Shape) {
				return nil, fmt.Errorf("I %v: want int64%v", *in[1], x.Shape)
			}
			var given []int
			if in[2] != nil {
				var err error
				if given, err = constInts(c[2], "output_shape"); err != nil {
					return nil, err
				}
			}
			out, err := unpoolShape(a, x.Shape, given)
			if err != nil {
				return nil, err
			}
			return []TensorType{{x.DType, out}}, nil
		},
	})
	register(&OpSpec{
		Name: "LRN", Doc: "X / (bias + alpha/size · Σ X² over size neighbouring channels)^beta",
		Inputs: []string{"X"}, Outputs: []string{"Y"}, Eval: evalLRN,
		Attrs: []AttrSpec{
			{Name: "size", Kind: AttrInt, Required: true},
			{Name: "alpha", Kind: AttrFloat, Default: Float(1e-4)},
			{Name: "beta", Kind: AttrFloat, Default: Float(0.75)},
			{Name: "bias", Kind: AttrFloat, Default: Float(1)},
		},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			if !in[0].DType.IsFloat() || in[0].Shape.Rank() < 2 {
				return nil, fmt.Errorf("X %v: want a float [N, C, ...]", *in[0])
			}
			if a.Int("size", 0) <= 0 {
				return nil, fmt.Errorf("size %d: want a positive channel count", a.Int("size", 0))
			}
			return []TensorType{*in[0]}, nil
		},
	})
	register(&OpSpec{
		Name: "Det", Doc: "determinant of each square matrix of the last two axes",
		Inputs: []string{"X"}, Outputs: []string{"Y"}, Eval: evalDet,
		Infer: func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
			s := in[0].Shape
			if !in[0].DType.IsFloat() || s.Rank() < 2 || s[s.Rank()-1] != s[s.Rank()-2] {
				return nil, fmt.Errorf("X %v: want a float [..., M, M]", *in[0])
			}
			return []TensorType{{in[0].DType, s[:s.Rank()-2].Clone()}}, nil
		},
	})
}

// cumSumAxis reads CumSum's axis operand: one integer in [-rank, rank).
func cumSumAxis(c *Tensor, rank int) (int, error) {
	ax, err := constInts(c, "axis")
	if err != nil {
		return 0, err
	}
	if len(ax) != 1 {
		return 0, fmt.Errorf("axis %v: want one value", ax)
	}
	return NormAxis(ax[0], rank)
}

func evalCumSum(in []*Tensor, a Attrs, out []*Tensor) error {
	x, y := in[0], out[0]
	ax, err := cumSumAxis(in[1], x.Shape.Rank())
	if err != nil {
		return err
	}
	excl, rev := a.Int("exclusive", 0) != 0, a.Int("reverse", 0) != 0
	lines(x.Shape, ax, func(pos []int) {
		if rev {
			pos = slices.Clone(pos)
			slices.Reverse(pos)
		}
		var si int64 // int64 sums wrap as ONNX's do; floats add in float64
		var sf float64
		for _, p := range pos {
			if x.I64 != nil {
				if !excl {
					si += x.I64[p]
				}
				y.I64[p] = si
				if excl {
					si += x.I64[p]
				}
				continue
			}
			if !excl {
				sf += x.At(p)
			}
			y.Set(p, sf)
			if excl {
				sf += x.At(p)
			}
		}
	})
	return nil
}

// ndIndex is the geometry GatherND and ScatterND share: data's axes are
// batch [b], indexed [k] (the last axis of indices) and sliced (the rest);
// indices is [batch..., groups..., k].
type ndIndex struct {
	data     Shape
	idx      Shape
	b, k     int
	slice    int // elements per addressed slice
	perBatch int // index tuples per batch entry
}

func newNDIndex(data Shape, idx *TensorType, b int) (*ndIndex, error) {
	if idx.DType != Int64 {
		return nil, fmt.Errorf("indices must be int64, got %v", idx.DType)
	}
	r, q := data.Rank(), idx.Shape.Rank()
	if q < 1 || b < 0 || b >= q || b >= r {
		return nil, fmt.Errorf("batch_dims %d for data of rank %d and indices of rank %d", b, r, q)
	}
	k := idx.Shape[q-1]
	if k < 1 || b+k > r {
		return nil, fmt.Errorf("indices %v address %d axes of data %v after %d batch axes", idx.Shape, k, data, b)
	}
	for d := range b {
		if idx.Shape[d] != data[d] {
			return nil, fmt.Errorf("batch axis %d: indices %v and data %v differ", d, idx.Shape, data)
		}
	}
	return &ndIndex{data: data, idx: idx.Shape, b: b, k: k,
		slice: data[b+k:].Numel(), perBatch: idx.Shape[b : q-1].Numel()}, nil
}

// outShape is GatherND's output (and ScatterND's updates):
// indices.shape[:-1] + data.shape[batch_dims+k:].
func (g *ndIndex) outShape() Shape {
	return append(g.idx[:g.idx.Rank()-1].Clone(), g.data[g.b+g.k:]...)
}

// start is the flat data position of the slice index tuple t (counted over
// all batch entries) addresses; negative coordinates count from the end.
func (g *ndIndex) start(idx *Tensor, t int) (int, error) {
	batch := t / max(g.perBatch, 1)
	p := batch
	for d := range g.k {
		n := g.data[g.b+d]
		v := idx.I64[t*g.k+d]
		if v < 0 {
			v += int64(n)
		}
		if v < 0 || v >= int64(n) {
			return 0, fmt.Errorf("index %d out of range for axis %d of size %d", idx.I64[t*g.k+d], g.b+d, n)
		}
		p = p*n + int(v)
	}
	return p * g.slice, nil
}

func evalGatherND(in []*Tensor, a Attrs, out []*Tensor) error {
	data, idx := in[0], in[1]
	g, err := newNDIndex(data.Shape, &TensorType{idx.DType, idx.Shape}, int(a.Int("batch_dims", 0)))
	if err != nil {
		return err
	}
	for t := range idx.Len() / g.k {
		s, err := g.start(idx, t)
		if err != nil {
			return err
		}
		for j := range g.slice {
			copyElem(out[0], t*g.slice+j, data, s+j)
		}
	}
	return nil
}

// evalScatterND applies the updates in row-major order of indices, so that
// with reduction none a slice addressed twice keeps the last write (ONNX
// leaves that undefined; this is the order runtimes use).
func evalScatterND(in []*Tensor, a Attrs, out []*Tensor) error {
	data, idx, upd, o := in[0], in[1], in[2], out[0]
	g, err := newNDIndex(data.Shape, &TensorType{idx.DType, idx.Shape}, 0)
	if err != nil {
		return err
	}
	for i := range o.Len() {
		copyElem(o, i, data, i)
	}
	red := a.String("reduction", "none")
	for t := range idx.Len() / g.k {
		s, err := g.start(idx, t)
		if err != nil {
			return err
		}
		for j := range g.slice {
			q, p := s+j, t*g.slice+j
			if o.I64 != nil {
				o.I64[q] = scatterCombine(red, o.I64[q], upd.I64[p])
				continue
			}
			o.Set(q, scatterCombine(red, o.At(q), upd.At(p)))
		}
	}
	return nil
}

func reverseSequenceAxes(a Attrs, rank int) (batch, time int, err error) {
	if rank < 2 {
		return 0, 0, fmt.Errorf("input of rank %d: want at least 2", rank)
	}
	b, t := a.Int("batch_axis", 1), a.Int("time_axis", 0)
	if (b != 0 && b != 1) || (t != 0 && t != 1) || b == t {
		return 0, 0, fmt.Errorf("batch_axis %d and time_axis %d: want 0 and 1 in some order", b, t)
	}
	return int(b), int(t), nil
}

func evalReverseSequence(in []*Tensor, a Attrs, out []*Tensor) error {
	x, lens, y := in[0], in[1], out[0]
	ba, ta, err := reverseSequenceAxes(a, x.Shape.Rank())
	if err != nil {
		return err
	}
	steps := x.Shape[ta]
	for b, l := range lens.I64 {
		if l < 0 || l > int64(steps) {
			return fmt.Errorf("sequence_lens[%d] = %d outside [0, %d]", b, l, steps)
		}
	}
	pos := make([]int, x.Shape.Rank())
	for p := range y.Len() {
		unravel(p, y.Shape, pos)
		if l := int(lens.I64[pos[ba]]); pos[ta] < l {
			pos[ta] = l - 1 - pos[ta]
		}
		copyElem(y, p, x, ravel(pos, x.Shape))
	}
	return nil
}

// UnpoolShape is MaxUnpool's default output for X of shape x: [N, C] +
// (in − 1)·stride + kernel − pads, the shape its indices number.
func UnpoolShape(a Attrs, x Shape) (Shape, error) { return unpoolShape(a, x, nil) }

// unpoolShape is MaxUnpool's output: output_shape when given (it must hold
// the default one), else [N, C] + (in − 1)·stride + kernel − pads.
func unpoolShape(a Attrs, x Shape, given []int) (Shape, error) {
	n := x.Rank() - 2
	k := toInts(a.IntList("kernel_shape"))
	if len(k) != n {
		return nil, fmt.Errorf("kernel_shape %v for %d spatial axes", k, n)
	}
	strides, err := windowInts(a, "strides", 1, n)
	if err != nil {
		return nil, err
	}
	pads, err := windowInts(a, "pads", 0, 2*n)
	if err != nil {
		return nil, err
	}
	out := x[:2].Clone()
	for i := range n {
		if k[i] <= 0 || strides[i] <= 0 || pads[i] < 0 || pads[n+i] < 0 {
			return nil, fmt.Errorf("kernel_shape %v, strides %v and pads %v must be positive (pads non-negative)", k, strides, pads)
		}
		d := (x[2+i]-1)*strides[i] + k[i] - pads[i] - pads[n+i]
		if d <= 0 {
			return nil, fmt.Errorf("unpooled axis %d has size %d", 2+i, d)
		}
		out = append(out, d)
	}
	if given == nil {
		return out, nil
	}
	if len(given) != x.Rank() || given[0] != x[0] || given[1] != x[1] {
		return nil, fmt.Errorf("output_shape %v for X %v", given, x)
	}
	for i := range n {
		if given[2+i] < out[2+i] {
			return nil, fmt.Errorf("output_shape %v is smaller than the unpooled %v", given, out)
		}
	}
	return Shape(given).Clone(), nil
}

func evalMaxUnpool(in []*Tensor, a Attrs, out []*Tensor) error {
	x, idx, y := in[0], in[1], out[0]
	// I numbers positions of the default unpooled shape; a larger
	// output_shape keeps each at its multi-index (the extra rows and
	// columns, at the ends, stay zero).
	def, err := UnpoolShape(a, x.Shape)
	if err != nil {
		return err
	}
	for i := range y.Len() {
		y.Set(i, 0)
	}
	pos := make([]int, def.Rank())
	for i, q := range idx.I64 {
		if q < 0 || q >= int64(def.Numel()) {
			return fmt.Errorf("index %d out of range for an unpooled %v", q, def)
		}
		unravel(int(q), def, pos)
		y.Set(ravel(pos, y.Shape), x.At(i))
	}
	return nil
}

// evalLRN sums the squares over channels c − ⌊(size−1)/2⌋ … c + ⌈(size−1)/2⌉
// (those that exist).
func evalLRN(in []*Tensor, a Attrs, out []*Tensor) error {
	x, y := in[0], out[0]
	size := int(a.Int("size", 1))
	alpha, beta, bias := a.Float("alpha", 1e-4), a.Float("beta", 0.75), a.Float("bias", 1)
	ch, inner := x.Shape[1], x.Shape[2:].Numel()
	lo, hi := (size-1)/2, size-1-(size-1)/2
	for p := range x.Len() {
		c := p / inner % ch
		base := p - c*inner
		var s float64
		for j := max(0, c-lo); j <= min(ch-1, c+hi); j++ {
			v := x.At(base + j*inner)
			s += v * v
		}
		y.Set(p, x.At(p)/math.Pow(bias+alpha/float64(size)*s, beta))
	}
	return nil
}

// evalDet factors each matrix by Gaussian elimination with partial pivoting
// in float64: the determinant is the pivots' product, negated per row swap.
func evalDet(in []*Tensor, _ Attrs, out []*Tensor) error {
	x := in[0]
	m := x.Shape[x.Shape.Rank()-1]
	a := make([]float64, m*m)
	for b := range out[0].Len() {
		for i := range a {
			a[i] = x.At(b*m*m + i)
		}
		det := 1.0
		for c := range m {
			piv := c
			for r := c + 1; r < m; r++ {
				if math.Abs(a[r*m+c]) > math.Abs(a[piv*m+c]) {
					piv = r
				}
			}
			if a[piv*m+c] == 0 {
				det = 0
				break
			}
			if piv != c {
				for j := range m {
					a[c*m+j], a[piv*m+j] = a[piv*m+j], a[c*m+j]
				}
				det = -det
			}
			det *= a[c*m+c]
			for r := c + 1; r < m; r++ {
				f := a[r*m+c] / a[c*m+c]
				for j := c; j < m; j++ {
					a[r*m+j] -= f * a[c*m+j]
				}
			}
		}
		out[0].Set(b, det)
	}
	return nil
}
