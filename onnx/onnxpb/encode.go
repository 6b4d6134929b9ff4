package onnxpb

import (
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Encode serializes m. The output depends only on m: fields are written in
// field-number order, so equal models give equal bytes.
func Encode(m *Model) []byte {
	return appendModel(nil, m)
}

func putVarint(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// putInt writes a proto2 optional int field when it is set (non-zero).
func putInt(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	return putVarint(b, num, uint64(v))
}

func putString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func putBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// putMessage writes a length-delimited sub-message produced by fn.
func putMessage(b []byte, num protowire.Number, fn func([]byte) []byte) []byte {
	return putBytes(b, num, fn(nil))
}

func putPacked[T int32 | int64 | uint64](b []byte, num protowire.Number, vs []T) []byte {
	if len(vs) == 0 {
		return b
	}
	var p []byte
	for _, v := range vs {
		// int32 values are sign-extended to 64 bits, as protobuf requires.
		p = protowire.AppendVarint(p, uint64(int64(v)))
	}
	return putBytes(b, num, p)
}

func appendModel(b []byte, m *Model) []byte {
	b = putInt(b, 1, m.IRVersion)
	b = putString(b, 2, m.ProducerName)
	b = putString(b, 3, m.ProducerVersion)
	b = putString(b, 4, m.Domain)
	b = putInt(b, 5, m.ModelVersion)
	b = putString(b, 6, m.DocString)
	if m.Graph != nil {
		b = putMessage(b, 7, func(p []byte) []byte { return appendGraph(p, m.Graph) })
	}
	for _, o := range m.OpsetImport {
		b = putMessage(b, 8, func(p []byte) []byte {
			p = putString(p, 1, o.Domain)
			return putInt(p, 2, o.Version)
		})
	}
	for _, e := range m.MetadataProps {
		b = putEntry(b, 14, e)
	}
	for _, fn := range m.Functions {
		b = putBytes(b, 25, fn)
	}
	return b
}

func putEntry(b []byte, num protowire.Number, e StringEntry) []byte {
	return putMessage(b, num, func(p []byte) []byte {
		p = putString(p, 1, e.Key)
		return putString(p, 2, e.Value)
	})
}

func appendGraph(b []byte, g *Graph) []byte {
	for _, n := range g.Node {
		b = putMessage(b, 1, func(p []byte) []byte { return appendNode(p, n) })
	}
	b = putString(b, 2, g.Name)
	for _, t := range g.Initializer {
		b = putMessage(b, 5, func(p []byte) []byte { return appendTensor(p, t) })
	}
	b = putString(b, 10, g.DocString)
	for num, list := range [][]*ValueInfo{g.Input, g.Output, g.ValueInfo} {
		for _, v := range list {
			b = putMessage(b, protowire.Number(11+num), func(p []byte) []byte { return appendValueInfo(p, v) })
		}
	}
	for _, e := range g.MetadataProps {
		b = putEntry(b, 16, e)
	}
	return b
}

func appendNode(b []byte, n *Node) []byte {
	// Repeated strings are written even when empty: an empty input name means
	// "optional input not given" and its position matters.
	for _, s := range n.Input {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	for _, s := range n.Output {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	b = putString(b, 3, n.Name)
	b = putString(b, 4, n.OpType)
	for _, a := range n.Attribute {
		b = putMessage(b, 5, func(p []byte) []byte { return appendAttribute(p, a) })
	}
	b = putString(b, 6, n.DocString)
	b = putString(b, 7, n.Domain)
	b = putString(b, 8, n.Overload)
	for _, e := range n.MetadataProps {
		b = putEntry(b, 9, e)
	}
	return b
}

func appendAttribute(b []byte, a *Attribute) []byte {
	b = putString(b, 1, a.Name)
	// A scalar value is written when non-zero or when the type says it is the value:
	// an INT attribute equal to 0 must still carry its i field.
	if a.F != 0 || math.Signbit(float64(a.F)) || a.Type == AttrFloat {
		b = protowire.AppendTag(b, 2, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, math.Float32bits(a.F))
	}
	if a.I != 0 || a.Type == AttrInt {
		b = putVarint(b, 3, uint64(a.I))
	}
	if len(a.S) > 0 || a.Type == AttrString {
		b = putBytes(b, 4, a.S)
	}
	if a.T != nil {
		b = putMessage(b, 5, func(p []byte) []byte { return appendTensor(p, a.T) })
	}
	if a.G != nil {
		b = putMessage(b, 6, func(p []byte) []byte { return appendGraph(p, a.G) })
	}
	// floats and ints are not declared packed in onnx.proto (proto2), so they are
	// written one element per tag, as the reference implementation does.
	for _, v := range a.Floats {
		b = protowire.AppendTag(b, 7, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, math.Float32bits(v))
	}
	for _, v := range a.Ints {
		b = putVarint(b, 8, uint64(v))
	}
	for _, s := range a.Strings {
		b = putBytes(b, 9, s)
	}
	for _, t := range a.Tensors {
		b = putMessage(b, 10, func(p []byte) []byte { return appendTensor(p, t) })
	}
	for _, g := range a.Graphs {
		b = putMessage(b, 11, func(p []byte) []byte { return appendGraph(p, g) })
	}
	b = putString(b, 13, a.DocString)
	if a.TP != nil {
		b = putMessage(b, 14, func(p []byte) []byte { return appendType(p, a.TP) })
	}
	for _, t := range a.TypeProtos {
		b = putMessage(b, 15, func(p []byte) []byte { return appendType(p, t) })
	}
	b = putInt(b, 20, int64(a.Type))
	return putString(b, 21, a.RefAttrName)
}

func appendTensor(b []byte, t *Tensor) []byte {
	// dims is not declared packed in onnx.proto.
	for _, d := range t.Dims {
		b = putVarint(b, 1, uint64(d))
	}
	b = putInt(b, 2, int64(t.DataType))
	if t.Segment != nil {
		b = putMessage(b, 3, func(p []byte) []byte {
			p = putInt(p, 1, t.Segment.Begin)
			return putInt(p, 2, t.Segment.End)
		})
	}
	if len(t.FloatData) > 0 {
		p := make([]byte, 0, 4*len(t.FloatData))
		for _, v := range t.FloatData {
			p = protowire.AppendFixed32(p, math.Float32bits(v))
		}
		b = putBytes(b, 4, p)
	}
	b = putPacked(b, 5, t.Int32Data)
	for _, s := range t.StringData {
		b = putBytes(b, 6, s)
	}
	b = putPacked(b, 7, t.Int64Data)
	b = putString(b, 8, t.Name)
	// raw_data keeps its presence: an empty but present raw_data is how exporters
	// write a zero-element tensor.
	if t.RawData != nil {
		b = putBytes(b, 9, t.RawData)
	}
	if len(t.DoubleData) > 0 {
		p := make([]byte, 0, 8*len(t.DoubleData))
		for _, v := range t.DoubleData {
			p = protowire.AppendFixed64(p, math.Float64bits(v))
		}
		b = putBytes(b, 10, p)
	}
	b = putPacked(b, 11, t.Uint64Data)
	b = putString(b, 12, t.DocString)
	for _, e := range t.ExternalData {
		b = putEntry(b, 13, e)
	}
	b = putInt(b, 14, int64(t.DataLocation))
	for _, e := range t.MetadataProps {
		b = putEntry(b, 16, e)
	}
	return b
}

func appendValueInfo(b []byte, v *ValueInfo) []byte {
	b = putString(b, 1, v.Name)
	if v.Type != nil {
		b = putMessage(b, 2, func(p []byte) []byte { return appendType(p, v.Type) })
	}
	b = putString(b, 3, v.DocString)
	for _, e := range v.MetadataProps {
		b = putEntry(b, 4, e)
	}
	return b
}

func appendType(b []byte, t *Type) []byte {
	if t.Tensor != nil {
		b = putMessage(b, 1, func(p []byte) []byte { return appendTensorType(p, t.Tensor) })
	}
	other := t.Tensor == nil && t.OtherField != 0
	if other && t.OtherField < 6 {
		b = putBytes(b, protowire.Number(t.OtherField), t.OtherRaw)
	}
	b = putString(b, 6, t.Denotation)
	if other && t.OtherField > 6 {
		b = putBytes(b, protowire.Number(t.OtherField), t.OtherRaw)
	}
	return b
}

func appendTensorType(b []byte, tt *TensorType) []byte {
	b = putInt(b, 1, int64(tt.ElemType))
	if tt.Shape != nil {
		b = putMessage(b, 2, func(p []byte) []byte {
			for _, d := range tt.Shape.Dim {
				p = putMessage(p, 1, func(q []byte) []byte {
					if d.HasValue {
						q = putVarint(q, 1, uint64(d.Value))
					} else {
						q = putString(q, 2, d.Param)
					}
					return putString(q, 3, d.Denotation)
				})
			}
			return p
		})
	}
	return b
}
