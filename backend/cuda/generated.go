package cuda

import (
	"fmt"

	"github.com/flashgraph/flashgraph/backend/cuda/codegen"
	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/graph"
)

// The launches of generated kernels: codegen writes the CUDA C of a program
// over buffers it knows by address and type; here it is compiled (once per
// source), and launched over the executor's buffers.

// gen is what the code generator knows of b.
func (b buffer) gen() codegen.Buffer { return codegen.Buffer{Addr: uint64(b.ptr), DType: b.dt, N: b.n} }

// inGen and outGen are c.in and c.out as the code generator knows them.
func (c *lowerCtx) inGen(i int) codegen.Buffer  { return c.in(i).gen() }
func (c *lowerCtx) outGen(i int) codegen.Buffer { return c.out(i).gen() }

// generatedFunction compiles (once per source) a generated kernel and
// returns its entry point.
func (b *Backend) generatedFunction(src, entry string) (*Function, error) {
	if b.render != nil {
		b.render(entry, src)
		return &Function{}, nil
	}
	b.genMu.Lock()
	defer b.genMu.Unlock()
	key := entry + "\x00" + src
	if f, ok := b.generated[key]; ok {
		return f, nil
	}
	m, err := b.dev.Compile("generated_"+entry+".cu", src, codegen.CompileOptions...)
	if err != nil {
		return nil, fmt.Errorf("generated kernel: %w\n%s", err, src)
	}
	f, err := m.Function(entry)
	if err != nil {
		return nil, err
	}
	if b.generated == nil {
		b.generated = map[string]*Function{}
	}
	b.generated[key] = f
	return f, nil
}

// lowerEwProgram generates, compiles and launches p.
func (c *lowerCtx) lowerEwProgram(p *codegen.Elementwise) (func() error, error) {
	return c.lowerProgram(p)
}

// lowerProgram generates, compiles and launches a program of any variant.
func (c *lowerCtx) lowerProgram(p codegen.Program) (func() error, error) {
	k, err := p.Generate()
	if err != nil {
		return nil, err
	}
	return c.launchKernel(k)
}

// launchKernel compiles a generated kernel (once per source) and returns
// its launch: k.Threads threads in blocks of 256 (the grid capped by
// gridFor), or k's own grid and block; its buffers' addresses as the
// arguments, in order, then the node's error flag and code when it raises
// it. A kernel with no work is not launched.
func (c *lowerCtx) launchKernel(k codegen.Kernel) (func() error, error) {
	grid, block := k.Grid, k.Block
	if block == ([3]uint32{}) {
		if k.Threads == 0 {
			return nop, nil
		}
		grid, block = c.gridFor(k.Threads, 256), [3]uint32{256, 1, 1}
	}
	f, err := c.x.b.generatedFunction(k.Source, k.Entry)
	if err != nil {
		return nil, err
	}
	var args []any
	for _, b := range k.Args {
		args = append(args, DevicePtr(b.Addr))
	}
	if k.UsesFlag {
		args = append(args, c.flag(), c.code())
	}
	l, err := driver.NewRawLaunch(f, grid, block, 0, args...)
	if err != nil {
		return nil, err
	}
	d := c.dev()
	return func() error { return l.Run(d) }, nil
}

// lowerFusedElementwise lowers a FusedElementwise node to one generated kernel.
func lowerFusedElementwise(c *lowerCtx) (func() error, error) {
	n := c.n
	steps, err := graph.FusedBody(n.Attrs.String("body", ""), len(n.Inputs))
	if err != nil {
		return nil, err
	}
	inTypes := make([]graph.TensorType, len(n.Inputs))
	for i, v := range n.Inputs {
		inTypes[i] = v.Type
	}
	types, err := graph.FusedTypes(steps, inTypes, n.Attrs)
	if err != nil {
		return nil, err
	}
	for _, st := range steps {
		if graph.FusibleReduce[st.Op] {
			return lowerFusedRows(c, steps, types)
		}
	}
	for _, st := range steps {
		if _, ok := graph.FusibleIndex[st.Op]; ok {
			return lowerFusedIndex(c, steps, types)
		}
	}
	shape := n.Outputs[0].Type.Shape
	for k, t := range types {
		if !t.Shape.Equal(shape) {
			return nil, fmt.Errorf("step %d is %v, the outputs %v: a generated kernel computes one shape", k, t.Shape, shape)
		}
	}
	p := &codegen.Elementwise{Shape: shape, Steps: steps}
	for _, t := range types {
		p.Narrow = append(p.Narrow, t.DType)
	}
	for i, v := range n.Inputs {
		p.Ins = append(p.Ins, codegen.BroadcastOperand(c.inGen(i), v.Type.Shape, shape))
	}
	for k, o := range n.Attrs["outputs"].Ints {
		p.Outs = append(p.Outs, int(o))
		p.OutBufs = append(p.OutBufs, c.outGen(k))
	}
	return c.lowerEwProgram(p)
}

// lowerGenerated lowers a node of an op defined by an expression (every
// elementwise op of the op table): the node becomes a generated program of
// one step, in whatever dtypes it has (float work in float or double,
// int64 and bool work in long long).
func lowerGenerated(op string) lowerFn {
	return func(c *lowerCtx) (func() error, error) {
		shape := c.n.Outputs[0].Type.Shape
		st := graph.FusedStep{Op: op, Attrs: graph.ExprStepAttrs(op, c.n.Attrs)}
		p := &codegen.Elementwise{Shape: shape, Outs: []int{0}, OutBufs: []codegen.Buffer{c.outGen(0)}}
		for i, v := range c.n.Inputs {
			p.Ins = append(p.Ins, codegen.BroadcastOperand(c.inGen(i), v.Type.Shape, shape))
			st.Args = append(st.Args, graph.FusedOperand{Index: i})
		}
		p.Steps = []graph.FusedStep{st}
		return c.lowerEwProgram(p)
	}
}

// copyTo copies (and converts) operand src, read over shape, into dst:
// data movement (Transpose, Slice, Expand, Cast, a copy) as a generated
// program of one Identity step.
func (c *lowerCtx) copyTo(dst buffer, shape graph.Shape, src codegen.Operand) (func() error, error) {
	if shape.Numel() == 0 {
		return nop, nil
	}
	p := &codegen.Elementwise{Shape: shape, Ins: []codegen.Operand{src}, Outs: []int{0}, OutBufs: []codegen.Buffer{dst.gen()},
		Steps: []graph.FusedStep{{Op: "Identity", Args: []graph.FusedOperand{{Index: 0}}}}}
	return c.lowerEwProgram(p)
}

// lowerFusedRows lowers a FusedElementwise node whose body reduces its last
// axis to one generated row kernel.
func lowerFusedRows(c *lowerCtx, steps []graph.FusedStep, types []graph.TensorType) (func() error, error) {
	p, err := codegen.NewRows(c.n, steps, types, c.inGen, c.outGen)
	if err != nil {
		return nil, err
	}
	return c.lowerProgram(p)
}

// lowerFusedIndex lowers a FusedElementwise node whose body has index
// steps to one generated kernel.
func lowerFusedIndex(c *lowerCtx, steps []graph.FusedStep, types []graph.TensorType) (func() error, error) {
	n := c.n
	shape := n.Outputs[0].Type.Shape
	inShapes := make([]graph.Shape, len(n.Inputs))
	for i, v := range n.Inputs {
		inShapes[i] = v.Type.Shape
	}
	p := &codegen.Index{Shape: shape, Steps: codegen.NormalizeIndexSteps(steps, types, inShapes), Types: types}
	for k, o := range n.Attrs["outputs"].Ints {
		if !types[o].Shape.Equal(shape) {
			return nil, fmt.Errorf("output %d is %v, output 0 %v: a generated kernel writes one shape", k, types[o].Shape, shape)
		}
		p.Outs = append(p.Outs, int(o))
		p.OutBufs = append(p.OutBufs, c.outGen(k))
	}
	for i, v := range n.Inputs {
		p.Ins = append(p.Ins, c.inGen(i))
		p.InShapes = append(p.InShapes, v.Type.Shape)
		// Only zeros that SetInitializer cannot change (a shared buffer).
		p.Zero = append(p.Zero, v.Kind == graph.Const && v.Init != nil && v.Init.Fn == "zeros" &&
			(c.x.sharedZeros[v] || c.x.zerosShared(v)))
	}
	p.Vec = p.VectorWidth()
	return c.lowerProgram(p)
}

// lowerRowReduceGenerated returns the generated kernel for rp when it is a
// reduction over the last axis of a contiguous float tensor, or nil.
func (c *lowerCtx) lowerRowReduceGenerated(rp reducePlan, x, y buffer) (func() error, error) {
	if !rp.rows || len(rp.red) != 1 || rp.redS[0] != 1 || !x.dt.IsFloat() || !y.dt.IsFloat() {
		return nil, nil
	}
	// Rows must follow each other: the kept dims merge into one of stride
	// count (or there is one row).
	if rp.nout > 1 && (len(rp.kept) != 1 || rp.keptS[0] != rp.count) {
		return nil, nil
	}
	p := &codegen.RowReduce{X: x.gen(), Y: y.gen(), Rows: rp.nout, Cols: rp.count, Op: rp.op, Divisor: 1}
	if rp.mean {
		p.Divisor = rp.count
	}
	return c.lowerProgram(p)
}

// lowerColReduceGenerated lowers a reduction over the leading axes of a
// contiguous float tensor (rp.colsContig): one pass, or two with partials in
// the node's scratch.
func (c *lowerCtx) lowerColReduceGenerated(rp reducePlan, x, y buffer) (func() error, error) {
	div := int64(1)
	if rp.mean {
		div = rp.count
	}
	if rp.chunks <= 1 {
		return c.lowerProgram(&codegen.ColReduce{X: x.gen(), Y: y.gen(), Rows: rp.count, Cols: rp.nout, ChunkLen: rp.count, Op: rp.op, Divisor: div})
	}
	part, err := c.takeScratch()
	if err != nil {
		return nil, err
	}
	first, err := c.lowerProgram(&codegen.ColReduce{X: x.gen(), Y: part.gen(), Rows: rp.count, Cols: rp.nout, ChunkLen: rp.clen, Op: rp.op, Divisor: 1})
	if err != nil {
		return nil, err
	}
	second, err := c.lowerProgram(&codegen.ColReduce{X: part.gen(), Y: y.gen(), Rows: rp.chunks, Cols: rp.nout, ChunkLen: rp.chunks, Op: rp.op, Divisor: div,
		PartialsF32: part.dt == graph.Float32})
	if err != nil {
		return nil, err
	}
	return seq(first, second), nil
}
