package onnx

import (
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// ReadTensorProto decodes one serialized TensorProto (an input_N.pb or
// output_N.pb of an ONNX test data set) into a host tensor, with the name it
// carries ("" when it has none). Integer types widen to int64, our one
// integer type; the element count must agree with the dims (the data is not
// allocated from the dims alone).
func ReadTensorProto(b []byte) (string, *graph.Tensor, error) {
	pt, err := onnxpb.DecodeTensor(b)
	if err != nil {
		return "", nil, err
	}
	t, err := hostTensor(pt)
	return pt.Name, t, err
}

// hostTensor is ReadTensorProto's conversion of a decoded TensorProto.
func hostTensor(pt *onnxpb.Tensor) (*graph.Tensor, error) {
	if pt.DataType == onnxpb.String {
		shape, err := tensorShape(pt)
		if err != nil {
			return nil, err
		}
		s, err := stringsOf(pt, shape)
		if err != nil {
			return nil, err
		}
		return &graph.Tensor{DType: graph.String, Shape: shape, S: s}, nil
	}
	c, err := cvalFromTensor(pt)
	if err != nil {
		return nil, err
	}
	dt, ok := dtypeOf(pt.DataType)
	if !ok {
		if !isIntType(pt.DataType) {
			return nil, fmt.Errorf("tensor %q: element type %v is not supported", pt.Name, pt.DataType)
		}
		dt = graph.Int64
	}
	t := graph.NewTensor(dt, c.shape)
	for k := range t.Len() {
		switch {
		case c.f != nil:
			t.Set(k, c.f[k])
		case dt == graph.Int64:
			t.I64[k] = c.i[k]
		default:
			t.B[k] = c.i[k] != 0
		}
	}
	return t, nil
}

// EncodeTensorProto serializes t as a TensorProto called name, the way
// ReadTensorProto and ONNX's test runners read it.
func EncodeTensorProto(name string, t *graph.Tensor) ([]byte, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	pt, err := tensorProto(name, t)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	return onnxpb.EncodeTensor(pt), nil
}

// tensorProto is t as a TensorProto called name: the one conversion that
// EncodeTensorProto and the exporter's initializers share.
func tensorProto(name string, t *graph.Tensor) (*onnxpb.Tensor, error) {
	dims := dims64(t.Shape)
	var pt *onnxpb.Tensor
	switch t.DType {
	case graph.Float32:
		pt = onnxpb.NewFloat32(name, dims, t.F32)
	case graph.Float16:
		pt = onnxpb.NewFloat16(name, dims, t.F32)
	case graph.BFloat16:
		pt = onnxpb.NewBFloat16(name, dims, t.F32)
	case graph.Float64:
		pt = onnxpb.NewFloat64(name, dims, t.F64)
	case graph.Int64:
		pt = onnxpb.NewInt64(name, dims, t.I64)
	case graph.Bool:
		pt = onnxpb.NewBool(name, dims, t.B)
	default:
		return nil, fmt.Errorf("dtype %v cannot be written as a TensorProto", t.DType)
	}
	return pt, nil
}

// TestValue is one file of an ONNX test data set (input_K.pb or
// output_K.pb) read by the type the model declares for it, as the graph's
// tensors (boundary.go): a tensor under its own name; a sequence's elements
// under SequenceElem names, their shapes in Sequences (what
// Options.Sequences takes); an optional's value under its name, or its name
// in Absent (what Options.Absent takes).
type TestValue struct {
	Names     []string
	Tensors   []*graph.Tensor
	Protos    []*onnxpb.Tensor // the TensorProtos Tensors were read from
	Sequences map[string][]graph.Shape
	Absent    []string
}

// ReadTestValue reads b, the test data of the graph input or output d: a
// TensorProto, or a SequenceProto or OptionalProto where d is a sequence or
// an optional.
func ReadTestValue(b []byte, d Declared) (*TestValue, error) {
	tv, err := DecodeTestValue(b, d.Name, d.typ)
	if err != nil {
		return nil, err
	}
	for i, pt := range tv.Protos {
		ht, err := hostTensor(pt)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tv.Names[i], err)
		}
		tv.Tensors = append(tv.Tensors, ht)
	}
	return tv, nil
}

// DecodeTestValue is ReadTestValue without the host tensors (Tensors is
// nil): the TensorProtos as decoded, for a caller that converts them itself.
func DecodeTestValue(b []byte, name string, t *onnxpb.Type) (*TestValue, error) {
	tv := &TestValue{Sequences: map[string][]graph.Shape{}}
	if err := tv.read(b, name, t); err != nil {
		return nil, err
	}
	return tv, nil
}

func (tv *TestValue) read(b []byte, name string, t *onnxpb.Type) error {
	switch {
	case t.IsOptional():
		o, err := onnxpb.DecodeOptional(b)
		switch {
		case err != nil:
			return err
		case !o.Present():
			tv.Absent = append(tv.Absent, name)
			return nil
		case o.Tensor != nil && t.Elem != nil && t.Elem.Tensor != nil:
			tv.add(name, o.Tensor)
			return nil
		case o.Sequence != nil && t.Elem.IsSequence():
			return tv.sequence(name, o.Sequence)
		}
		return fmt.Errorf("optional %q holds a %v, the model declares %s", name, o.ElemType, t.Elem.TypeKind())
	case t.IsSequence():
		s, err := onnxpb.DecodeSequence(b)
		if err != nil {
			return err
		}
		return tv.sequence(name, s)
	}
	pt, err := onnxpb.DecodeTensor(b)
	if err != nil {
		return err
	}
	tv.add(name, pt)
	return nil
}

func (tv *TestValue) sequence(name string, s *onnxpb.Sequence) error {
	if s.Len() > 0 && s.ElemType != onnxpb.KindTensor {
		return fmt.Errorf("sequence %q holds %v values; only sequences of tensors are read", name, s.ElemType)
	}
	shapes := []graph.Shape{}
	for i, pt := range s.Tensors {
		shape := make(graph.Shape, len(pt.Dims))
		for d, n := range pt.Dims {
			if n < 0 || n > math.MaxInt32 {
				return fmt.Errorf("element %d of %q has bad dimensions %v", i, name, pt.Dims)
			}
			shape[d] = int(n)
		}
		shapes = append(shapes, shape)
		tv.add(SequenceElem(name, i), pt)
	}
	tv.Sequences[name] = shapes
	return nil
}

func (tv *TestValue) add(name string, pt *onnxpb.Tensor) {
	tv.Names = append(tv.Names, name)
	tv.Protos = append(tv.Protos, pt)
}

// Declared is a graph input or output as an ONNX model declares it.
type Declared struct {
	Name string
	typ  *onnxpb.Type
}

// NonTensor reports whether the value is a sequence or an optional, whose
// test data is a SequenceProto or OptionalProto (see ReadTestValue).
func (d Declared) NonTensor() bool { return d.typ.IsSequence() || d.typ.IsOptional() }

// TypeKind names the declared type's kind (tensor_type, sequence_type, ...).
func (d Declared) TypeKind() string { return d.typ.TypeKind() }

// DeclaredIO reads the graph inputs (other than initializers) and outputs
// an ONNX model declares, in order, without importing it: the order of a test
// data set's input_K.pb and output_K.pb files.
func DeclaredIO(b []byte) (inputs, outputs []Declared, err error) {
	m, err := onnxpb.Decode(b)
	if err != nil {
		return nil, nil, fmt.Errorf("onnx: %w", err)
	}
	if m.Graph == nil {
		return nil, nil, fmt.Errorf("onnx: model has no graph")
	}
	inits := map[string]bool{}
	for _, t := range m.Graph.Initializer {
		inits[t.Name] = true
	}
	for _, vi := range m.Graph.Input {
		if !inits[vi.Name] {
			inputs = append(inputs, Declared{vi.Name, vi.Type})
		}
	}
	for _, vi := range m.Graph.Output {
		outputs = append(outputs, Declared{vi.Name, vi.Type})
	}
	return inputs, outputs, nil
}
