package onnx

import (
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Optionals, like sequences, are import-time values: an optional entry holds
// the entry of its value (a tensor or a sequence) or nothing, and whether it
// holds one is known at import (graph inputs: Options.Absent; see
// boundary.go). So OptionalHasElement folds to a constant, and
// OptionalGetElement is its value; neither becomes a node. From opset 18 both
// also accept a tensor or a sequence, which holds a value.
//
// Optional without an input makes an empty optional of the type its "type"
// attribute gives (a tensor or a sequence of tensors type).

func init() {
	nonTensorOps = map[string]handler{"Identity": importIdentityNonTensor, "Loop": importLoop}
}

// nonTensorOps are the ops outside the sequence and optional ops that may
// read a sequence or an optional (dispatch sends them those; tensors go the
// usual way): Identity passes one on, Loop carries one from iteration to
// iteration.
var nonTensorOps map[string]handler

// alias makes ONNX output i the sequence or optional e, under the output's
// name.
func (c *opCtx) alias(i int, e *entry) {
	cp := *e
	cp.name = c.n.Output[i]
	c.out[i] = &cp
}

func importIdentityNonTensor(c *opCtx) error {
	c.alias(0, c.input(0))
	return nil
}

func importOptional(c *opCtx) error {
	typ, err := c.attr("type", onnxpb.AttrTypeProto)
	if err != nil {
		return err
	}
	e := c.input(0)
	if e == nil {
		// The empty optional; its type says of what, which an import-time
		// optional holding nothing does not need beyond checking it.
		switch {
		case typ == nil:
			return c.errf("an empty Optional needs its type attribute")
		case typ.TP.Tensor == nil && !(typ.TP.IsSequence() && typ.TP.Elem != nil && typ.TP.Elem.Tensor != nil):
			return c.errf("type %s: only optionals of tensors and of sequences of tensors are supported", typ.TP.TypeKind())
		}
		c.out[0] = &entry{name: c.n.Output[0], isOpt: true}
		return nil
	}
	if e.isOpt {
		return c.errf("an optional of an optional is not supported")
	}
	c.out[0] = &entry{name: c.n.Output[0], isOpt: true, opt: e}
	return nil
}

func importOptionalHasElement(c *opCtx) error {
	e := c.input(0)
	has := e != nil && (!e.isOpt || e.opt != nil)
	if e == nil && c.ver < 18 {
		return c.errf("needs an input before opset 18")
	}
	if e != nil && !e.isOpt && c.ver < 18 {
		return c.errf("input must be an optional before opset 18")
	}
	var b int64
	if has {
		b = 1
	}
	return c.setOutput(0, &entry{c: &cval{dt: onnxpb.Bool, shape: graph.Shape{}, i: []int64{b}}})
}

func importOptionalGetElement(c *opCtx) error {
	e := c.input(0)
	switch {
	case e == nil:
		return c.errf("needs an input")
	case e.isOpt && e.opt == nil:
		return c.errf("the optional %q holds no value (known at import)", e.name)
	case e.isOpt:
		e = e.opt
	case c.ver < 18:
		return c.errf("input must be an optional before opset 18")
	}
	if e.nonTensor() {
		c.alias(0, e)
		return nil
	}
	return c.setOutput(0, e)
}
