package train

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

// tinyLogits is the built-in test model without its loss: inputs tokens
// only, outputs logits only (what an exporter writes for inference).
func tinyLogits(t *testing.T, cfg model.Config) *graph.Graph {
	t.Helper()
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.Outputs = []*graph.Value{g.Value("logits")}
	if g, err = (passes.DCE{}).Run(g, nil); err != nil {
		t.Fatal(err)
	}
	g.Inputs = g.Inputs[:1] // tokens; targets is no longer read
	if err := graph.Verify(g); err != nil {
		t.Fatal(err)
	}
	return g
}

// A graph source with the next-token loss appended trains step for step
// like the built-in model it was made from, and checkpoints know which model
// they are of.
func TestGraphSourceTrainsLikeBuiltIn(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	corpus := testCorpus(t)
	h := testHyper(3)
	spec := GraphSpec{File: "tiny.txt", SHA256: strings.Repeat("ab", 32), Format: "text", Loss: LossNextToken}
	m, err := PrepareGraph(tinyLogits(t, cfg), spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Tokens != "tokens" || m.Targets != "targets" || m.Loss != "loss" || len(m.Params) != len(cfg.Params()) || len(m.Frozen) != 0 {
		t.Fatalf("prepared: tokens %s targets %s loss %s, %d params, frozen %v", m.Tokens, m.Targets, m.Loss, len(m.Params), m.Frozen)
	}
	src := GraphSource(m)
	if c := src.Config; c.Batch != cfg.Batch || c.Seq != cfg.Seq || c.Vocab != cfg.Vocab || c.DType != graph.Float32 {
		t.Fatalf("graph config %+v", c)
	}
	a, err := NewTrainer(cpu.New(), cfg, true, h, corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewSourceTrainer(cpu.New(), src, true, h, corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := range 3 {
		la, err := a.Step()
		if err != nil {
			t.Fatal(err)
		}
		lb, err := b.Step()
		if err != nil {
			t.Fatal(err)
		}
		if la != lb {
			t.Fatalf("step %d: built-in loss %v, graph %v", i+1, la, lb)
		}
	}
	va, err := a.Eval()
	if err != nil {
		t.Fatal(err)
	}
	vb, err := b.Eval()
	if err != nil {
		t.Fatal(err)
	}
	if va != vb {
		t.Fatalf("validation: built-in %v, graph %v", va, vb)
	}

	// Checkpoints: of the built-in model into the graph run and the other
	// way round, and of another graph, are refused; its own restores.
	sa, err := a.State()
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.State()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Restore(sa, 3); err == nil || !strings.Contains(err.Error(), "built-in model") {
		t.Errorf("built-in checkpoint into a graph run: %v", err)
	}
	if _, err := a.Restore(sb, 3); err == nil || !strings.Contains(err.Error(), "tiny.txt") {
		t.Errorf("graph checkpoint into the built-in run: %v", err)
	}
	if _, err := b.Restore(sb, 3); err != nil {
		t.Errorf("own checkpoint: %v", err)
	}
	other := spec
	other.SHA256 = strings.Repeat("cd", 32)
	m2, err := PrepareGraph(tinyLogits(t, cfg), other, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewSourceTrainer(cpu.New(), GraphSource(m2), true, h, corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Restore(sb, 3); err == nil || !strings.Contains(err.Error(), "another model") || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("another graph's checkpoint: %v", err)
	}
}

// -train-params and -freeze pick the params; the optimizer state follows.
func TestGraphSourceParams(t *testing.T) {
	cfg := testConfig(t, graph.Float32)
	spec := GraphSpec{File: "tiny.txt", SHA256: strings.Repeat("ab", 32), Loss: LossNextToken,
		TrainParams: []string{"layers.*"}, Freeze: []string{"layers.*.w_*"}}
	m, err := PrepareGraph(tinyLogits(t, cfg), spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Params {
		if !strings.HasPrefix(p, "layers.") || strings.Contains(p, ".w_") {
			t.Errorf("%s trained", p)
		}
	}
	for _, p := range []string{"tok_emb", "lm_head", "layers.0.w_up"} {
		if m.Frozen[p] == "" {
			t.Errorf("%s not frozen: %v", p, m.Frozen)
		}
	}
	gs, err := BuildSourceGraphs(cpu.New(), GraphSource(m), true, testHyper(1))
	if err != nil {
		t.Fatal(err)
	}
	if len(gs.Step.Params) != len(m.Params) || len(gs.Step.Updates) != 3*len(m.Params) {
		t.Fatalf("step trains %d params with %d updates, want %d", len(gs.Step.Params), len(gs.Step.Updates), len(m.Params))
	}
}

// TestSourceSpec: the one reader of a checkpoint's source record (resume,
// generate, export and the restore check) refuses a damaged one.
func TestSourceSpec(t *testing.T) {
	if spec, err := sourceSpec(map[string]string{"config": "{}"}); spec != nil || err != nil {
		t.Errorf("built-in model: %v, %v", spec, err)
	}
	if spec, err := sourceSpec(map[string]string{MetaSource: `{"file":"m.onnx","sha256":"ab"}`}); err != nil || spec.File != "m.onnx" {
		t.Errorf("a record: %+v, %v", spec, err)
	}
	for _, raw := range []string{"{", `{"file":"m.onnx"}`} {
		if _, err := sourceSpec(map[string]string{MetaSource: raw}); err == nil || !strings.Contains(err.Error(), "damaged source record") {
			t.Errorf("%s: %v", raw, err)
		}
	}
}
