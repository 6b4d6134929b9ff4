package backend

import (
	"fmt"
	"math"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// Finiteness counts the non-finite elements of a tensor.
type Finiteness struct {
	NaN, Inf, Len int
}

// Finite reports that no element is NaN or infinite.
func (f Finiteness) Finite() bool { return f.NaN == 0 && f.Inf == 0 }

func (f Finiteness) String() string {
	if f.Finite() {
		return "finite"
	}
	var parts []string
	if f.NaN > 0 {
		parts = append(parts, fmt.Sprintf("%d NaN", f.NaN))
	}
	if f.Inf > 0 {
		parts = append(parts, fmt.Sprintf("%d Inf", f.Inf))
	}
	return fmt.Sprintf("%s of %d", strings.Join(parts, ", "), f.Len)
}

// FinitenessOf counts t's NaN and infinite elements (none for an integer or
// bool tensor).
func FinitenessOf(t *graph.Tensor) Finiteness {
	f := Finiteness{Len: t.Len()}
	switch {
	case t.F32 != nil:
		for _, v := range t.F32 {
			if v != v {
				f.NaN++
			} else if math.IsInf(float64(v), 0) {
				f.Inf++
			}
		}
	case t.F64 != nil:
		for _, v := range t.F64 {
			if v != v {
				f.NaN++
			} else if math.IsInf(v, 0) {
				f.Inf++
			}
		}
	}
	return f
}

// NodeInput is one input of the node a NonFiniteError names.
type NodeInput struct {
	Name string
	// Kind is "graph input", "param", "const" or "output of NODE (OP)".
	Kind string
	Finiteness
}

// NonFiniteError names the first node, in topological order, that made a
// non-finite value (Options.CheckFinite): a NaN from inputs without one, or
// an infinity from finite inputs.
type NonFiniteError struct {
	Node, Op string
	Output   string
	Out      Finiteness
	Inputs   []NodeInput
}

func (e *NonFiniteError) Error() string {
	var ins []string
	for _, in := range e.Inputs {
		ins = append(ins, fmt.Sprintf("%s (%s, %s)", in.Name, in.Kind, in.Finiteness))
	}
	return fmt.Sprintf("node %s (%s) is the first to make a non-finite value: its output %s has %s; its inputs: %s",
		e.Node, e.Op, e.Output, e.Out, strings.Join(ins, "; "))
}

// CheckNodeFinite returns the NonFiniteError of node n (whose inputs were in
// and outputs out) if it made a non-finite value, and nil otherwise. A node
// without a floating input (ConstantOfShape, Range, a Cast of integers) makes
// a value from its attributes: a deliberate infinity there (a mask's -inf) is
// not an accident, so such nodes are not checked.
func CheckNodeFinite(n *graph.Node, in, out []*graph.Tensor) *NonFiniteError {
	var ins []NodeInput
	var inNaN, inNonFinite, floatIn bool
	for i, t := range in {
		if t == nil || i >= len(n.Inputs) || n.Inputs[i] == nil {
			continue
		}
		v := n.Inputs[i]
		f := FinitenessOf(t)
		ins = append(ins, NodeInput{Name: v.Name, Kind: valueKind(v), Finiteness: f})
		floatIn = floatIn || t.DType.IsFloat()
		inNaN = inNaN || f.NaN > 0
		inNonFinite = inNonFinite || !f.Finite()
	}
	if !floatIn {
		return nil
	}
	for j, t := range out {
		if t == nil || j >= len(n.Outputs) {
			continue
		}
		f := FinitenessOf(t)
		if (f.NaN > 0 && !inNaN) || (f.Inf > 0 && !inNonFinite) {
			return &NonFiniteError{Node: n.Name, Op: n.Op, Output: n.Outputs[j].Name, Out: f, Inputs: ins}
		}
	}
	return nil
}

func valueKind(v *graph.Value) string {
	switch v.Kind {
	case graph.Intermediate:
		if v.Producer != nil {
			return fmt.Sprintf("output of %s (%s)", v.Producer.Name, v.Producer.Op)
		}
	case graph.Input:
		return "graph input"
	}
	return v.Kind.String()
}
