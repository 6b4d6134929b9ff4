package passes

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

// Constant evaluation, for conditions that must know a value at compile
// time: scales (Sqrt(64), 1/8) and masks, which exporters often compute from
// consts (Trilu(ones) → Where, a bool buffer sliced to the sequence length,
// (1 − tril)·−1e9). Only the ops such expressions use are evaluated; anything
// else (and anything reading an input or a param) is "not a constant", with
// the reason. Results are rounded to each value's dtype after every op, as
// the executor would compute them.

// maxConstElems bounds what compile time materialises (a [8,1,1024,1024]
// mask is 8M elements; twice that is the limit).
const maxConstElems = 1 << 24

type constResult struct {
	t   *graph.Tensor
	err error
}

type constEval struct {
	memo map[*graph.Value]constResult
}

func newConstEval() *constEval { return &constEval{memo: map[*graph.Value]constResult{}} }

func (ce *constEval) eval(v *graph.Value) (*graph.Tensor, error) {
	return ce.evalDepth(v, 0)
}

// maxConstDepth bounds the expressions followed: masks and scales are a few
// ops deep; a long chain is not a compile-time constant worth computing.
const maxConstDepth = 24

func (ce *constEval) evalDepth(v *graph.Value, depth int) (*graph.Tensor, error) {
	if r, ok := ce.memo[v]; ok {
		return r.t, r.err
	}
	t, err := ce.compute(v, depth)
	ce.memo[v] = constResult{t, err}
	return t, err
}

func (ce *constEval) compute(v *graph.Value, depth int) (*graph.Tensor, error) {
	switch v.Kind {
	case graph.Input:
		return nil, fmt.Errorf("%s is a graph input, not a constant", v.Name)
	case graph.Param:
		return nil, fmt.Errorf("%s is a trainable param, not a constant", v.Name)
	}
	if n := v.Type.Shape.Numel(); n > maxConstElems {
		return nil, fmt.Errorf("%s has %d elements, too many to check at compile time", v.Name, n)
	}
	if v.Kind == graph.Const {
		if v.Init == nil {
			return nil, fmt.Errorf("const %s has no recipe", v.Name)
		}
		return v.Init.Materialize(v.Type)
	}
	n := v.Producer
	if n == nil {
		return nil, fmt.Errorf("%s has no producer", v.Name)
	}
	if depth >= maxConstDepth {
		return nil, fmt.Errorf("%s is computed at run time (by node %s, %s)", v.Name, n.Name, n.Op)
	}
	fn, ok := constOps[n.Op]
	if !ok || len(n.Outputs) != 1 {
		return nil, fmt.Errorf("%s is computed at run time (by node %s, %s)", v.Name, n.Name, n.Op)
	}
	in := make([]*graph.Tensor, len(n.Inputs))
	for i, x := range n.Inputs {
		if x == nil {
			continue
		}
		t, err := ce.evalDepth(x, depth+1)
		if err != nil {
			return nil, fmt.Errorf("%s depends on %w", v.Name, err)
		}
		in[i] = t
	}
	out := graph.NewTensor(v.Type.DType, v.Type.Shape)
	if err := fn(n, in, out); err != nil {
		return nil, fmt.Errorf("evaluating %s (%s): %w", n.Name, n.Op, err)
	}
	return out, nil
}

type constOp func(n *graph.Node, in []*graph.Tensor, out *graph.Tensor) error

var constOps map[string]constOp

func init() {
	elemUnary := func(f func(float64) float64) constOp {
		return func(_ *graph.Node, in []*graph.Tensor, out *graph.Tensor) error {
			for i := range out.Len() {
				out.Set(i, f(in[0].At(i)))
			}
			return nil
		}
	}
	elemBinary := func(f func(a, b float64) float64) constOp {
		return func(_ *graph.Node, in []*graph.Tensor, out *graph.Tensor) error {
			return broadcastEach(out.Shape, in, func(o int, x []int) {
				out.Set(o, f(in[0].At(x[0]), in[1].At(x[1])))
			})
		}
	}
	copyData := func(_ *graph.Node, in []*graph.Tensor, out *graph.Tensor) error {
		for i := range out.Len() {
			out.Set(i, in[0].At(i))
		}
		return nil
	}
	constOps = map[string]constOp{
		"Identity": copyData, "Reshape": copyData, "Unsqueeze": copyData, "Squeeze": copyData,
		"Cast":       copyData, // Set rounds/truncates to the target dtype
		"Neg":        elemUnary(func(x float64) float64 { return -x }),
		"Sqrt":       elemUnary(math.Sqrt),
		"Reciprocal": elemUnary(func(x float64) float64 { return 1 / x }),
		"Abs":        elemUnary(math.Abs),
		"Add":        elemBinary(func(a, b float64) float64 { return a + b }),
		"Sub":        elemBinary(func(a, b float64) float64 { return a - b }),
		"Mul":        elemBinary(func(a, b float64) float64 { return a * b }),
		"Div":        elemBinary(func(a, b float64) float64 { return a / b }),
		"Equal": elemBinary(func(a, b float64) float64 {
			if a == b {
				return 1
			}
			return 0
		}),
		"Expand": func(_ *graph.Node, in []*graph.Tensor, out *graph.Tensor) error {
			return broadcastEach(out.Shape, in[:1], func(o int, x []int) { out.Set(o, in[0].At(x[0])) })
		},
		"Where": func(_ *graph.Node, in []*graph.Tensor, out *graph.Tensor) error {
			return broadcastEach(out.Shape, in, func(o int, x []int) {
				if in[0].At(x[0]) != 0 {
					out.Set(o, in[1].At(x[1]))
				} else {
					out.Set(o, in[2].At(x[2]))
				}
			})
		},
		"Trilu":     evalTrilu,
		"Transpose": evalTranspose,
		"Slice":     evalSlice,
	}
}

// broadcastEach calls f for every element o of out (row-major) with the
// offsets x[i] of the element of in[i] that broadcasts to it.
func broadcastEach(out graph.Shape, in []*graph.Tensor, f func(o int, x []int)) error {
	r := out.Rank()
	strides := make([][]int, len(in))
	for i, t := range in {
		s, err := broadcastStrides(t.Shape, out)
		if err != nil {
			return err
		}
		strides[i] = s
	}
	idx := make([]int, r)
	x := make([]int, len(in))
	for o := range out.Numel() {
		f(o, x)
		// Odometer increment of idx, moving every input offset along.
		for d := r - 1; d >= 0; d-- {
			idx[d]++
			for i := range x {
				x[i] += strides[i][d]
			}
			if idx[d] < out[d] {
				break
			}
			for i := range x {
				x[i] -= strides[i][d] * idx[d]
			}
			idx[d] = 0
		}
	}
	return nil
}

// broadcastStrides gives, for each axis of out, how far the offset into a
// tensor of shape in moves (0 along broadcast axes).
func broadcastStrides(in, out graph.Shape) ([]int, error) {
	r := out.Rank()
	if in.Rank() > r {
		return nil, fmt.Errorf("shape %v does not broadcast to %v", in, out)
	}
	st := make([]int, r)
	own := in.Strides()
	off := r - in.Rank()
	for d := range in {
		switch in[d] {
		case out[off+d]:
			st[off+d] = own[d]
		case 1:
		default:
			return nil, fmt.Errorf("shape %v does not broadcast to %v", in, out)
		}
	}
	return st, nil
}

func evalTrilu(n *graph.Node, in []*graph.Tensor, out *graph.Tensor) error {
	k := 0
	if len(in) > 1 && in[1] != nil {
		if in[1].Len() != 1 {
			return fmt.Errorf("k must be a scalar")
		}
		k = int(in[1].At(0))
	}
	upper := n.Attrs.Int("upper", 1) != 0
	s := out.Shape
	rows, cols := s[s.Rank()-2], s[s.Rank()-1]
	for o := range out.Len() {
		i, j := (o/cols)%rows, o%cols
		keep := j-i <= k
		if upper {
			keep = j-i >= k
		}
		if keep {
			out.Set(o, in[0].At(o))
		}
	}
	return nil
}

func evalTranspose(n *graph.Node, in []*graph.Tensor, out *graph.Tensor) error {
	perm, err := graph.TransposePerm(n.Attrs, in[0].Shape.Rank())
	if err != nil {
		return err
	}
	// View the input through the permutation: output axis d walks input
	// axis perm[d].
	own := in[0].Shape.Strides()
	st := make([]int, len(perm))
	for d, p := range perm {
		st[d] = own[p]
	}
	walkStrided(out.Shape, st, 0, func(o, x int) { out.Set(o, in[0].At(x)) })
	return nil
}

func evalSlice(n *graph.Node, in []*graph.Tensor, out *graph.Tensor) error {
	ints := func(i int) []int {
		if i >= len(in) || in[i] == nil {
			return nil
		}
		v := make([]int, in[i].Len())
		for j := range v {
			v[j] = int(in[i].At(j))
		}
		return v
	}
	spec, shape, err := graph.ResolveSlice(in[0].Shape, ints(1), ints(2), ints(3), ints(4))
	if err != nil {
		return err
	}
	if !shape.Equal(out.Shape) {
		return fmt.Errorf("slice gives %v, node declares %v", shape, out.Shape)
	}
	own := in[0].Shape.Strides()
	st := make([]int, len(own))
	base := 0
	for d := range own {
		st[d] = own[d] * spec.Step[d]
		base += own[d] * spec.Start[d]
	}
	walkStrided(out.Shape, st, base, func(o, x int) { out.Set(o, in[0].At(x)) })
	return nil
}

// walkStrided calls f for every element o of shape with the input offset
// base + Σ idx[d]·st[d].
func walkStrided(shape graph.Shape, st []int, base int, f func(o, x int)) {
	r := shape.Rank()
	idx := make([]int, r)
	x := base
	for o := range shape.Numel() {
		f(o, x)
		for d := r - 1; d >= 0; d-- {
			idx[d]++
			x += st[d]
			if idx[d] < shape[d] {
				break
			}
			x -= st[d] * idx[d]
			idx[d] = 0
		}
	}
}
