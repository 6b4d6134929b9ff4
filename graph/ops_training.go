package graph

import (
	"fmt"
	"math"
)

// The optimizer steps of ONNX's ai.onnx.preview.training domain: Adagrad,
// Adam and Momentum. Each is a deterministic function of its inputs: a
// learning rate R (a float scalar), an update count T (an int64 scalar),
// then n optimized tensors, their n gradients and their n (or, for Adam,
// 2n) state tensors, all of one float type; the outputs are the n new
// tensors followed by their new states. Every tensor is updated element by
// element and on its own, so a node of n tensors is n independent updates
// sharing R, T and the attributes. A tensor's gradient and state have its
// shape (the spec's broadcasting would give an output of another shape than
// its inference says; we refuse it).

// DomainONNXTraining is ONNX's domain of training operators.
const DomainONNXTraining = "ai.onnx.preview.training"

func init() {
	register(&OpSpec{
		Name: "Adagrad", Domain: DomainONNXTraining,
		Doc: "one Adagrad step per tensor X with gradient G and squared-gradient sum H: r = R/(1 + T·decay_factor), " +
			"g = norm_coefficient·X + G, H' = H + g², X' = X − r·g/(√H' + epsilon); outputs X'..., H'...",
		Inputs: []string{"R", "T", "inputs..."}, Outputs: []string{"outputs..."}, Eval: evalAdagrad,
		KeepDType: []int{0},
		Attrs: []AttrSpec{
			{Name: "decay_factor", Kind: AttrFloat, Default: Float(0)},
			{Name: "epsilon", Kind: AttrFloat, Default: Float(1e-6)},
			{Name: "norm_coefficient", Kind: AttrFloat, Default: Float(0)},
		},
		Infer: inferOptimizer(3),
	})
	register(&OpSpec{
		Name: "Adam", Domain: DomainONNXTraining,
		Doc: "one Adam step per tensor X with gradient G and moments V, H: g = norm_coefficient·X + G, V' = α·V + (1−α)·g, " +
			"H' = β·H + (1−β)·g², r = R·√(1−β^T)/(1−α^T) (R at T = 0), X' = (1 − norm_coefficient_post)·(X − r·V'/(√H' + epsilon)); outputs X'..., V'..., H'...",
		Inputs: []string{"R", "T", "inputs..."}, Outputs: []string{"outputs..."}, Eval: evalAdam,
		KeepDType: []int{0},
		Attrs: []AttrSpec{
			{Name: "alpha", Kind: AttrFloat, Default: Float(0.9)},
			{Name: "beta", Kind: AttrFloat, Default: Float(0.999)},
			{Name: "epsilon", Kind: AttrFloat, Default: Float(1e-6)},
			{Name: "norm_coefficient", Kind: AttrFloat, Default: Float(0)},
			{Name: "norm_coefficient_post", Kind: AttrFloat, Default: Float(0)},
		},
		Infer: inferOptimizer(4),
	})
	register(&OpSpec{
		Name: "Momentum", Domain: DomainONNXTraining,
		Doc: "one step of SGD with momentum per tensor X with gradient G and momentum V: g = norm_coefficient·X + G, " +
			"V' = alpha·V + b·g (b = beta, 1 at T = 0), X' = X − R·V' (mode=standard) or X − R·(g + alpha·V') (mode=nesterov); outputs X'..., V'...",
		Inputs: []string{"R", "T", "inputs..."}, Outputs: []string{"outputs..."}, Eval: evalMomentum,
		KeepDType: []int{0},
		Attrs: []AttrSpec{
			{Name: "alpha", Kind: AttrFloat, Required: true},
			{Name: "beta", Kind: AttrFloat, Required: true},
			{Name: "norm_coefficient", Kind: AttrFloat, Required: true},
			{Name: "mode", Kind: AttrString, Required: true},
		},
		Infer: func(in []*TensorType, a Attrs, c []*Tensor) ([]TensorType, error) {
			if m := a.String("mode", ""); m != "standard" && m != "nesterov" {
				return nil, fmt.Errorf("mode %q is neither standard nor nesterov", m)
			}
			return inferOptimizer(3)(in, a, c)
		},
	})
}

// inferOptimizer checks an optimizer step of k groups of n tensors (the
// optimized ones, their gradients, their states): R a float scalar, T an
// int64 scalar, every tensor of group j the shape and type of the
// optimized one. The outputs are the optimized tensors' types, then the
// states'.
func inferOptimizer(k int) func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
	return func(in []*TensorType, _ Attrs, _ []*Tensor) ([]TensorType, error) {
		for i, t := range in {
			if t == nil {
				return nil, fmt.Errorf("input %d is omitted", i)
			}
		}
		if !in[0].DType.IsFloat() || in[0].Shape.Rank() != 0 {
			return nil, fmt.Errorf("R must be a float scalar, got %v", in[0])
		}
		if in[1].DType != Int64 || in[1].Shape.Rank() != 0 {
			return nil, fmt.Errorf("T must be an int64 scalar, got %v", in[1])
		}
		ts := in[2:]
		if len(ts) == 0 || len(ts)%k != 0 {
			return nil, fmt.Errorf("want %d groups of tensors (optimized, gradients, states), got %d tensors", k, len(ts))
		}
		n := len(ts) / k
		for i, t := range ts {
			x := ts[i%n]
			if !x.DType.IsFloat() {
				return nil, fmt.Errorf("tensor %d is %v, not a float type", i%n, x.DType)
			}
			if !t.Equal(*x) {
				return nil, fmt.Errorf("input %d is %v, and the tensor it belongs to %v", 2+i, t, x)
			}
		}
		out := make([]TensorType, 0, n*(k-1))
		for _, t := range ts[:n] {
			out = append(out, *t)
		}
		for _, t := range ts[2*n:] {
			out = append(out, *t)
		}
		return out, nil
	}
}

// evalAdagrad is Adagrad's pseudo code, per element, in float64.
func evalAdagrad(in []*Tensor, a Attrs, out []*Tensor) error {
	n := (len(in) - 2) / 3
	decay, eps, norm := a.Float("decay_factor", 0), a.Float("epsilon", 1e-6), a.Float("norm_coefficient", 0)
	r := in[0].At(0) / (1 + in[1].At(0)*decay)
	for j := range n {
		x, g, h := in[2+j], in[2+n+j], in[2+2*n+j]
		for i := range x.Len() {
			gr := norm*x.At(i) + g.At(i)
			hn := h.At(i) + gr*gr
			out[j].Set(i, x.At(i)-r*gr/(math.Sqrt(hn)+eps))
			out[n+j].Set(i, hn)
		}
	}
	return nil
}

// evalAdam is Adam's pseudo code, per element, in float64.
func evalAdam(in []*Tensor, a Attrs, out []*Tensor) error {
	n := (len(in) - 2) / 4
	alpha, beta, eps := a.Float("alpha", 0.9), a.Float("beta", 0.999), a.Float("epsilon", 1e-6)
	norm, post := a.Float("norm_coefficient", 0), a.Float("norm_coefficient_post", 0)
	r, t := in[0].At(0), in[1].At(0)
	if t > 0 {
		r *= math.Sqrt(1-math.Pow(beta, t)) / (1 - math.Pow(alpha, t))
	}
	for j := range n {
		x, g, v, h := in[2+j], in[2+n+j], in[2+2*n+j], in[2+3*n+j]
		for i := range x.Len() {
			gr := norm*x.At(i) + g.At(i)
			vn := alpha*v.At(i) + (1-alpha)*gr
			hn := beta*h.At(i) + (1-beta)*gr*gr
			xn := x.At(i) - r*vn/(math.Sqrt(hn)+eps)
			out[j].Set(i, (1-post)*xn)
			out[n+j].Set(i, vn)
			out[2*n+j].Set(i, hn)
		}
	}
	return nil
}

// evalMomentum is Momentum's pseudo code, per element, in float64.
func evalMomentum(in []*Tensor, a Attrs, out []*Tensor) error {
	n := (len(in) - 2) / 3
	alpha, beta, norm := a.Float("alpha", 0), a.Float("beta", 0), a.Float("norm_coefficient", 0)
	nesterov := a.String("mode", "") == "nesterov"
	r := in[0].At(0)
	if in[1].At(0) <= 0 {
		beta = 1 // the first step takes the whole gradient
	}
	for j := range n {
		x, g, v := in[2+j], in[2+n+j], in[2+2*n+j]
		for i := range x.Len() {
			gr := norm*x.At(i) + g.At(i)
			vn := alpha*v.At(i) + beta*gr
			step := vn
			if nesterov {
				step = gr + alpha*vn
			}
			out[j].Set(i, x.At(i)-r*step)
			out[n+j].Set(i, vn)
		}
	}
	return nil
}
