package onnx

import (
	"slices"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// trainingOp imports a node of ONNX's ai.onnx.preview.training domain
// (opset 1). Its optimizer steps, Adagrad, Adam and Momentum, are
// deterministic functions of their inputs and rows of the op table
// (graph/ops_training.go) with ONNX's inputs, outputs and attributes, so a
// node maps to one node of the same name. Gradient names a part of the
// graph to differentiate; importGradient differentiates it.
func (c *opCtx) trainingOp() error {
	if c.n.OpType == "Gradient" && c.ver == 1 {
		if err := c.importGradient(); err != nil {
			return err
		}
		return c.checkAttrs()
	}
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

// importGradient imports Gradient in the form whose inputs are the tensors
// its xs and zs attributes name, in that order: the spec's outputs are
// then dy/dx for each x of xs at the values the graph computes, which is
// reverse-mode differentiation of the nodes imported so far (autodiff,
// the same rules the training step uses). Inputs other than those tensors
// (the gradient at other values: the subgraph evaluated anew) are refused,
// as are a y that is not a float scalar and ops without a gradient rule.
func (c *opCtx) importGradient() error {
	xs, err := c.attrNames("xs")
	if err != nil {
		return err
	}
	if len(xs) == 0 {
		return c.errf("xs is required")
	}
	zs, err := c.attrNames("zs")
	if err != nil {
		return err
	}
	y, err := c.attrString("y", "")
	if err != nil {
		return err
	}
	if y == "" {
		return c.errf("y is required")
	}
	names := append(slices.Clone(xs), zs...)
	if !slices.Equal(c.n.Input, names) {
		return c.errf("inputs %q are not the tensors of xs and zs %q: the gradient at other values is not supported", c.n.Input, names)
	}
	if len(c.n.Output) > len(xs) {
		return c.errf("%d outputs for %d tensors in xs", len(c.n.Output), len(xs))
	}
	in, err := c.values()
	if err != nil {
		return err
	}
	ye, ok := c.im.env[y]
	if !ok {
		return c.errf("y %q is not defined before this node", y)
	}
	yv, err := c.im.val(ye)
	if err != nil {
		return c.errf("y: %v", err)
	}
	// The graph so far, its initializers listed (the import lists them
	// at the end), y its output.
	g := &graph.Graph{Name: c.im.g.Name, Inputs: c.im.g.Inputs, Nodes: c.im.g.Nodes, Outputs: []*graph.Value{yv}}
	inits := map[string]bool{}
	for _, e := range c.im.inits {
		if v := e.v; v != nil && !inits[v.Name] {
			inits[v.Name] = true
			if v.Kind == graph.Param {
				g.Params = append(g.Params, v)
			} else {
				g.Consts = append(g.Consts, v)
			}
		}
	}
	wrt := make([]string, len(xs))
	for i := range xs {
		wrt[i] = in[i].Name
	}
	gg, grads, err := autodiff.Gradients(g, yv.Name, wrt)
	if err != nil {
		return c.errf("%v", err)
	}
	// gg is a copy of g with the backward nodes after g's: map its copies of
	// g's values back, and take its new values, constants and nodes in.
	if len(gg.Nodes) < len(g.Nodes) {
		return c.errf("internal error: differentiation dropped nodes")
	}
	orig := g.Values()
	for _, v := range g.Consts {
		orig[v.Name] = v
	}
	mapped := map[*graph.Value]*graph.Value{}
	mapv := func(v *graph.Value) *graph.Value {
		if v == nil {
			return nil
		}
		if m, ok := mapped[v]; ok {
			return m
		}
		m := v
		if o, ok := orig[v.Name]; ok {
			m = o
		} else if !c.im.values.Reserve(v.Name) {
			v.Name = c.im.values.Fresh(v.Name)
		}
		mapped[v] = m
		return m
	}
	for k, n := range gg.Nodes[:len(g.Nodes)] {
		if n.Name != g.Nodes[k].Name {
			return c.errf("internal error: differentiation reordered the forward nodes")
		}
	}
	for _, v := range append(slices.Clone(gg.Consts), gg.Params...) {
		if _, ok := orig[v.Name]; ok {
			continue
		}
		v = mapv(v)
		e := &entry{name: v.Name, v: v, seq: c.im.nextSeq}
		c.im.nextSeq++
		c.im.inits = append(c.im.inits, e)
	}
	for _, n := range gg.Nodes[len(g.Nodes):] {
		for i, v := range n.Inputs {
			n.Inputs[i] = mapv(v)
		}
		for _, v := range n.Outputs {
			mapv(v)
		}
		if !c.im.nodes.Reserve(n.Name) {
			n.Name = c.im.nodes.Fresh(n.Name)
		}
		c.im.g.Nodes = append(c.im.g.Nodes, n)
	}
	for i, name := range c.n.Output {
		if name == "" {
			continue
		}
		gv, ok := gg.Values()[grads[wrt[i]]]
		if !ok {
			return c.errf("internal error: no gradient value for %s", xs[i])
		}
		if err := c.emitOutput(i, "Identity", nil, mapv(gv)); err != nil {
			return err
		}
	}
	return nil
}

// attrNames reads a strings attribute (nil when absent).
func (c *opCtx) attrNames(name string) ([]string, error) {
	a, err := c.attr(name, onnxpb.AttrStrings)
	if err != nil || a == nil {
		return nil, err
	}
	out := make([]string, len(a.Strings))
	for i, s := range a.Strings {
		out[i] = string(s)
	}
	return out, nil
}
