package onnx

import "github.com/flashgraph/flashgraph/graph"

// constParams turns the params no gradient can reach into consts. An
// initializer that looked like a weight (finite, moderate, more than one
// element) may still only feed a boolean or integer value: a registered
// causal-mask buffer cast to bool for a Where condition (GPT-2's tril
// "bias"), a position table cast to int64 for a Gather. Training cannot
// change it, so it is a constant of the model; as a param it would also
// keep the attention fusion from reading the mask ("... is a trainable
// param, not a constant"). Our own exports say which initializers are
// params and are left as they are.
func (im *importer) constParams() {
	if im.faithful {
		return
	}
	reach := graph.GradientReach(im.g, nil)
	for _, e := range im.inits {
		if v := e.v; v != nil && v.Kind == graph.Param && !reach[v] {
			v.Kind = graph.Const
		}
	}
}
