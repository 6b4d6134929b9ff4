package onnx

import (
	"fmt"
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
	for _, b := range importSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := importChecked(b); err != nil {
			t.Fatal(err)
		}
	})
}

// importChecked is one execution of FuzzImport: nil when the input is imported
// (and verifies and exports) or refused with an ordinary error.
func importChecked(b []byte) error {
	g, err := ImportBytes(b)
	if err != nil {
		if strings.Contains(err.Error(), "internal error") {
			return err
		}
		return nil
	}
	if err := graph.Verify(g); err != nil {
		return fmt.Errorf("imported graph does not verify: %v", err)
	}
	if _, err := ExportBytes(g); err != nil {
		return fmt.Errorf("cannot export an imported graph: %v", err)
	}
	return nil
}

// importSeeds are FuzzImport's seeds: the exported fixtures, a small model
// that folds shapes, and models whose folding would be far larger than their
// bytes (see limits.go), a model of narrow integer types, so that the fuzzer starts next to the fold budget.
func importSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	var seeds [][]byte
	files, _ := filepath.Glob(filepath.Join("testdata", "*.onnx"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	x := []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 3)}
	seeds = append(seeds, onnxpb.Encode(modelOf(13, x, []*onnxpb.Tensor{onnxpb.NewInt64("ax", []int64{1}, []int64{1})}, []string{"y"},
		nd("Softmax", []string{"x"}, []string{"s"}, aInt("axis", 0)),
		nd("ReduceSum", []string{"s", "ax"}, []string{"r"}),
		nd("Shape", []string{"r"}, []string{"sh"}),
		nd("Reshape", []string{"s", "sh"}, []string{"y"}))))
	seeds = append(seeds, onnxpb.Encode(narrowModel())) // narrow integers (narrow_test.go)
	for _, m := range hostileFolds() {
		seeds = append(seeds, onnxpb.Encode(m))
	}
	return seeds
}
