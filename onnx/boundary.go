package onnx

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Sequences and optionals at the graph boundary.
//
// Our graphs hold tensors only, and inside a model a sequence is an
// import-time list of tensors and an optional an import-time "this tensor
// (or sequence), or nothing" (ops_sequence.go, ops_optional.go). A graph
// input or output of such a type is mapped onto tensors where the graph
// meets the caller:
//
//   - A sequence of tensors named x of length n is n tensors named x.0, x.1,
//     ..., x.(n-1) (SequenceElem), in order. An input's length and its
//     elements' shapes are the caller's to give (Options.Sequences), as a
//     symbolic dimension's size is: the elements may differ in shape, each
//     agreeing with the element type the model declares. An output's length
//     is what the import computed; a sequence of none is no output at all.
//   - An optional x is, when it holds a value, that value under the same
//     name (a tensor x, or a sequence x.0, x.1, ...) and, when it holds none,
//     nothing. An input is present unless Options.Absent names it; an
//     output's presence is what the import computed. OptionalHasElement
//     therefore folds to a constant, and OptionalGetElement is the value.
//
// A sequence of sequences, maps and sparse tensors are refused.

// SequenceElem is the name of element i of a sequence graph input or output
// named name: name.i.
func SequenceElem(name string, i int) string { return name + "." + strconv.Itoa(i) }

// SequenceError is the error of an import that needs the length and element
// shapes of a sequence graph input, which the caller gives in
// Options.Sequences.
type SequenceError struct {
	Input string // the graph input of sequence type
	err   error
}

func (e *SequenceError) Error() string { return e.err.Error() }

// boundaryInput makes the entry of a graph input of sequence or optional
// type t (of a tensor type at the top of an optional).
func (im *importer) boundaryInput(name string, t *onnxpb.Type) (*entry, error) {
	switch {
	case t.IsOptional():
		if im.opts.Absent[name] {
			return &entry{name: name, isOpt: true}, nil
		}
		if t.Elem == nil {
			return nil, errors.New("optional of an unknown type: it can only be absent (Options.Absent)")
		}
		if t.Elem.IsOptional() {
			return nil, errors.New("an optional of an optional is not supported")
		}
		inner, err := im.boundaryInput(name, t.Elem)
		if err != nil {
			return nil, err
		}
		return &entry{name: name, isOpt: true, opt: inner}, nil
	case t.IsSequence():
		if t.Elem == nil || t.Elem.Tensor == nil {
			return nil, fmt.Errorf("a sequence of %s is not supported (only sequences of tensors)", t.Elem.TypeKind())
		}
		shapes, ok := im.opts.Sequences[name]
		if !ok {
			return nil, &SequenceError{Input: name, err: fmt.Errorf(
				"graph input %q is a sequence of tensors: give its length and element shapes (Options.Sequences; it becomes the tensor inputs %s, %s, ...)",
				name, SequenceElem(name, 0), SequenceElem(name, 1))}
		}
		list := make([]*entry, len(shapes))
		for i, s := range shapes {
			en := SequenceElem(name, i)
			e, err := im.tensorInput(en, t.Elem.Tensor, s, true)
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
			list[i] = e
		}
		return &entry{name: name, list: list, isList: true}, nil
	case t.Tensor != nil:
		return im.tensorInput(name, t.Tensor, nil, false)
	}
	return nil, fmt.Errorf("type is %s; only tensors, sequences of tensors and optionals of them are supported", t.TypeKind())
}

// tensorInput declares graph input name of tensor type tt: the shape the
// model declares or, for a sequence's element (elem), shape, which must
// agree with the declared element type (a symbolic dimension Options.Dims
// does not give may differ from element to element).
func (im *importer) tensorInput(name string, tt *onnxpb.TensorType, shape graph.Shape, elem bool) (*entry, error) {
	if elem && !im.values.Reserve(name) {
		// An element's name is ours, not the model's (which reserved its
		// own graph inputs' names).
		return nil, fmt.Errorf("the name %q it would take is taken by another value of the model", name)
	}
	var typ graph.TensorType
	var err error
	if !elem {
		typ, err = im.staticType(&onnxpb.ValueInfo{Name: name, Type: &onnxpb.Type{Tensor: tt}})
	} else {
		typ, err = im.elemType(tt, shape)
	}
	if err != nil {
		return nil, err
	}
	v := &graph.Value{Name: name, Type: typ, Kind: graph.Input}
	im.g.Inputs = append(im.g.Inputs, v)
	e := &entry{name: name, v: v}
	if isNarrowInt(tt.ElemType) {
		e.odt = tt.ElemType
		im.declare(name, tt.ElemType)
	}
	return e, nil
}

// elemType is the type of a sequence element of shape s whose declared
// type is tt.
func (im *importer) elemType(tt *onnxpb.TensorType, s graph.Shape) (graph.TensorType, error) {
	dt, ok := graphDType(tt.ElemType)
	if !ok {
		return graph.TensorType{}, fmt.Errorf("element type %v is not supported (float32, float64, float16, bfloat16, int64, bool; int8 to int32 and uint8 to uint32 as int64)", tt.ElemType)
	}
	if tt.Shape != nil {
		if len(tt.Shape.Dim) != len(s) {
			return graph.TensorType{}, fmt.Errorf("shape %v given, the model declares rank %d", s, len(tt.Shape.Dim))
		}
		for i, d := range tt.Shape.Dim {
			want, known := int(d.Value), d.HasValue
			if !known && d.Param != "" {
				want, known = im.opts.Dims[d.Param]
			}
			if known && want != s[i] {
				return graph.TensorType{}, fmt.Errorf("shape %v given, the model declares dimension %d = %d", s, i, want)
			}
		}
	}
	if err := s.Check(); err != nil {
		return graph.TensorType{}, err
	}
	return graph.TensorType{DType: dt, Shape: s.Clone()}, nil
}

// boundaryOutput makes the graph outputs of ONNX graph output name, which
// holds e, a sequence or an optional: one output per sequence element
// (name.i), the optional's value under name, or none.
func (im *importer) boundaryOutput(name string, e *entry, t *onnxpb.Type) error {
	switch {
	case e.isOpt:
		if t != nil && !t.IsOptional() {
			return fmt.Errorf("the model declares %s, the graph computes an optional", t.TypeKind())
		}
		if e.opt == nil {
			return nil
		}
		var inner *onnxpb.Type
		if t != nil {
			inner = t.Elem
		}
		return im.boundaryOutput(name, e.opt, inner)
	case e.isList:
		if t != nil && !t.IsSequence() {
			return fmt.Errorf("the model declares %s, the graph computes a sequence", t.TypeKind())
		}
		for i, el := range e.list {
			if el.isList || el.isOpt {
				return fmt.Errorf("element %d is not a tensor", i)
			}
			if err := im.tensorOutput(SequenceElem(name, i), el, t); err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
		}
		return nil
	}
	if t != nil && t.Tensor == nil && t.OtherField != 0 {
		return fmt.Errorf("the model declares %s, the graph computes a tensor", t.TypeKind())
	}
	return im.tensorOutput(name, e, nil)
}

// tensorOutput makes graph output name hold tensor entry e: e's own value
// when it has that name, else a constant of that name or an Identity
// writing it. seq is the sequence type declared for the output e is an
// element of (nil: e is the output itself); an element's name is not one of
// the model's, and must be free.
func (im *importer) tensorOutput(name string, e *entry, seq *onnxpb.Type) error {
	dt, _ := e.typ()
	if seq != nil {
		if !im.values.Reserve(name) {
			return fmt.Errorf("the name %q it would take is taken by another value of the model", name)
		}
		if seq.Elem != nil && seq.Elem.Tensor != nil {
			if want := seq.Elem.Tensor.ElemType; want != onnxpb.Undefined && want != dt {
				return fmt.Errorf("the model declares element type %v, the graph computes %v", want, dt)
			}
		}
	}
	v := e.v
	switch {
	case v != nil && v.Name == name:
	case e.c != nil:
		var err error
		if v, err = im.initValue(name, e.c, false, ""); err != nil {
			return err
		}
		im.addInit(&entry{name: name, c: e.c, v: v})
	default:
		nd, err := graph.NewNode(im.nodes.Fresh(name), "Identity", nil, v)
		if err != nil {
			return err
		}
		nd.Outputs[0].Name = name
		im.g.Nodes = append(im.g.Nodes, nd)
		v = nd.Outputs[0]
	}
	if isNarrowInt(dt) {
		im.declare(name, dt)
	}
	if slices.Contains(im.g.Outputs, v) {
		return fmt.Errorf("%q is already a graph output", name)
	}
	im.g.Outputs = append(im.g.Outputs, v)
	return nil
}
