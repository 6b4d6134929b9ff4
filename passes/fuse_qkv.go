package passes

import (
	"fmt"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// PassFuseQKV names the merge of the q/k/v projections into one GEMM.
const PassFuseQKV = "fuse_qkv"

// qkvMinGroup is how many MatMuls must share their input for fuse_qkv to
// merge them: three is attention's q, k and v. Two would also merge a
// SwiGLU's gate and up projections, which is not measured yet.
const qkvMinGroup = 3

// FuseQKV returns the pass that merges MatMuls reading one activation, each
// against its own weight initializer (attention's q, k and v projections:
// x·Wq, x·Wk, x·Wv), into one MatMul against the weights concatenated along
// their columns, x·[Wq|Wk|Wv], followed by a Slice per original product.
// One GEMM of N = Dq+Dk+Dv instead of three of N = Dq, Dk, Dv keeps the
// tensor cores busier and reads x once; in the backward, autodiff gives dx
// as one GEMM of K = Dq+Dk+Dv instead of three and two adds.
//
// The weights stay what they were: params keep their names and shapes, and
// the concatenation is a Concat node of the graph, so gradients flow back
// through it to each weight (autodiff's Concat rule slices them out) and
// AdamW, checkpoints, export and the evaluation graph see the same params
// as without the pass. The price is a copy of the weights per step (3·D²
// elements per layer, small next to the activations) and of the merged
// weight gradient into the three. The Slices of the product and the Concat
// of their gradients cost no copy once the step's elementwise chains are
// fused: fuse_elementwise's slice_read and concat_write
// (fuse_elementwise_slices.go) read the slices in place and write the
// gradients where the merged backward GEMMs read them.
//
// It runs on a forward graph, after the attention fusion (which it leaves
// alone: the products it merges feed FlashAttention through the same
// Reshape and Transpose as before). It is not in Default: the GPU has yet
// to show it pays, and on the CPU its sums round differently.
func FuseQKV() Pass {
	return &RulePass{PassName: PassFuseQKV, Rules: qkvRules, Scope: qkvScope}
}

// qkvRules: rooted at the first MatMul (in graph order) that reads a shared
// activation as its left operand. The conditions find the group.
var qkvRules = []Rule{
	{
		Name: "shared-input-matmuls", Root: "MatMul",
		Pattern: Op("MatMul", Any("x"), Any("w")),
		Where:   []Cond{{Name: "enough MatMuls with weight initializers", Check: qkvGroupCond}},
		Rewrite: fuseQKV,
	},
}

// qkvScope accepts, for every value read as the left operand of two or more
// MatMuls, the first of them: the one rule root per group. Other MatMuls
// (the vast majority, reading an activation nothing else multiplies) are
// neither matched nor reported.
func qkvScope(g *graph.Graph) func(*graph.Node) bool {
	first := map[*graph.Value]*graph.Node{}
	count := map[*graph.Value]int{}
	for _, n := range g.Nodes {
		if n.Op != "MatMul" || len(n.Inputs) != 2 || n.Inputs[0] == nil {
			continue
		}
		x := n.Inputs[0]
		if count[x] == 0 {
			first[x] = n
		}
		count[x]++
	}
	roots := map[*graph.Node]bool{}
	for x, n := range first {
		if count[x] >= 2 {
			roots[n] = true
		}
	}
	return func(n *graph.Node) bool { return roots[n] }
}

// qkvGroup splits the MatMuls that read x as their left operand, in graph
// order, into those that can merge (a 2-D weight initializer with as many
// rows as x has columns, x's dtype) and the others, with why not.
func qkvGroup(m *Match, x *graph.Value) (group []*graph.Node, skipped []string) {
	r := x.Type.Shape.Rank()
	for _, n := range m.Users(x) {
		if n.Op != "MatMul" || len(n.Inputs) != 2 || n.Inputs[0] != x || containsNode(group, n) {
			continue
		}
		w := n.Inputs[1]
		switch {
		case r < 2:
			return nil, []string{fmt.Sprintf("%s is %d-D: no rows to share", describe(x), r)}
		case w == n.Inputs[0]:
			skipped = append(skipped, n.Name+" multiplies x by itself")
		case w.Producer != nil || (w.Kind != graph.Param && w.Kind != graph.Const):
			skipped = append(skipped, fmt.Sprintf("%s's weight %s is not an initializer", n.Name, describe(w)))
		case w.Type.Shape.Rank() != 2 || w.Type.Shape[0] != x.Type.Shape[r-1]:
			skipped = append(skipped, fmt.Sprintf("%s's weight %s is %v, not [%d, N]", n.Name, w.Name, w.Type.Shape, x.Type.Shape[r-1]))
		case w.Type.DType != x.Type.DType:
			skipped = append(skipped, fmt.Sprintf("%s's weight %s is %v, x %v", n.Name, w.Name, w.Type.DType, x.Type.DType))
		default:
			group = append(group, n)
		}
	}
	return group, skipped
}

func containsNode(ns []*graph.Node, n *graph.Node) bool {
	for _, x := range ns {
		if x == n {
			return true
		}
	}
	return false
}

// qkvGroupCond holds when at least qkvMinGroup MatMuls can merge; it leaves
// the group for the rewrite.
func qkvGroupCond(m *Match) string {
	x := m.Value("x")
	group, skipped := qkvGroup(m, x)
	if len(group) < qkvMinGroup {
		why := fmt.Sprintf("%s is the left operand of %d MatMuls with a weight initializer, fewer than %d (q, k, v)", describe(x), len(group), qkvMinGroup)
		if len(skipped) > 0 {
			why += "; " + strings.Join(skipped, "; ")
		}
		return why
	}
	m.Set("group", group)
	m.Set("skipped", skipped)
	return ""
}

// fuseQKV writes Concat(weights, axis 1), one MatMul and a Slice per
// original product, placed before the root, where x and the initializers
// are all defined.
//
// When each product is only reshaped into heads of one width d ([.., Dq] to
// [.., Dq/d, d], as attention does before its transposes), the merged
// product is reshaped into heads once and the Slices cut heads instead:
// each Slice then feeds the head transpose directly, so that elementwise
// fusion can fold it into the transpose's kernel (and, in the backward,
// the Concat of the cotangents into the transposes back) rather than
// copying each slice on its own.
func fuseQKV(m *Match, e *Edit) error {
	x := m.Value("x")
	group := m.Get("group").([]*graph.Node)
	ws := make([]*graph.Value, len(group))
	names := make([]string, len(group))
	for i, n := range group {
		ws[i], names[i] = n.Inputs[1], n.Inputs[1].Name
	}
	wcat, err := e.Op("Concat", graph.Attrs{"axis": graph.Int(1)}, ws...)
	if err != nil {
		return err
	}
	y, err := e.Op("MatMul", nil, x, wcat)
	if err != nil {
		return err
	}
	// What each Slice replaces, and the axis and widths it cuts.
	olds := make([]*graph.Value, len(group))
	widths := make([]int, len(group))
	axis := y.Type.Shape.Rank() - 1
	how := "columns"
	if reshapes, d := headReshapes(m, group); reshapes != nil {
		shape := append(y.Type.Shape.Clone(), d)
		shape[axis] /= d
		dims := make([]float64, len(shape))
		for i, s := range shape {
			dims[i] = float64(s)
		}
		if y, err = e.Op("Reshape", nil, y, e.Literal(graph.Int64, graph.Shape{len(dims)}, dims...)); err != nil {
			return err
		}
		for i, r := range reshapes {
			olds[i], widths[i] = r.Outputs[0], ws[i].Type.Shape[1]/d
		}
		how = fmt.Sprintf("heads of %d", d)
	} else {
		for i, n := range group {
			olds[i], widths[i] = n.Outputs[0], ws[i].Type.Shape[1]
		}
	}
	off := 0
	for i, old := range olds {
		s, err := e.Op("Slice", nil, y,
			e.Literal(graph.Int64, graph.Shape{1}, float64(off)),
			e.Literal(graph.Int64, graph.Shape{1}, float64(off+widths[i])),
			e.Literal(graph.Int64, graph.Shape{1}, float64(axis)))
		if err != nil {
			return err
		}
		e.Replace(old, s)
		off += widths[i]
	}
	detail := fmt.Sprintf("{weights=%s, N=%d, sliced by %s}", strings.Join(names, "|"), wcat.Type.Shape[1], how)
	if skipped := m.Get("skipped").([]string); len(skipped) > 0 {
		detail += " (not merged: " + strings.Join(skipped, "; ") + ")"
	}
	e.Describe(wcat.Producer.Name, detail)
	return nil
}

// headReshapes returns, when every product of group is read by exactly one
// node, a Reshape that splits its last axis into heads of one width d for
// all ([.., N] to [.., N/d, d]), those Reshapes and d; else nil.
func headReshapes(m *Match, group []*graph.Node) ([]*graph.Node, int) {
	rs := make([]*graph.Node, len(group))
	d := 0
	for i, n := range group {
		out := n.Outputs[0]
		users := m.Users(out)
		if len(users) != 1 || users[0].Op != "Reshape" || m.IsOutput(out) {
			return nil, 0
		}
		xs, hs := out.Type.Shape, users[0].Outputs[0].Type.Shape
		r := xs.Rank()
		if hs.Rank() != r+1 || !xs[:r-1].Equal(hs[:r-1]) || hs[r-1]*hs[r] != xs[r-1] || (d != 0 && hs[r] != d) {
			return nil, 0
		}
		rs[i], d = users[0], hs[r]
	}
	return rs, d
}
