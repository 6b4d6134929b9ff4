package codegen

import (
	"fmt"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
)

// Code generation for elementwise work: a FusedElementwise node (and each
// single float elementwise op, as a body of one step) becomes one NVRTC
// kernel specialised to its dtypes, shape and strides. Every output element
// is computed in registers from its inputs, in float32 (float64 when any
// operand is float64), with no per-element dtype switch and index arithmetic
// by compile-time constants; where every operand walks its innermost axis
// contiguously (or broadcasts along it) and the buffers are aligned, each
// thread moves 16-byte vectors. Kernels are compiled once per distinct
// source and cached on disk with the other cubins. The variant of the
// kernel skeleton (kernel.go) whose loop is a grid stride over the
// coalesced elements.

// Elementwise is one generated elementwise kernel.
type Elementwise struct {
	Shape   graph.Shape // every step's shape (the outputs')
	Ins     []Operand   // read through strides over shape
	Steps   []graph.FusedStep
	Outs    []int    // the step each output holds
	OutBufs []Buffer // the outputs
	// ostrides, when set, place output k at offset ooff[k] with strides
	// ostrides[k] over shape (a slice of a larger tensor: Concat); nil
	// means contiguous.
	OutStrides [][]int64
	OutOffs    []int64
	// narrow, when set, is each step's dtype: a bfloat16 or float16 step is
	// rounded to it before later steps read it, as separate nodes would be.
	Narrow []graph.DType
}

// Generate writes the kernel ("ew"): a thread per vector of elements.
func (p *Elementwise) Generate() (Kernel, error) {
	n := int64(p.Shape.Numel())
	dims := dims64(p.Shape)
	// Inputs and outputs alike are operands over the shape: a buffer read
	// or written at an offset plus coordinates times strides, coalesced
	// together.
	ops := slices.Clone(p.Ins)
	for k, b := range p.OutBufs {
		ops = append(ops, Operand{Buf: b, Off: p.outOff(k), Strides: p.outStrides(k)})
	}
	strides := make([][]int64, len(ops))
	for k, o := range ops {
		strides[k] = o.Strides
	}
	dims, strides = Coalesce(dims, strides)
	r := len(dims)
	nIn := len(p.Ins)
	bufs := opBufs(ops)
	types, err := cTypes(bufs)
	if err != nil {
		return Kernel{}, err
	}
	ct := ComputeType(dtypesOf(bufs)...)

	// Vector width: 16 bytes of the widest type, when the innermost axis
	// splits into whole vectors, every input reads it contiguously or
	// broadcasts it, every output writes it contiguously, and every vector
	// starts aligned.
	vec := vectorOf(widest(bufs))
	ok := dims[r-1]%int64(vec) == 0
	for k, o := range ops {
		s := strides[k]
		if k >= nIn && s[r-1] != 1 || !movesVectors(o.Buf, o.Off, s[r-1], s[:r-1], vec) {
			ok = false
		}
	}
	if !ok || n < int64(vec) {
		vec = 1
	}

	idx := indexType(n)
	// Offsets in 32 bits where they fit (cheaper multiplies).
	offType := make([]string, len(ops))
	for k, o := range ops {
		last := o.Off
		for j := 0; j < r; j++ {
			last += (dims[j] - 1) * strides[k][j]
		}
		offType[k] = "unsigned long long"
		if idx == "unsigned" && last < 1<<31 {
			offType[k] = "unsigned"
		}
	}
	offset := func(k int) string {
		return offsetExpr(fmt.Sprintf("%du", ops[k].Off), strides[k], func(j int, s int64) string {
			return fmt.Sprintf("(%s)c%d * %du", offType[k], j, s)
		})
	}
	kn := &kernel{entry: "ew", comment: fmt.Sprintf("%v, %d inputs, %d steps, %d outputs, vector %d", p.Shape, nIn, len(p.Steps), len(p.OutBufs), vec),
		params: bufferParams(types[:nIn], types[nIn:])}
	if ct == "long long" {
		kn.helpers = intHelpers
	}
	w := kn.w
	// Operands that broadcast over everything are loaded once.
	scalar := make([]bool, nIn)
	for k := range p.Ins {
		scalar[k] = !slices.ContainsFunc(strides[k], func(s int64) bool { return s != 0 })
		if scalar[k] {
			w("    const %s s%d = %s;\n", ct, k, loadExpr(types[k], ct, fmt.Sprintf("in%d[%d]", k, p.Ins[k].Off)))
		}
	}
	kn.gridStride(idx, "base", vec, n)
	kn.coordinates("        ", idx, "base", dims, "u")
	for k := range p.Ins {
		if scalar[k] {
			continue
		}
		w("        const %s o%d = %s;\n", offType[k], k, offset(k))
		if vec > 1 && strides[k][r-1] == 1 {
			w("        %s\n", alignedArray(types[k], fmt.Sprintf("v%d", k), vec))
			w("        %s\n", vecMove(fmt.Sprintf("v%d", k), fmt.Sprintf("in%d + o%d", k, k), vec*p.Ins[k].Buf.DType.Size()))
		}
	}
	for i := range p.OutBufs {
		w("        const %s q%d = %s;\n", offType[nIn+i], i, offset(nIn+i))
		if vec > 1 {
			w("        %s\n", alignedArray(types[nIn+i], fmt.Sprintf("w%d", i), vec))
		}
	}
	ins := make([]elemIn, nIn)
	for k := range p.Ins {
		ins[k].t = types[k]
		switch {
		case scalar[k]:
			ins[k].arg = fmt.Sprintf("s%d", k)
		case vec > 1 && strides[k][r-1] == 1:
			ins[k].load = fmt.Sprintf("v%d[e]", k)
		default: // read at o (a broadcast inner axis, or one element per thread)
			ins[k].load = fmt.Sprintf("in%d[o%d]", k, k)
		}
	}
	args := kn.elementLoop("        ", ct, vec, vec == 1, ins)
	usesFlag, err := kn.steps("            ", ct, p.Steps, p.Narrow, args, nil)
	if err != nil {
		return Kernel{}, err
	}
	outs := make([]elemOut, len(p.Outs))
	for i, s := range p.Outs {
		outs[i] = elemOut{at: fmt.Sprintf("q%d", i), t: types[nIn+i], step: s, size: p.OutBufs[i].DType.Size()}
	}
	kn.closeElementLoop("        ", ct, vec, outs)
	w("    }\n}\n")
	// The error flag's parameters follow the buffers only when a step
	// divides integers.
	if usesFlag {
		kn.params = append(kn.params, "int* __restrict__ flag", "int code")
	}
	k := kn.done((n+int64(vec)-1)/int64(vec), bufs)
	k.UsesFlag, k.Vec = usesFlag, vec
	return k, nil
}

// outStrides are output k's strides over the program's shape.
func (p *Elementwise) outStrides(k int) []int64 {
	if k < len(p.OutStrides) && p.OutStrides[k] != nil {
		return p.OutStrides[k]
	}
	return ContiguousStrides(p.Shape)
}

// outOff is output k's offset in elements.
func (p *Elementwise) outOff(k int) int64 {
	if k < len(p.OutOffs) {
		return p.OutOffs[k]
	}
	return 0
}
