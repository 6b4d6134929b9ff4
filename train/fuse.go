package train

import (
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// compileGraph runs the compile pipeline on a forward graph: with fuse, the
// attention fusion (canonicalize, fuse_attention, dce); without, only the
// checks that leave the graph byte-identical to the graph as built. It is
// the same pipeline `flashgraph compile` runs, so the graph trained is the
// graph that command shows. With fuseQKV, fuse_qkv follows (the q/k/v
// projections as one GEMM; compile -passes ...,fuse_qkv shows it).
func compileGraph(g *graph.Graph, fuse, fuseQKV bool) (*graph.Graph, error) {
	return CompilePipeline(fuse, fuseQKV).Run(g, nil)
}

// CompilePipeline is the pipeline a forward graph is trained through:
// passes.Default(fuse), then fuse_qkv when asked (Hyper.FuseQKV).
func CompilePipeline(fuse, fuseQKV bool) passes.Pipeline {
	pl := passes.Default(fuse)
	if fuseQKV {
		pl.Name += "+" + passes.PassFuseQKV
		pl.Passes = append(pl.Passes, passes.FuseQKV())
	}
	return pl
}
