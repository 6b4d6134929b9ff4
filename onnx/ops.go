package onnx

import (
	"errors"
	"math"
	"slices"
	"strconv"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// handler imports one ONNX op whose inputs are (at least partly) runtime values.
type handler func(c *opCtx) error

var handlers map[string]handler

func init() {
	handlers = map[string]handler{
		"Pow": importPow, "MatMul": direct("MatMul"),
		"Identity": importIdentity, "Cast": importCast, "Gemm": importGemm,
		"ReduceMean": importReduce(18), "ReduceMax": importReduce(18), "ReduceSum": importReduce(13),
		"Softmax": importSoftmax, "LogSoftmax": importSoftmax,
		"SoftmaxCrossEntropyLoss": importSCELoss,
		"Transpose":               importTranspose, "Reshape": importReshape, "Concat": importConcat,
		"Slice": importSlice, "Unsqueeze": importUnsqueeze, "Squeeze": importSqueeze,
		"Expand": importExpand, "Gather": importGather, "Trilu": importTrilu, "Split": importSplit,
		"LayerNormalization": importLayerNorm, "RMSNormalization": importRMSNorm,
		"Gelu": importGelu, "Attention": importAttention,
	}
	// Every elementwise op of the table has the ONNX op's name and
	// operands (Pow keeps its handler above for ONNX's mixed types).
	for _, s := range graph.ExprOps() {
		if _, ok := handlers[s.Name]; !ok && s.Domain == graph.DomainONNX {
			if s.HasExprAttrs() {
				handlers[s.Name] = directAttrs(s)
			} else {
				handlers[s.Name] = direct(s.Name)
			}
		}
	}
}

// directAttrs maps an op whose expression reads attributes onto ours,
// with the attributes it declares (ONNX's names, kinds and defaults).
func directAttrs(s *graph.OpSpec) handler {
	return func(c *opCtx) error {
		r := c.rewrite()
		attrs := r.tableAttrs(s)
		r.emit(s.Name, attrs, r.values()...)
		return r.err
	}
}

// tableAttrs reads the attributes the op table declares for s from the
// node (those it omits keep the table's defaults, which are ONNX's).
func (c *opCtx) tableAttrs(s *graph.OpSpec) (graph.Attrs, error) {
	attrs := graph.Attrs{}
	r := c.rewrite()
	for _, as := range s.Attrs {
		if !c.has(as.Name) {
			continue
		}
		switch as.Kind {
		case graph.AttrFloat:
			attrs[as.Name] = graph.Float(r.attrFloat(as.Name, 0))
		case graph.AttrInt:
			attrs[as.Name] = graph.Int(r.attrInt(as.Name, 0))
		case graph.AttrString:
			v := r.attrString(as.Name, "")
			if r.err == nil && as.Enum != nil && !slices.Contains(as.Enum, v) {
				r.fail(c.errf("attribute %s is %q, want one of %q", as.Name, v, as.Enum))
			}
			attrs[as.Name] = graph.Str(v)
		case graph.AttrInts:
			v, _ := r.attrInts(as.Name)
			attrs[as.Name] = graph.Ints(v...)
		case graph.AttrFloats:
			a, err := c.attr(as.Name, onnxpb.AttrFloats)
			if err != nil {
				return nil, err
			}
			f := make([]float64, len(a.Floats))
			for i, x := range a.Floats {
				f[i] = float64(x)
			}
			attrs[as.Name] = graph.Floats(f...)
		case graph.AttrStrings:
			a, err := c.attr(as.Name, onnxpb.AttrStrings)
			if err != nil {
				return nil, err
			}
			s := make([]string, len(a.Strings))
			for i, b := range a.Strings {
				s[i] = string(b)
			}
			attrs[as.Name] = graph.Strs(s...)
		default:
			r.fail(c.errf("attribute %s: kind %v is not read", as.Name, as.Kind))
		}
		if r.err != nil {
			return nil, r.err
		}
	}
	return attrs, nil
}

// introduced gives the first opset of ops added after our minimum opset: a
// model that uses one before it exists is malformed, and we say so rather than
// guess what its exporter meant.
var introduced = map[string]int64{
	"Expand": 8, "Where": 9, "Erf": 9, "ConstantOfShape": 9, "Range": 11,
	"SoftmaxCrossEntropyLoss": 12, "LessOrEqual": 12, "GreaterOrEqual": 12,
	"Trilu": 14, "LayerNormalization": 17, "Gelu": 20, "Attention": 23, "RMSNormalization": 23,
	"Sin": 7, "Cos": 7, "Tan": 7, "Asin": 7, "Acos": 7, "Atan": 7,
	"Sinh": 9, "Cosh": 9, "Asinh": 9, "Acosh": 9, "Atanh": 9, "Shrink": 9, "Sign": 9, "IsNaN": 9,
	"ThresholdedRelu": 10, "IsInf": 10, "Mod": 10, "Round": 11, "Celu": 12, "HardSwish": 14, "Mish": 18,
}

func (c *opCtx) dispatch() error {
	op := c.n.OpType
	if c.n.Domain == graph.DomainFlashgraph {
		// Our export hands our ops int64 values only (narrow types stay at
		// the boundary); a narrow operand is from elsewhere, and refused.
		for _, e := range c.in {
			if e == nil {
				continue
			}
			if dt, _ := e.typ(); isNarrowInt(dt) {
				return c.errf("integer semantics differ: %s on %v (the flashgraph domain's ops compute in int64)", op, dt)
			}
		}
		return c.ourOp()
	}
	if c.n.Domain == graph.DomainONNXTraining {
		return c.trainingOp()
	}
	if since, ok := introduced[op]; ok && c.ver < since {
		return c.errf("%s does not exist before opset %d", op, since)
	}
	if h, ok := sequenceOps[op]; ok {
		if err := h(c); err != nil {
			return err
		}
		return c.checkAttrs()
	}
	if h, ok := nonTensorOps[op]; ok && slices.ContainsFunc(c.in, (*entry).nonTensor) {
		if err := h(c); err != nil {
			return err
		}
		return c.checkAttrs()
	}
	for i, e := range c.in {
		if e != nil && e.isList {
			return c.errf("input %d is a sequence: only the sequence ops read one (sequence_type values are import-time lists)", i)
		}
		if e != nil && e.isOpt {
			return c.errf("input %d is an optional: only the optional ops read one (OptionalGetElement gives its value)", i)
		}
	}
	if f, ok := shapeOnly[op]; ok {
		outs, err := f(c)
		if err != nil {
			return err
		}
		return c.folded(outs)
	}
	// Ops outside our table fold whenever their inputs are constant; table ops
	// fold too, except when importing our own export, which must come back as built.
	_, inTable := graph.LookupOp(op)
	if f, ok := folders[op]; ok && c.allConst() && (!inTable || !c.im.faithful) {
		in := make([]*cval, len(c.in))
		for i, e := range c.in {
			if e != nil {
				in[i] = e.c
			}
		}
		outs, err := c.fold(f, in)
		switch {
		case err == nil:
			return c.folded(outs)
		case (!errors.Is(err, errTooBig) && !errors.Is(err, errNotFolded)) || !inTable:
			return err
		}
		// Too large to keep as a literal, or not a cval's to hold (text):
		// compute it at run time instead.
		clear(c.used)
	}
	h, ok := handlers[op]
	if !ok {
		if _, foldable := folders[op]; foldable {
			err := c.errf("op is supported only on constant inputs (it is not in flashgraph's op table)")
			for _, e := range c.in {
				if in := sourceInput(e); in != "" {
					return &BindError{Input: in, err: err}
				}
			}
			return err
		}
		return c.errf("op is not supported")
	}
	ndt, err := c.narrowCheck()
	if err != nil {
		return err
	}
	if ndt != onnxpb.Undefined && narrowWrapped[op] {
		h = importWrapped
	}
	if err := h(c); err != nil {
		return err
	}
	if ndt != onnxpb.Undefined {
		c.markNarrow(ndt)
	}
	return c.checkAttrs()
}

// folded records constant results.
func (c *opCtx) folded(outs []*cval) error {
	if err := c.checkAttrs(); err != nil {
		return err
	}
	for i, v := range outs {
		if i < len(c.n.Output) && c.n.Output[i] != "" {
			c.out[i] = &entry{name: c.n.Output[i], c: v, seq: c.im.nextSeq}
			c.im.nextSeq++
			c.im.inits = append(c.im.inits, c.out[i])
		}
	}
	return nil
}

// values materializes every input.
func (c *opCtx) values() ([]*graph.Value, error) {
	out := make([]*graph.Value, len(c.in))
	for i := range c.in {
		v, err := c.value(i)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// direct maps an op with the same inputs and no attributes onto ours.
func direct(op string) handler {
	return func(c *opCtx) error {
		r := c.rewrite()
		r.emit(op, nil, r.values()...)
		return r.err
	}
}

// importPow converts a constant exponent to the base's type (opset 12 allows
// them to differ; our Pow does not) when that is exact. Otherwise a runtime
// exponent of another type is converted as the ONNX reference computes
// the op: for a float base, the exponent is cast to the base's type; for an
// integer base, both are raised in float64 and the result truncated back
// to the base's type (an integer power with a fractional exponent).
func importPow(c *opCtx) error {
	base, err := c.need(0)
	if err != nil || base == nil {
		return err
	}
	exp := c.input(1)
	if exp == nil {
		return c.errf("needs an exponent")
	}
	bt := base.Type.DType
	if exp.c != nil && exp.c.dt != onnxType(bt) {
		cv := newCval(onnxType(bt), exp.c.shape)
		exact := true
		for k := range cv.n() {
			cv.set(k, exp.c.at(k))
			exact = exact && cv.at(k) == exp.c.at(k)
		}
		switch {
		case exact:
			exp = c.im.constant(exp.name+"_"+bt.String(), cv)
		case bt.IsFloat():
			return c.errf("exponent %v does not convert exactly to %v", exp.c, bt)
		}
	}
	ev, err := c.im.val(exp)
	if err != nil {
		return c.errf("%v", err)
	}
	if et := ev.Type.DType; et != bt {
		if et == graph.Bool || bt == graph.Bool {
			return c.errf("Pow of %v to a %v exponent is not supported", bt, et)
		}
		r := c.rewrite()
		if bt.IsFloat() {
			ev = r.sub("Cast", graph.Attrs{"to": graph.Str(bt.String())}, ev)
		} else {
			wide := graph.Attrs{"to": graph.Str(graph.Float64.String())}
			base = r.sub("Cast", wide, base)
			if et != graph.Float64 {
				ev = r.sub("Cast", wide, ev)
			}
			r.emit("Cast", graph.Attrs{"to": graph.Str(bt.String())}, r.sub("Pow", nil, base, ev))
			return r.err
		}
		if r.err != nil {
			return r.err
		}
	}
	_, err = c.emit("Pow", nil, base, ev)
	return err
}

// importIdentity aliases the input (exporters use Identity to rename weights),
// keeping a node only where the name itself matters: a graph output, or our own
// export, whose nodes must come back one for one.
func importIdentity(c *opCtx) error {
	isOutput := slices.ContainsFunc(c.im.m.Graph.Output, func(o *onnxpb.ValueInfo) bool { return o.Name == c.n.Output[0] })
	if !c.im.faithful && !isOutput {
		c.out[0] = c.in[0]
		return nil
	}
	return direct("Identity")(c)
}

func importCast(c *opCtx) error {
	r := c.rewrite()
	to := r.attrInt("to", 0)
	r.attrInt("saturate", 1) // only affects float8 targets
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	if kind := meta(c.n.MetadataProps, metaBoundary); kind != "" && c.im.faithful {
		return c.boundary(kind, onnxpb.DataType(to))
	}
	if isNarrowInt(onnxpb.DataType(to)) {
		from, _ := c.in[0].typ()
		return c.castNarrow(x, from, onnxpb.DataType(to))
	}
	dt, ok := dtypeOf(onnxpb.DataType(to))
	if !ok {
		return c.errf("cast to %v is not supported on runtime values", onnxpb.DataType(to))
	}
	r.emit("Cast", graph.Attrs{"to": graph.Str(dt.String())}, x)
	return r.err
}

func importGemm(c *opCtx) error {
	r := c.rewrite()
	attrs := graph.Attrs{
		"alpha":  graph.Float(r.attrFloat("alpha", 1)),
		"beta":   graph.Float(r.attrFloat("beta", 1)),
		"transA": graph.Int(r.attrInt("transA", 0)),
		"transB": graph.Int(r.attrInt("transB", 0)),
	}
	if r.err != nil {
		return r.err
	}
	in, err := c.values()
	if err != nil {
		return err
	}
	// C is optional from opset 11; our node always lists it ("_" when absent).
	for len(in) < 3 {
		in = append(in, nil)
	}
	_, err = c.emit("Gemm", attrs, in...)
	return err
}

// importReduce handles reductions whose axes moved from attribute to input at
// opset since (13 for ReduceSum, 18 for the others).
func importReduce(since int64) handler {
	return func(c *opCtx) error {
		r := c.rewrite()
		attrs := graph.Attrs{"keepdims": graph.Int(r.attrInt("keepdims", 1))}
		x := r.need(0)
		var axes *graph.Value
		if c.ver < since {
			if vals, ok := r.attrInts("axes"); ok {
				axes = r.ints("axes", vals)
			}
		} else {
			attrs["noop_with_empty_axes"] = graph.Int(r.attrInt("noop_with_empty_axes", 0))
			r.constInput(1, "axes")
			axes = r.value(1)
		}
		in := []*graph.Value{x}
		if axes != nil {
			in = append(in, axes)
		}
		r.emit(c.n.OpType, attrs, in...)
		return r.err
	}
}

// importSoftmax maps Softmax and LogSoftmax. Before opset 13 the op flattened
// its input to 2-D at axis (default 1) and normalized over everything from axis
// on; that is our per-axis op when axis is the last one, and otherwise a
// Reshape to 2-D, Softmax over the last axis, and a Reshape back.
func importSoftmax(c *opCtx) error {
	r := c.rewrite()
	axis := r.softmaxAxis()
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	rank := x.Type.Shape.Rank()
	a, err := graph.NormAxis(int(axis), rank)
	if err != nil {
		return c.errf("%v", err)
	}
	if c.ver >= 13 || a == rank-1 {
		r.emit(c.n.OpType, graph.Attrs{"axis": graph.Int(axis)}, x)
		return r.err
	}
	y2 := r.sub(c.n.OpType, graph.Attrs{"axis": graph.Int(-1)}, r.as2D(x, a))
	r.emitReshape(y2, dims64(x.Type.Shape))
	return r.err
}

func importSCELoss(c *opCtx) error {
	r := c.rewrite()
	red := r.attrString("reduction", "mean")
	scores := r.need(0)
	// Our op takes [N, C] scores and [N] labels in [0, C), no class weights;
	// the other forms are written out (ops_conform.go). ignore_index drops
	// rows with that label from the loss and the mean. Our op has no such
	// rows: every label must be a class in [0, C), and the backends reject
	// any other label at run time. So an ignore_index outside [0, C)
	// (PyTorch exports -100) never changes a result the fused op computes,
	// and keeps the fused op (which has a gradient); one inside needs the
	// composed form.
	ign := r.attrInt("ignore_index", -1)
	if r.err != nil {
		return r.err
	}
	s := scores.Type.Shape
	ignoresClass := c.has("ignore_index") && (s.Rank() != 2 || (ign >= 0 && ign < int64(s[1])))
	if c.input(2) != nil || c.outputUsed(1) || ignoresClass || s.Rank() != 2 || red == "none" {
		return importSCEComposed(c)
	}
	labels := r.need(1)
	c.outNames = c.n.Output[:1]
	r.emit("SoftmaxCrossEntropyLoss", graph.Attrs{"reduction": graph.Str(red)}, scores, labels)
	return r.err
}

// importExpand needs its shape operand known: our shapes are static.
func importExpand(c *opCtx) error {
	if _, err := c.constInput(1, "shape"); err != nil {
		return err
	}
	return direct("Expand")(c)
}

func importTranspose(c *opCtx) error {
	r := c.rewrite()
	attrs := graph.Attrs{}
	if perm, ok := r.attrInts("perm"); ok {
		attrs["perm"] = graph.Ints(perm...)
	}
	r.emit("Transpose", attrs, r.need(0))
	return r.err
}

func importReshape(c *opCtx) error {
	r := c.rewrite()
	allowzero := r.attrInt("allowzero", 0)
	shape := r.constInput(1, "shape")
	if r.err != nil {
		return r.err
	}
	if shape == nil {
		return c.errf("needs a shape")
	}
	if target, err := shape.ints(); err != nil {
		return c.errf("shape: %v", err)
	} else if allowzero != 0 && slices.Contains(target, 0) {
		// A literal 0: the output has no elements, so it is a constant
		// (and the input, of as many elements, has none either).
		x, err := c.need(0)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(target, func(d int64) bool { return d < 0 }) {
			return c.errf("shape %v: allowzero=1 with a 0 leaves no -1 to infer", target)
		}
		if x.Type.Shape.Numel() != 0 {
			return c.errf("cannot reshape %v (%d elements) to %v", x.Type.Shape, x.Type.Shape.Numel(), target)
		}
		dims := make(graph.Shape, len(target))
		for i, d := range target {
			dims[i] = int(d)
		}
		dt, _ := c.in[0].typ()
		return c.folded([]*cval{newCval(dt, dims)})
	}
	r.emit("Reshape", nil, r.values()...)
	return r.err
}

func importConcat(c *opCtx) error {
	if !c.has("axis") {
		return c.errf("axis is required")
	}
	r := c.rewrite()
	axis := r.attrInt("axis", 0)
	r.emit("Concat", graph.Attrs{"axis": graph.Int(axis)}, r.values()...)
	return r.err
}

func fitsExactly(vals []int64) bool {
	for _, v := range vals {
		if v > maxExactInt || v < -maxExactInt {
			return false
		}
	}
	return true
}

func importSlice(c *opCtx) error {
	starts, ends, axes, steps, err := c.sliceOperands()
	if err != nil {
		return err
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	// Reuse the model's own operands unless they were attributes or hold values
	// (INT64_MAX for "to the end") that must be clamped to be held exactly.
	reuse := c.ver >= 10
	if !fitsExactly(starts) || !fitsExactly(ends) {
		reuse = false
		var ax []int64
		if starts, ends, ax, err = clampSlice(x.Type.Shape, starts, ends, axes); err != nil {
			return c.errf("%v", err)
		}
		if axes != nil {
			axes = ax
		}
	}
	operand := func(i int, what string, vals []int64) (*graph.Value, error) {
		if reuse && c.input(i) != nil {
			return c.value(i)
		}
		if vals == nil {
			return nil, nil
		}
		return c.ints(what, vals)
	}
	in := []*graph.Value{x}
	for i, op := range []struct {
		what string
		vals []int64
	}{{"starts", starts}, {"ends", ends}, {"axes", axes}, {"steps", steps}} {
		v, err := operand(i+1, op.what, op.vals)
		if err != nil {
			return err
		}
		in = append(in, v)
	}
	for len(in) > 3 && in[len(in)-1] == nil {
		in = in[:len(in)-1]
	}
	if len(in) == 5 && in[3] == nil {
		// steps without axes: ours needs the axes spelled out.
		all := make([]int64, len(starts))
		for i := range all {
			all[i] = int64(i)
		}
		if in[3], err = c.ints("axes", all); err != nil {
			return err
		}
	}
	_, err = c.emit("Slice", nil, in...)
	return err
}

// axesValue returns axes as a graph operand: the model's own input from opset
// since, or a constant made from the attribute before it.
func (c *opCtx) axesValue(i int, since int64) (*graph.Value, error) {
	axes, ok, err := c.axesOperand(i, since)
	if err != nil || !ok {
		return nil, err
	}
	if c.ver >= since {
		return c.value(i)
	}
	vals := make([]int64, len(axes))
	for k, a := range axes {
		vals[k] = int64(a)
	}
	return c.ints("axes", vals)
}

func importUnsqueeze(c *opCtx) error {
	r := c.rewrite()
	x, axes := r.need(0), r.axesValue(1, 13)
	if r.err == nil && axes == nil {
		return c.errf("axes are required")
	}
	r.emit("Unsqueeze", nil, x, axes)
	return r.err
}

func importSqueeze(c *opCtx) error {
	r := c.rewrite()
	in := []*graph.Value{r.need(0)}
	if axes := r.axesValue(1, 13); axes != nil {
		in = append(in, axes)
	}
	r.emit("Squeeze", nil, in...)
	return r.err
}

// importGather maps Gather and GatherElements (axis, data, indices),
// making constant indices int64 (ONNX also allows int32).
func importGather(c *opCtx) error {
	r := c.rewrite()
	axis := r.attrInt("axis", 0)
	data, idx := r.need(0), r.indices(1)
	r.emit(c.n.OpType, graph.Attrs{"axis": graph.Int(axis)}, data, idx)
	return r.err
}

func importTrilu(c *opCtx) error {
	r := c.rewrite()
	upper := r.attrInt("upper", 1)
	r.constInput(1, "k")
	r.emit("Trilu", graph.Attrs{"upper": graph.Int(upper)}, r.values()...)
	return r.err
}

// importSplit becomes one Slice per output. The sizes come from the split
// attribute (before 13) or input, else equal parts: the output count before
// opset 18 (which must divide the axis), num_outputs from 18 (the last part may
// be smaller).
func importSplit(c *opCtx) error {
	r := c.rewrite()
	axis := r.attrInt("axis", 0)
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	ax, err := graph.NormAxis(int(axis), x.Type.Shape.Rank())
	if err != nil {
		return c.errf("%v", err)
	}
	dim := int64(x.Type.Shape[ax])
	var sizes []int64
	if c.ver < 13 {
		if sizes, _, err = c.attrInts("split"); err != nil {
			return err
		}
	} else if v, err := c.constInput(1, "split"); err != nil {
		return err
	} else if v != nil {
		if sizes, err = v.ints(); err != nil {
			return c.errf("split: %v", err)
		}
	}
	n := int64(len(c.n.Output))
	if c.ver >= 18 {
		num, err := c.attrInt("num_outputs", 0)
		if err != nil {
			return err
		}
		if sizes == nil && num <= 0 {
			return c.errf("needs split or num_outputs")
		}
		if sizes == nil {
			n = num
		}
	}
	if sizes == nil {
		if n <= 0 {
			return c.errf("has no outputs")
		}
		chunk := dim / n
		if c.ver >= 18 {
			chunk = (dim + n - 1) / n
		} else if dim%n != 0 {
			return c.errf("axis of size %d does not split into %d equal parts", dim, n)
		}
		for i := range n {
			sizes = append(sizes, max(0, min(chunk, dim-i*chunk)))
		}
	}
	var total int64
	for _, s := range sizes {
		if s < 0 {
			return c.errf("negative split size in %v", sizes)
		}
		total += s
	}
	if total != dim || len(sizes) != len(c.n.Output) {
		return c.errf("split %v does not cover axis of size %d with %d outputs", sizes, dim, len(c.n.Output))
	}
	axes := r.ints("axes", []int64{int64(ax)})
	var start int64
	for i, s := range sizes {
		lo, hi := start, start+s
		start = hi
		if c.outputUsed(i) {
			r.emitOutput(i, "Slice", nil, x, r.ints("starts", []int64{lo}), r.ints("ends", []int64{hi}), axes)
		}
	}
	return r.err
}

// importLayerNorm writes LayerNormalization (opset 17) as the ONNX function that
// defines it: normalize over the axes from axis on, then scale and shift.
func importLayerNorm(c *opCtx) error {
	r := c.rewrite()
	x, axes, eps := normInputs(r)
	scale, bias := r.need(1), r.value(2)
	mean := r.sub("ReduceMean", graph.Attrs{"keepdims": graph.Int(1)}, x, axes)
	nrm, inv := r.rmsScale(r.sub("Sub", nil, x, mean), axes, eps)
	if r.err != nil {
		return r.err
	}
	c.outNames = c.n.Output[:1]
	if bias == nil {
		r.emit("Mul", nil, nrm, scale)
	} else {
		r.emit("Add", nil, r.sub("Mul", nil, nrm, scale), bias)
	}
	// The Mean and InvStdDev outputs (the statistics, reduced axes kept as 1).
	r.optionalOutput(1, mean)
	r.optionalOutput(2, inv)
	return r.err
}

// rmsScale writes v · 1/√(mean(v², axes) + eps), the step LayerNormalization
// (v = X − mean) and RMSNormalization (v = X) share, and returns it with
// 1/√(mean(v², axes) + eps).
func (r *rewrite) rmsScale(v, axes *graph.Value, eps float64) (y, inv *graph.Value) {
	if r.err != nil {
		return nil, nil
	}
	ms := r.sub("ReduceMean", graph.Attrs{"keepdims": graph.Int(1)}, r.sub("Mul", nil, v, v), axes)
	rms := r.sub("Sqrt", nil, r.sub("Add", nil, ms, r.scalar("epsilon", v.Type.DType, eps)))
	inv = r.sub("Reciprocal", nil, rms)
	return r.sub("Mul", nil, v, inv), inv
}

// normInputs reads what LayerNormalization and RMSNormalization share: the
// input X, the axes from the axis attribute to the last (as an operand of
// ReduceMean), epsilon, and a stash_type the rewrite can honour.
func normInputs(r *rewrite) (x, axes *graph.Value, eps float64) {
	c := r.c
	axis := r.attrInt("axis", -1)
	eps = r.attrFloat("epsilon", 1e-5)
	stash := r.attrInt("stash_type", int64(onnxpb.Float))
	x = r.need(0)
	if r.err != nil {
		return nil, nil, 0
	}
	// stash_type is the precision of the statistics; the rewrite computes them
	// in the input's type, so the two must agree.
	if onnxType(x.Type.DType) != onnxpb.DataType(stash) {
		r.fail(c.errf("stash_type %v with %v input is not supported", onnxpb.DataType(stash), x.Type.DType))
		return nil, nil, 0
	}
	rank := x.Type.Shape.Rank()
	a, err := graph.NormAxis(int(axis), rank)
	if err != nil {
		r.fail(c.errf("%v", err))
		return nil, nil, 0
	}
	var ax []int64
	for i := a; i < rank; i++ {
		ax = append(ax, int64(i))
	}
	return x, r.ints("axes", ax), eps
}

// importRMSNorm writes RMSNormalization (opset 23) as the ONNX function that
// defines it: X · 1/√(mean(X²) + ε) over the axes from axis on, times scale.
func importRMSNorm(c *opCtx) error {
	r := c.rewrite()
	x, axes, eps := normInputs(r)
	scale := r.need(1)
	nrm, _ := r.rmsScale(x, axes, eps)
	r.emit("Mul", nil, nrm, scale)
	return r.err
}

// importGelu writes Gelu (opset 20) with the formula that defines it.
//
// Our own export of the table's Gelu comes back as that node.
func importGelu(c *opCtx) error {
	if c.im.faithful {
		if s, ok := graph.LookupOp("Gelu"); ok && s.Expr != nil {
			return directAttrs(s)(c)
		}
	}
	r := c.rewrite()
	approx := r.attrString("approximate", "none")
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	dt := x.Type.DType
	var inner *graph.Value
	switch approx {
	case "none": // 0.5·x·(1 + erf(x/√2))
		inner = r.sub("Erf", nil, r.sub("Mul", nil, x, r.scalar("rsqrt2", dt, 1/math.Sqrt2)))
	case "tanh": // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
		x3 := r.sub("Mul", nil, r.sub("Mul", nil, x, x), x)
		u := r.sub("Add", nil, x, r.sub("Mul", nil, x3, r.scalar("coef", dt, 0.044715)))
		inner = r.sub("Tanh", nil, r.sub("Mul", nil, u, r.scalar("sqrt2_pi", dt, math.Sqrt(2/math.Pi))))
	default:
		return c.errf("approximate=%q is not supported", approx)
	}
	m := r.sub("Mul", nil, x, r.sub("Add", nil, inner, r.scalar("one", dt, 1)))
	r.emit("Mul", nil, m, r.scalar("half", dt, 0.5))
	return r.err
}

// importAttention maps opset-23 Attention onto FlashAttention, which has its
// meaning for 4-D Q, K, V (K, V with as many heads as Q or a divisor of
// them: grouped-query attention), no mask, no KV cache and no softcap; the
// logsumexp output FlashAttention adds is left unused.
func importAttention(c *opCtx) error {
	r := c.rewrite()
	causal := r.attrInt("is_causal", 0)
	softcap := r.attrFloat("softcap", 0)
	if r.err != nil {
		return r.err
	}
	if softcap != 0 {
		return c.errf("softcap is not supported")
	}
	// The QK output mode only selects what the unused fourth output holds.
	if _, err := c.attrInt("qk_matmul_output_mode", 0); err != nil {
		return err
	}
	for i, what := range map[int]string{3: "attn_mask", 4: "past_key", 5: "past_value", 6: "nonpad_kv_seqlen"} {
		if c.input(i) != nil {
			return c.errf("input %s is not supported", what)
		}
	}
	for i := 1; i < len(c.n.Output); i++ {
		if c.outputUsed(i) {
			return c.errf("output %d (%s) is not supported", i, c.n.Output[i])
		}
	}
	in, err := c.values()
	if err != nil {
		return err
	}
	if len(in) < 3 {
		return c.errf("needs Q, K and V")
	}
	q, k := in[0].Type.Shape, in[1].Type.Shape
	if q.Rank() != 4 {
		return c.errf("Q of rank %d: only 4-D [batch, heads, seq, head_dim] inputs are supported", q.Rank())
	}
	if c.has("q_num_heads") || c.has("kv_num_heads") {
		qh, _ := c.attrInt("q_num_heads", int64(q[1]))
		kh, _ := c.attrInt("kv_num_heads", int64(k[1]))
		if qh != int64(q[1]) || kh != int64(k[1]) {
			return c.errf("q_num_heads/kv_num_heads disagree with the 4-D inputs")
		}
	}
	// Grouped-query attention: ONNX repeats each K/V head for its group of
	// query heads in place (head h reads K/V head h/(q_heads/kv_heads)),
	// which is FlashAttention's grouping.
	if k.Rank() == 4 && k[1] != q[1] && (k[1] == 0 || q[1]%k[1] != 0) {
		return c.errf("%d query heads are not a multiple of %d key heads", q[1], k[1])
	}
	if p, err := c.attrInt("softmax_precision", 0); err != nil {
		return err
	} else if p != 0 && p != int64(onnxpb.Float) && p != int64(onnxType(in[0].Type.DType)) {
		// Our kernels compute the softmax in float32 (float64 for float64 inputs).
		return c.errf("softmax_precision %v is not supported", onnxpb.DataType(p))
	}
	// The default scale is 1/sqrt(head_dim), computed in float as runtimes do.
	scale, err := c.attrFloat("scale", float64(float32(1/math.Sqrt(float64(q[3])))))
	if err != nil {
		return err
	}
	c.outNames = c.n.Output[:1]
	if lse := meta(c.n.MetadataProps, metaLSE); lse != "" {
		c.outNames = []string{c.n.Output[0], lse}
	}
	_, err = c.emit("FlashAttention", graph.Attrs{"causal": graph.Int(causal), "scale": graph.Float(scale)}, in[0], in[1], in[2])
	return err
}

// ourOp imports a node of our own domain: its attributes map by the op table.
func (c *opCtx) ourOp() error {
	spec, ok := graph.LookupOp(c.n.OpType)
	if !ok || spec.Domain != graph.DomainFlashgraph {
		return c.errf("op is not in flashgraph's op table")
	}
	attrs := graph.Attrs{}
	for _, as := range spec.Attrs {
		if !c.has(as.Name) {
			continue
		}
		var err error
		switch as.Kind {
		case graph.AttrInt:
			var v int64
			v, err = c.attrInt(as.Name, 0)
			attrs[as.Name] = graph.Int(v)
		case graph.AttrFloat:
			var v float64
			v, err = c.attrFloat(as.Name, 0)
			attrs[as.Name] = graph.Float(v)
		case graph.AttrString:
			var v string
			v, err = c.attrString(as.Name, "")
			attrs[as.Name] = graph.Str(v)
		case graph.AttrInts:
			var v []int64
			v, _, err = c.attrInts(as.Name)
			attrs[as.Name] = graph.Ints(v...)
		case graph.AttrFloats:
			var a *onnxpb.Attribute
			if a, err = c.attr(as.Name, onnxpb.AttrFloats); a != nil {
				f := make([]float64, len(a.Floats))
				for i, x := range a.Floats {
					f[i] = float64(x)
					if s := meta(c.n.MetadataProps, metaAttr+as.Name+"."+strconv.Itoa(i)); s != "" {
						if v, perr := graph.ParseFloatLit(s); perr == nil && float32(v) == x {
							f[i] = v
						}
					}
				}
				attrs[as.Name] = graph.Floats(f...)
			}
		}
		if err != nil {
			return err
		}
	}
	if err := c.checkAttrs(); err != nil {
		return err
	}
	in, err := c.values()
	if err != nil {
		return err
	}
	_, err = c.emit(c.n.OpType, attrs, in...)
	return err
}
