package graph

import "fmt"

// Elementwise ops: ONNX semantics, multidirectional broadcasting.

func sameFloat(in []*TensorType) error {
	for _, t := range in {
		if t != nil && !t.DType.IsFloat() {
			return fmt.Errorf("needs float inputs, got %v", t.DType)
		}
	}
	return nil
}

func inferBroadcast(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
	shapes := make([]Shape, 0, len(in))
	for _, t := range in {
		if t.DType != in[0].DType {
			return nil, fmt.Errorf("input dtypes differ: %v vs %v", in[0].DType, t.DType)
		}
		shapes = append(shapes, t.Shape)
	}
	s, err := Broadcast(shapes...)
	if err != nil {
		return nil, err
	}
	return []TensorType{{in[0].DType, s}}, nil
}

func inferUnaryFloat(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
	if err := sameFloat(in); err != nil {
		return nil, err
	}
	return []TensorType{*in[0]}, nil
}

func inferSame(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
	return []TensorType{*in[0]}, nil
}

func init() {
	for _, op := range []struct{ name, doc string }{
		{"Add", "A + B"}, {"Sub", "A - B"}, {"Mul", "A * B"}, {"Div", "A / B"}, {"Pow", "A ^ B"},
	} {
		register(&OpSpec{Name: op.name, Doc: op.doc + ", broadcasting", Inputs: []string{"A", "B"}, Outputs: []string{"C"}, Infer: inferBroadcast})
	}
	for _, op := range []struct{ name, doc string }{
		{"Neg", "-X"}, {"Sqrt", "sqrt(X)"}, {"Reciprocal", "1 / X"}, {"Exp", "e^X"}, {"Log", "ln(X)"},
		{"Sigmoid", "1 / (1 + e^-X)"}, {"Tanh", "tanh(X)"}, {"Relu", "max(X, 0)"}, {"Erf", "the error function of X"},
		{"Abs", "|X|"},
	} {
		register(&OpSpec{Name: op.name, Doc: op.doc + ", elementwise", Inputs: []string{"X"}, Outputs: []string{"Y"}, Infer: inferUnaryFloat})
	}
	register(&OpSpec{Name: "Identity", Doc: "Y = X", Inputs: []string{"X"}, Outputs: []string{"Y"}, Infer: inferSame})
	register(&OpSpec{
		Name: "Where", Doc: "condition ? X : Y, broadcasting",
		Inputs: []string{"condition", "X", "Y"}, Outputs: []string{"output"},
		Infer: func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
			if in[0].DType != Bool {
				return nil, fmt.Errorf("condition must be bool, got %v", in[0].DType)
			}
			if in[1].DType != in[2].DType {
				return nil, fmt.Errorf("X and Y dtypes differ: %v vs %v", in[1].DType, in[2].DType)
			}
			s, err := Broadcast(in[0].Shape, in[1].Shape, in[2].Shape)
			if err != nil {
				return nil, err
			}
			return []TensorType{{in[1].DType, s}}, nil
		},
	})
	register(&OpSpec{
		Name: "Cast", Doc: "X converted to the dtype `to`",
		Inputs: []string{"input"}, Outputs: []string{"output"},
		Attrs: []AttrSpec{{Name: "to", Kind: AttrString, Required: true}},
		Infer: func(in []*TensorType, a Attrs, _ []*Tensor) ([]TensorType, error) {
			dt, err := ParseDType(a.String("to", ""))
			if err != nil {
				return nil, err
			}
			return []TensorType{{dt, in[0].Shape}}, nil
		},
	})
	register(&OpSpec{
		Name: "Equal", Doc: "A == B, broadcasting, bool result",
		Inputs: []string{"A", "B"}, Outputs: []string{"C"},
		Infer: func(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
			t, err := inferBroadcast(in, a, c)
			if err != nil {
				return nil, err
			}
			t[0].DType = Bool
			return t, nil
		},
	})
}
