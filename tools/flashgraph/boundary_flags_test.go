package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// seqCLIModel writes an ONNX model whose input xs is a sequence of float
// tensors [N] and o an optional float [2]; ys is xs with each element
// negated (SequenceMap), h whether o holds a value.
func seqCLIModel(t *testing.T, dir string) string {
	t.Helper()
	elem := func(d onnxpb.Dimension) *onnxpb.Type {
		return &onnxpb.Type{Tensor: &onnxpb.TensorType{ElemType: onnxpb.Float, Shape: &onnxpb.TensorShape{Dim: []onnxpb.Dimension{d}}}}
	}
	n, two := onnxpb.Dimension{Param: "N"}, onnxpb.Dimension{Value: 2, HasValue: true}
	body := &onnxpb.Graph{
		Name:   "neg",
		Input:  []*onnxpb.ValueInfo{{Name: "e", Type: elem(n)}},
		Output: []*onnxpb.ValueInfo{{Name: "ne", Type: elem(n)}},
		Node:   []*onnxpb.Node{{OpType: "Neg", Input: []string{"e"}, Output: []string{"ne"}}},
	}
	m := &onnxpb.Model{IRVersion: 8, OpsetImport: []onnxpb.OperatorSetID{{Version: 17}}, Graph: &onnxpb.Graph{
		Name: "seq",
		Input: []*onnxpb.ValueInfo{
			{Name: "xs", Type: onnxpb.SequenceOf(elem(n))},
			{Name: "o", Type: onnxpb.OptionalOf(elem(two))},
		},
		Output: []*onnxpb.ValueInfo{{Name: "ys", Type: onnxpb.SequenceOf(elem(n))}, {Name: "h"}},
		Node: []*onnxpb.Node{
			{OpType: "SequenceMap", Input: []string{"xs"}, Output: []string{"ys"}, Attribute: []*onnxpb.Attribute{{Name: "body", Type: onnxpb.AttrGraph, G: body}}},
			{OpType: "OptionalHasElement", Input: []string{"o"}, Output: []string{"h"}},
		},
	}}
	path := filepath.Join(dir, "seq.onnx")
	if err := os.WriteFile(path, onnxpb.Encode(m), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSequenceFlags: an ONNX model with a sequence input needs its elements'
// shapes (-sequence, or a test data set's SequenceProto); without them the
// error names the input and the flag. An optional input is present unless
// -absent names it.
func TestSequenceFlags(t *testing.T) {
	dir := t.TempDir()
	model := seqCLIModel(t, dir)
	code, _, stderr := runCode("compile", model)
	if code == 0 || !strings.Contains(stderr, "graph input xs is a sequence of tensors: give the shapes of its elements with -sequence xs=SHAPE,SHAPE,...") {
		t.Errorf("compile without -sequence: exit %d, stderr %s", code, stderr)
	}
	stdout, _ := runCLI(t, "compile", "-sequence", "xs=3,1", model)
	for _, want := range []string{"xs.0", "xs.1", "ys.0", "ys.1", "o"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("compile -sequence: no %s in the graph:\n%s", want, stdout)
		}
	}
	stdout, _ = runCLI(t, "run", "-sequence", "xs=3,1", "-absent", "o", model)
	if !strings.Contains(stdout, "h: bool[] = 0") || !strings.Contains(stdout, "ys.1: float32[1]") {
		t.Errorf("run -absent o: %s", stdout)
	}
	for _, c := range []struct{ args, want string }{
		{"-sequence xs=3x", `shape "3x": want sizes joined by x`},
		{"-sequence xs=3 -sequence xs=2", "sequence xs given twice"},
		{"-sequence o=3", `graph input "o" (Options.Sequences) is a optional_type, not a sequence`},
	} {
		args := append([]string{"compile"}, strings.Fields(c.args)...)
		if code, _, stderr := runCode(append(args, model)...); code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("compile %s: exit %d, stderr %s", c.args, code, stderr)
		}
	}
	if code, _, stderr := runCode("compile", "-sequence", "xs=3", "-config", "tiny"); code == 0 || !strings.Contains(stderr, "for an ONNX model's inputs") {
		t.Errorf("-sequence without an ONNX FILE: exit %d, stderr %s", code, stderr)
	}

	// A test data set: input_0.pb a SequenceProto, input_1.pb an
	// OptionalProto; the expected outputs a SequenceProto and a tensor.
	set := filepath.Join(dir, "test_data_set_0")
	if err := os.MkdirAll(set, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(set, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("input_0.pb", onnxpb.EncodeSequence(&onnxpb.Sequence{Name: "xs", ElemType: onnxpb.KindTensor, Tensors: []*onnxpb.Tensor{
		onnxpb.NewFloat32("", []int64{2}, []float32{1, -2}), onnxpb.NewFloat32("", []int64{3}, []float32{0.5, 4, -8}),
	}}))
	write("input_1.pb", onnxpb.EncodeOptional(&onnxpb.Optional{Name: "o", ElemType: onnxpb.KindTensor, Tensor: onnxpb.NewFloat32("", []int64{2}, []float32{7, 7})}))
	write("output_0.pb", onnxpb.EncodeSequence(&onnxpb.Sequence{Name: "ys", ElemType: onnxpb.KindTensor, Tensors: []*onnxpb.Tensor{
		onnxpb.NewFloat32("", []int64{2}, []float32{-1, 2}), onnxpb.NewFloat32("", []int64{3}, []float32{-0.5, -4, 8}),
	}}))
	write("output_1.pb", onnxpb.EncodeTensor(onnxpb.NewBool("h", nil, []bool{true})))
	stdout, _ = runCLI(t, "run", "-expect", set, model)
	if !strings.Contains(stdout, "expect ys.1: ok") || !strings.Contains(stdout, "expect: 3 outputs match") {
		t.Errorf("run -expect on sequences: %s", stdout)
	}
	// Inputs from safetensors by the graph's names, expected outputs from the set.
	st := filepath.Join(dir, "in.safetensors")
	x0 := graph.NewTensor(graph.Float32, graph.Shape{2})
	x1 := graph.NewTensor(graph.Float32, graph.Shape{3})
	copy(x0.F32, []float32{1, -2})
	copy(x1.F32, []float32{0.5, 4, -8})
	o := graph.NewTensor(graph.Float32, graph.Shape{2})
	if err := writeSafetensors(st, map[string]*graph.Tensor{"xs.0": x0, "xs.1": x1, "o": o}, nil); err != nil {
		t.Fatal(err)
	}
	stdout, _ = runCLI(t, "run", "-sequence", "xs=2,3", "-inputs", st, "-expect", set, model)
	if !strings.Contains(stdout, "expect: 3 outputs match") {
		t.Errorf("run -inputs safetensors -expect DIR: %s", stdout)
	}
	// A wrong expected element is a mismatch, not a pass.
	write("output_0.pb", onnxpb.EncodeSequence(&onnxpb.Sequence{Name: "ys", ElemType: onnxpb.KindTensor, Tensors: []*onnxpb.Tensor{
		onnxpb.NewFloat32("", []int64{2}, []float32{-1, 2}), onnxpb.NewFloat32("", []int64{3}, []float32{-0.5, -4, 9}),
	}}))
	if code, stdout, _ := runCode("run", "-expect", set, model); code == 0 || !strings.Contains(stdout, "expect ys.1: MISMATCH") {
		t.Errorf("run -expect, a wrong element: exit %d, stdout %s", code, stdout)
	}
}
