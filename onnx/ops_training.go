package onnx

import "github.com/flashgraph/flashgraph/graph"

// trainingOp imports a node of ONNX's ai.onnx.preview.training domain
// (opset 1). Its optimizer steps, Adagrad, Adam and Momentum, are
// deterministic functions of their inputs and rows of the op table
// (graph/ops_training.go) with ONNX's inputs, outputs and attributes, so a
// node maps to one node of the same name. Gradient, which names a part of
// the graph to differentiate rather than computing from its inputs, is not
// imported.
func (c *opCtx) trainingOp() error {
	s, ok := graph.LookupOp(c.n.OpType)
	if !ok || s.Domain != graph.DomainONNXTraining {
		return c.errf("op is not supported")
	}
	if c.ver != 1 {
		return c.errf("opset %d of the domain is not read (only 1)", c.ver)
	}
	for i, e := range c.in {
		if e == nil {
			continue
		}
		// The graph holds a narrow integer as int64; T must be INT64 itself.
		if dt, _ := e.typ(); isNarrowInt(dt) {
			return c.errf("input %d is %v: R and the tensors are float, T is INT64", i, dt)
		}
	}
	if err := directAttrs(s)(c); err != nil {
		return err
	}
	return c.checkAttrs()
}
