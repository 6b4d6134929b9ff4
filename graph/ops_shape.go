package graph

import "fmt"

// Shape ops. Operands that ONNX passes as tensors (Reshape's shape, Slice's
// starts/ends, axes from opset 13/18) must be constants here: shapes are static.

func constInts(c *Tensor, what string) ([]int, error) {
	if c == nil {
		return nil, fmt.Errorf("%s must be a constant", what)
	}
	if c.DType != Int64 {
		return nil, fmt.Errorf("%s must be int64, got %v", what, c.DType)
	}
	out := make([]int, len(c.I64))
	for i, v := range c.I64 {
		out[i] = int(v)
	}
	return out, nil
}

// ReshapeShape resolves ONNX Reshape's target (0 copies, -1 infers).
func ReshapeShape(in Shape, target []int) (Shape, error) {
	out := make(Shape, len(target))
	infer := -1
	known := 1
	for i, d := range target {
		switch {
		case d == 0:
			if i >= len(in) {
				return nil, fmt.Errorf("shape %v: 0 at axis %d copies a missing input dim", target, i)
			}
			out[i] = in[i]
		case d == -1:
			if infer >= 0 {
				return nil, fmt.Errorf("shape %v has two -1", target)
			}
			infer = i
			continue
		case d < 0:
			return nil, fmt.Errorf("shape %v has a negative dim", target)
		default:
			out[i] = d
		}
		known *= out[i]
	}
	if infer >= 0 {
		if known == 0 || in.Numel()%known != 0 {
			return nil, fmt.Errorf("cannot reshape %v to %v", in, target)
		}
		out[infer] = in.Numel() / known
	}
	if out.Numel() != in.Numel() {
		return nil, fmt.Errorf("cannot reshape %v (%d elements) to %v (%d)", in, in.Numel(), out, out.Numel())
	}
	return out, nil
}

// TransposePerm returns the permutation (default: reversed axes) checked.
func TransposePerm(a Attrs, rank int) ([]int, error) {
	p := a.IntList("perm")
	perm := make([]int, rank)
	if p == nil {
		for i := range perm {
			perm[i] = rank - 1 - i
		}
		return perm, nil
	}
	if len(p) != rank {
		return nil, fmt.Errorf("perm %v has %d entries for rank %d", p, len(p), rank)
	}
	seen := make([]bool, rank)
	for i, v := range p {
		if v < 0 || int(v) >= rank || seen[v] {
			return nil, fmt.Errorf("perm %v is not a permutation of 0..%d", p, rank-1)
		}
		seen[v] = true
		perm[i] = int(v)
	}
	return perm, nil
}

// SliceSpec is Slice's resolved start/step per axis (end exclusive).
type SliceSpec struct{ Start, End, Step []int }

// ResolveSlice clamps ONNX Slice operands against the input shape.
func ResolveSlice(in Shape, starts, ends, axes, steps []int) (SliceSpec, Shape, error) {
	r := in.Rank()
	sp := SliceSpec{make([]int, r), make([]int, r), make([]int, r)}
	out := in.Clone()
	for i := range r {
		sp.Start[i], sp.End[i], sp.Step[i] = 0, in[i], 1
	}
	if len(starts) != len(ends) {
		return sp, nil, fmt.Errorf("starts %v and ends %v differ in length", starts, ends)
	}
	if axes == nil {
		for i := range starts {
			axes = append(axes, i)
		}
	}
	if len(axes) != len(starts) || (steps != nil && len(steps) != len(starts)) {
		return sp, nil, fmt.Errorf("axes/steps length does not match starts")
	}
	for i, ax := range axes {
		a, err := NormAxis(ax, r)
		if err != nil {
			return sp, nil, err
		}
		step := 1
		if steps != nil {
			step = steps[i]
		}
		if step == 0 {
			return sp, nil, fmt.Errorf("slice step is 0")
		}
		dim := in[a]
		clamp := func(v, lo, hi int) int { return min(max(v, lo), hi) }
		s, e := starts[i], ends[i]
		if s < 0 {
			s += dim
		}
		if e < 0 {
			e += dim
		}
		if step > 0 {
			s, e = clamp(s, 0, dim), clamp(e, 0, dim)
			out[a] = max(0, (e-s+step-1)/step)
		} else {
			s, e = clamp(s, 0, dim-1), clamp(e, -1, dim-1)
			out[a] = max(0, (s-e-step-1)/(-step))
		}
		sp.Start[a], sp.End[a], sp.Step[a] = s, e, step
	}
	return sp, out, nil
}

func optInts(c *Tensor, present bool, what string) ([]int, error) {
	if !present {
		return nil, nil
	}
	return constInts(c, what)
}

func init() {
	register(&OpSpec{
		Name: "Transpose", Doc: "permute the axes of X by perm",
		Inputs: []string{"data"}, Outputs: []string{"transposed"}, Eval: evalTranspose, Permutation: TransposePerm,
		Attrs: []AttrSpec{{Name: "perm", Kind: AttrInts}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			perm, err := TransposePerm(a, in[0].Shape.Rank())
			if err != nil {
				return nil, err
			}
			out := make(Shape, len(perm))
			for i, p := range perm {
				out[i] = in[0].Shape[p]
			}
			return []TensorType{{in[0].DType, out}}, nil
		},
	})
	register(&OpSpec{
		Name: "Reshape", Doc: "same data, new shape (0 copies a dim, -1 infers one)",
		Inputs: []string{"data", "shape"}, Outputs: []string{"reshaped"}, Eval: evalCopy, View: true,
		Infer: func(in []*TensorType, _ Attrs, c []*Tensor) ([]TensorType, error) {
			target, err := constInts(c[1], "shape")
			if err != nil {
				return nil, err
			}
			s, err := ReshapeShape(in[0].Shape, target)
			if err != nil {
				return nil, err
			}
			return []TensorType{{in[0].DType, s}}, nil
		},
	})
	register(&OpSpec{
		Name: "Concat", Doc: "join inputs along axis",
		Inputs: []string{"inputs..."}, Outputs: []string{"concat_result"}, Eval: evalConcat,
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Required: true}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			r := in[0].Shape.Rank()
			ax, err := NormAxis(int(a.Int("axis", 0)), r)
			if err != nil {
				return nil, err
			}
			out := in[0].Shape.Clone()
			out[ax] = 0
			for _, t := range in {
				if t.DType != in[0].DType || t.Shape.Rank() != r {
					return nil, fmt.Errorf("inputs differ in dtype or rank: %v vs %v", in[0], t)
				}
				for i := range r {
					if i != ax && t.Shape[i] != in[0].Shape[i] {
						return nil, fmt.Errorf("inputs differ off the concat axis: %v vs %v", in[0].Shape, t.Shape)
					}
				}
				out[ax] += t.Shape[ax]
			}
			return []TensorType{{in[0].DType, out}}, nil
		},
	})
	register(&OpSpec{
		Name: "Slice", Doc: "data[starts:ends:steps] on axes",
		Inputs: []string{"data", "starts", "ends", "axes?", "steps?"}, Outputs: []string{"output"}, Eval: evalSlice,
		Infer: func(in []*TensorType, _ Attrs, c []*Tensor) ([]TensorType, error) {
			starts, err := constInts(c[1], "starts")
			if err != nil {
				return nil, err
			}
			ends, err := constInts(c[2], "ends")
			if err != nil {
				return nil, err
			}
			axes, err := optInts(at(c, 3), len(in) > 3 && in[3] != nil, "axes")
			if err != nil {
				return nil, err
			}
			steps, err := optInts(at(c, 4), len(in) > 4 && in[4] != nil, "steps")
			if err != nil {
				return nil, err
			}
			_, s, err := ResolveSlice(in[0].Shape, starts, ends, axes, steps)
			if err != nil {
				return nil, err
			}
			return []TensorType{{in[0].DType, s}}, nil
		},
	})
	register(&OpSpec{
		Name: "Unsqueeze", Doc: "insert size-1 axes",
		Inputs: []string{"data", "axes"}, Outputs: []string{"expanded"}, Eval: evalCopy, View: true,
		Infer: func(in []*TensorType, _ Attrs, c []*Tensor) ([]TensorType, error) {
			axes, err := constInts(c[1], "axes")
			if err != nil {
				return nil, err
			}
			r := in[0].Shape.Rank() + len(axes)
			ins := make([]bool, r)
			for _, ax := range axes {
				a, err := NormAxis(ax, r)
				if err != nil || ins[a] {
					return nil, fmt.Errorf("bad axes %v for output rank %d", axes, r)
				}
				ins[a] = true
			}
			out := make(Shape, 0, r)
			j := 0
			for i := range r {
				if ins[i] {
					out = append(out, 1)
				} else {
					out = append(out, in[0].Shape[j])
					j++
				}
			}
			return []TensorType{{in[0].DType, out}}, nil
		},
	})
	register(&OpSpec{
		Name: "Squeeze", Doc: "remove size-1 axes (all of them when axes is omitted)",
		Inputs: []string{"data", "axes?"}, Outputs: []string{"squeezed"}, Eval: evalCopy, View: true,
		Infer: func(in []*TensorType, _ Attrs, c []*Tensor) ([]TensorType, error) {
			s := in[0].Shape
			drop := make([]bool, s.Rank())
			if len(in) > 1 && in[1] != nil {
				axes, err := constInts(c[1], "axes")
				if err != nil {
					return nil, err
				}
				for _, ax := range axes {
					a, err := NormAxis(ax, s.Rank())
					if err != nil {
						return nil, err
					}
					if s[a] != 1 {
						return nil, fmt.Errorf("axis %d has size %d, not 1", ax, s[a])
					}
					drop[a] = true
				}
			} else {
				for i, d := range s {
					drop[i] = d == 1
				}
			}
			out := Shape{}
			for i, d := range s {
				if !drop[i] {
					out = append(out, d)
				}
			}
			return []TensorType{{in[0].DType, out}}, nil
		},
	})
	register(&OpSpec{
		Name: "Expand", Doc: "broadcast input to shape",
		Inputs: []string{"input", "shape"}, Outputs: []string{"output"}, Eval: evalExpand,
		Infer: func(in []*TensorType, _ Attrs, c []*Tensor) ([]TensorType, error) {
			target, err := constInts(c[1], "shape")
			if err != nil {
				return nil, err
			}
			s, err := Broadcast(in[0].Shape, Shape(target))
			if err != nil {
				return nil, err
			}
			return []TensorType{{in[0].DType, s}}, nil
		},
	})
	register(&OpSpec{
		Name: "Gather", Doc: "take slices of data along axis at int64 indices",
		Inputs: []string{"data", "indices"}, Outputs: []string{"output"}, Eval: evalGather,
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: Int(0)}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			if in[1].DType != Int64 {
				return nil, fmt.Errorf("indices must be int64, got %v", in[1].DType)
			}
			ax, err := NormAxis(int(a.Int("axis", 0)), in[0].Shape.Rank())
			if err != nil {
				return nil, err
			}
			d := in[0].Shape
			out := append(append(d[:ax].Clone(), in[1].Shape...), d[ax+1:]...)
			return []TensorType{{in[0].DType, out}}, nil
		},
	})
	register(&OpSpec{
		Name: "Trilu", Doc: "keep the upper (upper=1) or lower triangle of the last two axes, offset k",
		Inputs: []string{"input", "k?"}, Outputs: []string{"output"}, Eval: evalTrilu,
		Attrs: []AttrSpec{{Name: "upper", Kind: AttrInt, Default: Int(1)}},
		Infer: func(in []*TensorType, _ Attrs, c []*Tensor) ([]TensorType, error) {
			if in[0].Shape.Rank() < 2 {
				return nil, fmt.Errorf("input must have rank >= 2, got %v", in[0].Shape)
			}
			if len(in) > 1 && in[1] != nil {
				if _, err := constInts(c[1], "k"); err != nil {
					return nil, err
				}
			}
			return []TensorType{*in[0]}, nil
		},
	})
}

func at(c []*Tensor, i int) *Tensor {
	if i < len(c) {
		return c[i]
	}
	return nil
}
