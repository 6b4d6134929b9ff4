package passes

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// PassDisjointSums names the rewrite of sums of zero-padded blocks.
const PassDisjointSums = "disjoint_sums"

// DisjointSums returns the pass that turns the sum of two Concats, along
// one axis, whose non-zero blocks do not overlap (each non-zero block of
// one lies over zeros of the other) into one Concat of the blocks.
//
// Autodiff writes the gradient of a Slice as the cotangent padded with
// zero blocks back to the sliced tensor's shape, and sums the gradients of
// a tensor's readers. When the readers are Slices that tile the tensor, as
// the q, k and v Slices of fuse_qkv's merged product do, that sum is
// dq|0|0 + 0|dk|0 + 0|0|dv, which costs reading the zero blocks and adding
// them; the Concat dq|dk|dv computes the same values (x + 0 is x) from the
// cotangents alone. Zero blocks are the zero-filled consts autodiff makes
// (Init zeros).
//
// It runs on a training step, before elementwise fusion; train runs it
// with fuse_qkv (Hyper.FuseQKV) only, so that without it the step is
// byte-identical to what it was.
func DisjointSums() Pass {
	return &RulePass{PassName: PassDisjointSums, Rules: disjointSumRules}
}

var disjointSumRules = []Rule{
	{
		Name: "add-of-zero-padded-concats", Root: "Add",
		Pattern: Op("Add", Op("Concat").As("a"), Op("Concat").As("b")),
		Where:   []Cond{{Name: "blocks of one shape that do not overlap", Check: disjointBlocks}},
		Rewrite: concatDisjoint,
	},
}

// block is a piece of a Concat along its axis: [start, end), and its value
// (nil for zeros).
type block struct {
	start, end int
	v          *graph.Value
}

// isZeros reports whether v is a zero-filled const.
func isZeros(v *graph.Value) bool {
	return v != nil && v.Producer == nil && v.Kind == graph.Const && v.Init != nil && v.Init.Fn == "zeros"
}

// concatBlocks lists the blocks of a Concat node's output along its axis.
func concatBlocks(n *graph.Node) (int, []block, string) {
	r := n.Outputs[0].Type.Shape.Rank()
	ax, err := graph.NormAxis(int(n.Attrs.Int("axis", 0)), r)
	if err != nil {
		return 0, nil, err.Error()
	}
	var bs []block
	off := 0
	for _, in := range n.Inputs {
		w := in.Type.Shape[ax]
		b := block{start: off, end: off + w, v: in}
		if isZeros(in) {
			b.v = nil
		}
		bs = append(bs, b)
		off += w
	}
	return ax, bs, ""
}

// disjointBlocks holds when both operands are Concats of the Add's type
// along one axis and every non-zero block of each lies over zeros of the
// other; it leaves the merged blocks for the rewrite.
func disjointBlocks(m *Match) string {
	a, b := m.Node("a"), m.Node("b")
	out := m.Root.Outputs[0].Type
	if !a.Outputs[0].Type.Equal(out) || !b.Outputs[0].Type.Equal(out) {
		return "the Add broadcasts"
	}
	axA, ba, why := concatBlocks(a)
	if why != "" {
		return why
	}
	axB, bb, why := concatBlocks(b)
	if why != "" {
		return why
	}
	if axA != axB {
		return fmt.Sprintf("the Concats join axes %d and %d", axA, axB)
	}
	merged, why := mergeBlocks(ba, bb)
	if why != "" {
		return why
	}
	m.Set("axis", axA)
	m.Set("blocks", merged)
	return ""
}

// mergeBlocks overlays two block lists of one extent. A non-zero block of
// either side is kept whole when the other side is zero all over it;
// stretches where both are zero become zero blocks. Non-zero blocks of the
// two sides that overlap refuse.
func mergeBlocks(a, b []block) ([]block, string) {
	at := func(bs []block, p int) block {
		for _, x := range bs {
			if x.start <= p && p < x.end {
				return x
			}
		}
		return block{start: p, end: p} // not reached: both sides cover [0, end)
	}
	zeroOver := func(bs []block, x block) string {
		for _, y := range bs {
			if y.start < x.end && x.start < y.end && y.v != nil {
				return fmt.Sprintf("%s and %s overlap: both operands are non-zero there", x.v.Name, y.v.Name)
			}
		}
		return ""
	}
	var out []block
	end := a[len(a)-1].end
	for p := 0; p < end; {
		x, y := at(a, p), at(b, p)
		if x.end == x.start || y.end == y.start {
			return nil, "the Concats do not cover the same extent"
		}
		var keep block
		var other []block
		switch {
		case x.v != nil:
			keep, other = x, b
		case y.v != nil:
			keep, other = y, a
		default: // zeros on both sides up to the nearer end
			q := min(x.end, y.end)
			if n := len(out); n > 0 && out[n-1].v == nil {
				out[n-1].end = q
			} else {
				out = append(out, block{start: p, end: q})
			}
			p = q
			continue
		}
		if keep.start != p {
			return nil, fmt.Sprintf("%s starts inside a block of the other operand", keep.v.Name)
		}
		if why := zeroOver(other, keep); why != "" {
			return nil, why
		}
		out = append(out, keep)
		p = keep.end
	}
	return out, ""
}

// concatDisjoint writes the merged blocks as one Concat; a zero stretch
// reuses an operand's zero const of exactly its extent, or gets its own.
func concatDisjoint(m *Match, e *Edit) error {
	ax := m.Get("axis").(int)
	blocks := m.Get("blocks").([]block)
	out := m.Root.Outputs[0].Type
	var zeros []block
	for _, n := range []*graph.Node{m.Node("a"), m.Node("b")} {
		_, bs, _ := concatBlocks(n)
		for i, x := range bs {
			if x.v == nil {
				x.v = n.Inputs[i]
				zeros = append(zeros, x)
			}
		}
	}
	parts := make([]*graph.Value, len(blocks))
	for i, x := range blocks {
		if x.v != nil {
			parts[i] = x.v
			continue
		}
		for _, z := range zeros {
			if z.start == x.start && z.end == x.end {
				parts[i] = z.v
			}
		}
		if parts[i] == nil {
			shape := out.Shape.Clone()
			shape[ax] = x.end - x.start
			parts[i] = e.Zeros(graph.TensorType{DType: out.DType, Shape: shape})
		}
	}
	if len(parts) == 1 {
		return fmt.Errorf("the sum is one block")
	}
	v, err := e.Op("Concat", graph.Attrs{"axis": graph.Int(int64(ax))}, parts...)
	if err != nil {
		return err
	}
	e.Replace(m.Root.Outputs[0], v)
	return nil
}
