package onnx

import (
	"slices"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Sequences of tensors inside a model (between tensor inputs and outputs)
// are import-time lists: a sequence value is the list of its tensors, each
// a graph value or a constant, and the sequence ops edit the list when their
// positions are known (constants, or bound inputs). A sequence never becomes
// a graph value; ConcatFromSequence, SequenceAt and SequenceLength turn one
// back into tensors, and a graph input or output of sequence type is one
// tensor per element (boundary.go).

var sequenceOps map[string]handler

func init() {
	sequenceOps = map[string]handler{
		"SequenceEmpty": importSequenceEmpty, "SequenceConstruct": importSequenceConstruct,
		"SequenceInsert": importSequenceInsert, "SequenceErase": importSequenceErase,
		"SequenceAt": importSequenceAt, "SequenceLength": importSequenceLength,
		"ConcatFromSequence": importConcatFromSequence, "SplitToSequence": importSplitToSequence,
		"SequenceMap": importSequenceMap,
		// Optionals are import-time values too (ops_optional.go).
		"Optional": importOptional, "OptionalHasElement": importOptionalHasElement,
		"OptionalGetElement": importOptionalGetElement,
	}
	for op := range sequenceOps {
		introduced[op] = 11
	}
	introduced["SequenceMap"] = 17
	introduced["Optional"] = 15
	introduced["OptionalHasElement"] = 15
	introduced["OptionalGetElement"] = 15
}

// list reads input i as a sequence.
func (c *opCtx) list(i int) ([]*entry, error) {
	e := c.input(i)
	if e == nil || !e.isList {
		return nil, c.errf("input %d must be a sequence", i)
	}
	return e.list, nil
}

// setList makes output 0 the sequence l.
func (c *opCtx) setList(l []*entry) {
	c.out[0] = &entry{name: c.n.Output[0], list: l, isList: true}
}

// position reads optional input i, a position in a sequence of n (negative
// counts from the end), in [0, n] when insert else [0, n); absent: def.
func (c *opCtx) position(i, n, def int, insert bool) (int, error) {
	if c.input(i) == nil {
		return def, nil
	}
	p, err := c.constScalar(i, "position", 0)
	if err != nil {
		return 0, err
	}
	hi := n
	if insert {
		hi++
	}
	if p < 0 {
		p += int64(n)
	}
	if p < 0 || p >= int64(hi) {
		return 0, c.errf("position %d out of range for a sequence of %d", p, n)
	}
	return int(p), nil
}

func importSequenceEmpty(c *opCtx) error {
	if _, err := c.attrInt("dtype", int64(onnxpb.Float)); err != nil {
		return err
	}
	c.setList(nil)
	return nil
}

func importSequenceConstruct(c *opCtx) error {
	l := make([]*entry, len(c.in))
	for i, e := range c.in {
		if e == nil || e.isList {
			return c.errf("input %d must be a tensor", i)
		}
		l[i] = e
	}
	c.setList(l)
	return nil
}

func importSequenceInsert(c *opCtx) error {
	l, err := c.list(0)
	if err != nil {
		return err
	}
	t := c.input(1)
	if t == nil || t.isList {
		return c.errf("input 1 must be a tensor")
	}
	p, err := c.position(2, len(l), len(l), true)
	if err != nil {
		return err
	}
	c.setList(slices.Insert(slices.Clone(l), p, t))
	return nil
}

func importSequenceErase(c *opCtx) error {
	l, err := c.list(0)
	if err != nil {
		return err
	}
	if len(l) == 0 {
		return c.errf("erase from an empty sequence")
	}
	p, err := c.position(1, len(l), len(l)-1, false)
	if err != nil {
		return err
	}
	c.setList(slices.Delete(slices.Clone(l), p, p+1))
	return nil
}

// importSequenceAt makes the output the tensor at the position, under the
// output's name (a graph output gets a node writing it).
func importSequenceAt(c *opCtx) error {
	l, err := c.list(0)
	if err != nil {
		return err
	}
	if c.input(1) == nil {
		return c.errf("needs a position")
	}
	p, err := c.position(1, len(l), 0, false)
	if err != nil {
		return err
	}
	e := l[p]
	isOutput := slices.ContainsFunc(c.im.m.Graph.Output, func(v *onnxpb.ValueInfo) bool { return v.Name == c.n.Output[0] })
	if isOutput || e.c != nil {
		return c.setOutput(0, e)
	}
	c.out[0] = e
	return nil
}

func importSequenceLength(c *opCtx) error {
	l, err := c.list(0)
	if err != nil {
		return err
	}
	return c.setOutput(0, &entry{c: &cval{dt: onnxpb.Int64, shape: graph.Shape{}, i: []int64{int64(len(l))}}})
}

// importConcatFromSequence concatenates the tensors along axis, or stacks
// them on a new axis (new_axis=1).
func importConcatFromSequence(c *opCtx) error {
	l, err := c.list(0)
	if err != nil {
		return err
	}
	if !c.has("axis") {
		return c.errf("axis is required")
	}
	r := c.rewrite()
	axis := r.attrInt("axis", 0)
	newAxis := r.attrInt("new_axis", 0)
	if r.err != nil {
		return r.err
	}
	if len(l) == 0 {
		return c.errf("concatenating an empty sequence (its shape would be unknown)")
	}
	if newAxis != 0 {
		_, s := l[0].typ()
		a, err := graph.NormAxis(int(axis), s.Rank()+1)
		if err != nil {
			return c.errf("axis: %v", err)
		}
		return c.stack(0, l, int64(a), false)
	}
	vs := make([]*graph.Value, len(l))
	for i, e := range l {
		vs[i] = r.val(e)
	}
	if r.emit("Concat", graph.Attrs{"axis": graph.Int(axis)}, vs...); r.err != nil {
		return r.err
	}
	if c.out[0] != nil {
		c.out[0].odt = l[0].odt // a narrow integer type carries through
	}
	return nil
}

// importSplitToSequence splits X along axis into the sizes split gives (a
// list; one size: equal chunks, the last smaller; absent: chunks of 1,
// squeezed unless keepdims).
func importSplitToSequence(c *opCtx) error {
	r := c.rewrite()
	axis := r.attrInt("axis", 0)
	keep := r.attrInt("keepdims", 1)
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	s := x.Type.Shape
	a, err := graph.NormAxis(int(axis), s.Rank())
	if err != nil {
		return c.errf("axis: %v", err)
	}
	dim := int64(s[a])
	var sizes []int64
	squeeze := false
	switch sv, err := c.constInput(1, "split"); {
	case err != nil:
		return err
	case sv == nil:
		for range dim {
			sizes = append(sizes, 1)
		}
		squeeze = keep == 0
	case sv.n() == 1 && sv.shape.Rank() == 0:
		k := sv.i[0]
		if k <= 0 {
			return c.errf("split %d: want a positive size", k)
		}
		for at := int64(0); at < dim; at += k {
			sizes = append(sizes, min(k, dim-at))
		}
	default:
		if sizes, err = sv.ints(); err != nil {
			return c.errf("split: %v", err)
		}
		var total int64
		for _, n := range sizes {
			if n < 0 {
				return c.errf("split %v has a negative size", sizes)
			}
			total += n
		}
		if total != dim {
			return c.errf("split %v does not cover axis %d of %d", sizes, a, dim)
		}
	}
	ax := r.ints("axes", []int64{int64(a)})
	var l []*entry
	var start int64
	for _, n := range sizes {
		v := r.sub("Slice", nil, x, r.ints("starts", []int64{start}), r.ints("ends", []int64{start + n}), ax)
		start += n
		if squeeze {
			v = r.sub("Squeeze", nil, v, ax)
		}
		if r.err != nil {
			return r.err
		}
		l = append(l, &entry{name: v.Name, v: v, odt: c.in[0].odt})
	}
	c.setList(l)
	return nil
}

// importSequenceMap unrolls the body over the sequence's elements: body
// input k is element i of input k where that is a sequence (all of the
// sequence's length), else input k itself; body output k's values form
// output sequence k.
func importSequenceMap(c *opCtx) error {
	g, err := c.loopBody()
	if err != nil {
		return err
	}
	seq, err := c.list(0)
	if err != nil {
		return err
	}
	n := len(seq)
	for k, e := range c.in {
		switch {
		case e == nil:
			return c.errf("input %d is omitted", k)
		case e.isOpt:
			return c.errf("input %d is an optional; SequenceMap reads sequences and tensors", k)
		case e.isList && len(e.list) != n:
			return c.errf("input %d has %d elements, input 0 has %d", k, len(e.list), n)
		}
	}
	if len(g.Output) != len(c.n.Output) {
		return c.errf("the body has %d outputs, the node %d", len(g.Output), len(c.n.Output))
	}
	outs := make([][]*entry, len(g.Output))
	for i := range n {
		in := make([]*entry, len(c.in))
		for k, e := range c.in {
			in[k] = e
			if e.isList {
				in[k] = e.list[i]
			}
		}
		out, err := c.body(g, in, i)
		if err != nil {
			return err
		}
		for k, e := range out {
			if e.nonTensor() {
				return c.errf("body output %d is not a tensor", k)
			}
			outs[k] = append(outs[k], e)
		}
	}
	for k, l := range outs {
		c.out[k] = &entry{name: c.n.Output[k], list: l, isList: true}
	}
	return nil
}
