package cuda

import (
	"fmt"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// Generated kernels for bodies with index steps (Slice, Concat): a thread
// per output element knows its coordinates, and every value is computed at
// the coordinates its reader asks for. A Slice shifts its reader's
// coordinate along the sliced axis; a Concat picks one of its operands by
// the coordinate along the joined axis and asks that operand at the
// coordinate less the operands before it. So a rotate-half reads the other
// half of the input row in place, and the elementwise steps under a Concat
// are computed at the positions it selects (each once per position: values
// are kept by the coordinates they were computed at). Operands that are
// shared all-zero constants (the padding of a Slice's gradient) are not read.

// indexProgram is one generated kernel of a body with index steps.
type indexProgram struct {
	shape    graph.Shape // the outputs' shape: one thread per element
	steps    []graph.FusedStep
	types    []graph.TensorType // every step's
	ins      []buffer           // contiguous in their own shapes
	inShapes []graph.Shape
	zero     []bool // input k is a zeros constant: reads give 0
	outs     []int
	obufs    []buffer
}

// indexGen writes the body of one thread.
type indexGen struct {
	p     *indexProgram
	ct    string
	sb    strings.Builder
	memo  []map[string]string // one map per open Concat branch, innermost last
	n     int                 // temporaries named so far
	depth int                 // indentation
}

func (g *indexGen) line(format string, args ...any) {
	g.sb.WriteString(strings.Repeat("    ", g.depth))
	fmt.Fprintf(&g.sb, format, args...)
	g.sb.WriteByte('\n')
}

func (g *indexGen) lookup(key string) (string, bool) {
	for i := len(g.memo) - 1; i >= 0; i-- {
		if v, ok := g.memo[i][key]; ok {
			return v, true
		}
	}
	return "", false
}

// broadcastCoords are the coordinates of an operand of shape s read by a
// step at coords (right-aligned; a size-1 axis reads index 0).
func broadcastCoords(coords []string, s graph.Shape) []string {
	out := make([]string, s.Rank())
	for j := range out {
		if s[j] == 1 {
			out[j] = "0"
		} else {
			out[j] = coords[len(coords)-s.Rank()+j]
		}
	}
	return out
}

// value emits what computing operand a at coords needs and returns the C
// expression of its value.
func (g *indexGen) value(a graph.FusedOperand, coords []string) (string, error) {
	key := a.String() + "@" + strings.Join(coords, ",")
	if v, ok := g.lookup(key); ok {
		return v, nil
	}
	var v string
	var err error
	if a.Step {
		v, err = g.step(a.Index, coords)
	} else {
		v, err = g.input(a.Index, coords)
	}
	if err != nil {
		return "", err
	}
	g.memo[len(g.memo)-1][key] = v
	return v, nil
}

func (g *indexGen) input(k int, coords []string) (string, error) {
	p := g.p
	if p.zero[k] {
		return "(" + g.ct + ")0", nil
	}
	s := p.inShapes[k]
	st := contiguousStrides(s)
	terms := []string{"0ull"}
	for j, c := range coords {
		if s[j] != 1 && c != "0" {
			terms = append(terms, fmt.Sprintf("(unsigned long long)(%s) * %dull", c, st[j]))
		}
	}
	t, err := ctype(p.ins[k].dt)
	if err != nil {
		return "", err
	}
	name := fmt.Sprintf("v%d", g.n)
	g.n++
	g.line("const %s %s = %s;", g.ct, name, loadExpr(t, g.ct, fmt.Sprintf("in%d[%s]", k, strings.Join(terms, " + "))))
	return name, nil
}

func (g *indexGen) shapeOf(a graph.FusedOperand) graph.Shape {
	if a.Step {
		return g.p.types[a.Index].Shape
	}
	return g.p.inShapes[a.Index]
}

func (g *indexGen) step(s int, coords []string) (string, error) {
	p := g.p
	st := p.steps[s]
	switch st.Op {
	case "Slice":
		axis, start := int(st.Params[0]), st.Params[1]
		c := append([]string(nil), coords...)
		if start != 0 {
			c[axis] = fmt.Sprintf("(%s + %du)", coords[axis], start)
		}
		return g.value(st.Args[0], c)
	case "Concat":
		axis := int(st.Params[0])
		name := fmt.Sprintf("v%d", g.n)
		g.n++
		g.line("%s %s;", g.ct, name)
		off := int64(0)
		for j, a := range st.Args {
			size := int64(g.shapeOf(a)[axis])
			c := append([]string(nil), coords...)
			if off != 0 {
				c[axis] = fmt.Sprintf("(%s - %du)", coords[axis], off)
			}
			switch {
			case j == len(st.Args)-1 && j > 0:
				g.line("else {")
			case j == 0 && len(st.Args) > 1:
				g.line("if (%s < %du) {", coords[axis], off+size)
			case j > 0:
				g.line("else if (%s < %du) {", coords[axis], off+size)
			default:
				g.line("{")
			}
			g.depth++
			g.memo = append(g.memo, map[string]string{})
			v, err := g.value(a, c)
			if err != nil {
				return "", err
			}
			g.line("%s = %s;", name, v)
			g.memo = g.memo[:len(g.memo)-1]
			g.depth--
			g.line("}")
			off += size
		}
		return name, nil
	}
	ops := make([]string, len(st.Args))
	for j, a := range st.Args {
		v, err := g.value(a, broadcastCoords(coords, g.shapeOf(a)))
		if err != nil {
			return "", err
		}
		ops[j] = v
	}
	e, err := ewExpr(st.Op, g.ct, ops)
	if err != nil {
		return "", err
	}
	if dt := p.types[s].DType; is16(dt) {
		t, _ := ctype(dt)
		e = loadExpr(t, g.ct, storeExpr(t, g.ct, e))
	}
	name := fmt.Sprintf("v%d", g.n)
	g.n++
	g.line("const %s %s = %s;", g.ct, name, e)
	return name, nil
}

// generate writes the kernel ("ix") and returns it with the element count.
func (p *indexProgram) generate() (string, int64, error) {
	n := int64(p.shape.Numel())
	r := p.shape.Rank()
	g := &indexGen{p: p, ct: "float", memo: []map[string]string{{}}, depth: 2}
	var params []string
	for k, b := range p.ins {
		t, err := ctype(b.dt)
		if err != nil {
			return "", 0, err
		}
		if b.dt == graph.Float64 {
			g.ct = "double"
		}
		params = append(params, fmt.Sprintf("const %s* __restrict__ in%d", t, k))
	}
	otypes := make([]string, len(p.obufs))
	for i, b := range p.obufs {
		t, err := ctype(b.dt)
		if err != nil {
			return "", 0, err
		}
		if b.dt == graph.Float64 {
			g.ct = "double"
		}
		otypes[i] = t
		params = append(params, fmt.Sprintf("%s* __restrict__ out%d", t, i))
	}
	idx := "unsigned"
	if n >= 1<<31 {
		idx = "unsigned long long"
	}
	coords := make([]string, r)
	for j := range coords {
		coords[j] = fmt.Sprintf("c%d", j)
	}
	vals := make([]string, len(p.outs))
	for i, s := range p.outs {
		v, err := g.value(graph.FusedOperand{Step: true, Index: s}, coords)
		if err != nil {
			return "", 0, err
		}
		vals[i] = v
	}
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	w("#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n")
	w("// %v, %d inputs, %d steps with index steps, %d outputs\n", p.shape, len(p.ins), len(p.steps), len(p.obufs))
	w("extern \"C\" __global__ void __launch_bounds__(256) ix(%s)\n{\n", strings.Join(params, ", "))
	w("    for (%s i = blockIdx.x * (%s)blockDim.x + threadIdx.x; i < %dull; i += (%s)gridDim.x * blockDim.x) {\n", idx, idx, n, idx)
	w("        %s rem = i;\n", idx)
	for j := r - 1; j >= 0; j-- {
		if j > 0 {
			w("        const %s c%d = rem %% %du; rem /= %du;\n", idx, j, p.shape[j], p.shape[j])
		} else {
			w("        const %s c0 = rem;\n", idx)
		}
	}
	sb.WriteString(g.sb.String())
	for i, v := range vals {
		w("        out%d[i] = %s;\n", i, storeExpr(otypes[i], g.ct, v))
	}
	w("    }\n}\n")
	return sb.String(), n, nil
}

// lowerFusedIndex lowers a FusedElementwise node whose body has index
// steps to one generated kernel.
func lowerFusedIndex(c *lowerCtx, steps []graph.FusedStep, types []graph.TensorType) (func() error, error) {
	n := c.n
	shape := n.Outputs[0].Type.Shape
	p := &indexProgram{shape: shape, steps: steps, types: types}
	for k, o := range n.Attrs["outputs"].Ints {
		if !types[o].Shape.Equal(shape) {
			return nil, fmt.Errorf("output %d is %v, output 0 %v: a generated kernel writes one shape", k, types[o].Shape, shape)
		}
		p.outs = append(p.outs, int(o))
		p.obufs = append(p.obufs, c.out(k))
	}
	for i, v := range n.Inputs {
		p.ins = append(p.ins, c.in(i))
		p.inShapes = append(p.inShapes, v.Type.Shape)
		// Only zeros that SetInitializer cannot change (a shared buffer).
		p.zero = append(p.zero, v.Kind == graph.Const && v.Init != nil && v.Init.Fn == "zeros" &&
			(c.x.sharedZeros[v] || c.x.zerosShared(v)))
	}
	src, count, err := p.generate()
	if err != nil {
		return nil, err
	}
	if count == 0 {
		return nop, nil
	}
	f, err := c.x.b.generatedFunction(src, "ix")
	if err != nil {
		return nil, err
	}
	var args []any
	for _, b := range p.ins {
		args = append(args, b.ptr)
	}
	for _, b := range p.obufs {
		args = append(args, b.ptr)
	}
	l, err := newRawLaunch(f, c.gridFor(count, 256), [3]uint32{256, 1, 1}, 0, args...)
	if err != nil {
		return nil, err
	}
	d := c.dev()
	return func() error { return l.run(d) }, nil
}
