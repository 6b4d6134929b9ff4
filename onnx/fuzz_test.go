package onnx

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// FuzzImport feeds arbitrary bytes to the importer: it must return a graph or
// an error, never panic, and never fail inside the op table's inference (the
// importer turns such a panic into an "internal error", which this test treats
// as a bug). A graph it returns must verify and survive export and import.
func FuzzImport(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.onnx"))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	x := []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 3)}
	f.Add(onnxpb.Encode(modelOf(13, x, []*onnxpb.Tensor{onnxpb.NewInt64("ax", []int64{1}, []int64{1})}, []string{"y"},
		nd("Softmax", []string{"x"}, []string{"s"}, aInt("axis", 0)),
		nd("ReduceSum", []string{"s", "ax"}, []string{"r"}),
		nd("Shape", []string{"r"}, []string{"sh"}),
		nd("Reshape", []string{"s", "sh"}, []string{"y"}))))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := ImportBytes(b)
		if err != nil {
			if strings.Contains(err.Error(), "internal error") {
				t.Fatal(err)
			}
			return
		}
		if err := graph.Verify(g); err != nil {
			t.Fatalf("imported graph does not verify: %v", err)
		}
		if _, err := ExportBytes(g); err != nil {
			t.Fatalf("cannot export an imported graph: %v", err)
		}
	})
}
