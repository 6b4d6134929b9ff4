package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// Lowerings of TopK, LRN, Det, Einsum and TfIdfVectorizer: each launches
// its kernel of the "spatial ops" section of kernels/ops.cu, the op table's
// Eval (graph/ops_index.go, ops_tensor.go, ops_einsum.go, ops_tfidf.go) one
// output element (or matrix) at a time.

func init() {
	for op, l := range map[string]lowering{
		"TopK": {lower: lowerTopK}, "LRN": {lower: lowerLRN},
		"Det": {lower: lowerDet, scratch: detScratch}, "Einsum": {lower: lowerEinsum},
		"TfIdfVectorizer": {lower: lowerTfIdfVectorizer},
	} {
		lowerings[op] = l
	}
}

func lowerTopK(c *lowerCtx) (func() error, error) {
	xs := c.n.Inputs[0].Type.Shape
	outer, dim, inner, err := gatherDims(xs, c.n.Attrs.Int("axis", -1))
	if err != nil {
		return nil, err
	}
	k, err := c.constInts(1, "K")
	if err != nil {
		return nil, err
	}
	if len(k) != 1 || k[0] < 0 || int64(k[0]) > dim {
		return nil, fmt.Errorf("K %v for an axis of %d", k, dim)
	}
	x, y, yi := c.in(0), c.out(0), c.out(1)
	if k[0] == 0 {
		return nop, nil
	}
	return c.launch1D("topk", outer*dim*inner, outer, dim, inner, int64(k[0]), int32(c.n.Attrs.Int("largest", 1)),
		x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt), yi.ptr)
}

func lowerLRN(c *lowerCtx) (func() error, error) {
	xs := c.n.Inputs[0].Type.Shape
	a := c.n.Attrs
	size := a.Int("size", 0)
	if xs.Rank() < 2 || size <= 0 {
		return nil, fmt.Errorf("LRN of %v with size %d", xs, size)
	}
	x, y := c.in(0), c.out(0)
	n := int64(xs.Numel())
	return c.launch1D("lrn", n, n, int64(xs[1]), int64(xs[2:].Numel()), size,
		a.Float("alpha", 1e-4), a.Float("beta", 0.75), a.Float("bias", 1), x.ptr, dtCode(x.dt), y.ptr, dtCode(y.dt))
}

// detScratch is the float64 copy of X the elimination works in.
func detScratch(n *graph.Node, _ func(*graph.Value) graph.DType, _ PlanOptions) []scratchReq {
	return []scratchReq{{"lu", graph.Float64, n.Inputs[0].Type.Shape.Clone()}}
}

func lowerDet(c *lowerCtx) (func() error, error) {
	xs := c.n.Inputs[0].Type.Shape
	r := xs.Rank()
	if r < 2 || xs[r-1] != xs[r-2] {
		return nil, fmt.Errorf("Det of %v: want [..., M, M]", xs)
	}
	lu, err := c.takeScratch()
	if err != nil {
		return nil, err
	}
	x, y := c.in(0), c.out(0)
	batch := int64(xs[:r-2].Numel())
	return c.launch1D("det", batch, batch, int64(xs[r-1]), x.ptr, dtCode(x.dt), lu.ptr, y.ptr, dtCode(y.dt))
}

// einsumMaxOperands is the most operands the einsum kernel reads.
const einsumMaxOperands = 4

// lowerEinsum gives the kernel, per operand, the element stride of each
// output label and each summed label in it: the sum of the contiguous
// strides of the operand's axes with that label (0 where it has none).
func lowerEinsum(c *lowerCtx) (func() error, error) {
	shapes := make([]graph.Shape, len(c.n.Inputs))
	for i, v := range c.n.Inputs {
		shapes[i] = v.Type.Shape
	}
	p, err := graph.ParseEinsum(c.n.Attrs.String("equation", ""), shapes)
	if err != nil {
		return nil, err
	}
	if len(shapes) > einsumMaxOperands || len(p.Out) > maxRank || len(p.Summed) > maxRank {
		return nil, fmt.Errorf("Einsum of %d operands, %d output and %d summed labels: the kernel takes at most %d, %d and %d: %w",
			len(shapes), len(p.Out), len(p.Summed), einsumMaxOperands, maxRank, maxRank, backend.ErrUnsupported)
	}
	dims := func(labels []rune) []int64 {
		out := make([]int64, len(labels))
		for i, l := range labels {
			out[i] = int64(p.Size[l])
		}
		return out
	}
	y := c.out(0)
	n := int64(c.n.Outputs[0].Type.Shape.Numel())
	args := []any{n, int32(len(p.Out)), int32(len(p.Summed)), int32(len(shapes))}
	args = append(args, six(dims(p.Out), 1)...)
	args = append(args, six(dims(p.Summed), 1)...)
	for k := range einsumMaxOperands {
		if k >= len(shapes) {
			args = append(args, DevicePtr(0), dtCode(graph.Float32))
			args = append(args, six(nil, 0)...)
			args = append(args, six(nil, 0)...)
			continue
		}
		strides := graph.Shape(shapes[k]).Strides()
		along := func(labels []rune) []int64 {
			out := make([]int64, len(labels))
			for i, l := range labels {
				for j, m := range p.Ins[k] {
					if m == l {
						out[i] += int64(strides[j])
					}
				}
			}
			return out
		}
		x := c.in(k)
		args = append(args, x.ptr, dtCode(x.dt))
		args = append(args, six(along(p.Out), 0)...)
		args = append(args, six(along(p.Summed), 0)...)
	}
	args = append(args, y.ptr, dtCode(y.dt))
	return c.launch1D("einsum", n, args...)
}

// lowerTfIdfVectorizer uploads the resolved pool (graph.NewTfIdfTable) as
// the kernel's table, and the weights per column when given.
func lowerTfIdfVectorizer(c *lowerCtx) (func() error, error) {
	xs := c.n.Inputs[0].Type.Shape
	if xs.Rank() != 1 && xs.Rank() != 2 {
		return nil, fmt.Errorf("TfIdfVectorizer of %v: want [C] or [N, C]", xs)
	}
	t, err := graph.NewTfIdfTable(c.n.Attrs)
	if err != nil {
		return nil, err
	}
	mode, err := code("mode", c.n.Attrs.String("mode", ""), "TF", "IDF", "TFIDF")
	if err != nil {
		return nil, err
	}
	rows, cols := int64(1), int64(xs[xs.Rank()-1])
	if xs.Rank() == 2 {
		rows = int64(xs[0])
	}
	if t.Width == 0 || rows == 0 {
		return nop, nil
	}
	// The table: each column's first n-gram (Column is sorted), each
	// n-gram's first item, the items.
	table := make([]int64, 0, t.Width+1+len(t.Grams)+1)
	g := 0
	for col := range t.Width + 1 {
		for g < len(t.Grams) && t.Column[g] < col {
			g++
		}
		table = append(table, int64(g))
	}
	at := int64(0)
	for _, gr := range t.Grams {
		table = append(table, at)
		at += int64(len(gr))
	}
	table = append(table, at)
	for _, gr := range t.Grams {
		table = append(table, gr...)
	}
	tp, err := c.upload(int64Bytes(table))
	if err != nil {
		return nil, err
	}
	var wp DevicePtr
	if t.Weight != nil {
		if wp, err = c.upload(float64Bytes(t.Weight)); err != nil {
			return nil, err
		}
	}
	maxGap := min(int64(t.MaxSkips)+1, max(cols-1, 1))
	y := c.out(0)
	return c.launch1D("tfidf", rows*int64(t.Width), rows, cols, int64(t.Width), int64(len(t.Grams)), int64(t.Min), maxGap, mode,
		c.in(0).ptr, tp, wp, y.ptr, dtCode(y.dt))
}

func int64Bytes(v []int64) []byte {
	out := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(out[8*i:], uint64(x))
	}
	return out
}

func float64Bytes(v []float64) []byte {
	out := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(x))
	}
	return out
}
