package gorgonia

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// dtypeOf maps a gorgonia element type to ours. Only float types are
// imported: every op translated here is a float op, and gorgonia's integer
// tensors (Int is the platform int) have no exact counterpart.
func dtypeOf(dt tensor.Dtype) (graph.DType, bool) {
	switch dt {
	case tensor.Float64:
		return graph.Float64, true
	case tensor.Float32:
		return graph.Float32, true
	}
	return graph.InvalidDType, false
}

// values returns the row-major data of a gorgonia value as float64s (exact
// for float32 too) with its dtype.
func values(v G.Value) ([]float64, graph.DType, error) {
	if d, ok := v.(*tensor.Dense); ok {
		if d.IsMasked() {
			return nil, 0, fmt.Errorf("masked tensors are not supported")
		}
		// Views (slices, lazy transposes) and column-major tensors keep their
		// data in another order: Materialize copies it out in logical order.
		if d.RequiresIterator() || d.IsMaterializable() || !d.DataOrder().IsRowMajor() {
			m, ok := d.Materialize().(*tensor.Dense)
			if !ok || m.RequiresIterator() || !m.DataOrder().IsRowMajor() {
				return nil, 0, fmt.Errorf("cannot read the data of a %v tensor view", d.Shape())
			}
			d = m
		}
		v = d
	}
	n := v.Shape().TotalSize()
	switch data := v.Data().(type) {
	case float64:
		return []float64{data}, graph.Float64, nil
	case float32:
		return []float64{float64(data)}, graph.Float32, nil
	case []float64:
		if len(data) < n {
			return nil, 0, fmt.Errorf("value holds %d elements, its shape %v needs %d", len(data), v.Shape(), n)
		}
		return append([]float64(nil), data[:n]...), graph.Float64, nil
	case []float32:
		if len(data) < n {
			return nil, 0, fmt.Errorf("value holds %d elements, its shape %v needs %d", len(data), v.Shape(), n)
		}
		out := make([]float64, n)
		for i, x := range data[:n] {
			out[i] = float64(x)
		}
		return out, graph.Float32, nil
	}
	return nil, 0, fmt.Errorf("values of dtype %v are not supported (float64 and float32 are)", v.Dtype())
}

// ToTensor copies a gorgonia value (a *tensor.Dense or a scalar such as
// *gorgonia.F64) into a graph.Tensor: feeds for an imported graph, or
// gorgonia's results to compare with.
func ToTensor(v G.Value) (*graph.Tensor, error) {
	if v == nil {
		return nil, fmt.Errorf("no value")
	}
	data, dt, err := values(v)
	if err != nil {
		return nil, err
	}
	t := graph.NewTensor(dt, graph.Shape(v.Shape()))
	if t.Len() != len(data) {
		return nil, fmt.Errorf("value of shape %v holds %d elements", v.Shape(), len(data))
	}
	for i, x := range data {
		t.Set(i, x)
	}
	return t, nil
}

// Feeds returns the graph inputs of an imported graph with the values that
// are bound to their gorgonia nodes now (gorgonia.Let or WithValue), keyed
// by input name, ready for Executable.Run. names is ImportWithNames' map.
func Feeds(g *graph.Graph, names map[*G.Node]string) (map[string]*graph.Tensor, error) {
	byName := make(map[string]*G.Node, len(names))
	for n, name := range names {
		byName[name] = n
	}
	feeds := make(map[string]*graph.Tensor, len(g.Inputs))
	for _, in := range g.Inputs {
		n, ok := byName[in.Name]
		if !ok {
			return nil, fmt.Errorf("input %s does not come from a gorgonia node of this import", in.Name)
		}
		t, err := ToTensor(n.Value())
		if err != nil {
			return nil, fmt.Errorf("input %s (node %s): %w", in.Name, n.Name(), err)
		}
		if !t.Type().Equal(in.Type) {
			return nil, fmt.Errorf("input %s: bound value is %v, the graph wants %v", in.Name, t.Type(), in.Type)
		}
		feeds[in.Name] = t
	}
	return feeds, nil
}
