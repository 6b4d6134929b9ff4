package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// TestRunNarrowIntegers: an ONNX model whose input and output are INT32
// runs on int32 test data (held as int64 inside), and an int64 feed
// outside int32's range is refused on the way in.
func TestRunNarrowIntegers(t *testing.T) {
	dir := t.TempDir()
	info := func(name string, n int64) *onnxpb.ValueInfo {
		return &onnxpb.ValueInfo{Name: name, Type: &onnxpb.Type{Tensor: &onnxpb.TensorType{ElemType: onnxpb.Int32,
			Shape: &onnxpb.TensorShape{Dim: []onnxpb.Dimension{{Value: n, HasValue: true}}}}}}
	}
	m := &onnxpb.Model{IRVersion: 8, OpsetImport: []onnxpb.OperatorSetID{{Version: 13}}, Graph: &onnxpb.Graph{
		Name: "narrow", Input: []*onnxpb.ValueInfo{info("x", 3)}, Output: []*onnxpb.ValueInfo{info("y", 2)},
		Initializer: []*onnxpb.Tensor{onnxpb.NewInt32("idx", []int64{2}, []int32{2, 0})},
		Node:        []*onnxpb.Node{{Name: "g", OpType: "Gather", Input: []string{"x", "idx"}, Output: []string{"y"}}},
	}}
	model := filepath.Join(dir, "narrow.onnx")
	if err := os.WriteFile(model, onnxpb.Encode(m), 0o644); err != nil {
		t.Fatal(err)
	}
	set := filepath.Join(dir, "test_data_set_0")
	if err := os.MkdirAll(set, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path string, pt *onnxpb.Tensor) {
		if err := os.WriteFile(path, onnxpb.EncodeTensor(pt), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(set, "input_0.pb"), onnxpb.NewInt32("x", []int64{3}, []int32{-2147483648, 5, 2147483647}))
	write(filepath.Join(set, "output_0.pb"), onnxpb.NewInt32("y", []int64{2}, []int32{2147483647, -2147483648}))
	stdout, _ := runCLI(t, "run", "-expect", set, model)
	if !strings.Contains(stdout, "expect y: ok") {
		t.Errorf("int32 run: %s", stdout)
	}
	big := filepath.Join(dir, "big")
	if err := os.MkdirAll(big, 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(big, "input_0.pb"), onnxpb.NewInt64("x", []int64{3}, []int64{1 << 40, 0, 0}))
	if code, _, stderr := runCode("run", "-inputs", big, model); code == 0 || !strings.Contains(stderr, "x is declared int32: element 0 is 1099511627776") {
		t.Errorf("out-of-range feed: exit %d, stderr %s", code, stderr)
	}
}
