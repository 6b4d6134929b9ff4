package onnx

import (
	"math"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Standard ops imported as table ops with the same meaning, exactly: each
// rewrite below computes what the ONNX operator's definition computes, in
// the input's type, with no approximation (the ONNX backend test suite,
// onnx/conformance_test.go, checks them). Where a rewrite would differ (an
// integer operand whose negation wraps, an attribute we do not read), the
// node is refused with the reason.

func init() {
	for op, h := range map[string]handler{
		"Flatten": importFlatten, "Dropout": importDropout, "CastLike": importCastLike,
		"ReduceMin": importReduceDerived, "ReduceL1": importReduceDerived, "ReduceL2": importReduceDerived,
		"ReduceSumSquare": importReduceDerived, "ReduceLogSum": importReduceDerived,
		"ReduceLogSumExp": importReduceDerived,
		"Sum":             importVariadic, "Mean": importVariadic, "Max": importVariadic, "Min": importVariadic,
		"Clip": importClip, "Tile": importTile,
	} {
		handlers[op] = h
	}
	introduced["CastLike"] = 15
}

// importFlatten is Reshape to [prod(dims before axis), prod(dims from axis)].
func importFlatten(c *opCtx) error {
	r := c.rewrite()
	axis, x := r.attrInt("axis", 1), r.need(0)
	if r.err != nil {
		return r.err
	}
	s := x.Type.Shape
	a := int(axis)
	if a < 0 {
		a += s.Rank()
	}
	if a < 0 || a > s.Rank() {
		return c.errf("axis %d out of range for rank %d", axis, s.Rank())
	}
	return c.emitReshape(x, []int64{int64(s[:a].Numel()), int64(s[a:].Numel())})
}

// importDropout is the identity at inference; its mask output is all true.
// Training mode draws a random mask, which we refuse.
func importDropout(c *opCtx) error {
	if _, err := c.attrInt("seed", 0); err != nil {
		return err
	}
	if c.ver < 12 {
		if _, err := c.attrFloat("ratio", 0.5); err != nil {
			return err
		}
		if c.ver < 7 {
			if t, err := c.attrInt("is_test", 0); err != nil || t == 0 {
				return c.errf("is_test=0 draws a random mask: random ops are not supported")
			}
		}
	} else if c.input(2) != nil {
		tm, err := c.constInput(2, "training_mode")
		if err != nil {
			return err
		}
		if tm.n() != 1 || tm.at(0) != 0 {
			// A ratio of 0 drops nothing: the identity, in training too.
			r, err := c.constInput(1, "ratio")
			if err != nil {
				return err
			}
			if r == nil || r.n() != 1 || r.at(0) != 0 {
				return c.errf("training_mode=true draws a random mask: random ops are not supported")
			}
		}
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	if c.outputUsed(1) {
		cv := newCval(onnxpb.Bool, x.Type.Shape)
		for k := range cv.n() {
			cv.set(k, 1)
		}
		c.out[1] = &entry{name: c.n.Output[1], c: cv, seq: c.im.nextSeq}
		c.im.nextSeq++
		c.im.inits = append(c.im.inits, c.out[1])
	}
	c.outNames = c.n.Output[:1]
	isOutput := slices.ContainsFunc(c.im.m.Graph.Output, func(o *onnxpb.ValueInfo) bool { return o.Name == c.n.Output[0] })
	if !isOutput {
		c.out[0] = c.in[0]
		return nil
	}
	_, err = c.emit("Identity", nil, x)
	return err
}

// importCastLike is Cast to the element type of its second input.
func importCastLike(c *opCtx) error {
	r := c.rewrite()
	r.attrInt("saturate", 1) // only affects float8 targets
	x, like := r.need(0), r.need(1)
	if r.err != nil {
		return r.err
	}
	if to, _ := c.in[1].typ(); isNarrowInt(to) {
		from, _ := c.in[0].typ()
		return c.castNarrow(x, from, to)
	}
	r.emit("Cast", graph.Attrs{"to": graph.Str(like.Type.DType.String())}, x)
	return r.err
}

// reduceOperands reads what every reduction shares: X, the axes (attribute
// before opset 18, input from 18) as a graph operand or nil for all, and
// keepdims. noop_with_empty_axes=1 with no axes is refused.
func reduceOperands(c *opCtx) (x, axes *graph.Value, keep int64, err error) {
	r := c.rewrite()
	keep = r.attrInt("keepdims", 1)
	x = r.need(0)
	if c.ver < 18 {
		if vals, ok := r.attrInts("axes"); ok {
			axes = r.ints("axes", vals)
		}
	} else {
		noop := r.attrInt("noop_with_empty_axes", 0)
		cv := r.constInput(1, "axes")
		if r.err == nil && noop != 0 && (cv == nil || cv.n() == 0) {
			return nil, nil, 0, c.errf("noop_with_empty_axes=1 with no axes is not supported")
		}
		if cv != nil && cv.n() > 0 {
			axes = r.value(1)
		}
	}
	if r.err != nil {
		return nil, nil, 0, r.err
	}
	return x, axes, keep, nil
}

// reduce adds one table reduction (ReduceSum, ReduceMax, ReduceMean).
func (c *opCtx) reduce(op string, x, axes *graph.Value, keep int64) (*graph.Value, error) {
	in := []*graph.Value{x}
	if axes != nil {
		in = append(in, axes)
	}
	return c.sub(op, graph.Attrs{"keepdims": graph.Int(keep)}, in...)
}

// importReduceDerived writes the reductions ONNX defines by a formula over
// ReduceSum or ReduceMax: Min = −Max(−x), L1 = Σ|x|, L2 = √Σx², SumSquare =
// Σx², LogSum = log Σx, LogSumExp = log Σexp(x − m) + m with m = max x.
func importReduceDerived(c *opCtx) error {
	x, axes, keep, err := reduceOperands(c)
	if err != nil {
		return err
	}
	op := c.n.OpType
	float := x.Type.DType.IsFloat()
	if !float && op != "ReduceL1" && op != "ReduceSumSquare" {
		// −x wraps for the most negative integer; the logs and roots are of floats.
		return c.errf("%s of %v is not supported", op, x.Type.DType)
	}
	r := c.rewrite()
	c.outNames = c.n.Output[:1]
	switch op {
	case "ReduceMin":
		r.emit("Neg", nil, r.reduce("ReduceMax", r.sub("Neg", nil, x), axes, keep))
	case "ReduceL1":
		r.emit("Identity", nil, r.reduce("ReduceSum", r.sub("Abs", nil, x), axes, keep))
	case "ReduceL2", "ReduceSumSquare":
		s := r.reduce("ReduceSum", r.sub("Mul", nil, x, x), axes, keep)
		if op == "ReduceL2" {
			r.emit("Sqrt", nil, s)
		} else {
			r.emit("Identity", nil, s)
		}
	case "ReduceLogSum":
		r.emit("Log", nil, r.reduce("ReduceSum", x, axes, keep))
	default: // ReduceLogSumExp
		mk := r.reduce("ReduceMax", x, axes, 1)
		e := r.sub("Exp", nil, r.sub("Sub", nil, x, mk))
		l := r.sub("Log", nil, r.reduce("ReduceSum", e, axes, keep))
		m := mk
		if keep == 0 {
			m = r.reduce("ReduceMax", x, axes, 0)
		}
		r.emit("Add", nil, l, m)
	}
	return r.err
}

// importVariadic writes Sum and Mean as a chain of Adds (Mean then divided
// by the count), and Max and Min as a chain of the table's two-input Max and
// Min (which broadcast and propagate NaN as ONNX's do).
func importVariadic(c *opCtx) error {
	in, err := c.values()
	if err != nil {
		return err
	}
	if len(in) == 0 || slices.Contains(in, nil) {
		return c.errf("needs at least one input, none omitted")
	}
	op := c.n.OpType
	dt := in[0].Type.DType
	if op == "Mean" && !dt.IsFloat() {
		return c.errf("%s of %v is not supported", op, dt)
	}
	c.outNames = c.n.Output[:1]
	if len(in) == 1 {
		_, err := c.emit("Identity", nil, in[0])
		return err
	}
	step := op
	if op == "Sum" || op == "Mean" {
		step = "Add"
	}
	r := c.rewrite()
	acc := in[0]
	for i, v := range in[1:] {
		if i == len(in)-2 && op != "Mean" {
			r.emit(step, nil, acc, v)
			return r.err
		}
		acc = r.sub(step, nil, acc, v)
	}
	r.emit("Div", nil, acc, r.scalar("count", dt, float64(len(in))))
	return r.err
}

// elementwiseMax is the elementwise maximum of the inputs (of their
// negations when neg), broadcast together: each input expanded to the common
// shape and given a leading axis, concatenated on it, and reduced by ReduceMax.
func (c *opCtx) elementwiseMax(in []*graph.Value, neg bool) (*graph.Value, error) {
	if dt := in[0].Type.DType; !dt.IsFloat() {
		// Our ReduceMax is defined on floats.
		return nil, c.errf("%s of %v is not supported", c.n.OpType, dt)
	}
	shape := graph.Shape{}
	for _, v := range in {
		if v.Type.DType != in[0].Type.DType {
			return nil, c.errf("inputs differ in element type: %v and %v", in[0].Type.DType, v.Type.DType)
		}
		s, err := graph.Broadcast(shape, v.Type.Shape)
		if err != nil {
			return nil, c.errf("%v", err)
		}
		shape = s
	}
	target := make([]int64, 0, shape.Rank()+1)
	target = append(target, 1)
	for _, d := range shape {
		target = append(target, int64(d))
	}
	r := c.rewrite()
	tv := r.ints("shape", target)
	parts := make([]*graph.Value, len(in))
	for i, v := range in {
		if neg {
			v = r.sub("Neg", nil, v)
		}
		parts[i] = r.sub("Expand", nil, v, tv)
	}
	cat := parts[0]
	if len(parts) > 1 {
		cat = r.sub("Concat", graph.Attrs{"axis": graph.Int(0)}, parts...)
	}
	m := r.reduce("ReduceMax", cat, r.ints("axes", []int64{0}), 0)
	return m, r.err
}

func (r *rewrite) elementwiseMax(in []*graph.Value, neg bool) *graph.Value {
	return step(r, func() (*graph.Value, error) { return r.c.elementwiseMax(in, neg) })
}

// importClipInt is Clip of integers (int64, or a narrow type held as one):
// the table's Max then Min with the scalar bounds, which select values and
// so are exact (the float form's negations would wrap at the minimum).
func importClipInt(c *opCtx, x *graph.Value) error {
	r := c.rewrite()
	lo, hi := r.value(1), r.value(2)
	if r.err != nil {
		return r.err
	}
	for _, b := range []*graph.Value{lo, hi} {
		if b != nil && (b.Type.DType != graph.Int64 || b.Type.Shape.Rank() != 0) {
			return c.errf("bound %v: want a %v scalar", b.Type, x.Type.DType)
		}
	}
	c.outNames = c.n.Output[:1]
	switch {
	case lo != nil && hi != nil:
		r.emit("Min", nil, r.sub("Max", nil, x, lo), hi)
	case lo != nil:
		r.emit("Max", nil, x, lo)
	case hi != nil:
		r.emit("Min", nil, x, hi)
	default:
		r.emit("Identity", nil, x)
	}
	return r.err
}

// importClip is min(max(x, lo), hi) with the bounds from attributes (before
// opset 11) or scalar inputs; an absent bound does not clip.
func importClip(c *opCtx) error {
	x, err := c.need(0)
	if err != nil {
		return err
	}
	dt := x.Type.DType
	if dt == graph.Int64 && c.ver >= 11 {
		return importClipInt(c, x)
	}
	if !dt.IsFloat() {
		return c.errf("Clip of %v is not supported", dt)
	}
	var lo, hi *graph.Value
	r := c.rewrite()
	if c.ver < 11 {
		bound := func(name string) *graph.Value {
			if !c.has(name) {
				return nil
			}
			return r.scalar(name, dt, r.attrFloat(name, 0))
		}
		lo, hi = bound("min"), bound("max")
	} else {
		lo, hi = r.value(1), r.value(2)
	}
	if r.err != nil {
		return r.err
	}
	c.outNames = c.n.Output[:1]
	y := x
	if lo != nil {
		y = r.elementwiseMax([]*graph.Value{y, lo}, false)
	}
	if hi != nil {
		// min(y, hi) = −max(−y, −hi)
		r.emit("Neg", nil, r.elementwiseMax([]*graph.Value{y, hi}, true))
	} else {
		r.emit("Identity", nil, y)
	}
	return r.err
}

// importTile is Reshape to [1, d0, 1, d1, ...], Expand to [r0, d0, r1, d1,
// ...] and Reshape to [r0·d0, r1·d1, ...].
func importTile(c *opCtx) error {
	r := c.rewrite()
	x, rc := r.need(0), r.constInput(1, "repeats")
	if r.err != nil {
		return r.err
	}
	if rc == nil {
		return c.errf("needs repeats")
	}
	reps, err := rc.ints()
	if err != nil {
		return c.errf("repeats: %v", err)
	}
	s := x.Type.Shape
	if len(reps) != s.Rank() {
		return c.errf("repeats %v for rank %d", reps, s.Rank())
	}
	var split, expanded, final []int64
	for i, d := range s {
		if reps[i] < 0 {
			return c.errf("negative repeat in %v", reps)
		}
		split = append(split, 1, int64(d))
		expanded = append(expanded, reps[i], int64(d))
		final = append(final, reps[i]*int64(d))
	}
	xs := r.sub("Reshape", nil, x, r.ints("split", split))
	xe := r.sub("Expand", nil, xs, r.ints("expanded", expanded))
	r.emitReshape(xe, final)
	return r.err
}

func init() {
	for op, h := range map[string]handler{
		"GatherElements": importGather, "ArgMax": importArgMax, "ArgMin": importArgMax,
		"ReduceProd":                importReduceProd,
		"NegativeLogLikelihoodLoss": importNLLLoss,
	} {
		handlers[op] = h
	}
	introduced["GatherElements"] = 11
	introduced["NegativeLogLikelihoodLoss"] = 12
}

// indicesValue returns input i as int64 indices (constant int32 indices are
// converted; a runtime operand must be int64).
func (c *opCtx) indicesValue(i int) (*graph.Value, error) {
	idx := c.input(i)
	if idx == nil {
		return nil, c.errf("needs indices")
	}
	if idx.c != nil && idx.c.dt != onnxpb.Int64 {
		vals, err := idx.c.ints()
		if err != nil {
			return nil, c.errf("indices: %v", err)
		}
		idx = c.im.constant(idx.name+"_int64", &cval{dt: onnxpb.Int64, shape: idx.c.shape, i: vals})
	}
	v, err := c.im.val(idx)
	if err != nil {
		return nil, c.errf("%v", err)
	}
	return v, nil
}

// importArgMax maps ArgMax, and ArgMin as ArgMax of −x (exact for floats).
func importArgMax(c *opCtx) error {
	r := c.rewrite()
	attrs := graph.Attrs{
		"axis":              graph.Int(r.attrInt("axis", 0)),
		"keepdims":          graph.Int(r.attrInt("keepdims", 1)),
		"select_last_index": graph.Int(r.attrInt("select_last_index", 0)),
	}
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	if !x.Type.DType.IsFloat() {
		return c.errf("%s of %v is not supported", c.n.OpType, x.Type.DType)
	}
	if c.n.OpType == "ArgMin" {
		x = r.sub("Neg", nil, x)
	}
	r.emit("ArgMax", attrs, x)
	return r.err
}

func importReduceProd(c *opCtx) error {
	x, axes, keep, err := reduceOperands(c)
	if err != nil {
		return err
	}
	in := []*graph.Value{x}
	if axes != nil {
		in = append(in, axes)
	}
	_, err = c.emit("ReduceProd", graph.Attrs{"keepdims": graph.Int(keep)}, in...)
	return err
}

func importNLLLoss(c *opCtx) error {
	r := c.rewrite()
	loss := r.nllLoss(r.need(0))
	c.outNames = c.n.Output[:1]
	r.emit("Identity", nil, loss)
	return r.err
}

// nllLoss writes NegativeLogLikelihoodLoss of input (log-probabilities
// [N, C, d1, ...]) with the node's target, optional weight, ignore_index and
// reduction: loss[n, d] = −input[n, target[n, d], d]·w[target[n, d]], 0 where
// the target is ignore_index; "sum" adds them up, "mean" divides the sum by
// the sum of the weights of the targets not ignored.
func (r *rewrite) nllLoss(input *graph.Value) *graph.Value {
	c := r.c
	red := r.attrString("reduction", "mean")
	if r.err == nil && red != "none" && red != "sum" && red != "mean" {
		r.fail(c.errf("reduction %q is not supported", red))
	}
	target := r.need(1)
	weight := r.value(2)
	if r.err != nil {
		return nil
	}
	dt := input.Type.DType
	if !dt.IsFloat() || target.Type.DType != graph.Int64 {
		r.fail(c.errf("input %v and target %v: want float and int64", dt, target.Type.DType))
		return nil
	}
	if input.Type.Shape.Rank() < 2 || target.Type.Shape.Rank() != input.Type.Shape.Rank()-1 {
		r.fail(c.errf("input %v and target %v: want [N, C, d...] and [N, d...]", input.Type.Shape, target.Type.Shape))
		return nil
	}
	safe := target
	var ignored *graph.Value // bool, true where the target is ignore_index
	if c.has("ignore_index") {
		ign := r.attrInt("ignore_index", 0)
		ignored = r.sub("Equal", nil, target, r.scalar("ignore_index", graph.Int64, float64(ign)))
		safe = r.sub("Where", nil, ignored, r.scalar("zero_index", graph.Int64, 0), target)
	}
	axis1 := r.ints("class_axis", []int64{1})
	tu := r.sub("Unsqueeze", nil, safe, axis1)
	picked := r.sub("GatherElements", graph.Attrs{"axis": graph.Int(1)}, input, tu)
	loss := r.sub("Neg", nil, r.sub("Squeeze", nil, picked, axis1))
	var w *graph.Value // the weight of each target, nil for all ones
	if weight != nil {
		w = r.sub("Gather", graph.Attrs{"axis": graph.Int(0)}, weight, safe)
	}
	if ignored != nil {
		zero := r.scalar("zero", dt, 0)
		keep := w
		if weight == nil {
			keep = r.scalar("one", dt, 1)
		}
		w = r.sub("Where", nil, ignored, zero, keep)
	}
	if w != nil {
		loss = r.sub("Mul", nil, loss, w)
	}
	if red == "none" {
		return loss
	}
	sum := r.reduce("ReduceSum", loss, nil, 0)
	if red == "sum" {
		return sum
	}
	var den *graph.Value
	if w != nil {
		den = r.reduce("ReduceSum", w, nil, 0)
	} else {
		den = r.scalar("count", dt, float64(target.Type.Shape.Numel()))
	}
	return r.sub("Div", nil, sum, den)
}

// importSCEComposed writes SoftmaxCrossEntropyLoss in the forms our fused op
// does not take (class weights, ignore_index, more than two dims, the
// log_prob output) as its definition: NegativeLogLikelihoodLoss of
// LogSoftmax(scores) over the class axis.
func importSCEComposed(c *opCtx) error {
	scores, err := c.need(0)
	if err != nil {
		return err
	}
	if !scores.Type.DType.IsFloat() || scores.Type.Shape.Rank() < 2 {
		return c.errf("scores %v: want float [N, C, d...]", scores.Type)
	}
	r := c.rewrite()
	lp := r.sub("LogSoftmax", graph.Attrs{"axis": graph.Int(1)}, scores)
	loss := r.nllLoss(lp)
	c.outNames = c.n.Output[:1]
	r.emit("Identity", nil, loss)
	r.optionalOutput(1, lp)
	return r.err
}

// legacyForms handles what opsets before 7 spelled differently: the
// consumed_inputs attribute (a memory hint of opsets 1 to 5, with no effect
// on values) is read and ignored; forms whose meaning differs from the later
// opsets' are refused.
func (c *opCtx) legacyForms() error {
	if c.ver >= 7 || (c.n.Domain != "" && c.n.Domain != "ai.onnx") {
		return nil
	}
	if c.has("consumed_inputs") {
		if _, _, err := c.attrInts("consumed_inputs"); err != nil {
			return err
		}
	}
	if legacyBroadcast[c.n.OpType] && c.has("broadcast") {
		if err := c.legacyBroadcast(); err != nil {
			return err
		}
	}
	switch op := c.n.OpType; {
	case op == "PRelu":
		return c.legacyPReluSlope()
	case op == "Reshape" && c.ver < 5:
		return c.errf("the shape attribute of opset < 5 is not supported")
	case op == "Tile" && c.ver < 6:
		return c.errf("the tiles and axis inputs of opset < 6 are not supported")
	case op == "Split" && c.ver < 2 && c.input(1) != nil:
		return c.errf("the split input of opset 1 is not supported")
	}
	return nil
}

func init() {
	for op, h := range map[string]handler{
		"Conv": importWindowOp, "MaxPool": importWindowOp, "AveragePool": importWindowOp,
		"ConvInteger": importWindowOp, "QLinearConv": importWindowOp,
		"GlobalAveragePool": importGlobalPool, "GlobalMaxPool": importGlobalPool,
		"BatchNormalization": importBatchNorm, "ConvTranspose": importConvTranspose,
	} {
		handlers[op] = h
	}
}

// importWindowOp maps Conv, MaxPool and AveragePool, resolving auto_pad into
// explicit pads (SAME_UPPER puts the odd pad at the end, SAME_LOWER at the
// beginning). MaxPool's Indices output is its table row's second output.
func importWindowOp(c *opCtx) error {
	op := c.n.OpType
	x, err := c.need(0)
	if err != nil {
		return err
	}
	if x.Type.Shape.Rank() < 3 {
		return c.errf("X %v: want [N, C, D...]", x.Type.Shape)
	}
	in := []*graph.Value{x}
	n := x.Type.Shape.Rank() - 2
	var kernel []int64
	// The integer convolutions convolve their centred inputs in float64
	// (exact: sums of 8-bit products), then (quant.go) cast or requantize.
	integer := op == "ConvInteger" || op == "QLinearConv"
	if op == "Conv" || integer {
		wi, zx, zw := 1, 2, 3
		if op == "QLinearConv" {
			wi, zx, zw = 3, 2, 5
		}
		r := c.rewrite()
		w := r.need(wi)
		if r.err != nil {
			return r.err
		}
		ws := w.Type.Shape
		var b *graph.Value
		if integer {
			in[0] = r.centred(0, zx, x.Type.Shape, 1, graph.Float64)
			w = r.centred(wi, zw, ws, 0, graph.Float64)
		} else {
			b = r.value(2)
		}
		if r.err != nil {
			return r.err
		}
		in = append(in, w)
		if b != nil {
			in = append(in, b)
		}
		for _, d := range w.Type.Shape[min(2, w.Type.Shape.Rank()):] {
			kernel = append(kernel, int64(d))
		}
	}
	attrs := graph.Attrs{}
	if ks, ok, err := c.attrInts("kernel_shape"); err != nil {
		return err
	} else if ok {
		kernel = ks
		attrs["kernel_shape"] = graph.Ints(ks...)
	} else if op != "Conv" && !integer {
		return c.errf("kernel_shape is required")
	}
	if len(kernel) != n {
		return c.errf("kernel %v for %d spatial axes", kernel, n)
	}
	ones := func(name string) ([]int64, error) {
		v, ok, err := c.attrInts(name)
		if err != nil || ok {
			return v, err
		}
		v = make([]int64, n)
		for i := range v {
			v[i] = 1
		}
		return v, nil
	}
	strides, err := ones("strides")
	if err != nil {
		return err
	}
	dil, err := ones("dilations")
	if err != nil {
		return err
	}
	if len(strides) != n || len(dil) != n {
		return c.errf("strides %v or dilations %v for %d spatial axes", strides, dil, n)
	}
	attrs["strides"], attrs["dilations"] = graph.Ints(strides...), graph.Ints(dil...)
	r := c.rewrite()
	autoPad := r.attrString("auto_pad", "NOTSET")
	pads, hasPads := r.attrInts("pads")
	if r.err != nil {
		return r.err
	}
	switch autoPad {
	case "NOTSET":
		if !hasPads {
			pads = make([]int64, 2*n)
		}
	case "VALID":
		pads = make([]int64, 2*n)
	case "SAME_UPPER", "SAME_LOWER":
		pads = make([]int64, 2*n)
		for i := range n {
			in, s := int64(x.Type.Shape[2+i]), strides[i]
			if s <= 0 {
				return c.errf("strides %v", strides)
			}
			out := (in + s - 1) / s
			total := max(0, (out-1)*s+(kernel[i]-1)*dil[i]+1-in)
			small := total / 2
			if autoPad == "SAME_UPPER" {
				pads[i], pads[n+i] = small, total-small
			} else {
				pads[i], pads[n+i] = total-small, small
			}
		}
	default:
		return c.errf("auto_pad %q is not supported", autoPad)
	}
	attrs["pads"] = graph.Ints(pads...)
	switch op {
	case "Conv", "ConvInteger", "QLinearConv":
		attrs["group"] = graph.Int(r.attrInt("group", 1))
	case "MaxPool", "AveragePool":
		if c.ver >= 10 {
			attrs["ceil_mode"] = graph.Int(r.attrInt("ceil_mode", 0))
		}
		if op == "AveragePool" {
			attrs["count_include_pad"] = graph.Int(r.attrInt("count_include_pad", 0))
			c.outNames = c.n.Output[:1]
		} else {
			// storage_order says how Indices number the spatial positions.
			attrs["storage_order"] = graph.Int(r.attrInt("storage_order", 0))
			if !c.outputUsed(1) {
				c.outNames = c.n.Output[:1]
			}
		}
	}
	if integer {
		y := r.sub("Conv", attrs, in...)
		if r.err != nil {
			return r.err
		}
		return c.requantizeConv(y)
	}
	r.emit(op, attrs, in...)
	return r.err
}

// importGlobalPool is ReduceMean or ReduceMax over the spatial axes, kept.
func importGlobalPool(c *opCtx) error {
	x, err := c.need(0)
	if err != nil {
		return err
	}
	if x.Type.Shape.Rank() < 3 {
		return c.errf("X %v: want [N, C, D...]", x.Type.Shape)
	}
	var ax []int64
	for i := 2; i < x.Type.Shape.Rank(); i++ {
		ax = append(ax, int64(i))
	}
	red := "ReduceMean"
	if c.n.OpType == "GlobalMaxPool" {
		red = "ReduceMax"
	}
	r := c.rewrite()
	r.emit(red, graph.Attrs{"keepdims": graph.Int(1)}, x, r.ints("axes", ax))
	return r.err
}

// importBatchNorm is BatchNormalization: (X − mean)/√(var + ε)·scale + B,
// with the [C] statistics reshaped to broadcast over [N, C, D...]. At
// inference mean and var are the inputs; in training mode (opset 14 on)
// they are the batch's, over every axis but the channel one (the variance
// divided by the count, as ONNX's reference computes it), and the running
// statistics are also output: input·momentum + batch·(1 − momentum).
func importBatchNorm(c *opCtx) error {
	r := c.rewrite()
	eps := r.attrFloat("epsilon", 1e-5)
	momentum := r.attrFloat("momentum", 0.9)
	if r.err != nil {
		return r.err
	}
	if c.ver < 9 {
		if sp, err := c.attrInt("spatial", 1); err != nil || sp != 1 {
			if err != nil {
				return err
			}
			return c.errf("spatial=0 is not supported")
		}
	}
	if c.ver < 7 {
		if t, err := c.attrInt("is_test", 0); err != nil || t == 0 {
			if err != nil {
				return err
			}
			return c.errf("is_test=0 (training) is not supported")
		}
	}
	tm, err := c.attrInt("training_mode", 0)
	if err != nil {
		return err
	}
	training := tm != 0
	if training && c.ver < 14 {
		return c.errf("training_mode does not exist before opset 14")
	}
	for i := 1; i < len(c.n.Output); i++ {
		if c.outputUsed(i) && (!training || i > 2) {
			return c.errf("output %d (running statistics) is not supported at inference", i)
		}
	}
	in := make([]*graph.Value, 5)
	for i := range in {
		if in[i], err = c.need(i); err != nil {
			return err
		}
	}
	x := in[0]
	rank := x.Type.Shape.Rank()
	if rank < 2 || !x.Type.DType.IsFloat() {
		return c.errf("X %v: want a float [N, C, ...]", x.Type)
	}
	ch := x.Type.Shape[1]
	for i := 1; i < 5; i++ {
		if in[i].Type.DType != x.Type.DType || !in[i].Type.Shape.Equal(graph.Shape{ch}) {
			return c.errf("input %d %v: want %v[%d]", i, in[i].Type, x.Type.DType, ch)
		}
	}
	shape := make([]int64, rank-1)
	shape[0] = int64(ch)
	for i := 1; i < len(shape); i++ {
		shape[i] = 1
	}
	sv := r.ints("shape", shape)
	stats := slices.Clone(in) // the [C] inputs, for the running statistics
	for i := 1; i < 5; i++ {
		in[i] = r.sub("Reshape", nil, in[i], sv)
	}
	scale, bias, mean, variance := in[1], in[2], in[3], in[4]
	var d *graph.Value
	var running [][2]*graph.Value // training: the input and batch statistics
	if training {
		ax := []int64{0}
		for i := 2; i < rank; i++ {
			ax = append(ax, int64(i))
		}
		axes := r.ints("axes", ax)
		// The batch statistics, [1, C, 1, ...] dropped to [C, 1, ...].
		keep := graph.Attrs{"keepdims": graph.Int(1)}
		bm := r.sub("ReduceMean", keep, x, axes)
		d = r.sub("Sub", nil, x, bm)
		bv := r.sub("ReduceMean", keep, r.sub("Mul", nil, d, d), axes)
		mean = r.sub("Reshape", nil, bm, sv)
		variance = r.sub("Reshape", nil, bv, sv)
		running = [][2]*graph.Value{{stats[3], bm}, {stats[4], bv}}
	} else {
		d = r.sub("Sub", nil, x, mean)
	}
	sd := r.sub("Sqrt", nil, r.sub("Add", nil, variance, r.scalar("epsilon", x.Type.DType, eps)))
	y := r.sub("Mul", nil, r.sub("Div", nil, d, sd), scale)
	c.outNames = c.n.Output[:1]
	r.emit("Add", nil, y, bias)
	for k, st := range running {
		if r.err == nil && c.outputUsed(k+1) {
			r.fail(c.runningStat(k+1, st[0], st[1], momentum, ch))
		}
	}
	return r.err
}

// runningStat writes output i of training BatchNormalization: the running
// statistic old·momentum + batch·(1 − momentum), batch given [1, C, 1, ...]
// and written as old's [C].
func (c *opCtx) runningStat(i int, old, batch *graph.Value, momentum float64, ch int) error {
	r := c.rewrite()
	b := r.sub("Reshape", nil, batch, r.ints("channels", []int64{int64(ch)}))
	dt := old.Type.DType
	m := r.scalar("momentum", dt, momentum)
	rest := r.scalar("one_minus_momentum", dt, 1-momentum)
	kept := r.sub("Mul", nil, old, m)
	added := r.sub("Mul", nil, b, rest)
	r.emitOutput(i, "Add", nil, kept, added)
	return r.err
}

func init() {
	handlers["Hardmax"] = importHardmax
}

// importHardmax is 1 at the first maximum along axis and 0 elsewhere:
// ArgMax along axis compared with the positions along it. Before opset 13
// the input is flattened to 2-D at axis (default 1) first, as Softmax was.
func importHardmax(c *opCtx) error {
	r := c.rewrite()
	axis := r.softmaxAxis()
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	dt, s := x.Type.DType, x.Type.Shape
	if !dt.IsFloat() {
		return c.errf("Hardmax of %v is not supported", dt)
	}
	a, err := graph.NormAxis(int(axis), s.Rank())
	if err != nil {
		return c.errf("%v", err)
	}
	v := x
	if c.ver < 13 {
		v = r.as2D(x, a)
		if r.err != nil {
			return r.err
		}
		a = 1
	}
	vs := v.Type.Shape
	if vs[a] == 0 {
		return c.errf("axis %d is empty", a)
	}
	am := r.sub("ArgMax", graph.Attrs{"axis": graph.Int(int64(a)), "keepdims": graph.Int(1), "select_last_index": graph.Int(0)}, v)
	iotaShape := make(graph.Shape, vs.Rank())
	for i := range iotaShape {
		iotaShape[i] = 1
	}
	iotaShape[a] = vs[a]
	iota := &cval{dt: onnxpb.Int64, shape: iotaShape, i: make([]int64, vs[a])}
	for i := range iota.i {
		iota.i[i] = int64(i)
	}
	if r.err != nil {
		return r.err
	}
	iv, err := c.im.val(c.im.constant(c.nodeBase()+"/positions", iota))
	if err != nil {
		return c.errf("%v", err)
	}
	eq := r.sub("Equal", nil, am, iv)
	to := graph.Attrs{"to": graph.Str(dt.String())}
	if c.ver >= 13 {
		r.emit("Cast", to, eq)
		return r.err
	}
	r.emitReshape(r.sub("Cast", to, eq), dims64(s))
	return r.err
}

// importConvTranspose resolves output_shape and auto_pad into pads: the
// total padding is s·(in − 1) + output_padding + d·(k − 1) + 1 − out, its
// odd half at the end for SAME_UPPER and at the beginning otherwise, as the
// operator's definition says.
func importConvTranspose(c *opCtx) error {
	r := c.rewrite()
	x, w, b := r.need(0), r.need(1), r.value(2)
	if r.err != nil {
		return r.err
	}
	xs, ws := x.Type.Shape, w.Type.Shape
	if xs.Rank() < 3 || ws.Rank() != xs.Rank() {
		return c.errf("X %v and W %v: want [N, C, D...] and [C, M/group, K...]", xs, ws)
	}
	n := xs.Rank() - 2
	kernel := make([]int64, n)
	for i := range kernel {
		kernel[i] = int64(ws[2+i])
	}
	attrs := graph.Attrs{}
	if ks, ok := r.attrInts("kernel_shape"); ok {
		attrs["kernel_shape"] = graph.Ints(ks...)
	}
	list := func(name string, def int64) []int64 {
		v, ok := r.attrInts(name)
		if r.err != nil {
			return nil
		}
		if !ok {
			v = make([]int64, n)
			for i := range v {
				v[i] = def
			}
		}
		if len(v) != n {
			r.fail(c.errf("%s %v for %d spatial axes", name, v, n))
			return nil
		}
		attrs[name] = graph.Ints(v...)
		return v
	}
	strides := list("strides", 1)
	dil := list("dilations", 1)
	outPad := list("output_padding", 0)
	attrs["group"] = graph.Int(r.attrInt("group", 1))
	autoPad := r.attrString("auto_pad", "NOTSET")
	pads, hasPads := r.attrInts("pads")
	outShape, hasOut := r.attrInts("output_shape")
	if r.err != nil {
		return r.err
	}
	if hasOut && len(outShape) == n+2 {
		outShape = outShape[2:]
	}
	switch {
	case autoPad != "NOTSET" && autoPad != "VALID" && autoPad != "SAME_UPPER" && autoPad != "SAME_LOWER":
		return c.errf("auto_pad %q is not supported", autoPad)
	case hasOut || autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER":
		if !hasOut {
			outShape = make([]int64, n)
			for i := range n {
				outShape[i] = int64(xs[2+i]) * strides[i]
			}
		}
		if len(outShape) != n {
			return c.errf("output_shape %v for %d spatial axes", outShape, n)
		}
		pads = make([]int64, 2*n)
		grown := false
		for i := range n {
			total := strides[i]*(int64(xs[2+i])-1) + outPad[i] + (kernel[i]-1)*dil[i] + 1 - outShape[i]
			// ONNX splits the total with a floor division; a negative total
			// (an output_shape past the full output) makes negative pads.
			half := total / 2
			if total < 0 && total%2 != 0 {
				half--
			}
			if autoPad == "SAME_UPPER" {
				pads[i], pads[n+i] = half, total-half
			} else {
				pads[i], pads[n+i] = total-half, half
			}
			if pads[i] < 0 {
				return c.errf("output_shape %v starts before the full output (a negative leading pad)", outShape)
			}
			if pads[n+i] < 0 {
				// Rows past the full output's end: output_padding's zeros.
				outPad[i] -= pads[n+i]
				pads[n+i] = 0
				grown = true
			}
		}
		if grown {
			attrs["output_padding"] = graph.Ints(outPad...)
		}
	case autoPad == "VALID" || !hasPads:
		pads = make([]int64, 2*n)
	}
	attrs["pads"] = graph.Ints(pads...)
	in := []*graph.Value{x, w}
	if b != nil {
		in = append(in, b)
	}
	r.emit("ConvTranspose", attrs, in...)
	return r.err
}

func init() {
	handlers["Einsum"] = importEinsum
	introduced["Einsum"] = 12
}

func importEinsum(c *opCtx) error {
	r := c.rewrite()
	eq := r.attrString("equation", "")
	in := r.values()
	if r.err == nil && (len(in) == 0 || slices.Contains(in, nil)) {
		return c.errf("needs operands, none omitted")
	}
	r.emit("Einsum", graph.Attrs{"equation": graph.Str(eq)}, in...)
	return r.err
}

func init() {
	handlers["DepthToSpace"] = importSpaceDepth
	handlers["SpaceToDepth"] = importSpaceDepth
	handlers["InstanceNormalization"] = importInstanceNorm
}

// importSpaceDepth writes DepthToSpace and SpaceToDepth as the Reshape,
// Transpose, Reshape their definitions are.
func importSpaceDepth(c *opCtx) error {
	r := c.rewrite()
	bs := r.attrInt("blocksize", 0)
	mode := "DCR"
	if c.n.OpType == "DepthToSpace" && c.ver >= 11 {
		mode = r.attrString("mode", "DCR")
	}
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	s := x.Type.Shape
	if s.Rank() != 4 || bs <= 0 {
		return c.errf("want a [N, C, H, W] input and a positive blocksize, got %v and %d", s, bs)
	}
	n, ch, h, w, b := int64(s[0]), int64(s[1]), int64(s[2]), int64(s[3]), bs
	var split, perm, final []int64
	switch {
	case c.n.OpType == "SpaceToDepth":
		if h%b != 0 || w%b != 0 {
			return c.errf("H and W of %v are not multiples of %d", s, b)
		}
		split, perm, final = []int64{n, ch, h / b, b, w / b, b}, []int64{0, 3, 5, 1, 2, 4}, []int64{n, ch * b * b, h / b, w / b}
	case ch%(b*b) != 0:
		return c.errf("C of %v is not a multiple of %d", s, b*b)
	case mode == "DCR":
		split, perm, final = []int64{n, b, b, ch / (b * b), h, w}, []int64{0, 3, 4, 1, 5, 2}, []int64{n, ch / (b * b), h * b, w * b}
	case mode == "CRD":
		split, perm, final = []int64{n, ch / (b * b), b, b, h, w}, []int64{0, 1, 4, 2, 5, 3}, []int64{n, ch / (b * b), h * b, w * b}
	default:
		return c.errf("mode %q is not supported", mode)
	}
	xs := r.sub("Reshape", nil, x, r.ints("split", split))
	xt := r.sub("Transpose", graph.Attrs{"perm": graph.Ints(perm...)}, xs)
	r.emitReshape(xt, final)
	return r.err
}

// importInstanceNorm normalizes each [n, c] plane over the spatial axes:
// (X − mean)/√(var + ε)·scale[c] + B[c].
func importInstanceNorm(c *opCtx) error {
	r := c.rewrite()
	eps := r.attrFloat("epsilon", 1e-5)
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	s := x.Type.Shape
	if s.Rank() < 3 || !x.Type.DType.IsFloat() {
		return c.errf("X %v: want a float [N, C, D...]", x.Type)
	}
	var ax []int64
	shape := []int64{int64(s[1])}
	for i := 2; i < s.Rank(); i++ {
		ax = append(ax, int64(i))
		shape = append(shape, 1)
	}
	axes := r.ints("axes", ax)
	sv := r.ints("shape", shape)
	var sb [2]*graph.Value
	for i := range sb {
		v := r.need(i + 1)
		if r.err != nil {
			return r.err
		}
		if v.Type.DType != x.Type.DType || !v.Type.Shape.Equal(graph.Shape{s[1]}) {
			return c.errf("input %d %v: want %v[%d]", i+1, v.Type, x.Type.DType, s[1])
		}
		sb[i] = r.sub("Reshape", nil, v, sv)
	}
	mean := r.sub("ReduceMean", graph.Attrs{"keepdims": graph.Int(1)}, x, axes)
	nrm, _ := r.rmsScale(r.sub("Sub", nil, x, mean), axes, eps)
	r.emit("Add", nil, r.sub("Mul", nil, nrm, sb[0]), sb[1])
	return r.err
}

func init() {
	for op, h := range map[string]handler{
		"ScatterElements": importScatterElements, "Scatter": importScatterElements,
		"Pad": importPad, "TopK": importTopK, "OneHot": importOneHot,
	} {
		handlers[op] = h
	}
	introduced["ScatterElements"] = 11
	introduced["OneHot"] = 9
	introduced["Scatter"] = 9
}

// importScatterElements maps ScatterElements and Scatter (its name before
// opset 11, without reduction).
func importScatterElements(c *opCtx) error {
	r := c.rewrite()
	axis := r.attrInt("axis", 0)
	red := "none"
	if c.n.OpType == "ScatterElements" && c.ver >= 16 {
		red = r.attrString("reduction", "none")
	}
	data, idx, upd := r.need(0), r.indices(1), r.need(2)
	r.emit("ScatterElements", graph.Attrs{"axis": graph.Int(axis), "reduction": graph.Str(red)}, data, idx, upd)
	return r.err
}

// importPad reads pads and the constant from attributes (before opset 11)
// or inputs; opset 18's axes input spreads pads over the axes it names.
func importPad(c *opCtx) error {
	r := c.rewrite()
	mode := r.attrString("mode", "constant")
	x := r.need(0)
	if r.err != nil {
		return r.err
	}
	rank := x.Type.Shape.Rank()
	var pads []int64
	var value *graph.Value
	if c.ver < 11 {
		name := "pads"
		if c.ver < 2 {
			name = "paddings"
		}
		p, ok := r.attrInts(name)
		if r.err == nil && !ok {
			return c.errf("%s is required", name)
		}
		pads = p
		value = r.scalar("value", x.Type.DType, r.attrFloat("value", 0))
	} else {
		pc := r.constInput(1, "pads")
		if r.err != nil {
			return r.err
		}
		if pc == nil {
			return c.errf("needs pads")
		}
		var err error
		if pads, err = pc.ints(); err != nil {
			return c.errf("pads: %v", err)
		}
		value = r.value(2)
		if ac := r.constInput(3, "axes"); ac != nil {
			axes, err := ac.ints()
			if err != nil {
				return c.errf("axes: %v", err)
			}
			if len(pads) != 2*len(axes) {
				return c.errf("pads %v for axes %v", pads, axes)
			}
			full := make([]int64, 2*rank)
			for i, a := range axes {
				ax, err := graph.NormAxis(int(a), rank)
				if err != nil {
					return c.errf("%v", err)
				}
				full[ax], full[rank+ax] = pads[i], pads[len(axes)+i]
			}
			pads = full
		}
	}
	if r.err != nil {
		return r.err
	}
	in := []*graph.Value{x, r.ints("pads", pads)}
	if value != nil {
		if value.Type.Shape.Rank() != 0 {
			// Our constant_value is one element of any rank; ONNX's is a scalar
			// (or [1]).
			if r.err == nil && value.Type.Shape.Numel() != 1 {
				return c.errf("constant_value %v: want one element", value.Type.Shape)
			}
		}
		in = append(in, value)
	}
	r.emit("Pad", graph.Attrs{"mode": graph.Str(mode)}, in...)
	return r.err
}

// importTopK reads K from the attribute (before opset 10) or input.
func importTopK(c *opCtx) error {
	r := c.rewrite()
	attrs := graph.Attrs{"axis": graph.Int(r.attrInt("axis", -1))}
	if c.ver >= 11 {
		attrs["largest"] = graph.Int(r.attrInt("largest", 1))
		// Unsorted order is unspecified; ours is sorted, which is one such
		// order (sorted is read, and always 1).
		r.attrInt("sorted", 1)
		attrs["sorted"] = graph.Int(1)
	}
	x := r.need(0)
	var k *graph.Value
	if c.ver < 10 {
		kv, ok := r.attrInts("k")
		if r.err != nil {
			return r.err
		}
		if a, _ := c.attr("k", onnxpb.AttrInt); a != nil {
			kv, ok = []int64{a.I}, true
		}
		if !ok {
			return c.errf("k is required")
		}
		k = r.ints("k", kv)
	} else {
		r.constInput(1, "K")
		k = r.need(1)
	}
	r.emit("TopK", attrs, x, k)
	return r.err
}

func importOneHot(c *opCtx) error {
	r := c.rewrite()
	axis := r.attrInt("axis", -1)
	idx := r.need(0)
	dc := r.constInput(1, "depth")
	if r.err != nil {
		return r.err
	}
	if dc == nil || dc.n() != 1 {
		return c.errf("depth must be one value")
	}
	d := dc.at(0)
	if d != float64(int64(d)) {
		return c.errf("depth %v is not an integer", d)
	}
	depth := r.ints("depth", []int64{int64(d)})
	vals := r.need(2)
	if r.err != nil {
		return r.err
	}
	if c.ver < 11 {
		// Negative indices are out of range before opset 11; ours count from the end.
		if e := c.input(0); e.c == nil {
			return c.errf("runtime indices before opset 11 (negative ones mean out of range) are not supported")
		} else if slices.ContainsFunc(e.c.f, func(v float64) bool { return v < 0 }) || slices.ContainsFunc(e.c.i, func(v int64) bool { return v < 0 }) {
			return c.errf("negative indices before opset 11 are not supported")
		}
	}
	r.emit("OneHot", graph.Attrs{"axis": graph.Int(axis)}, idx, depth, vals)
	return r.err
}

// legacyBroadcast lists the ops that took broadcast (and, but for Gemm,
// axis) attributes before opset 7.
var legacyBroadcast = map[string]bool{
	"Add": true, "Sub": true, "Mul": true, "Div": true, "Pow": true, "Equal": true,
	"Less": true, "Greater": true, "And": true, "Or": true, "Xor": true, "Gemm": true,
}

// legacyBroadcast reads opset < 7's broadcast attribute: with broadcast=1, B
// broadcasts to A, its dims lined up with A's from axis on (the trailing dims
// when axis is absent, which is numpy's rule, ours). B is reshaped to put its
// dims there; the op then broadcasts as from opset 7 on. broadcast=0 means
// equal shapes, which broadcasting leaves alone.
func (c *opCtx) legacyBroadcast() error {
	b, err := c.attrInt("broadcast", 0)
	if err != nil {
		return err
	}
	if c.n.OpType == "Gemm" || b == 0 || !c.has("axis") {
		return nil
	}
	axis, err := c.attrInt("axis", 0)
	if err != nil {
		return err
	}
	ea, eb := c.input(0), c.input(1)
	if ea == nil || eb == nil {
		return c.errf("needs two inputs")
	}
	_, sa := ea.typ()
	_, sb := eb.typ()
	if axis < 0 {
		axis += int64(sa.Rank())
	}
	if axis < 0 || int(axis)+sb.Rank() > sa.Rank() {
		return c.errf("broadcast axis %d does not place B %v in A %v", axis, sb, sa)
	}
	shape := sb.Clone()
	for range sa.Rank() - int(axis) - sb.Rank() {
		shape = append(shape, 1)
	}
	if shape.Rank() == sb.Rank() {
		return nil
	}
	return c.reshapeInput(1, shape)
}

// reshapeInput replaces input i by itself reshaped to shape (a constant
// folded, a runtime value through a Reshape node).
func (c *opCtx) reshapeInput(i int, shape graph.Shape) error {
	eb := c.input(i)
	if eb.c != nil {
		c.in[i] = c.im.constant(eb.name+"_aligned", eb.c.reshaped(shape))
		return nil
	}
	v, err := c.im.val(eb)
	if err != nil {
		return c.errf("%v", err)
	}
	r := c.rewrite()
	y := r.sub("Reshape", nil, v, r.ints("aligned", dims64(shape)))
	if r.err != nil {
		return r.err
	}
	c.in[i] = &entry{name: y.Name, v: y}
	return nil
}

// legacyPReluSlope: before opset 7 PRelu's slope was per channel, a [C]
// vector for X [N, C, ...] (or one value for all); from 7 it broadcasts
// numpy-style. A [C] slope is reshaped to [C, 1, ...] to keep its meaning.
func (c *opCtx) legacyPReluSlope() error {
	ex, es := c.input(0), c.input(1)
	if ex == nil || es == nil {
		return c.errf("needs X and slope")
	}
	_, sx := ex.typ()
	_, ss := es.typ()
	if ss.Rank() != 1 || ss[0] == 1 {
		return nil
	}
	if sx.Rank() < 2 || ss[0] != sx[1] {
		return c.errf("slope %v is not one value per channel of X %v", ss, sx)
	}
	shape := graph.Shape{ss[0]}
	for range sx.Rank() - 2 {
		shape = append(shape, 1)
	}
	return c.reshapeInput(1, shape)
}

func init() {
	handlers["Compress"] = importCompress
	handlers["MeanVarianceNormalization"] = importMVN
	introduced["Compress"] = 9
	introduced["MeanVarianceNormalization"] = 9
}

// importCompress needs its condition known (the output's shape depends on
// it): it is then Gather of the selected positions, along axis or of the
// flattened input.
func importCompress(c *opCtx) error {
	r := c.rewrite()
	x, cond := r.need(0), r.constInput(1, "condition")
	if r.err != nil {
		return r.err
	}
	if cond == nil || cond.shape.Rank() != 1 {
		return c.errf("needs a 1-D condition")
	}
	var idx []int64
	for k := range cond.n() {
		if cond.at(k) != 0 {
			idx = append(idx, int64(k))
		}
	}
	src, axis := x, int64(0)
	if c.has("axis") {
		if axis = r.attrInt("axis", 0); r.err != nil {
			return r.err
		}
		a, err := graph.NormAxis(int(axis), x.Type.Shape.Rank())
		if err != nil {
			return c.errf("%v", err)
		}
		if cond.n() > x.Type.Shape[a] {
			return c.errf("condition of %d for axis %d of size %d", cond.n(), a, x.Type.Shape[a])
		}
	} else {
		if cond.n() > x.Type.Shape.Numel() {
			return c.errf("condition of %d for %d elements", cond.n(), x.Type.Shape.Numel())
		}
		src = r.sub("Reshape", nil, x, r.ints("flat", []int64{int64(x.Type.Shape.Numel())}))
	}
	r.emit("Gather", graph.Attrs{"axis": graph.Int(axis)}, src, r.ints("indices", idx))
	return r.err
}

// importMVN is (X − mean)/(√(mean((X − mean)²)) + 1e-9) over axes (default
// 0, 2, 3), as the function that defines it (which writes the variance as
// E[X²] − E[X]², the same value).
func importMVN(c *opCtx) error {
	r := c.rewrite()
	x := r.need(0)
	ax, ok := r.attrInts("axes")
	if r.err != nil {
		return r.err
	}
	if !ok {
		ax = []int64{0, 2, 3}
	}
	if !x.Type.DType.IsFloat() {
		return c.errf("MeanVarianceNormalization of %v is not supported", x.Type.DType)
	}
	keep := graph.Attrs{"keepdims": graph.Int(1)}
	axes := r.ints("axes", ax)
	d := r.sub("Sub", nil, x, r.sub("ReduceMean", keep, x, axes))
	sd := r.sub("Sqrt", nil, r.sub("ReduceMean", keep, r.sub("Mul", nil, d, d), axes))
	den := r.sub("Add", nil, sd, r.scalar("epsilon", x.Type.DType, 1e-9))
	r.emit("Div", nil, d, den)
	return r.err
}

func init() {
	handlers["Resize"] = importResize
	handlers["Upsample"] = importResize
	introduced["Resize"] = 10
}

// importResize maps Resize and Upsample onto our Interpolate, with the output
// sizes, the per-axis scales and the roi resolved from constant (or bound)
// inputs. Before Resize-11 (Resize-10, Upsample) the coordinate transform is
// asymmetric and nearest takes the floor.
func importResize(c *opCtx) error {
	mode, err := c.attrString("mode", "nearest")
	if err != nil {
		return err
	}
	x, err := c.need(0)
	if err != nil {
		return err
	}
	r := x.Type.Shape.Rank()
	attrs := graph.Attrs{"mode": graph.Str(mode)}
	legacy := c.n.OpType == "Upsample" || c.ver < 11
	var scales []float64
	var sizes []int64
	var roi []float64
	floats := func(i int, what string) ([]float64, error) {
		cv, err := c.constInput(i, what)
		if err != nil || cv == nil {
			return nil, err
		}
		out := make([]float64, cv.n())
		for k := range out {
			out[k] = cv.at(k)
		}
		return out, nil
	}
	if legacy {
		if mode != "nearest" && mode != "linear" {
			return c.errf("mode %q is not supported", mode)
		}
		attrs["coordinate_transformation_mode"] = graph.Str("asymmetric")
		attrs["nearest_mode"] = graph.Str("floor")
		if c.n.OpType == "Upsample" && c.ver < 9 {
			a, err := c.attr("scales", onnxpb.AttrFloats)
			if err != nil {
				return err
			}
			if a == nil {
				return c.errf("scales is required")
			}
			for _, f := range a.Floats {
				scales = append(scales, float64(f))
			}
		} else if scales, err = floats(1, "scales"); err != nil {
			return err
		}
	} else {
		rw := c.rewrite()
		attrs["coordinate_transformation_mode"] = graph.Str(rw.attrString("coordinate_transformation_mode", "half_pixel"))
		attrs["nearest_mode"] = graph.Str(rw.attrString("nearest_mode", "round_prefer_floor"))
		attrs["cubic_coeff_a"] = graph.Float(rw.attrFloat("cubic_coeff_a", -0.75))
		attrs["exclude_outside"] = graph.Int(rw.attrInt("exclude_outside", 0))
		attrs["extrapolation_value"] = graph.Float(rw.attrFloat("extrapolation_value", 0))
		if rw.err != nil {
			return rw.err
		}
		if scales, err = floats(2, "scales"); err != nil {
			return err
		}
		sc, err := c.constInput(3, "sizes")
		if err != nil {
			return err
		}
		if sc != nil && sc.n() > 0 {
			if sizes, err = sc.ints(); err != nil {
				return c.errf("sizes: %v", err)
			}
		}
		if attrs.String("coordinate_transformation_mode", "") == "tf_crop_and_resize" {
			if roi, err = floats(1, "roi"); err != nil {
				return err
			}
			if len(roi) != 2*r {
				return c.errf("roi %v for rank %d", roi, r)
			}
			attrs["roi"] = graph.Floats(roi...)
		}
	}
	if len(sizes) > 0 && len(scales) > 0 {
		return c.errf("scales and sizes are both given")
	}
	switch {
	case len(sizes) == r:
		for i, s := range sizes {
			if x.Type.Shape[i] == 0 {
				return c.errf("cannot resize the empty axis %d", i)
			}
			scales = append(scales, float64(s)/float64(x.Type.Shape[i]))
		}
	case len(scales) == r:
		for i, s := range scales {
			n := float64(x.Type.Shape[i])
			if roi != nil {
				n *= roi[r+i] - roi[i]
			}
			v := math.Floor(n * s)
			if !(v >= 0) || v > math.MaxInt32 {
				return c.errf("scale %v gives no output size", s)
			}
			sizes = append(sizes, int64(v))
		}
	default:
		return c.errf("needs scales or sizes for each of the %d axes", r)
	}
	attrs["sizes"], attrs["scales"] = graph.Ints(sizes...), graph.Floats(scales...)
	_, err = c.emit("Interpolate", attrs, x)
	return err
}
