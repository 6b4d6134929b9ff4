package generate

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// Graphs are the graphs Generate compiles for a promptLen-token prompt and
// maxNew new tokens (the prefill, and the decode graph when maxNew > 1),
// as built (before the passes): what a memory plan of the generation reads.
func Graphs(cfg model.Config, promptLen, maxNew int) ([]*graph.Graph, error) {
	p, err := model.BuildPrefill(cfg, promptLen)
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	gs := []*graph.Graph{p}
	if maxNew > 1 {
		d, err := model.BuildDecode(cfg, cfg.Seq)
		if err != nil {
			return nil, fmt.Errorf("generate: %w", err)
		}
		gs = append(gs, d)
	}
	return gs, nil
}
