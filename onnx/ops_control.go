package onnx

import (
	"slices"

	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// If is imported when its condition is known at import time (a constant, a
// value folded from static shapes, or a bound input): the chosen branch's
// nodes are imported in place and its outputs become the If's. A condition
// known only at run time is refused: a static graph has one set of nodes.

func init() {
	handlers["If"] = importIf
}

func importIf(c *opCtx) error {
	cond, err := c.constInput(0, "cond")
	if err != nil {
		return err
	}
	if cond == nil || cond.n() != 1 {
		return c.errf("cond: want one value")
	}
	then, err := c.attr("then_branch", onnxpb.AttrGraph)
	if err != nil {
		return err
	}
	els, err := c.attr("else_branch", onnxpb.AttrGraph)
	if err != nil {
		return err
	}
	branch := els
	if cond.at(0) != 0 {
		branch = then
	}
	if branch == nil || branch.G == nil {
		return c.errf("needs then_branch and else_branch")
	}
	return c.inline(branch.G)
}

// inline imports subgraph g's initializers and nodes into the model being
// imported (they read the outer values by name) and makes its outputs the
// node's. A subgraph name that shadows an outer one is refused.
func (c *opCtx) inline(g *onnxpb.Graph) error {
	im := c.im
	if len(g.Output) != len(c.n.Output) {
		return c.errf("the branch has %d outputs, the node %d", len(g.Output), len(c.n.Output))
	}
	for _, t := range g.Initializer {
		if _, dup := im.env[t.Name]; dup {
			return c.errf("branch initializer %q shadows an outer value, which is not supported", t.Name)
		}
		cv, err := cvalFromTensor(t)
		if err != nil {
			return c.errf("branch initializer %q: %v", t.Name, err)
		}
		e := &entry{name: t.Name, c: cv, seq: im.nextSeq}
		im.nextSeq++
		im.inits = append(im.inits, e)
		im.env[t.Name] = e
	}
	for _, n := range g.Node {
		for _, o := range n.Output {
			if _, dup := im.env[o]; dup && o != "" {
				return c.errf("branch value %q shadows an outer value, which is not supported", o)
			}
		}
		if err := im.node(n); err != nil {
			return err
		}
	}
	for i, o := range g.Output {
		e, ok := im.env[o.Name]
		if !ok {
			return c.errf("branch output %q is not produced", o.Name)
		}
		isOutput := slices.ContainsFunc(im.m.Graph.Output, func(v *onnxpb.ValueInfo) bool { return v.Name == c.n.Output[i] })
		if isOutput && e.c == nil {
			// A graph output takes the If's name: a node writes it.
			v, err := im.val(e)
			if err != nil {
				return c.errf("%v", err)
			}
			if err := c.emitOutput(i, "Identity", nil, v); err != nil {
				return err
			}
			continue
		}
		if e.c != nil { // a constant, known under the If's name
			e = &entry{name: c.n.Output[i], c: e.c, seq: im.nextSeq}
			im.nextSeq++
			im.inits = append(im.inits, e)
		}
		c.out[i] = e
	}
	return nil
}
