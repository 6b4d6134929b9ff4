package main

import (
	"fmt"
	"io"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
	"github.com/flashgraph/flashgraph/train"
)

// fuseQKVHelp is -fuse-qkv's help, shared by train and compile.
const fuseQKVHelp = "merge the MatMuls that share an input, attention's q, k and v projections, into one GEMM against their concatenated weights (pass fuse_qkv, after the attention fusion); the params and checkpoints keep the three weights. Off by default until it measures faster on the GPU; on the CPU the sums round differently"

// explainFuseQKV prints, for train -explain, what fuse_qkv does to the
// fused forward graph g: each merge and each refusal, or that it is off.
func explainFuseQKV(w io.Writer, g *graph.Graph, on bool) error {
	if !on {
		fmt.Fprintln(w, "fuse_qkv: off (-fuse-qkv merges the q, k and v projections into one GEMM)")
		return nil
	}
	log := &passes.Log{}
	if _, err := train.CompilePipeline(true, true).Run(g, log); err != nil {
		return err
	}
	evs := log.Filter(passes.PassFuseQKV, passes.Fired)
	fmt.Fprintf(w, "fuse_qkv: %d merged\n", len(evs))
	for _, e := range append(evs, log.Filter(passes.PassFuseQKV, passes.Refused)...) {
		fmt.Fprintf(w, "  %s\n", e)
	}
	return nil
}
