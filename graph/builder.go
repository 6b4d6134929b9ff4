package graph

import (
	"fmt"
	"math"
	"strings"
)

// Builder makes graphs with code that reads like the model. The first error
// sticks: later calls return placeholder values and Build reports it, so model
// code needs no error check per op.
type Builder struct {
	g      *Graph
	namer  *Namer
	scopes []string
	consts map[string]*Value
	err    error
}

// NewBuilder starts an empty graph.
func NewBuilder(name string) *Builder {
	return &Builder{g: &Graph{Name: name}, namer: NewNamer(nil), consts: map[string]*Value{}}
}

// Err returns the first error so far.
func (b *Builder) Err() error { return b.err }

func (b *Builder) fail(err error) *Value {
	if b.err == nil {
		b.err = err
	}
	return &Value{Name: "<error>", Type: TensorType{DType: InvalidDType}}
}

// Push enters a name scope (node names get "scope/" prefixes); Pop leaves it.
func (b *Builder) Push(scope string) { b.scopes = append(b.scopes, scope) }

// Pop leaves the innermost scope; a Pop without a Push is an error.
func (b *Builder) Pop() {
	if len(b.scopes) == 0 {
		b.fail(fmt.Errorf("Pop without a matching Push"))
		return
	}
	b.scopes = b.scopes[:len(b.scopes)-1]
}

func (b *Builder) prefix(s string) string {
	if len(b.scopes) == 0 {
		return s
	}
	return strings.Join(b.scopes, "/") + "/" + s
}

func (b *Builder) leaf(name string, kind ValueKind, t TensorType, init *Init) *Value {
	return b.leafNamed(name, false, kind, t, init)
}

// leafNamed declares a graph input or initializer; fresh says the namer
// already handed the name out.
func (b *Builder) leafNamed(name string, fresh bool, kind ValueKind, t TensorType, init *Init) *Value {
	if b.err != nil {
		return b.fail(nil)
	}
	if !validName(name) {
		return b.fail(fmt.Errorf("%s %q: invalid name", kind, name))
	}
	if !fresh && !b.namer.Reserve(name) {
		return b.fail(fmt.Errorf("%s %q: name already used", kind, name))
	}
	if err := t.Shape.Check(); err != nil {
		return b.fail(fmt.Errorf("%s %s: %w", kind, name, err))
	}
	if init != nil {
		if err := init.check(t); err != nil {
			return b.fail(fmt.Errorf("%s %s: %w", kind, name, err))
		}
	}
	v := &Value{Name: name, Type: t, Kind: kind, Init: init}
	switch kind {
	case Input:
		b.g.Inputs = append(b.g.Inputs, v)
	case Param:
		b.g.Params = append(b.g.Params, v)
	case Const:
		b.g.Consts = append(b.g.Consts, v)
	}
	return v
}

// Input declares a runtime input.
func (b *Builder) Input(name string, dt DType, shape ...int) *Value {
	return b.leaf(name, Input, TensorType{dt, Shape(shape).Clone()}, nil)
}

// Param declares a trainable initializer.
func (b *Builder) Param(name string, dt DType, shape Shape, init Init) *Value {
	return b.leaf(name, Param, TensorType{dt, shape.Clone()}, &init)
}

// Const declares a fixed initializer.
func (b *Builder) Const(name string, dt DType, shape Shape, init Init) *Value {
	return b.leaf(name, Const, TensorType{dt, shape.Clone()}, &init)
}

// literal returns a shared auto-named literal constant (the same content gives
// the same value, so graphs stay small and deterministic).
func (b *Builder) literal(dt DType, shape Shape, data []float64) *Value {
	key := dt.String() + shape.String() + formatInit(&Init{Fn: "literal", Data: data})
	if v, ok := b.consts[key]; ok {
		return v
	}
	v := b.leafNamed(b.namer.Fresh("c"), true, Const, TensorType{dt, shape.Clone()}, &Init{Fn: "literal", Data: data})
	b.consts[key] = v
	return v
}

// Ints returns a 1-D int64 constant (shapes, axes, perms as ONNX passes them).
func (b *Builder) Ints(vals ...int) *Value {
	d := make([]float64, len(vals))
	for i, v := range vals {
		d[i] = float64(v)
	}
	return b.literal(Int64, Shape{len(vals)}, d)
}

// Scalar returns a rank-0 constant of type dt.
func (b *Builder) Scalar(dt DType, v float64) *Value { return b.literal(dt, Shape{}, []float64{v}) }

// OpN applies op and returns all its outputs.
func (b *Builder) OpN(op string, attrs Attrs, inputs ...*Value) []*Value {
	if b.err != nil {
		return []*Value{b.fail(nil), b.fail(nil), b.fail(nil)}
	}
	n, err := NewNode(b.namer.Fresh(b.prefix(op)), op, attrs, inputs...)
	if err != nil {
		return []*Value{b.fail(err), b.fail(nil), b.fail(nil)}
	}
	for _, o := range n.Outputs[1:] {
		b.namer.Reserve(o.Name)
	}
	b.g.Nodes = append(b.g.Nodes, n)
	return n.Outputs
}

// Op applies op and returns its first output.
func (b *Builder) Op(op string, attrs Attrs, inputs ...*Value) *Value {
	return b.OpN(op, attrs, inputs...)[0]
}

// Rename gives a value a readable name; it must not be in use.
func (b *Builder) Rename(v *Value, name string) *Value {
	if b.err != nil {
		return v
	}
	if v == nil {
		return b.fail(fmt.Errorf("rename nil value to %q", name))
	}
	if !validName(name) || !b.namer.Reserve(name) {
		return b.fail(fmt.Errorf("rename %s to %q: name invalid or in use", v.Name, name))
	}
	v.Name = name
	return v
}

// Output marks graph outputs.
func (b *Builder) Output(vs ...*Value) { b.g.Outputs = append(b.g.Outputs, vs...) }

// Build returns the verified graph, or the first error.
func (b *Builder) Build() (*Graph, error) {
	if b.err != nil {
		return nil, b.err
	}
	if err := Verify(b.g); err != nil {
		return nil, err
	}
	return b.g, nil
}

// Convenience wrappers for the ops model code uses most.

func (b *Builder) MatMul(x, y *Value) *Value { return b.Op("MatMul", nil, x, y) }
func (b *Builder) Add(x, y *Value) *Value    { return b.Op("Add", nil, x, y) }
func (b *Builder) Sub(x, y *Value) *Value    { return b.Op("Sub", nil, x, y) }
func (b *Builder) Mul(x, y *Value) *Value    { return b.Op("Mul", nil, x, y) }
func (b *Builder) Div(x, y *Value) *Value    { return b.Op("Div", nil, x, y) }
func (b *Builder) Neg(x *Value) *Value       { return b.Op("Neg", nil, x) }
func (b *Builder) Sqrt(x *Value) *Value      { return b.Op("Sqrt", nil, x) }
func (b *Builder) Reciprocal(x *Value) *Value {
	return b.Op("Reciprocal", nil, x)
}
func (b *Builder) Sigmoid(x *Value) *Value { return b.Op("Sigmoid", nil, x) }

// Transpose permutes axes.
func (b *Builder) Transpose(x *Value, perm ...int64) *Value {
	return b.Op("Transpose", Attrs{"perm": Ints(perm...)}, x)
}

// Reshape reshapes to a static shape (0 copies, -1 infers).
func (b *Builder) Reshape(x *Value, shape ...int) *Value {
	return b.Op("Reshape", nil, x, b.Ints(shape...))
}

// Softmax along axis.
func (b *Builder) Softmax(x *Value, axis int64) *Value {
	return b.Op("Softmax", Attrs{"axis": Int(axis)}, x)
}

// ReduceMean over axes.
func (b *Builder) ReduceMean(x *Value, keepdims bool, axes ...int) *Value {
	return b.Op("ReduceMean", Attrs{"keepdims": Int(boolInt(keepdims))}, x, b.Ints(axes...))
}

// ReduceSum over axes.
func (b *Builder) ReduceSum(x *Value, keepdims bool, axes ...int) *Value {
	return b.Op("ReduceSum", Attrs{"keepdims": Int(boolInt(keepdims))}, x, b.Ints(axes...))
}

// Slice takes [start, end) along one axis.
func (b *Builder) Slice(x *Value, axis, start, end int) *Value {
	return b.Op("Slice", nil, x, b.Ints(start), b.Ints(end), b.Ints(axis))
}

// Concat joins along axis.
func (b *Builder) Concat(axis int64, xs ...*Value) *Value {
	return b.Op("Concat", Attrs{"axis": Int(axis)}, xs...)
}

// Gather takes slices of data at indices along axis.
func (b *Builder) Gather(data, indices *Value, axis int64) *Value {
	return b.Op("Gather", Attrs{"axis": Int(axis)}, data, indices)
}

// NegInf is the additive mask value for "masked out".
var NegInf = math.Inf(-1)

func boolInt(v bool) int64 {
	if v {
		return 1
	}
	return 0
}
