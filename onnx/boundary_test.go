package onnx

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Sequences and optionals at the graph boundary (boundary.go): a sequence
// input or output is one tensor per element, an optional its value or
// nothing.

func floatN(dims ...onnxpb.Dimension) *onnxpb.Type {
	return &onnxpb.Type{Tensor: &onnxpb.TensorType{ElemType: onnxpb.Float, Shape: &onnxpb.TensorShape{Dim: dims}}}
}

var (
	dimN = onnxpb.Dimension{Param: "N"}
	dim2 = onnxpb.Dimension{Value: 2, HasValue: true}
)

func outputNames(g *graph.Graph) []string {
	var out []string
	for _, v := range g.Outputs {
		out = append(out, v.Name)
	}
	return out
}

// seqModel: xs, a sequence of float [N, 2]; t a float [1, 2]. ys is xs with t
// appended, each element squared (SequenceMap); n is ys's length.
func seqModel() *onnxpb.Model {
	body := &onnxpb.Graph{
		Name:   "square",
		Input:  []*onnxpb.ValueInfo{{Name: "e", Type: floatN(dimN, dim2)}},
		Output: []*onnxpb.ValueInfo{{Name: "sq", Type: floatN(dimN, dim2)}},
		Node:   []*onnxpb.Node{nd("Mul", []string{"e", "e"}, []string{"sq"})},
	}
	m := modelOf(17, []*onnxpb.ValueInfo{
		{Name: "xs", Type: onnxpb.SequenceOf(floatN(dimN, dim2))},
		vi("t", onnxpb.Float, 1, 2),
	}, nil, nil,
		nd("SequenceInsert", []string{"xs", "t"}, []string{"s2"}),
		nd("SequenceMap", []string{"s2"}, []string{"ys"}, &onnxpb.Attribute{Name: "body", Type: onnxpb.AttrGraph, G: body}),
		nd("SequenceLength", []string{"ys"}, []string{"n"}),
	)
	m.Graph.Output = []*onnxpb.ValueInfo{{Name: "ys", Type: onnxpb.SequenceOf(floatN(dimN, dim2))}, {Name: "n"}}
	return m
}

func TestSequenceBoundary(t *testing.T) {
	m := seqModel()
	g, err := ImportModel(m, Options{Sequences: map[string][]graph.Shape{"xs": {{2, 2}, {3, 2}}}})
	if err != nil {
		t.Fatal(err)
	}
	var ins []string
	for _, v := range g.Inputs {
		ins = append(ins, v.Name+" "+v.Type.String())
	}
	if want := []string{"xs.0 float32[2,2]", "xs.1 float32[3,2]", "t float32[1,2]"}; !slices.Equal(ins, want) {
		t.Fatalf("inputs %v, want %v", ins, want)
	}
	if got, want := outputNames(g), []string{"ys.0", "ys.1", "ys.2", "n"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %v, want %v", got, want)
	}
	x0 := graph.NewTensor(graph.Float32, graph.Shape{2, 2})
	x1 := graph.NewTensor(graph.Float32, graph.Shape{3, 2})
	tt := graph.NewTensor(graph.Float32, graph.Shape{1, 2})
	for _, x := range []*graph.Tensor{x0, x1, tt} {
		for i := range x.Len() {
			x.Set(i, float64(i)-2.5)
		}
	}
	out := runGraph(t, g, map[string]*graph.Tensor{"xs.0": x0, "xs.1": x1, "t": tt})
	for i, x := range []*graph.Tensor{x0, x1, tt} {
		name := SequenceElem("ys", i)
		want := make([]float64, x.Len())
		for k := range want {
			want[k] = x.At(k) * x.At(k)
		}
		closeTo(t, name, out[name], want, x.Shape, 0)
	}
	if n := out["n"]; n == nil || n.Len() != 1 || n.At(0) != 3 {
		t.Fatalf("n = %v, want 3", n)
	}
	// Through the wire format too (the sequence types encode and decode).
	if _, err := ImportBytesWith(onnxpb.Encode(m), Options{Sequences: map[string][]graph.Shape{"xs": {{1, 2}}}}); err != nil {
		t.Fatal(err)
	}
}

func TestSequenceBoundaryErrors(t *testing.T) {
	_, err := ImportModel(seqModel(), Options{})
	var se *SequenceError
	if !errors.As(err, &se) || se.Input != "xs" || !strings.Contains(err.Error(), "xs.0") {
		t.Fatalf("no shapes for xs: %v, want a SequenceError naming xs", err)
	}
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Sequences: map[string][]graph.Shape{"xs": {{2}}}}, "element 0: shape [2] given, the model declares rank 2"},
		{Options{Sequences: map[string][]graph.Shape{"xs": {{2, 3}}}}, "the model declares dimension 1 = 2"},
		{Options{Sequences: map[string][]graph.Shape{"xs": {{2, 2}}, "t": {{1, 2}}}}, `"t" (Options.Sequences) is a tensor_type, not a sequence`},
		{Options{Sequences: map[string][]graph.Shape{"zz": nil}}, `"zz" (Options.Sequences) is not a graph input`},
		{Options{Sequences: map[string][]graph.Shape{"xs": {{2, 2}}}, Absent: map[string]bool{"t": true}}, `"t" (Options.Absent) is a tensor_type, not an optional`},
		{Options{Bind: map[string]*onnxpb.Tensor{"xs": onnxpb.NewFloat32("xs", []int64{1, 2}, []float32{1, 2})}}, "cannot be bound to a tensor"},
		// Both elements have N = 3 once Options.Dims says so.
		{Options{Dims: map[string]int{"N": 3}, Sequences: map[string][]graph.Shape{"xs": {{3, 2}, {2, 2}}}}, "element 1: shape [2,2] given, the model declares dimension 0 = 3"},
	} {
		if _, err := ImportModel(seqModel(), c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.opts, err, c.want)
		}
	}
	// An element's name must not be one the model uses.
	m := seqModel()
	m.Graph.Node = append(m.Graph.Node, nd("Identity", []string{"t"}, []string{"xs.1"}))
	if _, err := ImportModel(m, Options{Sequences: map[string][]graph.Shape{"xs": {{2, 2}, {3, 2}}}}); err == nil || !strings.Contains(err.Error(), `"xs.1" it would take is taken`) {
		t.Errorf("element name taken: %v", err)
	}
	// A sequence of sequences is refused.
	m = seqModel()
	m.Graph.Input[0].Type = onnxpb.SequenceOf(onnxpb.SequenceOf(floatN(dimN, dim2)))
	if _, err := ImportModel(m, Options{Sequences: map[string][]graph.Shape{"xs": {{2, 2}}}}); err == nil || !strings.Contains(err.Error(), "a sequence of sequence_type is not supported") {
		t.Errorf("sequence of sequences: %v", err)
	}
	// An empty sequence maps onto no inputs; a graph whose every output is
	// then an empty sequence has nothing to compute, and says so.
	m = modelOf(16, []*onnxpb.ValueInfo{{Name: "xs", Type: onnxpb.SequenceOf(floatN(dim2))}}, nil, nil, nd("Identity", []string{"xs"}, []string{"ys"}))
	m.Graph.Output = []*onnxpb.ValueInfo{{Name: "ys", Type: onnxpb.SequenceOf(floatN(dim2))}}
	if _, err := ImportModel(m, Options{Sequences: map[string][]graph.Shape{"xs": {}}}); err == nil || !strings.Contains(err.Error(), "no tensor outputs") {
		t.Errorf("empty sequence output: %v", err)
	}
}

// optModel: o, an optional float [3]; h says whether it holds a value, oo
// is o passed on, v its value (only when wantValue).
func optModel(wantValue bool) *onnxpb.Model {
	opt := onnxpb.OptionalOf(floatN(onnxpb.Dimension{Value: 3, HasValue: true}))
	nodes := []*onnxpb.Node{
		nd("OptionalHasElement", []string{"o"}, []string{"h"}),
		nd("Identity", []string{"o"}, []string{"oo"}),
	}
	outs := []*onnxpb.ValueInfo{{Name: "h"}, {Name: "oo", Type: opt}}
	if wantValue {
		nodes = append(nodes, nd("OptionalGetElement", []string{"oo"}, []string{"v"}))
		outs = append(outs, &onnxpb.ValueInfo{Name: "v"})
	}
	m := modelOf(15, []*onnxpb.ValueInfo{{Name: "o", Type: opt}}, nil, nil, nodes...)
	m.Graph.Output = outs
	return m
}

func TestOptionalBoundary(t *testing.T) {
	g, err := ImportModel(optModel(true), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Inputs) != 1 || g.Inputs[0].Name != "o" {
		t.Fatalf("inputs %v, want o", g.Inputs)
	}
	if got, want := outputNames(g), []string{"h", "oo", "v"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %v, want %v", got, want)
	}
	x := graph.NewTensor(graph.Float32, graph.Shape{3})
	for i := range 3 {
		x.Set(i, float64(i)+0.5)
	}
	out := runGraph(t, g, map[string]*graph.Tensor{"o": x})
	if h := out["h"]; h.DType != graph.Bool || h.At(0) != 1 {
		t.Errorf("h = %v, want true", h)
	}
	closeTo(t, "oo", out["oo"], data(x), x.Shape, 0)
	closeTo(t, "v", out["v"], data(x), x.Shape, 0)

	// Absent: no input, h false, and oo is no output.
	g, err = ImportModel(optModel(false), Options{Absent: map[string]bool{"o": true}})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Inputs) != 0 || !slices.Equal(outputNames(g), []string{"h"}) {
		t.Fatalf("absent: inputs %v, outputs %v", g.Inputs, outputNames(g))
	}
	if h := runGraph(t, g, nil)["h"]; h.At(0) != 0 {
		t.Errorf("absent: h = %v, want false", h)
	}
	// Reading the value of an absent optional is an error naming it.
	if _, err := ImportModel(optModel(true), Options{Absent: map[string]bool{"o": true}}); err == nil || !strings.Contains(err.Error(), `optional "oo" holds no value`) {
		t.Errorf("value of an absent optional: %v", err)
	}
	// An optional is not a tensor: a tensor op reading one is refused.
	m := optModel(false)
	m.Graph.Node = append(m.Graph.Node, nd("Relu", []string{"o"}, []string{"r"}))
	m.Graph.Output = append(m.Graph.Output, &onnxpb.ValueInfo{Name: "r"})
	if _, err := ImportModel(m, Options{}); err == nil || !strings.Contains(err.Error(), "input 0 is an optional") {
		t.Errorf("Relu of an optional: %v", err)
	}
}

// Optional makes an optional inside the model: of its input, or, without
// one, empty of the type its attribute gives (a TYPE_PROTO, read through
// the wire format here).
func TestOptionalOp(t *testing.T) {
	empty := &onnxpb.Attribute{Name: "type", Type: onnxpb.AttrTypeProto, TP: floatN(dim2)}
	m := modelOf(16, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2)}, nil, []string{"has_none", "has_x", "v"},
		nd("Optional", nil, []string{"none"}, empty),
		nd("Optional", []string{"x"}, []string{"ox"}),
		nd("OptionalHasElement", []string{"none"}, []string{"has_none"}),
		nd("OptionalHasElement", []string{"ox"}, []string{"has_x"}),
		nd("OptionalGetElement", []string{"ox"}, []string{"v"}))
	x := graph.NewTensor(graph.Float32, graph.Shape{2})
	copy(x.F32, []float32{3, -4})
	g, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
	if len(g.Nodes) != 1 {
		t.Errorf("%d nodes, want one (v's Identity): the optional ops fold", len(g.Nodes))
	}
	if out["has_none"].At(0) != 0 || out["has_x"].At(0) != 1 {
		t.Errorf("has_none %v, has_x %v; want false, true", out["has_none"], out["has_x"])
	}
	closeTo(t, "v", out["v"], data(x), x.Shape, 0)

	m.Graph.Node[0].Attribute[0].TP = &onnxpb.Type{OtherField: 5} // a map type
	if _, err := ImportBytes(onnxpb.Encode(m)); err == nil || !strings.Contains(err.Error(), "type map_type: only optionals of tensors") {
		t.Errorf("Optional of a map: %v", err)
	}
}
