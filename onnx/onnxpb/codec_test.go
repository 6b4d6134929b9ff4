package onnxpb

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// sampleModel exercises every field the codec models.
func sampleModel() *Model {
	f32 := func(name string, dims ...int64) *ValueInfo {
		sh := &TensorShape{}
		for _, d := range dims {
			if d < 0 {
				sh.Dim = append(sh.Dim, Dimension{Param: "batch", Denotation: "DATA_BATCH"})
			} else {
				sh.Dim = append(sh.Dim, Dimension{Value: d, HasValue: true})
			}
		}
		return &ValueInfo{Name: name, Type: &Type{Tensor: &TensorType{ElemType: Float, Shape: sh}}, DocString: "vi " + name,
			MetadataProps: []StringEntry{{"vi", name}}}
	}
	body := &Graph{
		Name: "body",
		Node: []*Node{{Input: []string{"a"}, Output: []string{"b"}, OpType: "Identity"}},
		Input: []*ValueInfo{
			{Name: "a", Type: &Type{Tensor: &TensorType{ElemType: Int64}}}, // unknown rank
		},
		Output: []*ValueInfo{{Name: "b", Type: &Type{OtherField: 4, OtherRaw: []byte{0x0a, 0x02, 0x0a, 0x00}, Elem: &Type{Tensor: &TensorType{}}}}},
	}
	return &Model{
		IRVersion:       10,
		ProducerName:    "flashgraph-test",
		ProducerVersion: "0.1",
		Domain:          "org.flashgraph",
		ModelVersion:    3,
		DocString:       "a model that uses every modelled field",
		OpsetImport:     []OperatorSetID{{Domain: "", Version: 23}, {Domain: "org.flashgraph", Version: 1}},
		MetadataProps:   []StringEntry{{Key: "k", Value: "v"}, {Key: "empty"}},
		Functions:       [][]byte{{0x0a, 0x03, 'f', 'o', 'o'}},
		Graph: &Graph{
			Name:          "main",
			DocString:     "graph doc",
			MetadataProps: []StringEntry{{"g", "1"}},
			Node: []*Node{
				{
					Input: []string{"x", "w", ""}, Output: []string{"y"}, Name: "n0", OpType: "Gemm", DocString: "gemm",
					Attribute: []*Attribute{
						{Name: "alpha", Type: AttrFloat, F: 0.5},
						{Name: "beta", Type: AttrFloat, F: 0}, // zero must survive
						{Name: "transB", Type: AttrInt, I: 0},
						{Name: "neg", Type: AttrInt, I: -7},
					},
				},
				{
					Input: []string{"y"}, Output: []string{"z", "lse"}, Name: "n1", OpType: "FlashAttention", Domain: "org.flashgraph",
					Overload: "v2", MetadataProps: []StringEntry{{"scale", "0.125"}},
					Attribute: []*Attribute{
						{Name: "s", Type: AttrString, S: []byte("hello")},
						{Name: "empty_s", Type: AttrString, S: []byte{}},
						{Name: "t", Type: AttrTensor, T: NewFloat32("", []int64{2}, []float32{1, -2})},
						{Name: "g", Type: AttrGraph, G: body},
						{Name: "fs", Type: AttrFloats, Floats: []float32{1.5, float32(math.Inf(-1)), 0}},
						{Name: "is", Type: AttrInts, Ints: []int64{0, -1, 1 << 40}},
						{Name: "ss", Type: AttrStrings, Strings: [][]byte{[]byte("a"), {}}},
						{Name: "ts", Type: AttrTensors, Tensors: []*Tensor{NewInt64("", nil, []int64{5})}},
						{Name: "gs", Type: AttrGraphs, Graphs: []*Graph{body, {Name: "empty"}}},
						{Name: "tp", Type: AttrTypeProto, TP: OptionalOf(SequenceOf(&Type{Tensor: &TensorType{ElemType: Float}}))},
						{Name: "tps", Type: AttrTypeProtos, TypeProtos: []*Type{{Tensor: &TensorType{ElemType: Int64, Shape: &TensorShape{}}}, SequenceOf(nil)}},
						{Name: "ref", Type: AttrFloat, RefAttrName: "parent_alpha", DocString: "ref doc"},
					},
				},
			},
			Initializer: []*Tensor{
				NewFloat32("w", []int64{2, 3}, []float32{1, 2, 3, 4, 5, 6}),
				{Name: "fd", DataType: Float, Dims: []int64{3}, FloatData: []float32{1, 2, 3}},
				{Name: "i32", DataType: Int32, Dims: []int64{3}, Int32Data: []int32{-1, 0, math.MaxInt32}},
				{Name: "i64", DataType: Int64, Dims: []int64{2}, Int64Data: []int64{math.MinInt64, 9}},
				{Name: "dd", DataType: Double, Dims: []int64{1}, DoubleData: []float64{math.Pi}},
				{Name: "u64", DataType: Uint64, Dims: []int64{1}, Uint64Data: []uint64{math.MaxUint64}},
				{Name: "str", DataType: String, Dims: []int64{2}, StringData: [][]byte{[]byte("x"), []byte("yz")}},
				{Name: "seg", DataType: Float, Dims: []int64{1}, Segment: &Segment{Begin: 0, End: 1}, FloatData: []float32{1}, DocString: "d"},
				{Name: "ext", DataType: Float, Dims: []int64{1}, DataLocation: LocationExternal,
					ExternalData: []StringEntry{{Key: "location", Value: "w.bin"}, {Key: "offset", Value: "0"}}},
				{Name: "empty", DataType: Float, Dims: []int64{0}, RawData: []byte{}, MetadataProps: []StringEntry{{"kind", "const"}}},
			},
			Input:     []*ValueInfo{f32("x", -1, 2)},
			Output:    []*ValueInfo{f32("z", -1, 3), {Name: "lse"}},
			ValueInfo: []*ValueInfo{f32("y", -1, 3), {Name: "scalar", Type: &Type{Tensor: &TensorType{ElemType: Float, Shape: &TensorShape{}}, Denotation: "TENSOR"}}},
		},
	}
}

// firstDiff shows where two values' JSON forms first differ.
func firstDiff(a, b any) string {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	i := 0
	for i < len(ja) && i < len(jb) && ja[i] == jb[i] {
		i++
	}
	from := max(0, i-80)
	return fmt.Sprintf("\n got …%s\nwant …%s", ja[from:min(len(ja), i+80)], jb[from:min(len(jb), i+80)])
}

func TestRoundTrip(t *testing.T) {
	m := sampleModel()
	b := Encode(m)
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip changed the model: %s", firstDiff(got, m))
	}
	if b2 := Encode(got); !bytes.Equal(b, b2) {
		t.Fatal("re-encoding a decoded model gave different bytes")
	}
	// Deterministic: the same model encodes to the same bytes every time.
	for range 5 {
		if !bytes.Equal(Encode(sampleModel()), b) {
			t.Fatal("encoding is not deterministic")
		}
	}
}

// hand-encoding helpers: tag bytes are written out as (field<<3 | wiretype) in the
// tests so the field numbers are checked against onnx.proto, not against our encoder.
func ld(tag byte, payload ...[]byte) []byte { // length-delimited, short payloads only
	p := bytes.Join(payload, nil)
	if len(p) > 127 {
		panic("ld: payload too long for a one-byte length")
	}
	return append([]byte{tag, byte(len(p))}, p...)
}

func str(tag byte, s string) []byte { return ld(tag, []byte(s)) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// handModel is a model serialized field by field the way the C++ protobuf runtime
// writes it (field-number order, packed only where onnx.proto says so).
func handModel() []byte {
	dim := func(v byte) []byte { return ld(0x0a, []byte{0x08, v}) } // Dimension{dim_value = 1}
	vi := func(name string, dims ...byte) []byte {
		var ds [][]byte
		for _, d := range dims {
			ds = append(ds, dim(d))
		}
		shape := ld(0x12, ds...)                          // TypeProto.Tensor.shape = 2 { dim = 1 ... }
		tensorType := ld(0x0a, []byte{0x08, 0x01}, shape) // TypeProto.tensor_type = 1 { elem_type = 1: FLOAT }
		return cat(str(0x0a, name), ld(0x12, tensorType)) // ValueInfoProto name = 1, type = 2
	}
	attrAxis := cat(
		str(0x0a, "axis"), // name = 1
		[]byte{0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // i = 3: -1
		[]byte{0xa0, 0x01, 0x02}, // type = 20: INT
	)
	node := cat(
		str(0x0a, "x"), str(0x0a, "w"), // input = 1
		str(0x12, "y"),       // output = 2
		str(0x1a, "node0"),   // name = 3
		str(0x22, "Softmax"), // op_type = 4
		ld(0x2a, attrAxis),   // attribute = 5
		str(0x32, "doc"),     // doc_string = 6
	)
	init := cat(
		[]byte{0x08, 0x02}, // dims = 1 (not packed)
		[]byte{0x10, 0x01}, // data_type = 2: FLOAT
		ld(0x22, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40}), // float_data = 4, packed: 1, 2
		str(0x42, "w"), // name = 8
	)
	graph := cat(
		ld(0x0a, node),       // node = 1
		str(0x12, "g"),       // name = 2
		ld(0x2a, init),       // initializer = 5
		ld(0x5a, vi("x", 2)), // input = 11
		ld(0x62, vi("y", 2)), // output = 12
	)
	return cat(
		[]byte{0x08, 0x08},                       // ir_version = 1: 8
		str(0x12, "hand"),                        // producer_name = 2
		ld(0x3a, graph),                          // graph = 7
		ld(0x42, []byte{0x10, 0x11}),             // opset_import = 8 { version = 2: 17 }
		ld(0x72, str(0x0a, "k"), str(0x12, "v")), // metadata_props = 14 { key = 1, value = 2 }
	)
}

func TestDecodeHandEncoded(t *testing.T) {
	m, err := Decode(handModel())
	if err != nil {
		t.Fatal(err)
	}
	if m.IRVersion != 8 || m.ProducerName != "hand" || len(m.OpsetImport) != 1 || m.OpsetImport[0] != (OperatorSetID{"", 17}) {
		t.Fatalf("model header: %+v", m)
	}
	if v, ok := m.Opset("ai.onnx"); !ok || v != 17 {
		t.Fatalf("Opset(ai.onnx) = %d, %v", v, ok)
	}
	if !reflect.DeepEqual(m.MetadataProps, []StringEntry{{"k", "v"}}) {
		t.Fatalf("metadata %+v", m.MetadataProps)
	}
	g := m.Graph
	if g.Name != "g" || len(g.Node) != 1 || len(g.Initializer) != 1 || len(g.Input) != 1 || len(g.Output) != 1 {
		t.Fatalf("graph %+v", g)
	}
	n := g.Node[0]
	if !reflect.DeepEqual(n.Input, []string{"x", "w"}) || !reflect.DeepEqual(n.Output, []string{"y"}) ||
		n.Name != "node0" || n.OpType != "Softmax" || n.DocString != "doc" || n.Domain != "" {
		t.Fatalf("node %+v", n)
	}
	if a := n.Attribute[0]; a.Name != "axis" || a.Type != AttrInt || a.I != -1 {
		t.Fatalf("attribute %+v", a)
	}
	w := g.Initializer[0]
	vals, err := w.Float32s()
	if err != nil || w.Name != "w" || !reflect.DeepEqual(w.Dims, []int64{2}) || !reflect.DeepEqual(vals, []float32{1, 2}) {
		t.Fatalf("initializer %+v %v %v", w, vals, err)
	}
	in := g.Input[0]
	if in.Name != "x" || in.Type.Tensor.ElemType != Float || len(in.Type.Tensor.Shape.Dim) != 1 ||
		!in.Type.Tensor.Shape.Dim[0].HasValue || in.Type.Tensor.Shape.Dim[0].Value != 2 {
		t.Fatalf("input %+v", in)
	}
	// Our encoder writes exactly the bytes the reference runtime would.
	if got := Encode(m); !bytes.Equal(got, handModel()) {
		t.Fatalf("re-encoded bytes differ:\n got %x\nwant %x", got, handModel())
	}
}

func TestUnknownAndUnpackedFields(t *testing.T) {
	tensor := cat(
		[]byte{0x08, 0x03},                                // dims = 1: 3
		[]byte{0x10, 0x01},                                // data_type = 2: FLOAT
		[]byte{0x25, 0, 0, 0x80, 0x3f},                    // float_data = 4 unpacked (fixed32): 1
		ld(0x22, []byte{0, 0, 0, 0x40, 0, 0, 0x40, 0x40}), // then packed: 2, 3
		[]byte{0xf8, 0x07, 0x05},                          // unknown varint field 127
		[]byte{0x81, 0x08, 1, 2, 3, 4, 5, 6, 7, 8},        // unknown fixed64 field 128
		[]byte{0xab, 0x08, 0x08, 0x01, 0xac, 0x08},        // unknown group 133 holding a varint
		ld(0x7a, []byte{1, 2}),                            // unknown bytes field 15
	)
	tt, err := DecodeTensor(tensor)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tt.Float32s()
	if err != nil || !reflect.DeepEqual(v, []float32{1, 2, 3}) {
		t.Fatalf("float_data = %v, %v", v, err)
	}
	// Packed dims are accepted too, though onnx.proto does not declare them packed;
	// int64_data may equally arrive unpacked.
	tt, err = DecodeTensor(cat(ld(0x0a, []byte{2, 3}), []byte{0x10, 0x07}, ld(0x3a, []byte{0x01, 0x7f, 0x80, 0x01}), []byte{0x38, 0x05, 0x38, 0x06}))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(tt.Dims, []int64{2, 3}) || !reflect.DeepEqual(tt.Int64Data, []int64{1, 127, 128, 5, 6}) {
		t.Fatalf("packed/unpacked: %+v", tt)
	}
}

func TestIRv1AttributeTypeInferred(t *testing.T) {
	// An attribute without the type discriminator (IR version 1) gets its type from
	// the value field present.
	node := cat(str(0x22, "Foo"), ld(0x2a, str(0x0a, "alpha"), []byte{0x15, 0, 0, 0, 0x3f}))
	m, err := Decode(ld(0x3a, ld(0x0a, node)))
	if err != nil {
		t.Fatal(err)
	}
	a := m.Graph.Node[0].Attribute[0]
	if a.Type != AttrFloat || a.F != 0.5 {
		t.Fatalf("attribute %+v", a)
	}
}

func TestMalformedInputsAreErrors(t *testing.T) {
	full := Encode(sampleModel())
	// Every proper prefix either decodes (a prefix that ends on a field boundary is a
	// valid message) or returns an error; none may panic.
	for i := range len(full) {
		_, _ = Decode(full[:i])
	}
	cases := []struct {
		name string
		in   []byte
		want string // substring of the error
	}{
		{"truncated varint", []byte{0x08, 0x80}, "ModelProto"},
		{"truncated length", []byte{0x3a, 0x05, 0x0a}, "field 7"},
		{"graph length past end", []byte{0x3a, 0xff, 0xff, 0xff, 0xff, 0x0f}, "field 7"},
		{"field number zero", []byte{0x00, 0x01}, "bad field tag"},
		{"wrong wire type", []byte{0x3d, 0, 0, 0, 0}, "graph"},
		{"bad wire type 6", []byte{0x0e}, "ModelProto"},
		{"stray end group", []byte{0x0c}, "end-group"},
		{"node truncated inside", ld(0x3a, ld(0x0a, []byte{0x0a, 0x09, 'x'})), "ModelProto.graph.node[0]"},
		{"attribute tensor corrupt", ld(0x3a, ld(0x0a, ld(0x2a, ld(0x2a, []byte{0x22, 0x03, 0, 0, 0})))), "graph.node[0].attribute[0].t.float_data"},
		{"packed double not multiple of 8", ld(0x3a, ld(0x2a, ld(0x52, []byte{1, 2, 3}))), "initializer[0].double_data"},
		{"packed varint truncated", ld(0x3a, ld(0x2a, ld(0x3a, []byte{0x80}))), "int64_data"},
		{"sparse initializer refused", ld(0x3a, ld(0x7a)), "sparse initializers are not supported"},
		{"sparse attribute refused", ld(0x3a, ld(0x0a, ld(0x2a, []byte{0xb2, 0x01, 0x00}))), "sparse"},
		{"second node corrupt", ld(0x3a, ld(0x0a), ld(0x0a, []byte{0x22, 0x05, 'S'})), "node[1]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Decode(c.in)
			if err == nil {
				t.Fatalf("decoded %+v, want an error", m)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T is not a *DecodeError", err)
			}
		})
	}
	var de *DecodeError
	_, err := Decode(ld(0x3a, ld(0x7a)))
	if !errors.Is(err, ErrUnsupported) || !errors.As(err, &de) || de.Path != "ModelProto.graph.sparse_initializer" {
		t.Fatalf("sparse initializer: %v", err)
	}
}

func TestDepthLimit(t *testing.T) {
	// Graph → node → attribute(g) → graph → ... nested past MaxDepth.
	var g []byte
	for range MaxDepth {
		attr := cat(str(0x0a, "body"), g)
		if len(g) > 0 {
			attr = cat(str(0x0a, "body"), lenField(0x32, g))
		}
		node := lenField(0x2a, attr)
		g = lenField(0x0a, node)
	}
	_, err := Decode(lenField(0x3a, g))
	if err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Fatalf("deep nesting: %v", err)
	}
}

// lenField writes a length-delimited field with a varint length of any size.
func lenField(tag byte, p []byte) []byte {
	out := []byte{tag}
	n := uint64(len(p))
	for n >= 0x80 {
		out = append(out, byte(n)|0x80)
		n >>= 7
	}
	return append(append(out, byte(n)), p...)
}

func TestTensorData(t *testing.T) {
	f16 := []uint16{0x3c00, 0xc000, 0x0001, 0x7c00, 0x3555} // 1, -2, 2^-24, +inf, 0.333251953125
	want16 := []float32{1, -2, float32(math.Ldexp(1, -24)), float32(math.Inf(1)), 0.333251953125}
	raw := make([]byte, 0, 10)
	var i32 []int32
	for _, h := range f16 {
		raw = append(raw, byte(h), byte(h>>8))
		i32 = append(i32, int32(h))
	}
	for _, tc := range []*Tensor{
		{DataType: Float16, Dims: []int64{5}, RawData: raw},
		{DataType: Float16, Dims: []int64{5}, Int32Data: i32},
	} {
		got, err := tc.Float32s()
		if err != nil || !reflect.DeepEqual(got, want16) {
			t.Fatalf("float16 %v, %v; want %v", got, err, want16)
		}
	}
	bf, err := NewBFloat16("b", []int64{3}, []float32{1, -3.140625, 1.00390625}).Float32s()
	if err != nil || !reflect.DeepEqual(bf, []float32{1, -3.140625, 1}) { // 1+2^-8 ties to even
		t.Fatalf("bfloat16 %v %v", bf, err)
	}
	// Every binary16 value survives float32 and back.
	for h := range 1 << 16 {
		f := graph.F16ToFloat32(uint16(h))
		back := graph.F16FromFloat32(f)
		if math.IsNaN(float64(f)) {
			if back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#x came back as %#x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("binary16 %#x → %v → %#x", h, f, back)
		}
	}
	// Rounding: halfway between 1 and the next binary16 goes to even (1); above goes up.
	if graph.F16FromFloat32(1+1.0/2048) != 0x3c00 || graph.F16FromFloat32(1+1.0/2048+1.0/65536) != 0x3c01 || graph.F16FromFloat32(70000) != 0x7c00 {
		t.Fatal("binary16 rounding")
	}

	if v, err := NewFloat64("d", []int64{2}, []float64{1.5, -2}).Float64s(); err != nil || !reflect.DeepEqual(v, []float64{1.5, -2}) {
		t.Fatalf("double %v %v", v, err)
	}
	if v, err := NewInt64("i", []int64{2, 1}, []int64{-5, 1 << 50}).Int64s(); err != nil || !reflect.DeepEqual(v, []int64{-5, 1 << 50}) {
		t.Fatalf("int64 %v %v", v, err)
	}
	if v, err := NewInt32("i", []int64{2}, []int32{-5, 7}).Int64s(); err != nil || !reflect.DeepEqual(v, []int64{-5, 7}) {
		t.Fatalf("int32→int64 %v %v", v, err)
	}
	if v, err := (&Tensor{DataType: Int8, Dims: []int64{2}, RawData: []byte{0xff, 3}}).Int32s(); err != nil || !reflect.DeepEqual(v, []int32{-1, 3}) {
		t.Fatalf("int8 %v %v", v, err)
	}
	if v, err := (&Tensor{DataType: Uint8, Dims: []int64{2}, Int32Data: []int32{255, 3}}).Int64s(); err != nil || !reflect.DeepEqual(v, []int64{255, 3}) {
		t.Fatalf("uint8 %v %v", v, err)
	}
	if v, err := NewBool("b", []int64{3}, []bool{true, false, true}).Bools(); err != nil || !reflect.DeepEqual(v, []bool{true, false, true}) {
		t.Fatalf("bool %v %v", v, err)
	}
	if v, err := (&Tensor{DataType: Float, Dims: []int64{0, 4}}).Float32s(); err != nil || len(v) != 0 {
		t.Fatalf("empty %v %v", v, err)
	}
	if v, err := (&Tensor{DataType: Float}).Float32s(); err == nil {
		t.Fatalf("scalar without data gave %v", v)
	}
	if v, err := (&Tensor{DataType: Float, FloatData: []float32{2}}).Float32s(); err != nil || !reflect.DeepEqual(v, []float32{2}) {
		t.Fatalf("scalar %v %v", v, err)
	}

	bad := []*Tensor{
		{DataType: Float, Dims: []int64{3}, RawData: []byte{1, 2, 3, 4}},                  // short raw
		{DataType: Float, Dims: []int64{2}, FloatData: []float32{1}},                      // short typed
		{DataType: Float, Dims: []int64{-1}, FloatData: []float32{1}},                     // negative dim
		{DataType: Float, Dims: []int64{1 << 40, 1 << 40}, RawData: []byte{1, 2, 3, 4}},   // overflow
		{DataType: Float, Dims: []int64{1}, DataLocation: LocationExternal},               // not loaded
		{DataType: Float, Dims: []int64{1}, FloatData: []float32{1}, Segment: &Segment{}}, // segmented
		{DataType: Uint64, Dims: []int64{1}, Uint64Data: []uint64{math.MaxUint64}},        // does not fit
		{DataType: String, Dims: []int64{1}, StringData: [][]byte{{'a'}}},
	}
	for i, b := range bad {
		if _, err := b.Float32s(); err == nil {
			t.Errorf("bad[%d].Float32s: no error", i)
		}
		if _, err := b.Int64s(); err == nil {
			t.Errorf("bad[%d].Int64s: no error", i)
		}
	}
	if _, err := NewFloat32("f", []int64{1}, []float32{1}).Int64s(); err == nil {
		t.Error("reading floats as int64 must fail")
	}
}

func TestExternalData(t *testing.T) {
	dir := t.TempDir()
	data := NewFloat32("", nil, []float32{9, 1, 2, 3}).RawData // 16 bytes
	if err := os.WriteFile(filepath.Join(dir, "weights.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "b.bin"), data[:8], 0o644); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret.bin"), filepath.Join(dir, "link.bin")); err != nil {
		t.Fatal(err)
	}
	ext := func(name string, dims []int64, kv ...string) *Tensor {
		t := &Tensor{Name: name, DataType: Float, Dims: dims, DataLocation: LocationExternal}
		for i := 0; i < len(kv); i += 2 {
			t.ExternalData = append(t.ExternalData, StringEntry{kv[i], kv[i+1]})
		}
		return t
	}
	model := func(ts ...*Tensor) string {
		m := &Model{IRVersion: 10, Graph: &Graph{Initializer: ts}}
		p := filepath.Join(dir, "m.onnx")
		if err := os.WriteFile(p, Encode(m), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	p := model(
		ext("a", []int64{3}, "location", "weights.bin", "offset", "4", "length", "12"),
		ext("b", []int64{2}, "location", "sub/b.bin"),
		// The same file may hold several tensors; a Constant's tensor attribute too.
	)
	m, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Graph.Initializer[0].Float32s()
	if err != nil || !reflect.DeepEqual(a, []float32{1, 2, 3}) {
		t.Fatalf("a = %v, %v", a, err)
	}
	b, err := m.Graph.Initializer[1].Float32s()
	if err != nil || !reflect.DeepEqual(b, []float32{9, 1}) {
		t.Fatalf("b = %v, %v", b, err)
	}
	if m.Graph.Initializer[0].DataLocation != LocationDefault || m.Graph.Initializer[0].ExternalData != nil {
		t.Fatal("loaded tensor still marked external")
	}

	for name, tensor := range map[string]*Tensor{
		"dotdot":       ext("x", []int64{1}, "location", "../"+filepath.Base(outside)+"/secret.bin"),
		"absolute":     ext("x", []int64{1}, "location", filepath.Join(outside, "secret.bin")),
		"symlink out":  ext("x", []int64{4}, "location", "link.bin"),
		"missing":      ext("x", []int64{1}, "location", "nope.bin"),
		"no location":  ext("x", []int64{1}),
		"short file":   ext("x", []int64{5}, "location", "weights.bin"),
		"length wrong": ext("x", []int64{1}, "location", "weights.bin", "length", "8"),
		"offset past":  ext("x", []int64{1}, "location", "weights.bin", "offset", "100", "length", "4"),
		"bad offset":   ext("x", []int64{1}, "location", "weights.bin", "offset", "-4", "length", "4"),
		"rest too big": ext("x", []int64{1}, "location", "weights.bin"),
	} {
		if _, err := Load(model(tensor)); err == nil {
			t.Errorf("%s: loaded, want an error", name)
		} else if name == "dotdot" || name == "absolute" {
			if !strings.Contains(err.Error(), "outside the model's directory") {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}
