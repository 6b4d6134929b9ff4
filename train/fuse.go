package train

import (
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// compileGraph runs the compile pipeline on a forward graph: with fuse, the
// attention fusion (canonicalize, fuse_attention, dce); without, only the
// checks that leave the graph byte-identical to the graph as built. It is
// the same pipeline `flashgraph compile` runs, so the graph trained is the
// graph that command shows.
func compileGraph(g *graph.Graph, fuse bool) (*graph.Graph, error) {
	return passes.Default(fuse).Run(g, nil)
}
