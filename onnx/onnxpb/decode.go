package onnxpb

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// MaxDepth bounds message nesting (graphs inside attributes inside nodes inside
// graphs...). Real models nest a handful of levels; the bound exists so that a
// hostile input cannot exhaust the stack. It matches protobuf's default of 100.
const MaxDepth = 100

// ErrUnsupported marks input that is well-formed but uses a part of ONNX this
// package deliberately does not model (sparse tensors, maps).
var ErrUnsupported = errors.New("unsupported")

// DecodeError says where decoding failed: the path of fields from ModelProto down
// (for example "ModelProto.graph.node[3].attribute[0].t.raw_data") and the byte
// offset in the input.
type DecodeError struct {
	Path   string
	Offset int
	Err    error
}

func (e *DecodeError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("onnxpb: at byte %d: %v", e.Offset, e.Err)
	}
	return fmt.Sprintf("onnxpb: %s (byte %d): %v", e.Path, e.Offset, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// within prefixes err's path with seg, the field or element that contained it.
func within(err error, seg string) error {
	var de *DecodeError
	if !errors.As(err, &de) {
		return err
	}
	switch {
	case de.Path == "":
		de.Path = seg
	case strings.HasPrefix(de.Path, "["):
		de.Path = seg + de.Path
	default:
		de.Path = seg + "." + de.Path
	}
	return err
}

func indexed(name string, i int) string { return name + "[" + strconv.Itoa(i) + "]" }

// Decode parses a serialized ModelProto.
func Decode(b []byte) (*Model, error) {
	m := &Model{}
	if err := decodeModel(b, 0, m, 0); err != nil {
		return nil, within(err, "ModelProto")
	}
	return m, nil
}

// DecodeTensor parses a serialized TensorProto (as found in .pb test data files).
func DecodeTensor(b []byte) (*Tensor, error) {
	t := &Tensor{}
	if err := decodeTensor(b, 0, t, 0); err != nil {
		return nil, within(err, "TensorProto")
	}
	return t, nil
}

// field is one decoded (tag, value) pair.
type field struct {
	num protowire.Number
	typ protowire.Type
	u   uint64 // the value of a varint, fixed32 or fixed64 field
	b   []byte // the payload of a length-delimited field
	off int    // absolute offset of the value in the whole input
}

func (f *field) errorf(format string, args ...any) error {
	return &DecodeError{Offset: f.off, Err: fmt.Errorf(format, args...)}
}

func (f *field) want(t protowire.Type) error {
	if f.typ != t {
		return f.errorf("field %d has wire type %s, want %s", f.num, wireName(f.typ), wireName(t))
	}
	return nil
}

func wireName(t protowire.Type) string {
	switch t {
	case protowire.VarintType:
		return "varint"
	case protowire.Fixed32Type:
		return "fixed32"
	case protowire.Fixed64Type:
		return "fixed64"
	case protowire.BytesType:
		return "bytes"
	case protowire.StartGroupType:
		return "group"
	case protowire.EndGroupType:
		return "end-group"
	}
	return fmt.Sprintf("wire type %d", int(t))
}

// walk calls fn for every field of the message in b, whose first byte is at
// absolute offset base. Unknown fields reach fn too; fn ignores them.
func walk(b []byte, base int, fn func(f *field) error) error {
	pos := 0
	for pos < len(b) {
		num, typ, n := protowire.ConsumeTag(b[pos:])
		if n < 0 {
			return &DecodeError{Offset: base + pos, Err: fmt.Errorf("bad field tag: %w", protowire.ParseError(n))}
		}
		pos += n
		f := field{num: num, typ: typ, off: base + pos}
		switch typ {
		case protowire.VarintType:
			f.u, n = protowire.ConsumeVarint(b[pos:])
		case protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b[pos:])
			f.u = uint64(v)
		case protowire.Fixed64Type:
			f.u, n = protowire.ConsumeFixed64(b[pos:])
		case protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b[pos:])
			if n >= 0 {
				// The payload starts after its length prefix.
				f.off = base + pos + n - len(v)
				f.b = v
			}
		case protowire.StartGroupType:
			// Groups are not used by onnx.proto; they can only be unknown fields.
			n = protowire.ConsumeFieldValue(num, typ, b[pos:])
		default:
			return &DecodeError{Offset: base + pos, Err: fmt.Errorf("field %d: unexpected %s", num, wireName(typ))}
		}
		if n < 0 {
			return &DecodeError{Offset: base + pos, Err: fmt.Errorf("field %d (%s): %w", num, wireName(typ), protowire.ParseError(n))}
		}
		pos += n
		if err := fn(&f); err != nil {
			return err
		}
	}
	return nil
}

func (f *field) str(name string) (string, error) {
	if err := f.want(protowire.BytesType); err != nil {
		return "", within(err, name)
	}
	return string(f.b), nil
}

func (f *field) bytes(name string) ([]byte, error) {
	if err := f.want(protowire.BytesType); err != nil {
		return nil, within(err, name)
	}
	// Copy so that the decoded model does not pin (or alias) the caller's buffer.
	return append([]byte{}, f.b...), nil
}

func (f *field) varint(name string) (uint64, error) {
	if err := f.want(protowire.VarintType); err != nil {
		return 0, within(err, name)
	}
	return f.u, nil
}

func (f *field) int64v(name string) (int64, error) {
	v, err := f.varint(name)
	return int64(v), err
}

// int32v follows protobuf's int32 rule: the varint is a sign-extended 64-bit value
// truncated to 32 bits.
func (f *field) int32v(name string) (int32, error) {
	v, err := f.varint(name)
	return int32(v), err
}

func (f *field) float32v(name string) (float32, error) {
	if err := f.want(protowire.Fixed32Type); err != nil {
		return 0, within(err, name)
	}
	return math.Float32frombits(uint32(f.u)), nil
}

func (f *field) message(name string) ([]byte, error) {
	if err := f.want(protowire.BytesType); err != nil {
		return nil, within(err, name)
	}
	return f.b, nil
}

// Repeated scalars are accepted both packed and unpacked, as protobuf parsers must.

func appendVarints[T int32 | int64 | uint64](f *field, name string, dst []T) ([]T, error) {
	switch f.typ {
	case protowire.VarintType:
		return append(dst, T(f.u)), nil
	case protowire.BytesType:
		b := f.b
		for len(b) > 0 {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				off := f.off + len(f.b) - len(b)
				return dst, within(&DecodeError{Offset: off, Err: fmt.Errorf("packed varint: %w", protowire.ParseError(n))}, name)
			}
			dst = append(dst, T(v))
			b = b[n:]
		}
		return dst, nil
	}
	return dst, within(f.errorf("field %d has wire type %s, want varint or packed bytes", f.num, wireName(f.typ)), name)
}

func appendFloat32s(f *field, name string, dst []float32) ([]float32, error) {
	switch f.typ {
	case protowire.Fixed32Type:
		return append(dst, math.Float32frombits(uint32(f.u))), nil
	case protowire.BytesType:
		if len(f.b)%4 != 0 {
			return dst, within(f.errorf("packed float payload of %d bytes is not a multiple of 4", len(f.b)), name)
		}
		dst = growTo(dst, len(f.b)/4)
		for i := 0; i < len(f.b); i += 4 {
			v, _ := protowire.ConsumeFixed32(f.b[i:])
			dst = append(dst, math.Float32frombits(v))
		}
		return dst, nil
	}
	return dst, within(f.errorf("field %d has wire type %s, want fixed32 or packed bytes", f.num, wireName(f.typ)), name)
}

func appendFloat64s(f *field, name string, dst []float64) ([]float64, error) {
	switch f.typ {
	case protowire.Fixed64Type:
		return append(dst, math.Float64frombits(f.u)), nil
	case protowire.BytesType:
		if len(f.b)%8 != 0 {
			return dst, within(f.errorf("packed double payload of %d bytes is not a multiple of 8", len(f.b)), name)
		}
		dst = growTo(dst, len(f.b)/8)
		for i := 0; i < len(f.b); i += 8 {
			v, _ := protowire.ConsumeFixed64(f.b[i:])
			dst = append(dst, math.Float64frombits(v))
		}
		return dst, nil
	}
	return dst, within(f.errorf("field %d has wire type %s, want fixed64 or packed bytes", f.num, wireName(f.typ)), name)
}

// growTo makes room for n more elements; n is bounded by the input's length.
func growTo[T any](s []T, n int) []T {
	if cap(s)-len(s) >= n {
		return s
	}
	out := make([]T, len(s), len(s)+n)
	copy(out, s)
	return out
}

func deeper(f *field, depth int) error {
	if depth+1 > MaxDepth {
		return f.errorf("messages nested deeper than %d", MaxDepth)
	}
	return nil
}

func decodeModel(b []byte, base int, m *Model, depth int) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			m.IRVersion, err = f.int64v("ir_version")
		case 2:
			m.ProducerName, err = f.str("producer_name")
		case 3:
			m.ProducerVersion, err = f.str("producer_version")
		case 4:
			m.Domain, err = f.str("domain")
		case 5:
			m.ModelVersion, err = f.int64v("model_version")
		case 6:
			m.DocString, err = f.str("doc_string")
		case 7:
			var p []byte
			if p, err = f.message("graph"); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, "graph")
			}
			// A repeated occurrence of a singular message merges into it (protobuf rule).
			if m.Graph == nil {
				m.Graph = &Graph{}
			}
			if err = decodeGraph(p, f.off, m.Graph, depth+1); err != nil {
				return within(err, "graph")
			}
		case 8:
			var p []byte
			name := indexed("opset_import", len(m.OpsetImport))
			if p, err = f.message(name); err != nil {
				return err
			}
			var o OperatorSetID
			if err = decodeOpset(p, f.off, &o); err != nil {
				return within(err, name)
			}
			m.OpsetImport = append(m.OpsetImport, o)
		case 14:
			var e StringEntry
			name := indexed("metadata_props", len(m.MetadataProps))
			if e, err = decodeEntryField(f, name); err == nil {
				m.MetadataProps = append(m.MetadataProps, e)
			}
		case 25:
			var p []byte
			if p, err = f.bytes(indexed("functions", len(m.Functions))); err == nil {
				m.Functions = append(m.Functions, p)
			}
		}
		return err
	})
}

func decodeOpset(b []byte, base int, o *OperatorSetID) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			o.Domain, err = f.str("domain")
		case 2:
			o.Version, err = f.int64v("version")
		}
		return err
	})
}

func decodeEntryField(f *field, name string) (StringEntry, error) {
	var e StringEntry
	p, err := f.message(name)
	if err != nil {
		return e, err
	}
	err = walk(p, f.off, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			e.Key, err = f.str("key")
		case 2:
			e.Value, err = f.str("value")
		}
		return err
	})
	return e, within(err, name)
}

func decodeGraph(b []byte, base int, g *Graph, depth int) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			name := indexed("node", len(g.Node))
			var p []byte
			if p, err = f.message(name); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, name)
			}
			n := &Node{}
			if err = decodeNode(p, f.off, n, depth+1); err != nil {
				return within(err, name)
			}
			g.Node = append(g.Node, n)
		case 2:
			g.Name, err = f.str("name")
		case 5:
			name := indexed("initializer", len(g.Initializer))
			var t *Tensor
			if t, err = decodeTensorField(f, name, depth); err == nil {
				g.Initializer = append(g.Initializer, t)
			}
		case 10:
			g.DocString, err = f.str("doc_string")
		case 11, 12, 13:
			dst := map[protowire.Number]*[]*ValueInfo{11: &g.Input, 12: &g.Output, 13: &g.ValueInfo}[f.num]
			label := map[protowire.Number]string{11: "input", 12: "output", 13: "value_info"}[f.num]
			name := indexed(label, len(*dst))
			var p []byte
			if p, err = f.message(name); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, name)
			}
			v := &ValueInfo{}
			if err = decodeValueInfo(p, f.off, v, depth+1); err != nil {
				return within(err, name)
			}
			*dst = append(*dst, v)
		case 15:
			return within(&DecodeError{Offset: f.off, Err: fmt.Errorf("%w: sparse initializers are not supported; densify the model first", ErrUnsupported)}, "sparse_initializer")
		case 16:
			var e StringEntry
			if e, err = decodeEntryField(f, indexed("metadata_props", len(g.MetadataProps))); err == nil {
				g.MetadataProps = append(g.MetadataProps, e)
			}
		}
		return err
	})
}

func decodeNode(b []byte, base int, n *Node, depth int) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			var s string
			if s, err = f.str(indexed("input", len(n.Input))); err == nil {
				n.Input = append(n.Input, s)
			}
		case 2:
			var s string
			if s, err = f.str(indexed("output", len(n.Output))); err == nil {
				n.Output = append(n.Output, s)
			}
		case 3:
			n.Name, err = f.str("name")
		case 4:
			n.OpType, err = f.str("op_type")
		case 5:
			name := indexed("attribute", len(n.Attribute))
			var p []byte
			if p, err = f.message(name); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, name)
			}
			a := &Attribute{}
			if err = decodeAttribute(p, f.off, a, depth+1); err != nil {
				return within(err, name)
			}
			n.Attribute = append(n.Attribute, a)
		case 6:
			n.DocString, err = f.str("doc_string")
		case 7:
			n.Domain, err = f.str("domain")
		case 8:
			n.Overload, err = f.str("overload")
		case 9:
			var e StringEntry
			if e, err = decodeEntryField(f, indexed("metadata_props", len(n.MetadataProps))); err == nil {
				n.MetadataProps = append(n.MetadataProps, e)
			}
		}
		return err
	})
}

func decodeTensorField(f *field, name string, depth int) (*Tensor, error) {
	p, err := f.message(name)
	if err != nil {
		return nil, err
	}
	if err = deeper(f, depth); err != nil {
		return nil, within(err, name)
	}
	t := &Tensor{}
	if err = decodeTensor(p, f.off, t, depth+1); err != nil {
		return nil, within(err, name)
	}
	return t, nil
}

func decodeGraphField(f *field, name string, depth int) (*Graph, error) {
	p, err := f.message(name)
	if err != nil {
		return nil, err
	}
	if err = deeper(f, depth); err != nil {
		return nil, within(err, name)
	}
	g := &Graph{}
	if err = decodeGraph(p, f.off, g, depth+1); err != nil {
		return nil, within(err, name)
	}
	return g, nil
}

func decodeAttribute(b []byte, base int, a *Attribute, depth int) error {
	// seen records which value fields were present, to infer the type of IR-1
	// attributes that predate the discriminator.
	var seen AttributeType
	err := walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			a.Name, err = f.str("name")
		case 2:
			a.F, err = f.float32v("f")
			seen = AttrFloat
		case 3:
			a.I, err = f.int64v("i")
			seen = AttrInt
		case 4:
			a.S, err = f.bytes("s")
			seen = AttrString
		case 5:
			var t *Tensor
			if t, err = decodeTensorField(f, "t", depth); err == nil {
				a.T = t
			}
			seen = AttrTensor
		case 6:
			var g *Graph
			if g, err = decodeGraphField(f, "g", depth); err == nil {
				a.G = g
			}
			seen = AttrGraph
		case 7:
			a.Floats, err = appendFloat32s(f, "floats", a.Floats)
			seen = AttrFloats
		case 8:
			a.Ints, err = appendVarints(f, "ints", a.Ints)
			seen = AttrInts
		case 9:
			var s []byte
			if s, err = f.bytes(indexed("strings", len(a.Strings))); err == nil {
				a.Strings = append(a.Strings, s)
			}
			seen = AttrStrings
		case 10:
			var t *Tensor
			if t, err = decodeTensorField(f, indexed("tensors", len(a.Tensors)), depth); err == nil {
				a.Tensors = append(a.Tensors, t)
			}
			seen = AttrTensors
		case 11:
			var g *Graph
			if g, err = decodeGraphField(f, indexed("graphs", len(a.Graphs)), depth); err == nil {
				a.Graphs = append(a.Graphs, g)
			}
			seen = AttrGraphs
		case 13:
			a.DocString, err = f.str("doc_string")
		case 14, 15:
			name := "tp"
			if f.num == 15 {
				name = indexed("type_protos", len(a.TypeProtos))
			}
			var p []byte
			if p, err = f.message(name); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, name)
			}
			t := &Type{}
			if f.num == 14 && a.TP != nil {
				t = a.TP // a message field given twice merges
			}
			if err = within(decodeType(p, f.off, t, depth+1), name); err != nil {
				return err
			}
			if f.num == 14 {
				a.TP, seen = t, AttrTypeProto
			} else {
				a.TypeProtos, seen = append(a.TypeProtos, t), AttrTypeProtos
			}
		case 20:
			var v int32
			v, err = f.int32v("type")
			a.Type = AttributeType(v)
		case 21:
			a.RefAttrName, err = f.str("ref_attr_name")
		case 22, 23:
			err = within(&DecodeError{Offset: f.off, Err: fmt.Errorf("%w: sparse tensor attribute values", ErrUnsupported)}, "sparse_tensor")
		}
		return err
	})
	if err != nil {
		return err
	}
	if a.Type == AttrUndefined {
		a.Type = seen
	}
	// A TENSOR or GRAPH attribute carries its value in a message field; without
	// it (and without a reference to a function attribute) it has no value at
	// all, which no reader of T or G should have to check for.
	if a.RefAttrName == "" && ((a.Type == AttrTensor && a.T == nil) || (a.Type == AttrGraph && a.G == nil) || (a.Type == AttrTypeProto && a.TP == nil)) {
		return &DecodeError{Offset: base, Err: fmt.Errorf("attribute %q of type %v has no value", a.Name, a.Type)}
	}
	return nil
}

func decodeTensor(b []byte, base int, t *Tensor, depth int) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			t.Dims, err = appendVarints(f, "dims", t.Dims)
		case 2:
			var v int32
			v, err = f.int32v("data_type")
			t.DataType = DataType(v)
		case 3:
			var p []byte
			if p, err = f.message("segment"); err != nil {
				return err
			}
			if t.Segment == nil {
				t.Segment = &Segment{}
			}
			s := t.Segment
			err = within(walk(p, f.off, func(f *field) error {
				var err error
				switch f.num {
				case 1:
					s.Begin, err = f.int64v("begin")
				case 2:
					s.End, err = f.int64v("end")
				}
				return err
			}), "segment")
		case 4:
			t.FloatData, err = appendFloat32s(f, "float_data", t.FloatData)
		case 5:
			t.Int32Data, err = appendVarints(f, "int32_data", t.Int32Data)
		case 6:
			var s []byte
			if s, err = f.bytes(indexed("string_data", len(t.StringData))); err == nil {
				t.StringData = append(t.StringData, s)
			}
		case 7:
			t.Int64Data, err = appendVarints(f, "int64_data", t.Int64Data)
		case 8:
			t.Name, err = f.str("name")
		case 9:
			t.RawData, err = f.bytes("raw_data")
		case 10:
			t.DoubleData, err = appendFloat64s(f, "double_data", t.DoubleData)
		case 11:
			t.Uint64Data, err = appendVarints(f, "uint64_data", t.Uint64Data)
		case 12:
			t.DocString, err = f.str("doc_string")
		case 13:
			var e StringEntry
			if e, err = decodeEntryField(f, indexed("external_data", len(t.ExternalData))); err == nil {
				t.ExternalData = append(t.ExternalData, e)
			}
		case 14:
			var v int32
			v, err = f.int32v("data_location")
			t.DataLocation = DataLocation(v)
		case 16:
			var e StringEntry
			if e, err = decodeEntryField(f, indexed("metadata_props", len(t.MetadataProps))); err == nil {
				t.MetadataProps = append(t.MetadataProps, e)
			}
		}
		return err
	})
}

func decodeValueInfo(b []byte, base int, v *ValueInfo, depth int) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			v.Name, err = f.str("name")
		case 2:
			var p []byte
			if p, err = f.message("type"); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, "type")
			}
			if v.Type == nil {
				v.Type = &Type{}
			}
			err = within(decodeType(p, f.off, v.Type, depth+1), "type")
		case 3:
			v.DocString, err = f.str("doc_string")
		case 4:
			var e StringEntry
			if e, err = decodeEntryField(f, indexed("metadata_props", len(v.MetadataProps))); err == nil {
				v.MetadataProps = append(v.MetadataProps, e)
			}
		}
		return err
	})
}

func decodeType(b []byte, base int, t *Type, depth int) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			var p []byte
			if p, err = f.message("tensor_type"); err != nil {
				return err
			}
			if err = deeper(f, depth); err != nil {
				return within(err, "tensor_type")
			}
			// Members of a oneof replace each other; the same member merges.
			t.OtherField, t.OtherRaw, t.Elem = 0, nil, nil
			if t.Tensor == nil {
				t.Tensor = &TensorType{}
			}
			err = within(decodeTensorType(p, f.off, t.Tensor, depth+1), "tensor_type")
		case 4, 5, 8, 9:
			var p []byte
			if p, err = f.bytes(fmt.Sprintf("type field %d", f.num)); err != nil {
				return err
			}
			t.Tensor = nil
			if t.OtherField == int(f.num) {
				// Concatenated encodings of the same message merge.
				t.OtherRaw = append(t.OtherRaw, p...)
			} else {
				t.OtherField, t.OtherRaw, t.Elem = int(f.num), p, nil
			}
			if f.num == 4 || f.num == 9 {
				// The merged bytes are decoded again whole: that is what
				// merging the messages means.
				if err = deeper(f, depth); err != nil {
					return within(err, typeFieldName(int(f.num)))
				}
				t.Elem, err = decodeElemType(t.OtherRaw, f.off, depth+1)
				err = within(err, typeFieldName(int(f.num)))
			}
		case 6:
			t.Denotation, err = f.str("denotation")
		}
		return err
	})
}

func typeFieldName(num int) string {
	return (&Type{OtherField: num}).TypeKind()
}

// decodeElemType reads TypeProto.Sequence or TypeProto.Optional (the same
// layout: 1, elem_type) and returns its element type, nil when absent.
func decodeElemType(b []byte, base int, depth int) (*Type, error) {
	var elem *Type
	err := walk(b, base, func(f *field) error {
		if f.num != 1 {
			return nil
		}
		p, err := f.message("elem_type")
		if err != nil {
			return err
		}
		if err = deeper(f, depth); err != nil {
			return within(err, "elem_type")
		}
		if elem == nil {
			elem = &Type{}
		}
		return within(decodeType(p, f.off, elem, depth+1), "elem_type")
	})
	return elem, err
}

func decodeTensorType(b []byte, base int, tt *TensorType, depth int) error {
	return walk(b, base, func(f *field) error {
		var err error
		switch f.num {
		case 1:
			var v int32
			v, err = f.int32v("elem_type")
			tt.ElemType = DataType(v)
		case 2:
			var p []byte
			if p, err = f.message("shape"); err != nil {
				return err
			}
			if tt.Shape == nil {
				tt.Shape = &TensorShape{}
			}
			err = within(decodeShape(p, f.off, tt.Shape), "shape")
		}
		return err
	})
}

func decodeShape(b []byte, base int, s *TensorShape) error {
	return walk(b, base, func(f *field) error {
		if f.num != 1 {
			return nil
		}
		name := indexed("dim", len(s.Dim))
		p, err := f.message(name)
		if err != nil {
			return err
		}
		var d Dimension
		err = walk(p, f.off, func(f *field) error {
			var err error
			switch f.num {
			case 1:
				d.Value, err = f.int64v("dim_value")
				d.HasValue, d.Param = true, ""
			case 2:
				d.Param, err = f.str("dim_param")
				d.HasValue, d.Value = false, 0
			case 3:
				d.Denotation, err = f.str("denotation")
			}
			return err
		})
		if err != nil {
			return within(err, name)
		}
		s.Dim = append(s.Dim, d)
		return nil
	})
}
