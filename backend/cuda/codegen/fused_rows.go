package codegen

import (
	"fmt"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
)

// Generated row kernels: a FusedElementwise body with a reduction over the
// last axis (an RMSNorm's sum of squares with the residual add before it and
// the rsqrt after it; a norm backward's row sum with its scaling) becomes one
// kernel. A segment of lanes of one warp walks a row: it computes the
// element steps of each element in registers (writing those that are outputs),
// accumulates the reduced step, combines the lanes' sums with shuffles, and
// one lane computes the row steps on the result. The reduced operand is never
// written to memory. Element steps that read the row's values (an RMSNorm's
// x·rstd·w, a norm backward's dx) run in a second walk over the row: every
// lane of the segment computes the row steps, then the lanes walk the row
// again, recomputing from the inputs the earlier element steps those read
// (a row is never held in registers), and write their outputs.
//
// A Transpose step of an input that keeps the last axis in place (a head
// split read by a norm) is that input read with permuted strides: each row
// is still contiguous, only where it starts moves. The step becomes a copy
// of a second view of the input's buffer. So is a Slice of an input (fuse_qkv's
// head split of the merged q/k/v product, read in place), and a Transpose
// of such a Slice: the input's buffer at an offset.

// Rows is one generated row kernel.
type Rows struct {
	full     graph.Shape // the reduced operand's shape; its last axis is reduced
	steps    []graph.FusedStep
	rowLevel []bool // step s has the reduced shape (the reduction and after)
	dead     []bool // step s is read by no step and no output (a Slice only Transposes read)
	red      int    // the reduction step
	mean     bool
	ElemIns  []Operand // inputs over full (nil strides: not read per element)
	rIns     []Operand // inputs over the leading axes (nil strides: not read per row)
	outs     []int
	OutBufs  []Buffer
	narrow   []graph.DType

	// late: element step s reads a row step (or a late step), so it is
	// computed in a second walk over the row once the row's values are
	// known; again: element step s is computed in that walk (the late
	// steps and the earlier element steps they read, recomputed).
	late, again []bool
}

// Generate writes the kernel ("rows"): a segment of a warp's lanes per
// row, 8 warps a block.
func (p *Rows) Generate() (Kernel, error) {
	r := p.full.Rank()
	cols := int64(p.full[r-1])
	rows := int64(p.full.Numel()) / cols
	lead := dims64(p.full[:r-1])
	// Everything indexed by the leading axes, coalesced together: element
	// inputs' leading strides, row inputs' strides, the element outputs'
	// (cols per row) and the row outputs' (one per row).
	var lists [][]int64
	for _, o := range p.ElemIns {
		lists = append(lists, leadOf(o.Strides, r-1))
	}
	for _, o := range p.rIns {
		lists = append(lists, leadOf(o.Strides, r-1))
	}
	rowStr := ContiguousStrides(p.full[:r-1])
	elemStr := make([]int64, r-1)
	for i, s := range rowStr {
		elemStr[i] = s * cols
	}
	lists = append(lists, rowStr, elemStr)
	dims, lists := Coalesce(lead, lists) // one row: dims [1]
	eLead, rLead := lists[:len(p.ElemIns)], lists[len(p.ElemIns):len(p.ElemIns)+len(p.rIns)]

	types, err := cTypes(opBufs(p.ElemIns))
	if err != nil {
		return Kernel{}, err
	}
	otypes, err := cTypes(p.OutBufs)
	if err != nil {
		return Kernel{}, err
	}
	dts := dtypesOf(opBufs(p.ElemIns), p.OutBufs)
	ct := floatComputeType(dts...)
	acc := accumulatorType(dts...) // a 16-bit buffer: sums in float
	maxSize := 1
	for _, o := range p.ElemIns {
		if o.Strides != nil && o.Strides[r-1] == 1 {
			maxSize = max(maxSize, o.Buf.DType.Size())
		}
	}
	for i, b := range p.OutBufs {
		if !p.rowLevel[p.outs[i]] {
			maxSize = max(maxSize, b.DType.Size())
		}
	}

	// Vectors along the row, of the widest operand that moves along it:
	// every element input reads it contiguously or broadcasts it, rows
	// start aligned, the row splits into whole vectors.
	vec := vectorOf(maxSize)
	ok := cols%int64(vec) == 0
	for k, o := range p.ElemIns {
		if o.Strides != nil && !movesVectors(o.Buf, o.Off, o.Strides[r-1], eLead[k], vec) {
			ok = false
		}
	}
	for i, b := range p.OutBufs {
		if !p.rowLevel[p.outs[i]] && !b.alignedFor(0, vec) {
			ok = false
		}
	}
	if !ok {
		vec = 1
	}
	lanes, iters := rowSplit(cols, vec)

	kn := &kernel{entry: "rows", comment: fmt.Sprintf("rows %d x %d, %d steps (reduction at %d), vector %d, %d lanes per row", rows, cols, len(p.steps), p.red, vec, lanes)}
	// An input read neither per element nor per row is a void pointer.
	ptypes := slices.Clone(types)
	for k, o := range p.ElemIns {
		if o.Strides == nil && p.rIns[k].Strides == nil {
			ptypes[k] = "void"
		}
	}
	kn.params = bufferParams(ptypes, otypes)
	w := kn.w
	// The row's leading coordinates c0, c1, ... (the loop over the row and
	// the row steps each need them in scope).
	rowCoords := func() { kn.coordinates("            ", "unsigned long long", "row", dims, "ull") }
	kn.warpRows(lanes, rows)
	w("        %s a = 0;\n", acc)
	w("        if (row < %dull) {\n", rows)
	rowCoords()
	offset := func(base int64, strides []int64) string {
		return offsetExpr(fmt.Sprintf("%dull", base), strides, func(j int, s int64) string { return fmt.Sprintf("c%d * %dull", j, s) })
	}
	// walk writes a walk of the segment's lanes over the row: the element
	// steps keep selects over the inputs reads selects, the outputs out
	// selects written, and (accumulate) the reduced operand summed into a.
	walk := func(keep func(s int) bool, reads func(k int) bool, writes func(s int) bool, accumulate bool) error {
		elemArgs := make([]string, len(p.ElemIns))
		for k, o := range p.ElemIns {
			if o.Strides == nil || !reads(k) {
				continue
			}
			w("            const unsigned long long e%d = %s;\n", k, offset(o.Off, eLead[k]))
			if o.Strides[r-1] == 0 { // constant along the row
				w("            const %s b%d = %s;\n", ct, k, loadExpr(types[k], ct, fmt.Sprintf("in%d[e%d]", k, k)))
				elemArgs[k] = fmt.Sprintf("b%d", k)
			}
		}
		w("            const unsigned long long q = row * %dull;\n", cols)
		kn.walkRow("unsigned long long", "ull", iters, lanes, vec, cols)
		for k, o := range p.ElemIns {
			if o.Strides == nil || o.Strides[r-1] == 0 || !reads(k) {
				continue
			}
			if vec > 1 {
				w("                    %s\n", alignedArray(types[k], fmt.Sprintf("v%d", k), vec))
				w("                    %s\n", vecMove(fmt.Sprintf("v%d", k), fmt.Sprintf("in%d + e%d + col", k, k), vec*o.Buf.DType.Size()))
			}
		}
		for i, s := range p.outs {
			if writes(s) && vec > 1 {
				w("                    %s\n", alignedArray(otypes[i], fmt.Sprintf("w%d", i), vec))
			}
		}
		ins := make([]elemIn, len(p.ElemIns))
		for k, o := range p.ElemIns {
			ins[k].t = types[k]
			switch {
			case o.Strides == nil || !reads(k):
			case o.Strides[r-1] == 0:
				ins[k].arg = elemArgs[k]
			case vec > 1:
				ins[k].load = fmt.Sprintf("v%d[e]", k)
			default:
				ins[k].load = fmt.Sprintf("in%d[e%d + col * %dull]", k, k, o.Strides[r-1])
			}
		}
		args := kn.elementLoop("                    ", ct, vec, true, ins)
		if _, err := kn.steps("                        ", ct, p.steps, p.narrow, args, keep); err != nil {
			return err
		}
		if accumulate {
			w("                        a += (%s)%s;\n", acc, operandOf(p.steps[p.red].Args[0], args))
		}
		outs := make([]elemOut, len(p.outs))
		for i, s := range p.outs {
			if writes(s) {
				outs[i] = elemOut{at: "q + col", t: otypes[i], step: s, size: p.OutBufs[i].DType.Size()}
			}
		}
		kn.closeElementLoop("                    ", ct, vec, outs)
		w("                }\n            }\n")
		return nil
	}
	// The first walk: the element steps that need no row value and that
	// are outputs or feed the sum (not those only late steps read, which
	// the second walk computes: a norm backward's dy·w·rstd and the
	// residual gradient it is added to), writing the outputs, and the sum.
	need1 := make([]bool, len(p.steps))
	for _, s := range p.outs {
		need1[s] = true
	}
	if a := p.steps[p.red].Args[0]; a.Step {
		need1[a.Index] = true
	}
	for s := len(p.steps) - 1; s >= 0; s-- {
		if !need1[s] || p.rowLevel[s] || p.isLate(s) {
			continue
		}
		for _, a := range p.steps[s].Args {
			if a.Step {
				need1[a.Index] = true
			}
		}
	}
	walk1 := func(s int) bool { return need1[s] && !p.rowLevel[s] && !p.isDead(s) && !p.isLate(s) }
	reads1 := func(k int) bool { return p.readBy(k, walk1) || p.readByReduction(k) }
	if err := walk(walk1, reads1, walk1, true); err != nil {
		return Kernel{}, err
	}
	w("        }\n")
	// Every lane of the warp takes part in the shuffles (rows past the end
	// add nothing); the xor pattern leaves each segment's sum in all its lanes.
	for o := lanes / 2; o > 0; o /= 2 {
		w("        a += __shfl_xor_sync(0xffffffffu, a, %d, %d);\n", o, lanes)
	}
	// Without late steps one lane computes the row steps and writes the
	// row outputs; with them every lane does (the shuffles left the sum in
	// each lane of the segment, the same bits in all) and then walks the
	// row again for the late steps.
	late := slices.Contains(p.late, true)
	if late {
		w("        if (row < %dull) {\n", rows)
	} else {
		w("        if (row < %dull && lane == 0) {\n", rows)
	}
	rowCoords()
	rargs := make([]string, len(p.rIns))
	for k, o := range p.rIns {
		if o.Strides == nil {
			continue
		}
		rargs[k] = fmt.Sprintf("r%d", k)
		w("            const %s r%d = %s;\n", ct, k, loadExpr(types[k], ct, fmt.Sprintf("in%d[%s]", k, offset(o.Off, rLead[k]))))
	}
	// The row steps: the reduction's result (the mean divides it), then
	// the steps after it.
	for s := range p.steps {
		if !p.rowLevel[s] {
			continue
		}
		if s != p.red {
			if _, err := kn.steps("            ", ct, p.steps, p.narrow, rargs, func(k int) bool { return k == s }); err != nil {
				return Kernel{}, err
			}
			continue
		}
		e := "a"
		if p.mean {
			e = fmt.Sprintf("a / (%s)%d", acc, cols)
		}
		e = "(" + ct + ")(" + e + ")"
		if t, _ := CType(narrowOf(p.narrow, s)); Is16(narrowOf(p.narrow, s)) {
			e = loadExpr(t, ct, storeExpr(t, ct, e))
		}
		w("            const %s t%d = %s;\n", ct, s, e)
	}
	rowIndent := "            "
	if late {
		w("            if (lane == 0) {\n")
		rowIndent = "                "
	}
	for i, s := range p.outs {
		if p.rowLevel[s] {
			w("%sout%d[row] = %s;\n", rowIndent, i, storeExpr(otypes[i], ct, fmt.Sprintf("t%d", s)))
		}
	}
	if late {
		w("            }\n")
		// The second walk: the late steps over the row values, the
		// element steps they read recomputed from the inputs (no row is
		// held in registers), writing the late outputs.
		walk2 := func(s int) bool { return s < len(p.again) && p.again[s] }
		if err := walk(walk2, func(k int) bool { return p.readBy(k, walk2) }, p.isLate, false); err != nil {
			return Kernel{}, err
		}
	}
	w("        }\n    }\n}\n")
	rowsPerBlock := int64(8 * (32 / lanes))
	k := kn.done((rows+rowsPerBlock-1)/rowsPerBlock*256, opBufs(p.ElemIns), p.OutBufs)
	k.Vec, k.Lanes = vec, lanes
	return k, nil
}

// isDead reports whether step s is computed by no one (see inputViews).
func (p *Rows) isDead(s int) bool { return s < len(p.dead) && p.dead[s] }

// isLate reports whether element step s is computed after the reduction,
// in the second walk over the row.
func (p *Rows) isLate(s int) bool { return s < len(p.late) && p.late[s] }

// readBy reports whether a step that keep selects reads input k.
func (p *Rows) readBy(k int, keep func(s int) bool) bool {
	for s, st := range p.steps {
		if !keep(s) {
			continue
		}
		for _, a := range st.Args {
			if !a.Step && a.Index == k {
				return true
			}
		}
	}
	return false
}

// readByReduction reports whether the reduction reads input k directly.
func (p *Rows) readByReduction(k int) bool {
	a := p.steps[p.red].Args[0]
	return !a.Step && a.Index == k
}

// inputView is a node input read through index steps that only move where
// its values lie (a Slice of it, a Transpose of it that keeps the last axis,
// or a Transpose of such a Slice), as an extra operand of a row kernel: the
// input's buffer at an offset with permuted strides.
type inputView struct {
	input int
	slice []int64 // axis, start, end of a Slice step (nil: none)
	perm  []int64 // a Transpose step's (nil: none)
}

// inputViews rewrites each Slice step of a node input and each Transpose
// step (keeping the last axis) of a node input or of such a Slice into a
// copy (Identity) of a view of that input, numbered after the node's
// inputs, and returns the views. A Slice step that only Transposes read
// is then read by no step: dead reports it (unless it is an output), so
// that the kernel neither loads nor computes it. Any other Transpose step
// is an error: it moves values between rows.
func inputViews(steps []graph.FusedStep, inputs []*graph.Value, outputs []int64) (out []graph.FusedStep, views []inputView, dead []bool, err error) {
	out = slices.Clone(steps)
	sliceOf := map[int]inputView{} // Slice step -> its view
	view := func(v inputView) graph.FusedOperand {
		views = append(views, v)
		return graph.FusedOperand{Index: len(inputs) + len(views) - 1}
	}
	for k, st := range steps {
		switch st.Op {
		case "Slice":
			if a := st.Args[0]; !a.Step && len(st.Params) == 3 {
				v := inputView{input: a.Index, slice: st.Params}
				sliceOf[k] = v
				out[k] = graph.FusedStep{Op: "Identity", Args: []graph.FusedOperand{view(v)}}
			}
		case "Transpose":
			a := st.Args[0]
			v, ok := sliceOf[a.Index]
			if a.Step && !ok {
				return nil, nil, nil, fmt.Errorf("step %d: a row kernel reads a Transpose of a node input or of a Slice of one only, not of step %d", k, a.Index)
			}
			if !a.Step {
				v = inputView{input: a.Index}
			}
			r := inputs[v.input].Type.Shape.Rank()
			if len(st.Params) != r || st.Params[r-1] != int64(r-1) {
				return nil, nil, nil, fmt.Errorf("step %d: Transpose<%v> of a rank-%d input moves its last axis; a row kernel keeps rows contiguous", k, st.Params, r)
			}
			v.perm = st.Params
			out[k] = graph.FusedStep{Op: "Identity", Args: []graph.FusedOperand{view(v)}}
		}
	}
	read := make([]bool, len(out))
	for _, st := range out {
		for _, a := range st.Args {
			if a.Step {
				read[a.Index] = true
			}
		}
	}
	for _, o := range outputs {
		if o >= 0 && int(o) < len(read) {
			read[o] = true
		}
	}
	dead = make([]bool, len(out))
	for k := range sliceOf {
		dead[k] = !read[k]
	}
	return out, views, dead, nil
}

// Operand reads buf, of shape in, through the view (sliced, then
// transposed), broadcast to shape out.
func (v inputView) Operand(buf Buffer, in graph.Shape, out graph.Shape) Operand {
	st := ContiguousStrides(in)
	shape := in.Clone()
	var off int64
	if v.slice != nil {
		axis := v.slice[0]
		off = v.slice[1] * st[axis]
		shape[axis] = int(v.slice[2] - v.slice[1])
	}
	if v.perm != nil {
		tShape := make(graph.Shape, len(v.perm))
		tStrides := make([]int64, len(v.perm))
		for i, p := range v.perm {
			tShape[i], tStrides[i] = shape[p], st[p]
		}
		shape, st = tShape, tStrides
	}
	r := out.Rank()
	strides := make([]int64, r)
	for i := range shape {
		if shape[i] != 1 {
			strides[r-len(shape)+i] = st[i]
		}
	}
	return Operand{Buf: buf, Off: off, Strides: strides}
}

// TransposedOperand reads buf, of shape in, transposed by perm and then
// broadcast to shape out.
func TransposedOperand(buf Buffer, in graph.Shape, perm []int64, out graph.Shape) Operand {
	return inputView{perm: perm}.Operand(buf, in, out)
}

// leadOf is the first n strides (nil stays nil: an operand not read).
func leadOf(strides []int64, n int) []int64 {
	out := make([]int64, n)
	if strides != nil {
		copy(out, strides[:n])
	}
	return out
}

// NewRows is the row kernel of FusedElementwise node n, whose input i
// is buffer in(i) and output k buffer out(k).
func NewRows(n *graph.Node, steps []graph.FusedStep, types []graph.TensorType, in, out func(int) Buffer) (*Rows, error) {
	red := -1
	for s, st := range steps {
		if graph.FusibleReduce[st.Op] {
			red = s
		}
	}
	full := types[steps[red].Args[0].Index].Shape
	if !steps[red].Args[0].Step {
		full = n.Inputs[steps[red].Args[0].Index].Type.Shape
	}
	reduced := types[red].Shape
	steps, views, dead, err := inputViews(steps, n.Inputs, n.Attrs["outputs"].Ints)
	if err != nil {
		return nil, err
	}
	axes := n.Attrs["axes"].Ints
	r := full.Rank()
	if r == 0 || len(axes) != 1 || (axes[0] != -1 && axes[0] != int64(r-1)) {
		return nil, fmt.Errorf("generated row kernels reduce the last axis only (axes %v of %v)", axes, full)
	}
	p := &Rows{full: full, steps: steps, red: red, mean: steps[red].Op == "ReduceMean",
		rowLevel: make([]bool, len(steps)), dead: dead}
	for s, t := range types {
		switch {
		case dead[s]: // a Slice only its Transposes read: never computed
		case s == red || t.Shape.Equal(reduced): // full has two or more columns
			p.rowLevel[s] = true
		case t.Shape.Equal(full):
		default:
			return nil, fmt.Errorf("step %d is %v: a row kernel computes %v per element and %v per row", s, t.Shape, full, reduced)
		}
		p.narrow = append(p.narrow, t.DType)
	}
	// An element step that reads a row step, or such a step, is late: it
	// waits for the row's values (a second walk); again marks the steps
	// that walk computes, the late ones and the element steps they read.
	p.late = make([]bool, len(steps))
	p.again = make([]bool, len(steps))
	for s, st := range steps {
		if p.rowLevel[s] || dead[s] {
			continue
		}
		for _, a := range st.Args {
			if a.Step && (p.rowLevel[a.Index] || p.late[a.Index]) {
				p.late[s], p.again[s] = true, true
			}
		}
	}
	for s := len(steps) - 1; s >= 0; s-- {
		if !p.again[s] {
			continue
		}
		for _, a := range steps[s].Args {
			if a.Step && !p.rowLevel[a.Index] {
				p.again[a.Index] = true
			}
		}
	}
	// Element steps read inputs and element steps (late ones row steps
	// too); row steps read inputs, row steps and (the reduction only) the
	// reduced element step.
	nIn := len(n.Inputs) + len(views)
	readsElem := make([]bool, nIn)
	readsRow := make([]bool, nIn)
	for s, st := range steps {
		if dead[s] {
			continue
		}
		for _, a := range st.Args {
			switch {
			case !a.Step && s == red: // the reduced operand is read per element
				readsElem[a.Index] = true
			case !a.Step && p.rowLevel[s]:
				readsRow[a.Index] = true
			case !a.Step:
				readsElem[a.Index] = true
			case p.rowLevel[s] && !p.rowLevel[a.Index] && s != red:
				return nil, fmt.Errorf("step %d (per row) reads step %d (per element)", s, a.Index)
			case !p.rowLevel[s] && p.rowLevel[a.Index] && !p.late[s]:
				return nil, fmt.Errorf("step %d (per element) reads step %d (per row) but is not computed in the second walk", s, a.Index)
			}
		}
	}
	if slices.Contains(p.late, true) && n.Attrs.Int("keepdims", 1) == 0 {
		return nil, fmt.Errorf("element steps after a reduction that drops the reduced axis: its values do not broadcast along the row")
	}
	for i := range nIn {
		var e, rw Operand
		var operandOver func(out graph.Shape) Operand
		if i < len(n.Inputs) {
			e.Buf = in(i)
			operandOver = func(out graph.Shape) Operand { return BroadcastOperand(in(i), n.Inputs[i].Type.Shape, out) }
		} else {
			vw := views[i-len(n.Inputs)]
			e.Buf = in(vw.input)
			operandOver = func(out graph.Shape) Operand {
				return vw.Operand(in(vw.input), n.Inputs[vw.input].Type.Shape, out)
			}
		}
		rw.Buf = e.Buf
		if readsElem[i] {
			e = operandOver(full)
		}
		if readsRow[i] {
			rw = operandOver(reduced)
			if reduced.Rank() == r && rw.Strides[r-1] != 0 && reduced[r-1] != 1 {
				return nil, fmt.Errorf("input %d varies along the reduced axis but is read per row", i)
			}
		}
		p.ElemIns = append(p.ElemIns, e)
		p.rIns = append(p.rIns, rw)
	}
	for k, o := range n.Attrs["outputs"].Ints {
		p.outs = append(p.outs, int(o))
		p.OutBufs = append(p.OutBufs, out(k))
	}
	return p, nil
}
