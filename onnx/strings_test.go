package onnx

import (
	"errors"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

func strProto(name string, dims []int64, s ...string) *onnxpb.Tensor {
	t := &onnxpb.Tensor{Name: name, DataType: onnxpb.String, Dims: dims}
	for _, x := range s {
		t.StringData = append(t.StringData, []byte(x))
	}
	return t
}

// A STRING TensorProto (string_data) reads as a string tensor, byte for
// byte, and one with the wrong count or raw_data is refused.
func TestReadStringTensorProto(t *testing.T) {
	in := strProto("s", []int64{2, 2}, "a\"b", "", "naïve", "\xff")
	name, got, err := ReadTensorProto(onnxpb.EncodeTensor(in))
	if err != nil {
		t.Fatal(err)
	}
	if name != "s" || got.DType != graph.String || !got.Shape.Equal(graph.Shape{2, 2}) {
		t.Fatalf("read %s %v", name, got.Type())
	}
	for i, w := range []string{"a\"b", "", "naïve", "\xff"} {
		if got.S[i] != w {
			t.Errorf("element %d: %q, want %q", i, got.S[i], w)
		}
	}
	for _, bad := range []*onnxpb.Tensor{
		strProto("short", []int64{3}, "a", "b"),
		{Name: "raw", DataType: onnxpb.String, Dims: []int64{1}, RawData: []byte("a")},
	} {
		if _, _, err := ReadTensorProto(onnxpb.EncodeTensor(bad)); err == nil {
			t.Errorf("%s: read without error", bad.Name)
		}
	}
}

// A string initializer, Cast from and to strings, and StringNormalizer
// with its stopwords attribute import and run on the CPU backend.
func TestImportStringOps(t *testing.T) {
	m := modelOf(13, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 3)},
		[]*onnxpb.Tensor{strProto("words", []int64{1, 4}, "Monday", "tuesday", "MONDAY", "x")},
		[]string{"s", "f", "n"},
		nd("Cast", []string{"x"}, []string{"s"}, aInt("to", int64(onnxpb.String))),
		nd("Cast", []string{"s"}, []string{"f"}, aInt("to", int64(onnxpb.Double))),
		nd("StringNormalizer", []string{"words"}, []string{"n"}, aStr("case_change_action", "UPPER"),
			&onnxpb.Attribute{Name: "stopwords", Type: onnxpb.AttrStrings, Strings: [][]byte{[]byte("monday")}}),
	)
	x := &graph.Tensor{DType: graph.Float32, Shape: graph.Shape{3}, F32: []float32{0.1, -2.5, 1e10}}
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
	for i, w := range []string{"0.1", "-2.5", "10000000000"} {
		if out["s"].S[i] != w {
			t.Errorf("s[%d] = %q, want %q", i, out["s"].S[i], w)
		}
	}
	// The text is float32's shortest spelling: read as a double it is the
	// decimal, not the float32 value it came from.
	for i, w := range []float64{0.1, -2.5, 1e10} {
		if out["f"].F64[i] != w {
			t.Errorf("f[%d] = %v, want %v", i, out["f"].F64[i], w)
		}
	}
	if n := out["n"]; !n.Shape.Equal(graph.Shape{1, 2}) || n.S[0] != "TUESDAY" || n.S[1] != "X" {
		t.Errorf("n = %v %q, want [1 2] [TUESDAY X]", n.Shape, n.S)
	}
}

// StringNormalizer of a graph input asks for the input's value (its
// output's length follows the data); bound, it imports.
func TestStringNormalizerNeedsBinding(t *testing.T) {
	m := modelOf(13, []*onnxpb.ValueInfo{vi("x", onnxpb.String, 3)}, nil, []string{"y"},
		nd("StringNormalizer", []string{"x"}, []string{"y"}, aStr("case_change_action", "LOWER")))
	_, err := ImportModel(m, Options{})
	var be *BindError
	if !errors.As(err, &be) || be.Input != "x" {
		t.Fatalf("import = %v; want a BindError for x", err)
	}
	g, err := ImportModel(m, Options{Bind: map[string]*onnxpb.Tensor{"x": strProto("x", []int64{3}, "A", "b", "C")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Consts) != 1 || g.Consts[0].Type.DType != graph.String {
		t.Fatalf("bound x is not a string const: %v", g.Consts)
	}
	// A bound value of the wrong type or shape is refused.
	if _, err := ImportModel(m, Options{Bind: map[string]*onnxpb.Tensor{"x": strProto("x", []int64{2}, "A", "b")}}); err == nil || !strings.Contains(err.Error(), "declares dimension 0 = 3") {
		t.Errorf("bound [2] for [3]: %v", err)
	}
}

// Ops other than the string ops refuse a string operand at import, naming
// the op; export refuses a graph with strings.
func TestStringsRefusedElsewhere(t *testing.T) {
	m := modelOf(13, []*onnxpb.ValueInfo{vi("x", onnxpb.String, 2)}, nil, []string{"y"},
		nd("Identity", []string{"x"}, []string{"y"}))
	if _, err := ImportModel(m, Options{}); err == nil || !strings.Contains(err.Error(), "does not take strings") {
		t.Errorf("Identity of a string: %v", err)
	}
	b := graph.NewBuilder("e")
	b.Output(b.Op("Cast", graph.Attrs{"to": graph.Str("string")}, b.Input("x", graph.Float32, 2)))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Export(g); err == nil || !strings.Contains(err.Error(), "string tensor; export does not write strings") {
		t.Errorf("export of a string graph: %v", err)
	}
}
