package graph

import (
	"fmt"
	"slices"
)

// ReduceAxes resolves a reduction's axes (nil: all, unless noopEmpty).
func ReduceAxes(in Shape, axes []int, noopEmpty bool) ([]int, error) {
	if len(axes) == 0 {
		if noopEmpty {
			return nil, nil
		}
		out := make([]int, in.Rank())
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	out := make([]int, 0, len(axes))
	for _, ax := range axes {
		a, err := NormAxis(ax, in.Rank())
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, a) {
			return nil, fmt.Errorf("axis %d repeated", ax)
		}
		out = append(out, a)
	}
	slices.Sort(out)
	return out, nil
}

// ReducedShape is the output shape of a reduction over axes.
func ReducedShape(in Shape, axes []int, keepdims bool) Shape {
	out := Shape{}
	for i, d := range in {
		switch {
		case !slices.Contains(axes, i):
			out = append(out, d)
		case keepdims:
			out = append(out, 1)
		}
	}
	return out
}

var reduceAttrs = []AttrSpec{
	{Name: "keepdims", Kind: AttrInt, Default: Int(1)},
	{Name: "noop_with_empty_axes", Kind: AttrInt, Default: Int(0)},
}

func inferReduce(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
	var axes []int
	if len(in) > 1 && in[1] != nil {
		var err error
		if axes, err = constInts(c[1], "axes"); err != nil {
			return nil, err
		}
	}
	ax, err := ReduceAxes(in[0].Shape, axes, a.Int("noop_with_empty_axes", 0) != 0)
	if err != nil {
		return nil, err
	}
	return []TensorType{{in[0].DType, ReducedShape(in[0].Shape, ax, a.Int("keepdims", 1) != 0)}}, nil
}

func inferAxisSoftmax(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
	if err := sameFloat(in); err != nil {
		return nil, err
	}
	if _, err := NormAxis(int(a.Int("axis", -1)), in[0].Shape.Rank()); err != nil {
		return nil, err
	}
	return []TensorType{*in[0]}, nil
}

func init() {
	for _, op := range []struct{ name, doc string }{
		{"ReduceMean", "mean"}, {"ReduceSum", "sum"}, {"ReduceMax", "max"},
	} {
		register(&OpSpec{Name: op.name, Doc: op.doc + " over axes (opset 18: axes is an input)",
			Inputs: []string{"data", "axes?"}, Outputs: []string{"reduced"}, Attrs: reduceAttrs, Infer: inferReduce,
			Eval: evalReduce(op.doc)})
	}
	register(&OpSpec{Name: "Softmax", Doc: "exp(x - max) / sum along axis (opset 13 semantics)",
		Inputs: []string{"input"}, Outputs: []string{"output"},
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: Int(-1)}}, Infer: inferAxisSoftmax,
		Eval: evalSoftmax(false)})
	register(&OpSpec{Name: "LogSoftmax", Doc: "log of Softmax along axis",
		Inputs: []string{"input"}, Outputs: []string{"output"},
		Attrs: []AttrSpec{{Name: "axis", Kind: AttrInt, Default: Int(-1)}}, Infer: inferAxisSoftmax,
		Eval: evalSoftmax(true)})
	register(&OpSpec{
		Name: "SoftmaxCrossEntropyLoss", Doc: "mean (or sum) over rows of -log softmax(scores)[label]",
		Inputs: []string{"scores", "labels"}, Outputs: []string{"output"}, Eval: evalSCE, KeepDType: []int{0},
		Attrs: []AttrSpec{{Name: "reduction", Kind: AttrString, Default: Str("mean")}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			if err := sameFloat(in[:1]); err != nil {
				return nil, err
			}
			if in[0].Shape.Rank() != 2 || in[1].Shape.Rank() != 1 || in[1].Shape[0] != in[0].Shape[0] {
				return nil, fmt.Errorf("want scores [N, C] and labels [N], got %v and %v", in[0].Shape, in[1].Shape)
			}
			if in[1].DType != Int64 {
				return nil, fmt.Errorf("labels must be int64, got %v", in[1].DType)
			}
			if r := a.String("reduction", "mean"); r != "mean" && r != "sum" {
				return nil, fmt.Errorf("reduction %q not supported (mean, sum)", r)
			}
			return []TensorType{{in[0].DType, Shape{}}}, nil
		},
	})
}
