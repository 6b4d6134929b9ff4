package graph

import (
	"fmt"
	"math"
)

// Ops the ONNX backend test suite asks for beyond the transformer's: index
// selection along an axis (GatherElements, ArgMax) and the product reduction.
// Each is the ONNX operator of the same name (opset 13 semantics; ArgMax's
// select_last_index from opset 12; ReduceProd's axes as an input, opset 18).

func init() {
	register(&OpSpec{
		Name: "GatherElements", Doc: "output[i] = data[i with axis coordinate replaced by indices[i]]",
		Inputs: []string{"data", "indices"}, Outputs: []string{"output"}, Eval: evalGatherElements,
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: Int(0)}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			if in[1].DType != Int64 {
				return nil, fmt.Errorf("indices must be int64, got %v", in[1].DType)
			}
			r := in[0].Shape.Rank()
			ax, err := NormAxis(int(a.Int("axis", 0)), r)
			if err != nil {
				return nil, err
			}
			if in[1].Shape.Rank() != r {
				return nil, fmt.Errorf("indices %v and data %v differ in rank", in[1].Shape, in[0].Shape)
			}
			for d := range r {
				if d != ax && in[1].Shape[d] > in[0].Shape[d] {
					return nil, fmt.Errorf("indices %v exceed data %v on axis %d", in[1].Shape, in[0].Shape, d)
				}
			}
			return []TensorType{{in[0].DType, in[1].Shape.Clone()}}, nil
		},
	})
	register(&OpSpec{
		Name: "ArgMax", Doc: "int64 index of the largest element along axis (first, or last with select_last_index)",
		Inputs: []string{"data"}, Outputs: []string{"reduced"}, Eval: evalArgMax,
		Attrs: []AttrSpec{
			{Name: "axis", Kind: AttrInt, Default: Int(0)},
			{Name: "keepdims", Kind: AttrInt, Default: Int(1)},
			{Name: "select_last_index", Kind: AttrInt, Default: Int(0)},
		},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			if !in[0].DType.IsFloat() {
				return nil, fmt.Errorf("data must be a float type, got %v", in[0].DType)
			}
			ax, err := NormAxis(int(a.Int("axis", 0)), in[0].Shape.Rank())
			if err != nil {
				return nil, err
			}
			if in[0].Shape[ax] == 0 {
				return nil, fmt.Errorf("axis %d is empty", ax)
			}
			return []TensorType{{Int64, ReducedShape(in[0].Shape, []int{ax}, a.Int("keepdims", 1) != 0)}}, nil
		},
	})
	register(&OpSpec{
		Name: "ReduceProd", Doc: "product over axes (opset 18: axes is an input)",
		Inputs: []string{"data", "axes?"}, Outputs: []string{"reduced"}, Attrs: reduceAttrs, Eval: evalReduce("prod"),
		Infer: func(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
			if !in[0].DType.IsFloat() {
				return nil, fmt.Errorf("data must be a float type, got %v", in[0].DType)
			}
			return inferReduce(in, a, c)
		},
	})
}

// evalGatherElements reads data at each index's position with the axis
// coordinate taken from indices (negative counts from the end).
func evalGatherElements(in []*Tensor, a Attrs, out []*Tensor) error {
	data, idx := in[0], in[1]
	r := data.Shape.Rank()
	ax, err := NormAxis(int(a.Int("axis", 0)), r)
	if err != nil {
		return err
	}
	dim := data.Shape[ax]
	pos := make([]int, r)
	for p := range out[0].Len() {
		unravel(p, idx.Shape, pos)
		k := idx.I64[p]
		if k < 0 {
			k += int64(dim)
		}
		if k < 0 || k >= int64(dim) {
			return fmt.Errorf("index %d out of range for axis %d of size %d", idx.I64[p], ax, dim)
		}
		pos[ax] = int(k)
		copyElem(out[0], p, data, ravel(pos, data.Shape))
	}
	return nil
}

// evalArgMax scans each line along axis; a NaN is the maximum, as in numpy
// (the first NaN, or the last with select_last_index).
func evalArgMax(in []*Tensor, a Attrs, out []*Tensor) error {
	x := in[0]
	ax, err := NormAxis(int(a.Int("axis", 0)), x.Shape.Rank())
	if err != nil {
		return err
	}
	last := a.Int("select_last_index", 0) != 0
	k := 0
	lines(x.Shape, ax, func(pos []int) {
		best, bi := math.Inf(-1), -1
		for j, p := range pos {
			v := x.At(p)
			switch {
			case math.IsNaN(best) && !(last && math.IsNaN(v)):
			case bi < 0 || math.IsNaN(v) || v > best || (last && v == best):
				best, bi = v, j
			}
		}
		out[0].I64[k] = int64(bi)
		k++
	})
	return nil
}
