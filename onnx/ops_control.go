package onnx

import (
	"fmt"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
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
		im.env[t.Name] = im.addInit(&entry{name: t.Name, c: cv})
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
		if isOutput || e.c != nil {
			// A graph output takes the If's name (a node writes it); a
			// constant is known under it.
			if err := c.setOutput(i, e); err != nil {
				return err
			}
			continue
		}
		c.out[i] = e // the branch's value, read under the If's name
	}
	return nil
}

// Loop and Scan are imported unrolled when their iteration count is known
// at import: each iteration imports the body's nodes again under fresh
// names, its inputs bound to the iteration's values; the loop-carried
// values flow from one iteration to the next and the scan outputs of every
// iteration are stacked. A Loop whose condition is computed at run time is
// refused.

func init() {
	handlers["Loop"] = importLoop
	handlers["Scan"] = importScan
}

// maxUnroll bounds the iterations an unrolled loop may have.
const maxUnroll = 4096

// body imports one iteration of subgraph g with its inputs bound to in and
// returns its outputs. Every value the body defines gets a fresh name; the
// outer values it reads keep theirs.
func (c *opCtx) body(g *onnxpb.Graph, in []*entry, iter int) ([]*entry, error) {
	im := c.im
	if len(g.Input) != len(in) {
		return nil, c.errf("the body has %d inputs, want %d", len(g.Input), len(in))
	}
	rename := map[string]string{}
	fresh := func(name string) string {
		f := im.values.Fresh(fmt.Sprintf("%s/%d/%s", c.nodeBase(), iter, name))
		rename[name] = f
		return f
	}
	for i, vi := range g.Input {
		e := *in[i]
		if vi.Type.IsOptional() && !e.isOpt {
			// A value carried into an optional (Loop's state that starts
			// absent and is a sequence from then on) is one that is present.
			e = entry{isOpt: true, opt: in[i]}
		}
		e.name = fresh(vi.Name)
		im.env[e.name] = &e
	}
	for _, t := range g.Initializer {
		cv, err := cvalFromTensor(t)
		if err != nil {
			return nil, c.errf("body initializer %q: %v", t.Name, err)
		}
		e := im.addInit(&entry{name: fresh(t.Name), c: cv})
		im.env[e.name] = e
	}
	for _, n := range g.Node {
		cl := *n
		if slices.ContainsFunc(n.Attribute, func(a *onnxpb.Attribute) bool { return a.G != nil || len(a.Graphs) > 0 }) {
			// A subgraph (an If's branches) reads the body's values and
			// defines its own, which each iteration imports again: a copy
			// under this iteration's names.
			cl.Attribute = renameAttrs(n.Attribute, rename, fresh)
			for _, a := range cl.Attribute {
				if a.G != nil {
					im.markConsumed(a.G)
				}
				for _, sg := range a.Graphs {
					im.markConsumed(sg)
				}
			}
		}
		cl.Name = ""
		cl.Input = slices.Clone(n.Input)
		for i, name := range cl.Input {
			if r, ok := rename[name]; ok {
				cl.Input[i] = r
			}
			im.consumed[cl.Input[i]] = true
		}
		cl.Output = slices.Clone(n.Output)
		for i, name := range cl.Output {
			if name != "" {
				cl.Output[i] = fresh(name)
			}
		}
		if err := im.node(&cl); err != nil {
			return nil, err
		}
	}
	out := make([]*entry, len(g.Output))
	for i, vi := range g.Output {
		name := vi.Name
		if r, ok := rename[name]; ok {
			name = r
		}
		e, ok := im.env[name]
		if !ok {
			return nil, c.errf("body output %q is not produced", vi.Name)
		}
		out[i] = e
	}
	return out, nil
}

// renameGraph copies subgraph g of a loop body for one iteration: the
// names it reads from the body (rename) take the iteration's names, and the
// names it defines (inputs, initializers, node outputs, at any depth) fresh
// ones, so that importing it again in the next iteration defines nothing
// twice. fresh records each new name in rename.
func renameGraph(g *onnxpb.Graph, rename map[string]string, fresh func(string) string) *onnxpb.Graph {
	to := func(name string) string {
		if r, ok := rename[name]; ok {
			return r
		}
		return name
	}
	cp := *g
	cp.Input = renameInfos(g.Input, fresh)
	cp.Initializer = make([]*onnxpb.Tensor, len(g.Initializer))
	for i, t := range g.Initializer {
		ct := *t
		ct.Name = fresh(t.Name)
		cp.Initializer[i] = &ct
	}
	cp.Node = make([]*onnxpb.Node, len(g.Node))
	for i, n := range g.Node {
		cn := *n
		cn.Input = make([]string, len(n.Input))
		for k, name := range n.Input {
			cn.Input[k] = to(name)
		}
		cn.Output = make([]string, len(n.Output))
		for k, name := range n.Output {
			if name != "" {
				name = fresh(name)
			}
			cn.Output[k] = name
		}
		cn.Attribute = renameAttrs(n.Attribute, rename, fresh)
		cp.Node[i] = &cn
	}
	cp.Output = renameInfos(g.Output, to)
	return &cp
}

// renameInfos copies value infos with their names mapped by name.
func renameInfos(infos []*onnxpb.ValueInfo, name func(string) string) []*onnxpb.ValueInfo {
	out := make([]*onnxpb.ValueInfo, len(infos))
	for i, vi := range infos {
		v := *vi
		v.Name = name(vi.Name)
		out[i] = &v
	}
	return out
}

// renameAttrs copies a node's attributes, its subgraphs renamed (renameGraph).
func renameAttrs(attrs []*onnxpb.Attribute, rename map[string]string, fresh func(string) string) []*onnxpb.Attribute {
	out := make([]*onnxpb.Attribute, len(attrs))
	for k, a := range attrs {
		ca := *a
		if a.G != nil {
			ca.G = renameGraph(a.G, rename, fresh)
		}
		if a.Graphs != nil {
			ca.Graphs = make([]*onnxpb.Graph, len(a.Graphs))
			for j, sg := range a.Graphs {
				ca.Graphs[j] = renameGraph(sg, rename, fresh)
			}
		}
		out[k] = &ca
	}
	return out
}

// markConsumed counts every value subgraph g's nodes read, and its outputs,
// as read (as run does for the model's own subgraphs).
func (im *importer) markConsumed(g *onnxpb.Graph) {
	for _, o := range g.Output {
		im.consumed[o.Name] = true
	}
	for _, n := range g.Node {
		for _, in := range n.Input {
			im.consumed[in] = true
		}
		for _, a := range n.Attribute {
			if a.G != nil {
				im.markConsumed(a.G)
			}
			for _, sg := range a.Graphs {
				im.markConsumed(sg)
			}
		}
	}
}

// markBodyOutputs counts the body's outputs as read (each iteration's
// values feed the next or the stacked outputs).
func (c *opCtx) markBodyOutputs(g *onnxpb.Graph) {
	for _, o := range g.Output {
		c.im.consumed[o.Name] = true
	}
}

// setOutput makes e ONNX output i of the node: a constant under the
// output's name, or a node writing it.
func (c *opCtx) setOutput(i int, e *entry) error {
	if i >= len(c.n.Output) || c.n.Output[i] == "" {
		return nil
	}
	if e.nonTensor() {
		c.alias(i, e) // an import-time value: nothing to write
		return nil
	}
	if e.c != nil {
		c.out[i] = &entry{name: c.n.Output[i], c: e.c, seq: c.im.nextSeq}
		c.im.nextSeq++
		c.im.inits = append(c.im.inits, c.out[i])
		return nil
	}
	r := c.rewrite()
	if r.emitOutput(i, "Identity", nil, r.val(e)); r.err != nil {
		return r.err
	}
	c.out[i].odt = e.odt // a narrow integer type carries through
	return nil
}

// stack writes ONNX output i as the per-iteration values stacked on a new
// axis, in order (reversed when reverse).
func (c *opCtx) stack(i int, parts []*entry, axis int64, reverse bool) error {
	if i >= len(c.n.Output) || c.n.Output[i] == "" {
		return nil
	}
	if len(parts) == 0 {
		return c.errf("output %d stacks no iterations (its shape would be unknown)", i)
	}
	e, err := c.stacked(parts, axis, reverse)
	if err != nil {
		return err
	}
	return c.setOutput(i, e)
}

// stacked is parts stacked on a new axis: a constant when every part is
// one, else an Unsqueeze of each and a Concat.
func (c *opCtx) stacked(parts []*entry, axis int64, reverse bool) (*entry, error) {
	if reverse {
		parts = slices.Clone(parts)
		slices.Reverse(parts)
	}
	if cv := stackConst(parts, int(axis)); cv != nil {
		return &entry{c: cv}, nil
	}
	r := c.rewrite()
	ax := r.ints("axes", []int64{axis})
	vs := make([]*graph.Value, len(parts))
	for k, e := range parts {
		vs[k] = r.sub("Unsqueeze", nil, r.val(e), ax)
	}
	v := r.sub("Concat", graph.Attrs{"axis": graph.Int(axis)}, vs...)
	if r.err != nil {
		return nil, r.err
	}
	return &entry{name: v.Name, v: v, odt: parts[0].odt}, nil
}

// stackConst stacks constant parts of one type and shape on a new axis, or
// returns nil when a part is not a constant.
func stackConst(parts []*entry, axis int) *cval {
	first := parts[0].c
	for _, e := range parts {
		if e.c == nil || e.c.dt != first.dt || !e.c.shape.Equal(first.shape) {
			return nil
		}
	}
	shape := slices.Insert(first.shape.Clone(), axis, len(parts))
	out := newCval(first.dt, shape)
	outer, inner := first.shape[:axis].Numel(), first.shape[axis:].Numel()
	for k, e := range parts {
		for o := range outer {
			dst := (o*len(parts) + k) * inner
			if out.f != nil {
				copy(out.f[dst:dst+inner], e.c.f[o*inner:(o+1)*inner])
			} else {
				copy(out.i[dst:dst+inner], e.c.i[o*inner:(o+1)*inner])
			}
		}
	}
	return out
}

// loopBody reads the body attribute Loop and Scan share, and marks the
// outputs its nodes make.
func (c *opCtx) loopBody() (*onnxpb.Graph, error) {
	body, err := c.attr("body", onnxpb.AttrGraph)
	if err != nil {
		return nil, err
	}
	if body == nil || body.G == nil {
		return nil, c.errf("needs a body")
	}
	c.markBodyOutputs(body.G)
	return body.G, nil
}

func importLoop(c *opCtx) error {
	g, err := c.loopBody()
	if err != nil {
		return err
	}
	trips := int64(maxUnroll + 1)
	if c.input(0) != nil {
		m, err := c.constScalar(0, "M (the trip count)", 0)
		if err != nil {
			return err
		}
		trips = m
	}
	cond := true
	if c.input(1) != nil {
		cv, err := c.constInput(1, "cond")
		if err != nil {
			return err
		}
		if cv.n() != 1 {
			return c.errf("cond: want one value")
		}
		cond = cv.at(0) != 0
	}
	carried := slices.Clone(c.in[2:])
	for _, e := range carried {
		if e == nil {
			return c.errf("an omitted loop-carried value is not supported")
		}
	}
	nScan := len(g.Output) - 1 - len(carried)
	if nScan < 0 || len(g.Input) != 2+len(carried) {
		return c.errf("the body's %d inputs and %d outputs do not fit %d loop-carried values", len(g.Input), len(g.Output), len(carried))
	}
	scans := make([][]*entry, nScan)
	iter := 0
	for ; int64(iter) < trips && cond; iter++ {
		if iter == maxUnroll {
			return c.errf("more than %d iterations to unroll", maxUnroll)
		}
		in := []*entry{
			{c: &cval{dt: onnxpb.Int64, shape: graph.Shape{}, i: []int64{int64(iter)}}},
			{c: &cval{dt: onnxpb.Bool, shape: graph.Shape{}, i: []int64{1}}},
		}
		out, err := c.body(g, append(in, carried...), iter)
		if err != nil {
			return err
		}
		if out[0].c == nil || out[0].c.n() != 1 {
			return c.errf("the loop's condition is computed at run time: the iterations are not known at import")
		}
		cond = out[0].c.at(0) != 0
		carried = out[1 : 1+len(carried)]
		for k := range scans {
			scans[k] = append(scans[k], out[1+len(carried)+k])
		}
	}
	for k, e := range carried {
		if err := c.setOutput(k, e); err != nil {
			return err
		}
	}
	for k, parts := range scans {
		if err := c.stack(len(carried)+k, parts, 0, false); err != nil {
			return err
		}
	}
	return nil
}

// importScan unrolls Scan over the scan axis of its scan inputs. Before
// opset 9 every input has a leading batch axis (the scan axis is the one
// after it) and the body runs on each batch entry alone: the batch is
// unrolled too and the results stacked on it; sequence_lens is refused.
func importScan(c *opCtx) error {
	g, err := c.loopBody()
	if err != nil {
		return err
	}
	m, err := c.attrInt("num_scan_inputs", 0)
	if err != nil {
		return err
	}
	in := c.in
	if c.ver < 9 {
		if len(in) > 0 && in[0] != nil {
			return c.errf("sequence_lens is not supported")
		}
		if len(in) > 0 {
			in = in[1:]
		}
	}
	nState := len(in) - int(m)
	if m < 1 || nState < 0 {
		return c.errf("num_scan_inputs %d for %d inputs", m, len(in))
	}
	nOut := len(g.Output) - nState
	if nOut < 0 {
		return c.errf("the body's %d outputs do not fit %d state values", len(g.Output), nState)
	}
	list := func(name string, n int) ([]int64, error) {
		v, ok, err := c.attrInts(name)
		if err != nil {
			return nil, err
		}
		if !ok {
			return make([]int64, n), nil
		}
		if len(v) != n {
			return nil, c.errf("%s %v: want %d values", name, v, n)
		}
		return v, nil
	}
	sc := &scan{c: c, g: g, nState: nState, nOut: nOut}
	if c.ver < 9 {
		if sc.inDirs, err = list("directions", int(m)); err != nil {
			return err
		}
		sc.inAxes, sc.outAxes, sc.outDirs = make([]int64, m), make([]int64, nOut), make([]int64, nOut)
	} else {
		for _, l := range []struct {
			name string
			n    int
			dst  *[]int64
		}{{"scan_input_axes", int(m), &sc.inAxes}, {"scan_input_directions", int(m), &sc.inDirs},
			{"scan_output_axes", nOut, &sc.outAxes}, {"scan_output_directions", nOut, &sc.outDirs}} {
			if *l.dst, err = list(l.name, l.n); err != nil {
				return err
			}
		}
	}
	for _, e := range in {
		if e == nil {
			return c.errf("an omitted state or scan input is not supported")
		}
	}
	if c.ver >= 9 {
		state, outs, err := sc.run(in[:nState], in[nState:], 0)
		if err != nil {
			return err
		}
		for k, e := range append(state, outs...) {
			if err := c.setOutput(k, e); err != nil {
				return err
			}
		}
		return nil
	}
	// Opset 8: one scan per batch entry, the results stacked on axis 0.
	_, s0 := in[0].typ()
	if s0.Rank() == 0 {
		return c.errf("input %v has no batch axis", s0)
	}
	batch := s0[0]
	results := make([][]*entry, len(g.Output))
	for b := range batch {
		part := make([]*entry, len(in))
		for k, e := range in {
			r := c.rewrite()
			v := r.val(e)
			if r.err != nil {
				return r.err
			}
			if v.Type.Shape.Rank() == 0 || v.Type.Shape[0] != batch {
				return c.errf("input %d %v: want a batch axis of %d", k, v.Type.Shape, batch)
			}
			p := r.pick(v, int64(b), 0)
			if r.err != nil {
				return r.err
			}
			part[k] = &entry{name: p.Name, v: p, odt: e.odt}
		}
		state, outs, err := sc.run(part[:nState], part[nState:], b*maxUnroll)
		if err != nil {
			return err
		}
		for k, e := range append(state, outs...) {
			results[k] = append(results[k], e)
		}
	}
	for k, parts := range results {
		if err := c.stack(k, parts, 0, false); err != nil {
			return err
		}
	}
	return nil
}

// scan is a Scan's body and axes, run by run.
type scan struct {
	c                                *opCtx
	g                                *onnxpb.Graph
	nState, nOut                     int
	inAxes, inDirs, outAxes, outDirs []int64
}

// run unrolls the scan of xs from state, returning the final state and
// each scan output stacked (iterations numbered from first, for names).
func (s *scan) run(state, xs []*entry, first int) (final, outs []*entry, err error) {
	c := s.c
	vals := make([]*graph.Value, len(xs))
	steps := -1
	axes := slices.Clone(s.inAxes)
	for k, e := range xs {
		if vals[k], err = c.im.val(e); err != nil {
			return nil, nil, c.errf("%v", err)
		}
		sh := vals[k].Type.Shape
		a, err := graph.NormAxis(int(axes[k]), sh.Rank())
		if err != nil {
			return nil, nil, c.errf("scan input axis: %v", err)
		}
		axes[k] = int64(a)
		if steps >= 0 && sh[a] != steps {
			return nil, nil, c.errf("scan inputs of %d and %d steps", steps, sh[a])
		}
		steps = sh[a]
	}
	if steps > maxUnroll {
		return nil, nil, c.errf("more than %d iterations to unroll", maxUnroll)
	}
	if steps <= 0 {
		return nil, nil, c.errf("a scan of no steps is not supported")
	}
	scans := make([][]*entry, s.nOut)
	for it := range steps {
		in := slices.Clone(state)
		for k, v := range vals {
			pos := it
			if s.inDirs[k] != 0 {
				pos = steps - 1 - it
			}
			r := c.rewrite()
			p := r.pick(v, int64(pos), axes[k])
			if r.err != nil {
				return nil, nil, r.err
			}
			in = append(in, &entry{name: p.Name, v: p, odt: xs[k].odt})
		}
		out, err := c.body(s.g, in, first+it)
		if err != nil {
			return nil, nil, err
		}
		state = out[:s.nState]
		for k := range scans {
			scans[k] = append(scans[k], out[s.nState+k])
		}
	}
	for k, parts := range scans {
		v, err := c.im.val(parts[0])
		if err != nil {
			return nil, nil, c.errf("%v", err)
		}
		a, err := graph.NormAxis(int(s.outAxes[k]), v.Type.Shape.Rank()+1)
		if err != nil {
			return nil, nil, c.errf("scan_output_axes: %v", err)
		}
		st, err := c.stacked(parts, int64(a), s.outDirs[k] != 0)
		if err != nil {
			return nil, nil, err
		}
		outs = append(outs, st)
	}
	return state, outs, nil
}
