package codegen

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
//
// A Transpose asks its operand at the permuted coordinates (operand axis
// perm[i] at the reader's coordinate i), so a body reads a transposed input,
// or writes a transposed result, without a copy of either.
//
// Where every cut along the last axis (Slice starts, Concat pieces) and
// every operand's last dimension is a multiple of a 16-byte vector, a
// thread takes a vector of consecutive elements along the last axis: its
// branches are the same for all of them, and each operand is one 16-byte
// load. Every value is an array of vec elements in registers.

// Index is one generated kernel of a body with index steps.
type Index struct {
	Shape    graph.Shape // the outputs' shape: one thread per element
	Steps    []graph.FusedStep
	Types    []graph.TensorType // every step's
	Ins      []Buffer           // contiguous in their own shapes
	InShapes []graph.Shape
	Zero     []bool // input k is a zeros constant: reads give 0
	Outs     []int
	OutBufs  []Buffer
	Vec      int // elements per thread along the last axis (1: one)
}

// indexGen writes the body of one thread.
type indexGen struct {
	p     *Index
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

// newValue declares the next value: an array of the thread's vec
// elements, named v<n>.
func (g *indexGen) newValue() string {
	name := fmt.Sprintf("v%d", g.n)
	g.n++
	g.line("%s %s[%d];", g.ct, name, g.p.Vec)
	return name
}

// fill sets each element e of value name to x, then writes tail.
func (g *indexGen) fill(name, x, tail string) {
	g.line("#pragma unroll")
	g.line("for (int e = 0; e < %d; e++) { %s[e] = %s; }%s", g.p.Vec, name, x, tail)
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
	vec := p.Vec
	if p.Zero[k] {
		name := g.newValue()
		g.fill(name, "("+g.ct+")0", "")
		return name, nil
	}
	s := p.InShapes[k]
	// Coordinates along size-1 axes (and constant zeros) add nothing. (A
	// zero stride, of an axis before an empty one, keeps its term: unlike
	// offsetExpr, which drops it.)
	st := ContiguousStrides(s)
	terms := []string{"0ull"}
	for j, c := range coords {
		if s[j] != 1 && c != "0" {
			terms = append(terms, fmt.Sprintf("(unsigned long long)(%s) * %dull", c, st[j]))
		}
	}
	off := strings.Join(terms, " + ")
	t, err := CType(p.Ins[k].DType)
	if err != nil {
		return "", err
	}
	// Along the last axis the operand either varies (a vector load at the
	// vector's first element) or is broadcast (one load for all).
	varies := len(coords) > 0 && coords[len(coords)-1] != "0" && s[len(s)-1] != 1
	name := g.newValue()
	switch {
	case !varies:
		g.line("{ const %s x = %s;", g.ct, loadExpr(t, g.ct, fmt.Sprintf("in%d[%s]", k, off)))
		g.fill(name, "x", " }")
	case vec == 1:
		g.line("%s[0] = %s;", name, loadExpr(t, g.ct, fmt.Sprintf("in%d[%s]", k, off)))
	default:
		g.line("{ %s", alignedArray(t, "raw", vec))
		g.line("%s", vecMove("raw", fmt.Sprintf("in%d + %s", k, off), vec*p.Ins[k].DType.Size()))
		g.fill(name, loadExpr(t, g.ct, "raw[e]"), " }")
	}
	return name, nil
}

// shapeOf is the shape of a step's operand a.
func (p *Index) shapeOf(a graph.FusedOperand) graph.Shape {
	if a.Step {
		return p.Types[a.Index].Shape
	}
	return p.InShapes[a.Index]
}

func (g *indexGen) step(s int, coords []string) (string, error) {
	p := g.p
	st := p.Steps[s]
	switch st.Op {
	case "Slice":
		axis, start := int(st.Params[0]), st.Params[1]
		c := append([]string(nil), coords...)
		if start != 0 {
			c[axis] = fmt.Sprintf("(%s + %du)", coords[axis], start)
		}
		return g.value(st.Args[0], c)
	case "Transpose":
		if len(st.Params) != len(coords) {
			return "", fmt.Errorf("step %d: Transpose<%v> of a rank-%d value", s, st.Params, len(coords))
		}
		c := make([]string, len(coords))
		for i, p := range st.Params {
			c[p] = coords[i]
		}
		return g.value(st.Args[0], c)
	case "Concat":
		axis := int(st.Params[0])
		name := g.newValue()
		off := int64(0)
		for j, a := range st.Args {
			size := int64(g.p.shapeOf(a)[axis])
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
			g.fill(name, v+"[e]", "")
			g.memo = g.memo[:len(g.memo)-1]
			g.depth--
			g.line("}")
			off += size
		}
		return name, nil
	}
	ops := make([]string, len(st.Args))
	for j, a := range st.Args {
		v, err := g.value(a, broadcastCoords(coords, g.p.shapeOf(a)))
		if err != nil {
			return "", err
		}
		ops[j] = v + "[e]"
	}
	e, err := stepExpr(st, g.ct, ops, p.Types[s].DType)
	if err != nil {
		return "", err
	}
	name := g.newValue()
	g.fill(name, e, "")
	return name, nil
}

// Generate writes the kernel ("ix"): a thread per p.Vec elements along the
// last axis.
func (p *Index) Generate() (Kernel, error) {
	n := int64(p.Shape.Numel())
	types, err := cTypes(p.Ins)
	if err != nil {
		return Kernel{}, err
	}
	otypes, err := cTypes(p.OutBufs)
	if err != nil {
		return Kernel{}, err
	}
	g := &indexGen{p: p, ct: floatComputeType(dtypesOf(p.Ins, p.OutBufs)...), memo: []map[string]string{{}}, depth: 2}
	if p.Vec < 1 {
		p.Vec = 1
	}
	coords := make([]string, p.Shape.Rank())
	for j := range coords {
		coords[j] = fmt.Sprintf("c%d", j)
	}
	vals := make([]string, len(p.Outs))
	for i, s := range p.Outs {
		v, err := g.value(graph.FusedOperand{Step: true, Index: s}, coords)
		if err != nil {
			return Kernel{}, err
		}
		vals[i] = v
	}
	kn := &kernel{entry: "ix", comment: fmt.Sprintf("%v, %d inputs, %d steps with index steps, %d outputs, vector %d", p.Shape, len(p.Ins), len(p.Steps), len(p.OutBufs), p.Vec),
		params: bufferParams(types, otypes)}
	w := kn.w
	idx := indexType(n)
	kn.gridStride(idx, "i", p.Vec, n)
	kn.coordinates("        ", idx, "i", dims64(p.Shape), "u")
	kn.body.WriteString(g.sb.String())
	for i, v := range vals {
		if p.Vec == 1 {
			w("        out%d[i] = %s;\n", i, storeExpr(otypes[i], g.ct, v+"[0]"))
			continue
		}
		w("        { %s\n", alignedArray(otypes[i], "o", p.Vec))
		w("#pragma unroll\n        for (int e = 0; e < %d; e++) { o[e] = %s; }\n", p.Vec, storeExpr(otypes[i], g.ct, v+"[e]"))
		w("        %s }\n", vecMove(fmt.Sprintf("out%d + i", i), "o", p.Vec*p.OutBufs[i].DType.Size()))
	}
	w("    }\n}\n")
	k := kn.done(n/int64(p.Vec), p.Ins, p.OutBufs)
	k.Vec = p.Vec
	return k, nil
}

// VectorWidth is the elements a thread takes along the last axis: 16 bytes
// of the widest operand when every cut along the last axis and every last
// dimension that varies is a multiple of it and the buffers are aligned;
// otherwise 1.
func (p *Index) VectorWidth() int {
	r := p.Shape.Rank()
	if r == 0 {
		return 1
	}
	vec := int64(vectorOf(widest(p.Ins, p.OutBufs)))
	ok := int64(p.Shape[r-1])%vec == 0
	last := func(s graph.Shape) int64 {
		if s.Rank() == 0 {
			return 1
		}
		return int64(s[s.Rank()-1])
	}
	for _, st := range p.Steps {
		switch st.Op {
		case "Transpose":
			// A vector is consecutive along the last axis of the operand
			// too only when the Transpose keeps that axis in place.
			if n := len(st.Params); n == 0 || st.Params[n-1] != int64(n-1) {
				ok = false
			}
		case "Slice":
			if st.Params[0] == int64(r-1) && st.Params[1]%vec != 0 {
				ok = false
			}
		case "Concat":
			if st.Params[0] == int64(r-1) {
				for _, a := range st.Args {
					if last(p.shapeOf(a))%vec != 0 {
						ok = false
					}
				}
			}
		}
	}
	for _, t := range p.Types {
		if l := last(t.Shape); l != 1 && l%vec != 0 {
			ok = false
		}
	}
	for k, b := range p.Ins {
		if l := last(p.InShapes[k]); l != 1 && (l%vec != 0 || !b.alignedFor(0, int(vec))) {
			ok = false
		}
	}
	for _, b := range p.OutBufs {
		if !b.alignedFor(0, int(vec)) {
			ok = false
		}
	}
	if !ok {
		return 1
	}
	return int(vec)
}

// NormalizeIndexSteps returns steps with the index steps' axes made
// non-negative and a Slice's start resolved as ONNX does (negative counts
// from the end, clamped to the axis), as the generator reads them.
func NormalizeIndexSteps(steps []graph.FusedStep, types []graph.TensorType, inShapes []graph.Shape) []graph.FusedStep {
	out := make([]graph.FusedStep, len(steps))
	for k, st := range steps {
		out[k] = st
		if _, ok := graph.FusibleIndex[st.Op]; !ok || st.Op == "Transpose" {
			continue // a Transpose's perm is checked and non-negative
		}
		a := st.Args[0]
		shape := types[k].Shape
		if st.Op == "Slice" {
			if a.Step {
				shape = types[a.Index].Shape
			} else {
				shape = inShapes[a.Index]
			}
		}
		params := append([]int64(nil), st.Params...)
		if params[0] < 0 {
			params[0] += int64(shape.Rank())
		}
		if st.Op == "Slice" && params[0] >= 0 && int(params[0]) < shape.Rank() {
			d := int64(shape[params[0]])
			if params[1] < 0 {
				params[1] += d
			}
			params[1] = max(0, min(params[1], d))
		}
		out[k].Params = params
	}
	return out
}
