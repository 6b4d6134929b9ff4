package train

import (
	"os"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

func TestZZDump(t *testing.T) {
	cfg, _ := model.Lookup("gpt2")
	cfg.Layers = 2
	g, err := buildGraphs(cfg, true, Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, WeightDecay: 0.1}, true)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile("/tmp/step2.txt", []byte(graph.Format(g.Step.Graph)), 0o644)
}
