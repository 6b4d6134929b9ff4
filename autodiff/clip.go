package autodiff

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// TrainGradNormOutput names the global gradient norm output of a training
// step built with TrainOptions.ClipNorm.
const TrainGradNormOutput = "grad_norm"

// clipGradients adds global gradient-norm clipping to g (the gradients of
// params, gradOf(param)): norm = sqrt(Σ_params Σ g²), and every gradient
// scaled by c / max(norm, c), so that the update sees a gradient of norm at
// most c and an unclipped one when the norm is below c. max(norm, c) is
// written c + Relu(norm - c) (the op table has no Max). It returns the
// clipped gradient of each param and the norm (before clipping), which the
// step outputs.
func clipGradients(g *graph.Graph, nm *graph.Namer, gradOf func(string) *graph.Value, params []string, c float64) (map[string]*graph.Value, *graph.Value, error) {
	if !(c > 0) {
		return nil, nil, fmt.Errorf("gradient clipping: the norm bound must be positive, got %v", c)
	}
	addAttrs := func(op string, attrs graph.Attrs, inputs ...*graph.Value) (*graph.Value, error) {
		n, err := graph.NewNode(nm.Fresh("clip/"+op), op, attrs, inputs...)
		if err != nil {
			return nil, fmt.Errorf("gradient clipping: %w", err)
		}
		for _, o := range n.Outputs {
			o.Kind = graph.Intermediate
		}
		g.Nodes = append(g.Nodes, n)
		return n.Outputs[0], nil
	}
	add := func(op string, inputs ...*graph.Value) (*graph.Value, error) { return addAttrs(op, nil, inputs...) }
	dt := gradOf(params[0]).Type.DType
	scalar := func(v float64) *graph.Value {
		init := graph.Literal(v)
		s := &graph.Value{Name: nm.Fresh("clip/c"), Type: graph.TensorType{DType: dt, Shape: graph.Shape{}}, Kind: graph.Const, Init: &init}
		g.Consts = append(g.Consts, s)
		return s
	}
	var total *graph.Value
	for _, p := range params {
		gv := gradOf(p)
		sq, err := add("Mul", gv, gv)
		if err != nil {
			return nil, nil, err
		}
		// No axes: every element, to a scalar.
		sum, err := addAttrs("ReduceSum", graph.Attrs{"keepdims": graph.Int(0)}, sq)
		if err != nil {
			return nil, nil, err
		}
		if total == nil {
			total = sum
		} else if total, err = add("Add", total, sum); err != nil {
			return nil, nil, err
		}
	}
	norm, err := add("Sqrt", total)
	if err != nil {
		return nil, nil, err
	}
	cv := scalar(c)
	over, err := add("Sub", norm, cv)
	if err != nil {
		return nil, nil, err
	}
	if over, err = add("Relu", over); err != nil {
		return nil, nil, err
	}
	denom, err := add("Add", cv, over)
	if err != nil {
		return nil, nil, err
	}
	scale, err := add("Div", cv, denom)
	if err != nil {
		return nil, nil, err
	}
	clipped := map[string]*graph.Value{}
	for _, p := range params {
		if clipped[p], err = add("Mul", gradOf(p), scale); err != nil {
			return nil, nil, err
		}
	}
	if !nm.Reserve(TrainGradNormOutput) {
		return nil, nil, fmt.Errorf("gradient clipping: name %q is already used", TrainGradNormOutput)
	}
	out, err := add("Identity", norm)
	if err != nil {
		return nil, nil, err
	}
	out.Name = TrainGradNormOutput
	return clipped, out, nil
}
