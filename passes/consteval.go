package passes

import (
	"fmt"

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

// maxConstHeld bounds the elements one compile-time evaluation holds in all
// (its memo keeps every value it computed): 2^26, 256 MiB as float32. A
// graph of many large masks is refused, with the node and the size, before
// the evaluation allocates past it, instead of filling the machine.
const maxConstHeld = 1 << 26

type constResult struct {
	t   *graph.Tensor
	err error
}

type constEval struct {
	memo map[*graph.Value]constResult
	held int // elements computed so far
}

// hold charges the n elements of v (made by node, "" for a const's recipe)
// to the evaluation, or says why it may not compute them.
func (ce *constEval) hold(v *graph.Value, n int) error {
	if ce.held+n > maxConstHeld {
		return fmt.Errorf("%s (%v, %d elements) is not computed at compile time: compile-time evaluation already holds %d elements, and may hold at most %d", v.Name, v.Type, n, ce.held, maxConstHeld)
	}
	ce.held += n
	return nil
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
		if err := ce.hold(v, v.Type.Shape.Numel()); err != nil {
			return nil, err
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
	spec, _ := graph.LookupOp(n.Op)
	if spec == nil || !(constOps[n.Op] || spec.Expr != nil) || len(n.Outputs) != 1 {
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
	if err := ce.hold(v, v.Type.Shape.Numel()); err != nil {
		return nil, fmt.Errorf("by node %s (%s): %w", n.Name, n.Op, err)
	}
	out := graph.NewTensor(v.Type.DType, v.Type.Shape)
	if err := spec.Eval(in, n.Attrs, []*graph.Tensor{out}); err != nil {
		return nil, fmt.Errorf("evaluating %s (%s): %w", n.Name, n.Op, err)
	}
	return out, nil
}

// constOps are the ops constant evaluation runs (with the op table's
// reference Eval) besides every elementwise op (those defined by an
// expression): the data movement scale and mask expressions are built with.
var constOps = map[string]bool{
	"Identity": true, "Reshape": true, "Unsqueeze": true, "Squeeze": true, "Cast": true,
	"Expand": true, "Trilu": true, "Transpose": true, "Slice": true,
}
