// Package onnxpb reads and writes the subset of onnx.proto (IR versions up to 11)
// that models use, directly on the protobuf wire format.
//
// We decode by hand on protowire rather than generating code because there is no
// protoc in the build and because a hand decoder lets us bound every length and
// recursion depth, and say where in the message a malformed input went wrong.
//
// Presence: onnx.proto is proto2, so a scalar field can be present with its zero
// value. We keep presence only where it changes meaning (a dimension's dim_value,
// an attribute's value, which the attribute's type discriminator records); elsewhere
// a zero value is "absent" and is not written.
//
// Encoding is deterministic: fields in field-number order, repeated scalars packed
// exactly where onnx.proto declares [packed = true], the same layout the C++ protobuf
// runtime produces for the fields we model.
package onnxpb

import "fmt"

// Model is onnx.ModelProto.
type Model struct {
	IRVersion       int64           // 1
	ProducerName    string          // 2
	ProducerVersion string          // 3
	Domain          string          // 4
	ModelVersion    int64           // 5
	DocString       string          // 6
	Graph           *Graph          // 7
	OpsetImport     []OperatorSetID // 8
	MetadataProps   []StringEntry   // 14
	// Functions holds each model-local FunctionProto (field 25) as its undecoded
	// bytes: we do not interpret functions, but dropping them would silently change
	// what a node calling one means, so they are kept and written back unchanged.
	// Importers must refuse nodes that call them.
	Functions [][]byte
}

// OperatorSetID is onnx.OperatorSetIdProto.
type OperatorSetID struct {
	Domain  string // 1
	Version int64  // 2
}

// StringEntry is onnx.StringStringEntryProto.
type StringEntry struct {
	Key   string // 1
	Value string // 2
}

// Graph is onnx.GraphProto. Sparse initializers (field 15) are refused at decode.
type Graph struct {
	Node        []*Node      // 1
	Name        string       // 2
	Initializer []*Tensor    // 5
	DocString   string       // 10
	Input       []*ValueInfo // 11
	Output      []*ValueInfo // 12
	ValueInfo   []*ValueInfo // 13
	// MetadataProps (16, IR 10) carries named annotations.
	MetadataProps []StringEntry
}

// Node is onnx.NodeProto.
type Node struct {
	Input     []string     // 1
	Output    []string     // 2
	Name      string       // 3
	OpType    string       // 4
	Attribute []*Attribute // 5
	DocString string       // 6
	Domain    string       // 7
	// Overload (8, IR 10) selects a model-local function overload.
	Overload string
	// MetadataProps (9, IR 10) carries named annotations (exporters record source
	// locations here; we record exact float64 attribute values).
	MetadataProps []StringEntry
}

// AttributeType is onnx.AttributeProto.AttributeType.
type AttributeType int32

// Attribute types, numbered as in onnx.proto.
const (
	AttrUndefined     AttributeType = 0
	AttrFloat         AttributeType = 1
	AttrInt           AttributeType = 2
	AttrString        AttributeType = 3
	AttrTensor        AttributeType = 4
	AttrGraph         AttributeType = 5
	AttrFloats        AttributeType = 6
	AttrInts          AttributeType = 7
	AttrStrings       AttributeType = 8
	AttrTensors       AttributeType = 9
	AttrGraphs        AttributeType = 10
	AttrSparseTensor  AttributeType = 11
	AttrSparseTensors AttributeType = 12
	AttrTypeProto     AttributeType = 13
	AttrTypeProtos    AttributeType = 14
)

var attrTypeNames = map[AttributeType]string{
	AttrUndefined: "UNDEFINED", AttrFloat: "FLOAT", AttrInt: "INT", AttrString: "STRING",
	AttrTensor: "TENSOR", AttrGraph: "GRAPH", AttrFloats: "FLOATS", AttrInts: "INTS",
	AttrStrings: "STRINGS", AttrTensors: "TENSORS", AttrGraphs: "GRAPHS",
	AttrSparseTensor: "SPARSE_TENSOR", AttrSparseTensors: "SPARSE_TENSORS",
	AttrTypeProto: "TYPE_PROTO", AttrTypeProtos: "TYPE_PROTOS",
}

func (t AttributeType) String() string {
	if s, ok := attrTypeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("AttributeType(%d)", int32(t))
}

// Attribute is onnx.AttributeProto. Type is the discriminator (field 20); the value
// fields follow it. Sparse-tensor values are refused at decode.
type Attribute struct {
	Name        string        // 1
	F           float32       // 2
	I           int64         // 3
	S           []byte        // 4
	T           *Tensor       // 5
	G           *Graph        // 6
	Floats      []float32     // 7
	Ints        []int64       // 8
	Strings     [][]byte      // 9
	Tensors     []*Tensor     // 10
	Graphs      []*Graph      // 11
	DocString   string        // 13
	TP          *Type         // 14 (Optional's and SequenceEmpty-like ops' type)
	TypeProtos  []*Type       // 15
	Type        AttributeType // 20
	RefAttrName string        // 21
}

// DataType is onnx.TensorProto.DataType.
type DataType int32

// Element types, numbered as in onnx.proto.
const (
	Undefined      DataType = 0
	Float          DataType = 1
	Uint8          DataType = 2
	Int8           DataType = 3
	Uint16         DataType = 4
	Int16          DataType = 5
	Int32          DataType = 6
	Int64          DataType = 7
	String         DataType = 8
	Bool           DataType = 9
	Float16        DataType = 10
	Double         DataType = 11
	Uint32         DataType = 12
	Uint64         DataType = 13
	Complex64      DataType = 14
	Complex128     DataType = 15
	BFloat16       DataType = 16
	Float8E4M3FN   DataType = 17
	Float8E4M3FNUZ DataType = 18
	Float8E5M2     DataType = 19
	Float8E5M2FNUZ DataType = 20
	Uint4          DataType = 21
	Int4           DataType = 22
	Float4E2M1     DataType = 23
)

var dataTypeNames = map[DataType]string{
	Undefined: "UNDEFINED", Float: "FLOAT", Uint8: "UINT8", Int8: "INT8", Uint16: "UINT16",
	Int16: "INT16", Int32: "INT32", Int64: "INT64", String: "STRING", Bool: "BOOL",
	Float16: "FLOAT16", Double: "DOUBLE", Uint32: "UINT32", Uint64: "UINT64",
	Complex64: "COMPLEX64", Complex128: "COMPLEX128", BFloat16: "BFLOAT16",
	Float8E4M3FN: "FLOAT8E4M3FN", Float8E4M3FNUZ: "FLOAT8E4M3FNUZ", Float8E5M2: "FLOAT8E5M2",
	Float8E5M2FNUZ: "FLOAT8E5M2FNUZ", Uint4: "UINT4", Int4: "INT4", Float4E2M1: "FLOAT4E2M1",
}

func (t DataType) String() string {
	if s, ok := dataTypeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("DataType(%d)", int32(t))
}

// ElemSize is the number of bytes one element takes in raw_data, or 0 where the
// type has no fixed byte width (STRING, the 4-bit types, UNDEFINED, unknown).
func (t DataType) ElemSize() int {
	switch t {
	case Uint8, Int8, Bool, Float8E4M3FN, Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ:
		return 1
	case Uint16, Int16, Float16, BFloat16:
		return 2
	case Float, Int32, Uint32:
		return 4
	case Int64, Double, Uint64, Complex64:
		return 8
	case Complex128:
		return 16
	}
	return 0
}

// DataLocation is onnx.TensorProto.DataLocation.
type DataLocation int32

// Where a tensor's bytes live.
const (
	LocationDefault  DataLocation = 0
	LocationExternal DataLocation = 1
)

// Segment is onnx.TensorProto.Segment.
type Segment struct {
	Begin int64 // 1
	End   int64 // 2
}

// Tensor is onnx.TensorProto.
type Tensor struct {
	Dims         []int64       // 1
	DataType     DataType      // 2
	Segment      *Segment      // 3
	FloatData    []float32     // 4 (packed)
	Int32Data    []int32       // 5 (packed)
	StringData   [][]byte      // 6
	Int64Data    []int64       // 7 (packed)
	Name         string        // 8
	RawData      []byte        // 9
	DoubleData   []float64     // 10 (packed)
	Uint64Data   []uint64      // 11 (packed)
	DocString    string        // 12
	ExternalData []StringEntry // 13
	DataLocation DataLocation  // 14
	// MetadataProps (16, IR 10) carries named annotations.
	MetadataProps []StringEntry
}

// ValueInfo is onnx.ValueInfoProto.
type ValueInfo struct {
	Name          string        // 1
	Type          *Type         // 2
	DocString     string        // 3
	MetadataProps []StringEntry // 4 (IR 10)
}

// Type is onnx.TypeProto. Tensor types are modelled in full. Any other member of
// the value oneof (sequence 4, map 5, sparse tensor 8, optional 9) is kept as its
// field number and bytes, so it survives a round trip byte for byte and importers
// can name it when they refuse it; for a sequence or an optional, Elem is also
// decoded from those bytes (TypeProto.Sequence and TypeProto.Optional each hold
// one field, 1: elem_type, a TypeProto), because an importer can map a sequence of
// tensors or an optional tensor onto tensors at the graph boundary.
type Type struct {
	Tensor     *TensorType // 1
	OtherField int         // field number of a non-tensor type, 0 if none
	OtherRaw   []byte      // that field's bytes (what is encoded)
	// Elem is the element type of a sequence (OtherField 4) or optional (9),
	// decoded from OtherRaw; nil where the model leaves it out (unknown).
	Elem       *Type
	Denotation string // 6
}

// IsSequence reports whether t is a sequence_type.
func (t *Type) IsSequence() bool { return t != nil && t.Tensor == nil && t.OtherField == 4 }

// IsOptional reports whether t is an optional_type.
func (t *Type) IsOptional() bool { return t != nil && t.Tensor == nil && t.OtherField == 9 }

// TypeKind names the oneof member a Type holds, for messages.
func (t *Type) TypeKind() string {
	switch {
	case t == nil:
		return "no type"
	case t.Tensor != nil:
		return "tensor_type"
	case t.OtherField == 4:
		return "sequence_type"
	case t.OtherField == 5:
		return "map_type"
	case t.OtherField == 8:
		return "sparse_tensor_type"
	case t.OtherField == 9:
		return "optional_type"
	case t.OtherField != 0:
		return fmt.Sprintf("type field %d", t.OtherField)
	}
	return "empty type"
}

// TensorType is onnx.TypeProto.Tensor. A nil Shape means the rank is unknown, which
// is different from an empty Shape (a scalar).
type TensorType struct {
	ElemType DataType     // 1
	Shape    *TensorShape // 2
}

// TensorShape is onnx.TensorShapeProto.
type TensorShape struct {
	Dim []Dimension // 1
}

// Dimension is onnx.TensorShapeProto.Dimension: a known size (HasValue), a symbolic
// name (Param), or neither (unknown).
type Dimension struct {
	Value      int64  // 1, meaningful when HasValue
	HasValue   bool   // dim_value was present (0 is a valid size)
	Param      string // 2
	Denotation string // 3
}

// Opset returns the version imported for domain ("" and "ai.onnx" are the same
// default domain), and whether the model imports it at all.
func (m *Model) Opset(domain string) (int64, bool) {
	if domain == "ai.onnx" {
		domain = ""
	}
	for _, o := range m.OpsetImport {
		d := o.Domain
		if d == "ai.onnx" {
			d = ""
		}
		if d == domain {
			return o.Version, true
		}
	}
	return 0, false
}
