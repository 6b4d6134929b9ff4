package onnx

import (
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// TestGQAExportFusesWithoutRepeat: torch's export of a LLaMA-style model
// with grouped-query attention (2 K/V heads for 4 query heads, repeat_kv
// written as Unsqueeze, Expand, Reshape) fuses each layer's attention to one
// FlashAttention that reads the 2-headed K and V, and the repeats are gone
// from the fused graph (train/byom_test.go trains it against PyTorch).
func TestGQAExportFusesWithoutRepeat(t *testing.T) {
	g, err := Import("testdata/byom/llama_gqa_ts17.onnx")
	if err != nil {
		t.Fatal(err)
	}
	if n := g.CountOps()["Expand"]; n != 4 {
		t.Fatalf("the import has %d Expand nodes; want repeat_kv's K and V Expand in each of 2 layers", n)
	}
	fused, err := passes.Default(true).Run(g, &passes.Log{})
	if err != nil {
		t.Fatal(err)
	}
	ops := fused.CountOps()
	if ops["FlashAttention"] != 2 || ops["Softmax"] != 0 || ops["Expand"] != 0 {
		t.Fatalf("fused graph: %d FlashAttention, %d Softmax, %d Expand; want 2, 0, 0", ops["FlashAttention"], ops["Softmax"], ops["Expand"])
	}
	for _, n := range fused.Nodes {
		if n.Op != "FlashAttention" {
			continue
		}
		q, k, v := n.Inputs[0].Type.Shape, n.Inputs[1].Type.Shape, n.Inputs[2].Type.Shape
		if !q.Equal(graph.Shape{4, 4, 16, 8}) || !k.Equal(graph.Shape{4, 2, 16, 8}) || !v.Equal(k) {
			t.Errorf("%s reads Q %v, K %v, V %v; want Q [4,4,16,8] and K, V [4,2,16,8]", n.Name, q, k, v)
		}
	}
}
