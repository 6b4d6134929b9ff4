package onnx

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// TestWriteExportsForORT writes exported models with inputs and our CPU
// backend's outputs, for checking with onnx.checker and ONNX Runtime on a
// machine that has them (tools/reference/check_onnx.py FILE.onnx FILE.io.json).
// It runs only when FLASHGRAPH_ONNX_OUT names the folder to write.
func TestWriteExportsForORT(t *testing.T) {
	dir := os.Getenv("FLASHGRAPH_ONNX_OUT")
	if dir == "" {
		t.Skip("FLASHGRAPH_ONNX_OUT not set")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	write := func(name string, g *graph.Graph, run bool) {
		t.Helper()
		if err := ExportFile(g, filepath.Join(dir, name+".onnx")); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !run {
			return
		}
		feeds := map[string]*graph.Tensor{}
		io := ioFile{Inputs: map[string]ioTensor{}, Outputs: map[string]ioTensor{}}
		for _, in := range g.Inputs {
			x := graph.NewTensor(in.Type.DType, in.Type.Shape)
			for i := range x.Len() {
				switch {
				case in.Type.DType == graph.Int64:
					x.Set(i, float64(rng.IntN(in.Type.Shape[len(in.Type.Shape)-1])))
				case in.Name == "step":
					x.Set(i, 1)
				default:
					x.Set(i, rng.NormFloat64())
				}
			}
			feeds[in.Name] = x
			io.Inputs[in.Name] = toIO(x)
		}
		for k, v := range runGraph(t, g, feeds) {
			io.Outputs[k] = toIO(v)
		}
		b, err := json.Marshal(io)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".io.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	write("model_tiny", g, true)
	write("attention_causal", attentionGraph(t, false, 0.3), true)
	write("attention_lse", attentionGraph(t, true, 0.3), false)
	// Every fixture, imported and exported again: ORT must still give its own
	// outputs (the fixture's .io.json).
	for _, path := range fixtures(t) {
		g, err := Import(path)
		if err != nil {
			t.Fatal(err)
		}
		name := "reexport_" + strings.TrimSuffix(filepath.Base(path), ".onnx")
		write(name, g, false)
		raw, err := os.ReadFile(strings.TrimSuffix(path, ".onnx") + ".io.json")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".io.json"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func toIO(x *graph.Tensor) ioTensor {
	out := ioTensor{DType: x.DType.String(), Shape: append([]int{}, x.Shape...)}
	for i := range x.Len() {
		out.Data = append(out.Data, x.At(i))
	}
	if out.Shape == nil {
		out.Shape = []int{}
	}
	return out
}
