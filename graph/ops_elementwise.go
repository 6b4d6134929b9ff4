package graph

import (
	"fmt"
	"math"
)

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
	for _, op := range []struct {
		name, doc string
		f         func(a, b float64) float64
		i         func(a, b int64) (int64, error)
	}{
		{"Add", "A + B", func(a, b float64) float64 { return a + b }, func(a, b int64) (int64, error) { return a + b, nil }},
		{"Sub", "A - B", func(a, b float64) float64 { return a - b }, func(a, b int64) (int64, error) { return a - b, nil }},
		{"Mul", "A * B", func(a, b float64) float64 { return a * b }, func(a, b int64) (int64, error) { return a * b, nil }},
		{"Div", "A / B (int64: truncating, division by zero is an error)", func(a, b float64) float64 { return a / b },
			func(a, b int64) (int64, error) {
				if b == 0 {
					return 0, errIntDivZero
				}
				return a / b, nil
			}},
		{"Pow", "A ^ B", math.Pow, func(a, b int64) (int64, error) { return IntPow(a, b), nil }},
	} {
		register(&OpSpec{Name: op.name, Doc: op.doc + ", broadcasting", Inputs: []string{"A", "B"}, Outputs: []string{"C"}, Infer: inferBroadcast,
			Map: &MapFunc{
				Float: func(x []float64) float64 { return op.f(x[0], x[1]) },
				Int:   func(x []int64) (int64, error) { return op.i(x[0], x[1]) },
			}})
	}
	for _, op := range []struct {
		name, doc string
		f         func(float64) float64
	}{
		{"Neg", "-X", func(x float64) float64 { return -x }},
		{"Sqrt", "sqrt(X)", math.Sqrt},
		{"Reciprocal", "1 / X", func(x float64) float64 { return 1 / x }},
		{"Exp", "e^X", math.Exp},
		{"Log", "ln(X)", math.Log},
		{"Sigmoid", "1 / (1 + e^-X)", func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }},
		{"Tanh", "tanh(X)", math.Tanh},
		{"Relu", "max(X, 0)", func(x float64) float64 { return math.Max(x, 0) }},
		{"Erf", "the error function of X", math.Erf},
		{"Abs", "|X|", math.Abs},
		{"Softplus", "ln(1 + e^X)", softplus},
	} {
		register(&OpSpec{Name: op.name, Doc: op.doc + ", elementwise", Inputs: []string{"X"}, Outputs: []string{"Y"}, Infer: inferUnaryFloat,
			Map: &MapFunc{Float: func(x []float64) float64 { return op.f(x[0]) }}})
	}
	register(&OpSpec{Name: "Identity", Doc: "Y = X", Inputs: []string{"X"}, Outputs: []string{"Y"}, Infer: inferSame, Eval: evalCopy, View: true})
	register(&OpSpec{
		Name: "Where", Doc: "condition ? X : Y, broadcasting",
		Inputs: []string{"condition", "X", "Y"}, Outputs: []string{"output"},
		Map: &MapFunc{
			Float: func(x []float64) float64 {
				if x[0] != 0 {
					return x[1]
				}
				return x[2]
			},
			Int: func(x []int64) (int64, error) {
				if x[0] != 0 {
					return x[1], nil
				}
				return x[2], nil
			},
		},
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
		Name: "Cast", Doc: "X converted to the dtype `to` (floats to int64 truncate toward zero, to bool: X != 0)",
		Inputs: []string{"input"}, Outputs: []string{"output"}, Eval: evalCopy, KeepDType: []int{0},
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
		Map: &MapFunc{
			Float: func(x []float64) float64 { return b2f(x[0] == x[1]) },
			Int:   func(x []int64) (int64, error) { return int64(b2f(x[0] == x[1])), nil },
		},
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

// softplus is ln(1 + e^x) in the form whose exponential cannot overflow:
// for x > 0 it is x + ln(1 + e^-x), where e^-x < 1 (and log1p keeps the tiny
// term exact), so large x gives x rather than +Inf.
func softplus(x float64) float64 {
	if x > 0 {
		return x + math.Log1p(math.Exp(-x))
	}
	return math.Log1p(math.Exp(x))
}
