package onnx

import "github.com/flashgraph/flashgraph/graph"

// rewrite is one ONNX node's import written as straight-line steps (read
// attributes and inputs, emit nodes) that keeps the first error, the way
// bufio.Writer does: once a step fails, the later ones do nothing and
// return zero values, and the handler checks err once, at the end. The
// error is the one the first failing step gives, so the steps run in the
// order the checks used to. A value a failed step returns is nil: code that
// looks inside a value (its type or shape) checks err before it does.
type rewrite struct {
	c   *opCtx
	err error
}

func (c *opCtx) rewrite() *rewrite { return &rewrite{c: c} }

// step runs f unless an earlier step failed, and keeps its error.
func step[T any](r *rewrite, f func() (T, error)) T {
	if r.err != nil {
		var zero T
		return zero
	}
	v, err := f()
	r.err = err
	return v
}

// fail records err unless an earlier step already failed.
func (r *rewrite) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *rewrite) attrInt(name string, def int64) int64 {
	if r.err != nil {
		return def
	}
	v, err := r.c.attrInt(name, def)
	r.err = err
	return v
}

func (r *rewrite) attrFloat(name string, def float64) float64 {
	if r.err != nil {
		return def
	}
	v, err := r.c.attrFloat(name, def)
	r.err = err
	return v
}

func (r *rewrite) attrString(name, def string) string {
	if r.err != nil {
		return def
	}
	v, err := r.c.attrString(name, def)
	r.err = err
	return v
}

func (r *rewrite) attrInts(name string) ([]int64, bool) {
	if r.err != nil {
		return nil, false
	}
	v, ok, err := r.c.attrInts(name)
	r.err = err
	return v, ok
}

func (r *rewrite) need(i int) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.need(i) })
}

func (r *rewrite) value(i int) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.value(i) })
}

func (r *rewrite) constInput(i int, what string) *cval {
	return step(r, func() (*cval, error) { return r.c.constInput(i, what) })
}

// sub adds an intermediate node (opCtx.sub).
func (r *rewrite) sub(op string, attrs graph.Attrs, in ...*graph.Value) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.sub(op, attrs, in...) })
}

// reduce adds a table reduction (opCtx.reduce).
func (r *rewrite) reduce(op string, x, axes *graph.Value, keep int64) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.reduce(op, x, axes, keep) })
}

func (r *rewrite) ints(what string, vals []int64) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.ints(what, vals) })
}

func (r *rewrite) scalar(what string, dt graph.DType, v float64) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.scalar(what, dt, v) })
}

// emit adds the node that produces the ONNX node's outputs (opCtx.emit).
func (r *rewrite) emit(op string, attrs graph.Attrs, in ...*graph.Value) []*graph.Value {
	return step(r, func() ([]*graph.Value, error) { return r.c.emit(op, attrs, in...) })
}

// emitOutput adds a node that produces ONNX output i alone (opCtx.emitOutput).
func (r *rewrite) emitOutput(i int, op string, attrs graph.Attrs, in ...*graph.Value) {
	if r.err == nil {
		r.err = r.c.emitOutput(i, op, attrs, in...)
	}
}

// emitReshape writes the node's output as y reshaped (opCtx.emitReshape).
func (r *rewrite) emitReshape(y *graph.Value, shape []int64) {
	if r.err == nil {
		r.err = r.c.emitReshape(y, shape)
	}
}

// indices reads input i as int64 indices (opCtx.indicesValue).
func (r *rewrite) indices(i int) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.indicesValue(i) })
}

// dims64 is s as the int64 dimensions of a shape operand.
func dims64(s graph.Shape) []int64 {
	dims := make([]int64, len(s))
	for i, d := range s {
		dims[i] = int64(d)
	}
	return dims
}

// as2D reshapes x to [dims before axis a, dims from a], the 2-D form opsets
// before 13 gave Softmax, LogSoftmax and Hardmax.
func (r *rewrite) as2D(x *graph.Value, a int) *graph.Value {
	if r.err != nil {
		return nil
	}
	s := x.Type.Shape
	return r.sub("Reshape", nil, x, r.ints("shape2d", []int64{int64(s[:a].Numel()), int64(s[a:].Numel())}))
}

// values reads every input, nil for omitted ones (opCtx.values).
func (r *rewrite) values() []*graph.Value {
	return step(r, func() ([]*graph.Value, error) { return r.c.values() })
}

// axesValue reads the axes operand (opCtx.axesValue).
func (r *rewrite) axesValue(i int, since int64) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.axesValue(i, since) })
}

// slice is v[lo:hi] along axis, a Slice with constant starts, ends and axes
// (made in that order); it returns the axes operand too, for a Squeeze.
func (r *rewrite) slice(v *graph.Value, axis, lo, hi int64) (s, axes *graph.Value) {
	st := r.ints("starts", []int64{lo})
	en := r.ints("ends", []int64{hi})
	axes = r.ints("axes", []int64{axis})
	return r.sub("Slice", nil, v, st, en, axes), axes
}

// pick is v's entry pos along axis, the axis dropped.
func (r *rewrite) pick(v *graph.Value, pos, axis int64) *graph.Value {
	s, axes := r.slice(v, axis, pos, pos+1)
	return r.sub("Squeeze", nil, s, axes)
}

// val is entry e as a graph value (a constant made one), its error naming
// the node.
func (r *rewrite) val(e *entry) *graph.Value {
	if r.err != nil {
		return nil
	}
	v, err := r.c.im.val(e)
	if err != nil {
		r.err = r.c.errf("%v", err)
	}
	return v
}

// tableAttrs reads the attributes the op table declares for s (opCtx.tableAttrs).
func (r *rewrite) tableAttrs(s *graph.OpSpec) graph.Attrs {
	return step(r, func() (graph.Attrs, error) { return r.c.tableAttrs(s) })
}

// softmaxAxis reads the axis of Softmax, LogSoftmax and Hardmax: 1 by
// default before opset 13 (when they flattened their input to 2-D there),
// −1 from 13.
func (r *rewrite) softmaxAxis() int64 {
	def := int64(-1)
	if r.c.ver < 13 {
		def = 1
	}
	return r.attrInt("axis", def)
}

// optionalOutput writes ONNX output i as v (through an Identity) when the
// model reads it, and reports whether it did.
func (r *rewrite) optionalOutput(i int, v *graph.Value) bool {
	if r.err != nil || !r.c.outputUsed(i) {
		return false
	}
	r.emitOutput(i, "Identity", nil, v)
	return r.err == nil
}
