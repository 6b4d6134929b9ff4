package graph

import (
	"fmt"
	"slices"
)

// Index ops the ONNX backend test suite asks for: ScatterElements, Pad, TopK
// and OneHot, with ONNX's semantics (ScatterElements' reduction from opset
// 16/18; Pad's modes constant, reflect and edge; TopK's ties to the lower
// index; OneHot's negative indices from opset 11).

func init() {
	register(&OpSpec{
		Name: "ScatterElements", Doc: "data with updates written (or reduced) at the positions indices give along axis",
		Inputs: []string{"data", "indices", "updates"}, Outputs: []string{"output"}, Eval: evalScatterElements,
		Attrs: []AttrSpec{
			{Name: "axis", Kind: AttrInt, Default: Int(0)},
			{Name: "reduction", Kind: AttrString, Default: Str("none")},
		},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			if in[1].DType != Int64 || in[2].DType != in[0].DType {
				return nil, fmt.Errorf("want int64 indices and updates of data's type, got %v and %v", in[1].DType, in[2].DType)
			}
			if !in[1].Shape.Equal(in[2].Shape) || in[1].Shape.Rank() != in[0].Shape.Rank() {
				return nil, fmt.Errorf("indices %v and updates %v must match and have data's rank %d", in[1].Shape, in[2].Shape, in[0].Shape.Rank())
			}
			if _, err := NormAxis(int(a.Int("axis", 0)), in[0].Shape.Rank()); err != nil {
				return nil, err
			}
			if r := a.String("reduction", "none"); !slices.Contains([]string{"none", "add", "mul", "max", "min"}, r) {
				return nil, fmt.Errorf("reduction %q is not one of none, add, mul, max, min", r)
			}
			return []TensorType{*in[0]}, nil
		},
	})
	register(&OpSpec{
		Name: "Pad", Doc: "data padded by pads (begins then ends; negative crops) with constant_value, or reflected or edge values",
		Inputs: []string{"data", "pads", "constant_value?"}, Outputs: []string{"output"}, Eval: evalPad,
		Attrs: []AttrSpec{{Name: "mode", Kind: AttrString, Default: Str("constant")}},
		Infer: func(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
			pads, err := constInts(c[1], "pads")
			if err != nil {
				return nil, err
			}
			if in[2] != nil && (in[2].DType != in[0].DType || in[2].Shape.Numel() != 1) {
				return nil, fmt.Errorf("constant_value %v: want one %v", *in[2], in[0].DType)
			}
			out, err := padShape(in[0].Shape, pads, a.String("mode", "constant"))
			if err != nil {
				return nil, err
			}
			return []TensorType{{in[0].DType, out}}, nil
		},
	})
	register(&OpSpec{
		Name: "TopK", Doc: "the K largest (or smallest) elements along axis and their int64 indices, sorted, ties to the lower index",
		Inputs: []string{"X", "K"}, Outputs: []string{"Values", "Indices"}, Eval: evalTopK,
		Attrs: []AttrSpec{
			{Name: "axis", Kind: AttrInt, Default: Int(-1)},
			{Name: "largest", Kind: AttrInt, Default: Int(1)},
			{Name: "sorted", Kind: AttrInt, Default: Int(1)},
		},
		Infer: func(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
			k, err := constInts(c[1], "K")
			if err != nil {
				return nil, err
			}
			ax, err := NormAxis(int(a.Int("axis", -1)), in[0].Shape.Rank())
			if err != nil {
				return nil, err
			}
			if len(k) != 1 || k[0] < 0 || k[0] > in[0].Shape[ax] {
				return nil, fmt.Errorf("K %v for axis %d of size %d", k, ax, in[0].Shape[ax])
			}
			if !in[0].DType.IsFloat() {
				return nil, fmt.Errorf("X must be a float type, got %v", in[0].DType)
			}
			s := in[0].Shape.Clone()
			s[ax] = k[0]
			return []TensorType{{in[0].DType, s}, {Int64, s.Clone()}}, nil
		},
	})
	register(&OpSpec{
		Name: "OneHot", Doc: "values[1] where the position along the new axis equals the index (negative counts from depth), values[0] elsewhere",
		Inputs: []string{"indices", "depth", "values"}, Outputs: []string{"output"}, Eval: evalOneHot,
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: Int(-1)}},
		Infer: func(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
			d, err := constInts(c[1], "depth")
			if err != nil {
				return nil, err
			}
			if len(d) != 1 || d[0] <= 0 {
				return nil, fmt.Errorf("depth %v: want one positive value", d)
			}
			if in[0].DType == Bool || in[2].Shape.Numel() != 2 {
				return nil, fmt.Errorf("want numeric indices and two values, got %v and %v", in[0].DType, in[2].Shape)
			}
			r := in[0].Shape.Rank() + 1
			ax, err := NormAxis(int(a.Int("axis", -1)), r)
			if err != nil {
				return nil, err
			}
			s := append(append(in[0].Shape[:ax].Clone(), d[0]), in[0].Shape[ax:]...)
			return []TensorType{{in[2].DType, s}}, nil
		},
	})
}

// evalScatterElements writes in row-major order of indices, so that with
// reduction none a position named twice keeps the last write (ONNX leaves
// that case undefined; this is the sequential order runtimes use).
func evalScatterElements(in []*Tensor, a Attrs, out []*Tensor) error {
	data, idx, upd, o := in[0], in[1], in[2], out[0]
	ax, err := NormAxis(int(a.Int("axis", 0)), data.Shape.Rank())
	if err != nil {
		return err
	}
	for i := range o.Len() {
		copyElem(o, i, data, i)
	}
	red := a.String("reduction", "none")
	dim := data.Shape[ax]
	pos := make([]int, data.Shape.Rank())
	for p := range idx.Len() {
		unravel(p, idx.Shape, pos)
		k := idx.I64[p]
		if k < 0 {
			k += int64(dim)
		}
		if k < 0 || k >= int64(dim) {
			return fmt.Errorf("index %d out of range for axis %d of size %d", idx.I64[p], ax, dim)
		}
		pos[ax] = int(k)
		for d := range pos {
			if pos[d] >= data.Shape[d] {
				return fmt.Errorf("indices %v exceed data %v", idx.Shape, data.Shape)
			}
		}
		q := ravel(pos, data.Shape)
		if o.I64 != nil {
			o.I64[q] = scatterCombine(red, o.I64[q], upd.I64[p])
			continue
		}
		o.Set(q, scatterCombine(red, o.At(q), upd.At(p)))
	}
	return nil
}

// scatterCombine is the value at a position after an update u of the value
// v there, as ScatterElements' reduction says (none: u replaces v).
func scatterCombine[T int64 | float64](red string, v, u T) T {
	switch red {
	case "add":
		return v + u
	case "mul":
		return v * u
	case "max":
		return max(v, u)
	case "min":
		return min(v, u)
	}
	return u
}

func padShape(in Shape, pads []int, mode string) (Shape, error) {
	r := in.Rank()
	if len(pads) != 2*r {
		return nil, fmt.Errorf("pads %v for rank %d", pads, r)
	}
	if mode != "constant" && mode != "reflect" && mode != "edge" {
		return nil, fmt.Errorf("mode %q is not one of constant, reflect, edge", mode)
	}
	out := make(Shape, r)
	for i, d := range in {
		out[i] = d + pads[i] + pads[r+i]
		if out[i] < 0 {
			return nil, fmt.Errorf("pads %v crop past dim %d of %v", pads, i, in)
		}
		if out[i] > 0 && d == 0 && mode != "constant" {
			return nil, fmt.Errorf("mode %s cannot pad the empty dim %d of %v", mode, i, in)
		}
		if mode == "reflect" && (pads[i] >= d || pads[r+i] >= d) && (pads[i] > 0 || pads[r+i] > 0) {
			return nil, fmt.Errorf("reflect pads %v must be smaller than dim %d of %v", pads, i, in)
		}
	}
	return out, nil
}

func evalPad(in []*Tensor, a Attrs, out []*Tensor) error {
	x, o := in[0], out[0]
	pads, err := intsOf(in[1], "pads")
	if err != nil {
		return err
	}
	mode := a.String("mode", "constant")
	if _, err := padShape(x.Shape, pads, mode); err != nil {
		return err
	}
	fill := at(in, 2) // absent: zero
	if fill == nil {
		fill = NewTensor(x.DType, Shape{1})
	}
	r := x.Shape.Rank()
	oi := make([]int, r)
	ii := make([]int, r)
	for p := range o.Len() {
		unravel(p, o.Shape, oi)
		inside := true
		for d := range r {
			i, n := oi[d]-pads[d], x.Shape[d]
			switch {
			case i >= 0 && i < n:
			case mode == "edge":
				i = min(max(i, 0), n-1)
			case mode == "reflect":
				if i < 0 {
					i = -i
				} else {
					i = 2*(n-1) - i
				}
			default:
				inside = false
			}
			ii[d] = i
		}
		if !inside {
			copyElem(o, p, fill, 0)
			continue
		}
		copyElem(o, p, x, ravel(ii, x.Shape))
	}
	return nil
}

func evalTopK(in []*Tensor, a Attrs, out []*Tensor) error {
	x := in[0]
	ax, err := NormAxis(int(a.Int("axis", -1)), x.Shape.Rank())
	if err != nil {
		return err
	}
	largest := a.Int("largest", 1) != 0
	k := out[0].Shape[ax]
	var outPos [][]int
	lines(out[0].Shape, ax, func(pos []int) { outPos = append(outPos, pos) })
	li := 0
	lines(x.Shape, ax, func(pos []int) {
		order := make([]int, len(pos))
		for j := range order {
			order[j] = j
		}
		slices.SortStableFunc(order, func(i, j int) int {
			a, b := x.At(pos[i]), x.At(pos[j])
			if largest {
				a, b = b, a
			}
			switch {
			case a < b:
				return -1
			case a > b:
				return 1
			}
			return 0
		})
		for j := range k {
			out[0].Set(outPos[li][j], x.At(pos[order[j]]))
			out[1].I64[outPos[li][j]] = int64(order[j])
		}
		li++
	})
	return nil
}

func evalOneHot(in []*Tensor, a Attrs, out []*Tensor) error {
	idx, vals, o := in[0], in[2], out[0]
	depth := o.Shape
	r := o.Shape.Rank()
	ax, err := NormAxis(int(a.Int("axis", -1)), r)
	if err != nil {
		return err
	}
	d := depth[ax]
	oi := make([]int, r)
	ii := make([]int, r-1)
	for p := range o.Len() {
		unravel(p, o.Shape, oi)
		copy(ii, oi[:ax])
		copy(ii[ax:], oi[ax+1:])
		k := intAt(idx, ravel(ii, idx.Shape))
		if k < 0 {
			k += int64(d)
		}
		on := 0
		if k == int64(oi[ax]) {
			on = 1
		}
		copyElem(o, p, vals, on)
	}
	return nil
}
