package passes

import (
	"fmt"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// UnfusedError says that attention fusion was required and which attention
// Softmax nodes the pipeline left composed, each with the reason
// fuse_attention gave (like PyTorch's sdpa_kernel(FLASH_ATTENTION) listing
// why each backend was refused, instead of silently running the math path).
type UnfusedError struct {
	Attention int           // attention Softmax nodes in the graph
	Unfused   []Explanation // those left unfused, in graph order
}

func (e *UnfusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "attention fusion required, but %d of %d attention Softmax nodes were left unfused:", len(e.Unfused), e.Attention)
	for _, x := range e.Unfused {
		b.WriteString("\n  " + x.Softmax + ": " + x.Reason)
	}
	return b.String()
}

// RequireFused runs the fusion pipeline on g and returns an *UnfusedError
// when an attention Softmax of g is left unfused.
func RequireFused(g *graph.Graph) error {
	log := &Log{}
	if _, err := Default(true).Run(g, log); err != nil {
		return err
	}
	return RequireFusedLog(g, log)
}

// RequireFusedLog is RequireFused for a pipeline already run on g with log
// (which may not include fuse_attention: then every attention Softmax is
// reported as not looked at).
func RequireFusedLog(g *graph.Graph, log *Log) error {
	attn := map[string]bool{}
	for _, n := range attentionSoftmaxes(g) {
		attn[n.Name] = true
	}
	e := &UnfusedError{Attention: len(attn)}
	for _, x := range ExplainLog(g, log) {
		if attn[x.Softmax] && !x.Fused {
			e.Unfused = append(e.Unfused, x)
		}
	}
	if len(e.Unfused) > 0 {
		return e
	}
	return nil
}

// attentionSoftmaxes are the Softmax nodes of g that compute attention: their
// scores come from a MatMul and their probabilities go into one, each through
// at most a few other ops (scale, mask, cast, dropout). A Softmax that is not
// between two products (a classifier's output, a gate) is not attention, and
// fusion cannot be required of it.
func attentionSoftmaxes(g *graph.Graph) []*graph.Node {
	uses := g.Uses()
	const depth = 4
	var fromMatMul func(v *graph.Value, d int) bool
	fromMatMul = func(v *graph.Value, d int) bool {
		n := v.Producer
		if n == nil || d > depth {
			return false
		}
		if n.Op == "MatMul" || n.Op == "Gemm" {
			return true
		}
		for _, in := range n.Inputs {
			if in != nil && fromMatMul(in, d+1) {
				return true
			}
		}
		return false
	}
	var intoMatMul func(v *graph.Value, d int) bool
	intoMatMul = func(v *graph.Value, d int) bool {
		if d > depth {
			return false
		}
		for _, u := range uses[v] {
			if u.Op == "MatMul" || u.Op == "Gemm" {
				return true
			}
			for _, o := range u.Outputs {
				if intoMatMul(o, d+1) {
					return true
				}
			}
		}
		return false
	}
	var out []*graph.Node
	for _, n := range g.Nodes {
		if n.Op == "Softmax" && len(n.Inputs) > 0 && fromMatMul(n.Inputs[0], 0) && intoMatMul(n.Outputs[0], 0) {
			out = append(out, n)
		}
	}
	return out
}
