package train

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// A norm gain that several layers read, all ones (what an eval-mode
// torch.onnx export makes of per-layer gains), is named in a note; the
// built-in model, one gain per layer, gets none.
func TestSharedUniformParamNote(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	spec := GraphSpec{File: "tiny.txt", Format: "text", Loss: LossNextToken}
	m, err := PrepareGraph(tinyLogits(t, cfg), spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Notes) != 0 {
		t.Fatalf("built-in model: notes %q", m.Notes)
	}

	g := tinyLogits(t, cfg)
	shared, other := g.Value("layers.0.attn_norm"), g.Value("layers.1.attn_norm")
	if shared == nil || other == nil {
		t.Fatal("tiny has no layers.{0,1}.attn_norm")
	}
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if in == other {
				n.Inputs[i] = shared
			}
		}
	}
	if g, err = (passes.DCE{}).Run(g, nil); err != nil {
		t.Fatal(err)
	}
	m, err = PrepareGraph(g, spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Notes) != 1 || !strings.Contains(m.Notes[0], "param layers.0.attn_norm") || !strings.Contains(m.Notes[0], "read by 2 nodes") {
		t.Fatalf("shared gain: notes %q", m.Notes)
	}
	if !strings.Contains(m.Explain(), "note:    param layers.0.attn_norm") {
		t.Fatalf("Explain does not show the note:\n%s", m.Explain())
	}
}
