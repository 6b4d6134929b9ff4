package passes

import (
	"github.com/flashgraph/flashgraph/graph"
)

// Explanation says what fuse_attention did with one Softmax.
type Explanation struct {
	Softmax string // the Softmax node's name
	Fused   bool
	Rule    string // the rule that fused it, or that refused it ("" when none matched)
	Into    string // the FlashAttention node it became part of
	Detail  string // the fused node's attributes, "{causal=1, scale=0.125}"
	Reason  string // why it was not fused
}

func (x Explanation) String() string {
	if x.Fused {
		return x.Softmax + ": fused into " + x.Into + " " + x.Detail + " by " + x.Rule
	}
	return x.Softmax + ": not fused: " + x.Reason
}

// Explain runs the fusion pipeline (Default(true)) on g and says, for every
// Softmax of g in graph order, whether it was fused and why not.
func Explain(g *graph.Graph) ([]Explanation, error) {
	log := &Log{}
	if _, err := Default(true).Run(g, log); err != nil {
		return nil, err
	}
	return ExplainLog(g, log), nil
}

// ExplainLog reads the explanations of g's Softmax nodes off the log of a
// pipeline run on g (for tools that run their own pipeline). A Softmax the
// log does not mention was not looked at: fuse_attention was not run.
func ExplainLog(g *graph.Graph, log *Log) []Explanation {
	fired := map[string]Event{}
	refused := map[string]Event{}
	for _, e := range log.Filter(PassFuseAttention, 0) {
		switch e.Kind {
		case Fired:
			fired[e.Node] = e
		case Refused:
			// The first refusal is the first rule's: the one reported.
			if _, ok := refused[e.Node]; !ok {
				refused[e.Node] = e
			}
		}
	}
	var out []Explanation
	for _, n := range g.Nodes {
		if n.Op != "Softmax" {
			continue
		}
		x := Explanation{Softmax: n.Name}
		if e, ok := fired[n.Name]; ok {
			x.Fused, x.Rule, x.Into, x.Detail = true, e.Rule, e.Result, e.Detail
		} else if e, ok := refused[n.Name]; ok {
			x.Rule, x.Reason = e.Rule, e.Reason
			if e.Rule == "" {
				x.Reason = "not an attention pattern: " + e.Reason
			}
		} else {
			x.Reason = "fuse_attention did not run"
		}
		out = append(out, x)
	}
	return out
}
