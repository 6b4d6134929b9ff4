package onnxpb

import "fmt"

// Values that are not tensors: onnx.SequenceProto and onnx.OptionalProto, as the
// ONNX test data sets store a sequence or optional input or expected output
// (test_data_set_N/input_0.pb holds one such message where the model declares
// the input a sequence or an optional). Tensors, sequences and optionals nest;
// maps and sparse tensors are refused (ErrUnsupported), as elsewhere.

// ValueKind is the elem_type discriminator of SequenceProto and OptionalProto
// (both messages number it the same way).
type ValueKind int32

// Value kinds, numbered as in onnx.proto.
const (
	KindUndefined    ValueKind = 0
	KindTensor       ValueKind = 1
	KindSparseTensor ValueKind = 2
	KindSequence     ValueKind = 3
	KindMap          ValueKind = 4
	KindOptional     ValueKind = 5
)

var valueKindNames = map[ValueKind]string{
	KindUndefined: "UNDEFINED", KindTensor: "TENSOR", KindSparseTensor: "SPARSE_TENSOR",
	KindSequence: "SEQUENCE", KindMap: "MAP", KindOptional: "OPTIONAL",
}

func (k ValueKind) String() string {
	if s, ok := valueKindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("ValueKind(%d)", int32(k))
}

// Sequence is onnx.SequenceProto: a list of values of one kind.
type Sequence struct {
	Name      string      // 1
	ElemType  ValueKind   // 2
	Tensors   []*Tensor   // 3
	Sequences []*Sequence // 5
	Optionals []*Optional // 7
}

// Len is the number of elements of the sequence's kind.
func (s *Sequence) Len() int {
	switch s.ElemType {
	case KindSequence:
		return len(s.Sequences)
	case KindOptional:
		return len(s.Optionals)
	}
	return len(s.Tensors)
}

// Optional is onnx.OptionalProto: one value, or none (ElemType KindUndefined
// and no value: the absent optional).
type Optional struct {
	Name     string    // 1
	ElemType ValueKind // 2
	Tensor   *Tensor   // 3
	Sequence *Sequence // 5
	Optional *Optional // 7
}

// Present reports whether the optional holds a value.
func (o *Optional) Present() bool {
	return o.Tensor != nil || o.Sequence != nil || o.Optional != nil
}

// DecodeSequence parses a serialized SequenceProto.
func DecodeSequence(b []byte) (*Sequence, error) {
	s := &Sequence{}
	if err := decodeSequence(b, 0, s, 0); err != nil {
		return nil, within(err, "SequenceProto")
	}
	return s, nil
}

// DecodeOptional parses a serialized OptionalProto.
func DecodeOptional(b []byte) (*Optional, error) {
	o := &Optional{}
	if err := decodeOptional(b, 0, o, 0); err != nil {
		return nil, within(err, "OptionalProto")
	}
	return o, nil
}

// unsupportedValue refuses the members we do not model (fields 4 and 6 of
// both messages: sparse tensors and maps).
func unsupportedValue(f *field, what string) error {
	return f.errorf("%s: %w", what, ErrUnsupported)
}

func decodeSequence(b []byte, base int, s *Sequence, depth int) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			s.Name, err = f.str("name")
		case 2:
			var v int32
			v, err = f.int32v("elem_type")
			s.ElemType = ValueKind(v)
		case 3:
			var t *Tensor
			name := indexed("tensor_values", len(s.Tensors))
			if t, err = decodeTensorField(f, name, depth); err == nil {
				s.Tensors = append(s.Tensors, t)
			}
		case 4:
			err = unsupportedValue(f, "sparse_tensor_values")
		case 5:
			name := indexed("sequence_values", len(s.Sequences))
			var p []byte
			if p, err = f.message(name); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, name)
			}
			e := &Sequence{}
			if err = within(decodeSequence(p, f.off, e, depth+1), name); err == nil {
				s.Sequences = append(s.Sequences, e)
			}
		case 6:
			err = unsupportedValue(f, "map_values")
		case 7:
			name := indexed("optional_values", len(s.Optionals))
			var p []byte
			if p, err = f.message(name); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, name)
			}
			e := &Optional{}
			if err = within(decodeOptional(p, f.off, e, depth+1), name); err == nil {
				s.Optionals = append(s.Optionals, e)
			}
		}
		return err
	})
}

func decodeOptional(b []byte, base int, o *Optional, depth int) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			o.Name, err = f.str("name")
		case 2:
			var v int32
			v, err = f.int32v("elem_type")
			o.ElemType = ValueKind(v)
		case 3:
			// A message field given twice merges; a tensor is never split so in
			// practice, and the last one wins here.
			o.Tensor, err = decodeTensorField(f, "tensor_value", depth)
		case 4:
			err = unsupportedValue(f, "sparse_tensor_value")
		case 5:
			var p []byte
			if p, err = f.message("sequence_value"); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, "sequence_value")
			}
			o.Sequence = &Sequence{}
			err = within(decodeSequence(p, f.off, o.Sequence, depth+1), "sequence_value")
		case 6:
			err = unsupportedValue(f, "map_value")
		case 7:
			var p []byte
			if p, err = f.message("optional_value"); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, "optional_value")
			}
			o.Optional = &Optional{}
			err = within(decodeOptional(p, f.off, o.Optional, depth+1), "optional_value")
		}
		return err
	})
}

// EncodeSequence serializes a SequenceProto (fields in number order).
func EncodeSequence(s *Sequence) []byte { return appendSequence(nil, s) }

// EncodeOptional serializes an OptionalProto (fields in number order).
func EncodeOptional(o *Optional) []byte { return appendOptional(nil, o) }

func appendSequence(b []byte, s *Sequence) []byte {
	b = putString(b, 1, s.Name)
	b = putInt(b, 2, int64(s.ElemType))
	for _, t := range s.Tensors {
		b = putMessage(b, 3, func(p []byte) []byte { return appendTensor(p, t) })
	}
	for _, e := range s.Sequences {
		b = putMessage(b, 5, func(p []byte) []byte { return appendSequence(p, e) })
	}
	for _, e := range s.Optionals {
		b = putMessage(b, 7, func(p []byte) []byte { return appendOptional(p, e) })
	}
	return b
}

func appendOptional(b []byte, o *Optional) []byte {
	b = putString(b, 1, o.Name)
	b = putInt(b, 2, int64(o.ElemType))
	if o.Tensor != nil {
		b = putMessage(b, 3, func(p []byte) []byte { return appendTensor(p, o.Tensor) })
	}
	if o.Sequence != nil {
		b = putMessage(b, 5, func(p []byte) []byte { return appendSequence(p, o.Sequence) })
	}
	if o.Optional != nil {
		b = putMessage(b, 7, func(p []byte) []byte { return appendOptional(p, o.Optional) })
	}
	return b
}

// SequenceOf is the TypeProto of a sequence of elem (nil: of an unknown
// type), with OtherRaw encoded as Decode would keep it.
func SequenceOf(elem *Type) *Type { return wrapType(4, elem) }

// OptionalOf is the TypeProto of an optional of elem (nil: of an unknown
// type), with OtherRaw encoded as Decode would keep it.
func OptionalOf(elem *Type) *Type { return wrapType(9, elem) }

func wrapType(field int, elem *Type) *Type {
	raw := []byte{}
	if elem != nil {
		raw = putMessage(raw, 1, func(p []byte) []byte { return appendType(p, elem) })
	}
	return &Type{OtherField: field, OtherRaw: raw, Elem: elem}
}
