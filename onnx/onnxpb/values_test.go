package onnxpb

import (
	"errors"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

func TestSequenceAndOptionalValues(t *testing.T) {
	a := NewFloat32("", []int64{2}, []float32{1, 2})
	b := NewInt64("", []int64{1, 1}, []int64{-7})
	seq := &Sequence{Name: "s", ElemType: KindTensor, Tensors: []*Tensor{a, b}}
	got, err := DecodeSequence(EncodeSequence(seq))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, seq) || got.Len() != 2 {
		t.Fatalf("sequence round trip: got %+v, want %+v", got, seq)
	}
	nested := &Sequence{ElemType: KindSequence, Sequences: []*Sequence{seq, {ElemType: KindTensor}}}
	if got, err := DecodeSequence(EncodeSequence(nested)); err != nil || !reflect.DeepEqual(got, nested) || got.Len() != 2 {
		t.Fatalf("nested sequence round trip: %+v, %v", got, err)
	}
	for _, o := range []*Optional{
		{Name: "o", ElemType: KindTensor, Tensor: a},
		{Name: "os", ElemType: KindSequence, Sequence: seq},
		{Name: "none"}, // absent
		{ElemType: KindOptional, Optional: &Optional{ElemType: KindTensor, Tensor: b}},
	} {
		got, err := DecodeOptional(EncodeOptional(o))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, o) || got.Present() != (o.Name != "none") {
			t.Fatalf("optional round trip: got %+v, want %+v", got, o)
		}
	}
	// Hand-encoded per onnx.proto: SequenceProto{name=1 "q", elem_type=2 TENSOR,
	// tensor_values=3 {dims=1 [3], data_type=2 INT64}}.
	tensor := protowire.AppendTag(nil, 1, protowire.VarintType)
	tensor = protowire.AppendVarint(tensor, 3)
	tensor = protowire.AppendTag(tensor, 2, protowire.VarintType)
	tensor = protowire.AppendVarint(tensor, uint64(Int64))
	msg := protowire.AppendTag(nil, 1, protowire.BytesType)
	msg = protowire.AppendString(msg, "q")
	msg = protowire.AppendTag(msg, 2, protowire.VarintType)
	msg = protowire.AppendVarint(msg, uint64(KindTensor))
	msg = protowire.AppendTag(msg, 3, protowire.BytesType)
	msg = protowire.AppendBytes(msg, tensor)
	hs, err := DecodeSequence(msg)
	if err != nil || hs.Name != "q" || len(hs.Tensors) != 1 || !reflect.DeepEqual(hs.Tensors[0].Dims, []int64{3}) || hs.Tensors[0].DataType != Int64 {
		t.Fatalf("hand-encoded sequence: %+v, %v", hs, err)
	}
	// Maps (field 6) are not modelled: refused, not skipped.
	withMap := protowire.AppendTag(nil, 6, protowire.BytesType)
	withMap = protowire.AppendBytes(withMap, nil)
	if _, err := DecodeSequence(withMap); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("a sequence of maps: %v, want ErrUnsupported", err)
	}
	if _, err := DecodeOptional(withMap); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("an optional map: %v, want ErrUnsupported", err)
	}
	// A truncated message is an error naming where.
	if _, err := DecodeSequence(msg[:len(msg)-2]); err == nil {
		t.Fatal("a truncated sequence decoded")
	}
}

func TestSequenceAndOptionalTypes(t *testing.T) {
	elem := &Type{Tensor: &TensorType{ElemType: Float, Shape: &TensorShape{Dim: []Dimension{{Param: "N"}}}}}
	types := []*Type{SequenceOf(elem), OptionalOf(SequenceOf(elem)), OptionalOf(nil), SequenceOf(nil)}
	m := &Model{IRVersion: 8, OpsetImport: []OperatorSetID{{Version: 17}}, Graph: &Graph{Name: "g"}}
	for i, ty := range types {
		m.Graph.Input = append(m.Graph.Input, &ValueInfo{Name: string(rune('a' + i)), Type: ty})
	}
	got, err := Decode(Encode(m))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip changed the types: %+v", got.Graph.Input)
	}
	in := got.Graph.Input
	if !in[0].Type.IsSequence() || in[0].Type.Elem.Tensor.ElemType != Float || in[0].Type.IsOptional() {
		t.Errorf("sequence: %+v", in[0].Type)
	}
	if !in[1].Type.IsOptional() || !in[1].Type.Elem.IsSequence() || in[1].Type.Elem.Elem.Tensor.Shape.Dim[0].Param != "N" {
		t.Errorf("optional of a sequence: %+v", in[1].Type)
	}
	if !in[2].Type.IsOptional() || in[2].Type.Elem != nil {
		t.Errorf("optional of an unknown type: %+v", in[2].Type)
	}
	// A malformed element type is an error, not an unknown one.
	bad := &Type{OtherField: 4, OtherRaw: []byte{0x0a, 0x05, 0x0a}}
	m.Graph.Input = []*ValueInfo{{Name: "x", Type: bad}}
	if _, err := Decode(Encode(m)); err == nil {
		t.Fatal("a sequence type with a truncated element type decoded")
	}
}
