package train

import (
	"slices"
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

// -untie undoes a merge of per-layer gains: each reader gets its own param
// again, named NAME.k, and the step trains exactly as the unmerged model.
// -retie undoes a folded Transpose of a tied table: the copy is read as a
// Transpose of the table, and a table with its own values is left alone.
func TestUntieAndRetie(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	g := tinyLogits(t, cfg)
	shared, other := g.Value("layers.0.attn_norm"), g.Value("layers.1.attn_norm")
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if in == other {
				n.Inputs[i] = shared
			}
		}
	}
	g, err := (passes.DCE{}).Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A second table holding the embedding's transpose, as an exporter
	// that folded Transpose(table) writes it (here read by nothing: the
	// retie looks at values, not at readers).
	var emb *graph.Value
	for _, p := range g.Params {
		if len(p.Type.Shape) == 2 && p.Type.Shape[0] == cfg.Vocab {
			emb = p
			break
		}
	}
	if emb == nil {
		t.Fatal("tiny has no [vocab, dim] table")
	}
	rows, cols := emb.Type.Shape[0], emb.Type.Shape[1]
	data := make([]float64, rows*cols)
	for i := range data {
		data[i] = float64(i%97)/97 - 0.5
	}
	in := graph.Literal(data...)
	emb.Init = &in
	tdata := make([]float64, rows*cols)
	for i := range rows {
		for j := range cols {
			tdata[j*rows+i] = data[i*cols+j]
		}
	}
	tin := graph.Literal(tdata...)
	copyT := &graph.Value{Name: "folded_transpose", Type: graph.TensorType{DType: emb.Type.DType, Shape: graph.Shape{cols, rows}}, Kind: graph.Param, Init: &tin}
	g.Params = append(g.Params, copyT)

	spec := GraphSpec{File: "tiny.txt", Format: "text", Loss: LossNextToken, Untie: true, Retie: true}
	m, err := PrepareGraph(g, spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(m.Params, "layers.0.attn_norm") || !slices.Contains(m.Params, "layers.0.attn_norm.1") {
		t.Errorf("untie: params %v, want layers.0.attn_norm and layers.0.attn_norm.1", m.Params)
	}
	if slices.Contains(m.Params, "folded_transpose") {
		t.Errorf("retie: folded_transpose is still a param")
	}
	if v := m.Forward.Value("folded_transpose"); v == nil || v.Producer == nil || v.Producer.Op != "Transpose" || v.Producer.Inputs[0] != m.Forward.Value(emb.Name) {
		t.Errorf("retie: folded_transpose is not Transpose(%s): %+v", emb.Name, v)
	}
	var untied, retied int
	for _, n := range m.Notes {
		switch {
		case strings.HasPrefix(n, "untied layers.0.attn_norm"):
			untied++
		case strings.HasPrefix(n, "retied folded_transpose") && strings.Contains(n, "transpose of "+emb.Name):
			retied++
		default:
			t.Errorf("unexpected note %q", n)
		}
	}
	if untied != 1 || retied != 1 {
		t.Errorf("notes %q: want one untied and one retied", m.Notes)
	}

	// A table that is not the transpose of another stays a param.
	tdata[1] += 1
	other2 := graph.Literal(tdata...)
	g2 := g.Clone()
	g2.Value("folded_transpose").Init = &other2
	m2, err := PrepareGraph(g2, GraphSpec{File: "tiny.txt", Format: "text", Loss: LossNextToken, Retie: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range m2.Notes {
		if strings.HasPrefix(n, "retied") {
			t.Errorf("a table with values of its own was retied: %q", n)
		}
	}
}
