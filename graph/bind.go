package graph

import (
	"fmt"
	"math"
)

// maxExactInt is the largest integer a literal (float64) holds exactly.
const maxExactInt = 1 << 53

// Bind returns a copy of g in which the graph input called name is a
// constant holding t's values: a mask, a position table or any other input
// that is fixed for a deployment, so that passes fold it like any other
// constant. t must have the input's shape; its values are converted to the
// input's dtype when both are floating point or both integer (bool counts as
// integer), exactly or not at all (an int64 beyond 2^53, which a literal
// cannot hold, is an error). g is not modified.
func Bind(g *Graph, name string, t *Tensor) (*Graph, error) {
	if t == nil {
		return nil, fmt.Errorf("bind %s: no tensor", name)
	}
	if err := t.Check(); err != nil {
		return nil, fmt.Errorf("bind %s: %w", name, err)
	}
	out := g.Clone()
	idx := -1
	for i, in := range out.Inputs {
		if in.Name == name {
			idx = i
		}
	}
	if idx < 0 {
		var names []string
		for _, in := range out.Inputs {
			names = append(names, in.Name)
		}
		return nil, fmt.Errorf("bind %s: the graph has no input of that name (inputs: %v)", name, names)
	}
	v := out.Inputs[idx]
	if !t.Shape.Equal(v.Type.Shape) {
		return nil, fmt.Errorf("bind %s: the tensor is %v, the input is %v", name, t.Type(), v.Type)
	}
	if v.Type.DType == String || t.DType == String {
		if v.Type.DType != t.DType {
			return nil, fmt.Errorf("bind %s: the tensor is %v, the input is %v: strings bind only to strings", name, t.Type(), v.Type)
		}
		if err := t.Check(); err != nil {
			return nil, fmt.Errorf("bind %s: %w", name, err)
		}
		init := LiteralStrings(t.S...)
		return bindAs(out, idx, v, init, name)
	}
	isInt := func(dt DType) bool { return dt == Int64 || dt == Bool }
	if v.Type.DType.IsFloat() != t.DType.IsFloat() || isInt(v.Type.DType) != isInt(t.DType) {
		return nil, fmt.Errorf("bind %s: the tensor is %v, the input is %v: only float to float and integer to integer convert", name, t.Type(), v.Type)
	}
	if nt := g.ElemTypes[name]; nt != "" && t.DType == Int64 {
		// An input declared with a narrow integer type takes its values only.
		if err := CheckNarrow(t, nt); err != nil {
			return nil, fmt.Errorf("bind %s: the input is declared %s: %w", name, nt, err)
		}
	}
	data := make([]float64, t.Len())
	for i := range data {
		x := t.At(i)
		if t.DType == Int64 && (t.I64[i] > maxExactInt || t.I64[i] < -maxExactInt) {
			return nil, fmt.Errorf("bind %s: element %d is %d, beyond the %d a constant holds exactly", name, i, t.I64[i], int64(maxExactInt))
		}
		if v.Type.DType == Bool {
			x = math.Min(math.Abs(x), 1)
		}
		data[i] = x
	}
	return bindAs(out, idx, v, Literal(data...), name)
}

// bindAs makes input idx of out, v, the constant init.
func bindAs(out *Graph, idx int, v *Value, init Init, name string) (*Graph, error) {
	v.Kind, v.Init = Const, &init
	out.Inputs = append(out.Inputs[:idx], out.Inputs[idx+1:]...)
	out.Consts = append(out.Consts, v)
	if err := Verify(out); err != nil {
		return nil, fmt.Errorf("bind %s: %w", name, err)
	}
	return out, nil
}
