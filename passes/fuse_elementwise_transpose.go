package passes

import (
	"fmt"
	"slices"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// Transposes as index steps. A model splits heads with a Transpose that
// keeps the last axis in place ([B,S,H,D] to [B,H,S,D]) and normalises and
// rotates the heads after it; autodiff mirrors that in the backward. As a
// node, such a Transpose is a copy of the whole tensor. When the elementwise
// bodies around it read or write it, it costs nothing there: a generated
// kernel reads a transposed input at permuted coordinates (a row kernel
// keeps each row contiguous and only moves where it starts), and writes a
// transposed result the same way. A Transpose that moves the last axis
// would make every access strided; those stay copies.
//
// The rules, tried in order for each such Transpose (first match wins):
//
//	transpose_read   every reader is a member of an elementwise body: each
//	                 of those bodies reads the Transpose's input through a
//	                 Transpose step of its own.
//	transpose_write  it is the one reader outside its body of a value of an
//	                 elementwise body (no reduction) whose every other
//	                 result leaves it through such a Transpose too, with the
//	                 same perm: the body writes its results transposed (a
//	                 generated kernel writes one shape).
//
// With neither, the Transpose stays and -explain says why.

// transposeRule is one way a Transpose becomes an index step: absorb
// records it in the groups that take it (returning the Transposes taken,
// all with t), or says why not.
type transposeRule struct {
	name   string
	absorb func(t *graph.Node, c *transposeCtx) ([]*graph.Node, string)
}

var transposeRules = []transposeRule{
	{"transpose_read", absorbTransposeRead},
	{"transpose_write", absorbTransposeWrite},
}

type transposeCtx struct {
	groupOf map[*graph.Node]*ewGroup
	uses    map[*graph.Value][]*graph.Node
	isOut   map[*graph.Value]bool
	taken   map[*graph.Node]bool
}

// indexTranspose reports whether n is a Transpose a body can take as an
// index step: a float tensor of rank 2 or more, not empty, with its last
// axis kept in place.
func indexTranspose(n *graph.Node) bool {
	if n.Op != "Transpose" || len(n.Inputs) != 1 || n.Inputs[0] == nil {
		return false
	}
	x := n.Inputs[0].Type
	r := x.Shape.Rank()
	if !x.DType.IsFloat() || r < 2 || x.Shape.Numel() == 0 {
		return false
	}
	perm, err := graph.TransposePerm(n.Attrs, r)
	return err == nil && perm[r-1] == r-1
}

// transposePerm is an index Transpose's perm as step parameters.
func transposePerm(t *graph.Node) []int64 {
	perm, _ := graph.TransposePerm(t.Attrs, t.Inputs[0].Type.Shape.Rank())
	p := make([]int64, len(perm))
	for i, v := range perm {
		p[i] = int64(v)
	}
	return p
}

// absorbTransposes applies the rules to every index Transpose of nodes
// (after grouping: groupOf says which group each member ended in) and
// returns the Transposes that became index steps.
func absorbTransposes(nodes []*graph.Node, groupOf map[*graph.Node]*ewGroup, uses map[*graph.Value][]*graph.Node,
	isOut map[*graph.Value]bool, log *Log) map[*graph.Node]bool {
	c := &transposeCtx{groupOf: groupOf, uses: uses, isOut: isOut, taken: map[*graph.Node]bool{}}
	for _, t := range nodes {
		if c.taken[t] || !indexTranspose(t) {
			continue
		}
		var reasons []string
		for _, rule := range transposeRules {
			took, why := rule.absorb(t, c)
			if took == nil {
				reasons = append(reasons, rule.name+": "+why)
				continue
			}
			for _, n := range took {
				c.taken[n] = true
			}
			if log != nil {
				log.Add(Event{Pass: PassFuseElementwise, Kind: Fired, Rule: rule.name, Node: t.Name, Op: t.Op,
					Detail: fmt.Sprintf("perm %v of %v: no copy, %s", transposePerm(t), t.Inputs[0].Type.Shape, why)})
			}
			reasons = nil
			break
		}
		if reasons != nil && log != nil {
			log.Add(Event{Pass: PassFuseElementwise, Kind: Refused, Rule: "transpose_index", Node: t.Name, Op: t.Op,
				Reason: strings.Join(reasons, "; ")})
		}
	}
	return c.taken
}

// absorbTransposeRead: every reader of t is in an elementwise body.
func absorbTransposeRead(t *graph.Node, c *transposeCtx) ([]*graph.Node, string) {
	y := t.Outputs[0]
	if c.isOut[y] {
		return nil, "its result is a graph output"
	}
	readers := c.uses[y]
	if len(readers) == 0 {
		return nil, "nothing reads it"
	}
	var groups []*ewGroup
	for _, u := range readers {
		gr := c.groupOf[u]
		if gr == nil || len(gr.members) == 0 {
			return nil, fmt.Sprintf("read by %s (%s), which is in no elementwise body", u.Name, u.Op)
		}
		if !slices.Contains(groups, gr) {
			groups = append(groups, gr)
		}
	}
	var names []string
	for _, gr := range groups {
		if gr.reads == nil {
			gr.reads = map[*graph.Value]*graph.Node{}
		}
		gr.reads[y] = t
		names = append(names, gr.members[0].Name)
	}
	return []*graph.Node{t}, fmt.Sprintf("read through a Transpose step by the bodies at %s", strings.Join(names, ", "))
}

// absorbTransposeWrite: t transposes a result of an elementwise body, and
// every result of that body leaves it through an index Transpose of the
// same perm.
func absorbTransposeWrite(t *graph.Node, c *transposeCtx) ([]*graph.Node, string) {
	x := t.Inputs[0]
	gr := c.groupOf[x.Producer]
	if x.Producer == nil || gr == nil || len(gr.members) == 0 {
		return nil, "its input is not made by an elementwise body"
	}
	if gr.reduce != nil {
		return nil, fmt.Sprintf("its input is made by the body at %s, which reduces rows", gr.members[0].Name)
	}
	perm := transposePerm(t)
	writes := map[*graph.Value]*graph.Node{}
	for _, m := range gr.members {
		v := m.Outputs[0]
		var outside []*graph.Node
		for _, u := range c.uses[v] {
			if c.groupOf[u] != gr {
				outside = append(outside, u)
			}
		}
		if c.isOut[v] {
			return nil, fmt.Sprintf("%s, a result of the body at %s, is a graph output", v.Name, gr.members[0].Name)
		}
		if len(outside) == 0 {
			continue
		}
		w := outside[0]
		if len(outside) > 1 || c.taken[w] || !indexTranspose(w) || !slices.Equal(transposePerm(w), perm) {
			return nil, fmt.Sprintf("%s, a result of the body at %s, is also read by %s (%s)", v.Name, gr.members[0].Name,
				outside[len(outside)-1].Name, outside[len(outside)-1].Op)
		}
		writes[v] = w
	}
	gr.writes = writes
	var took []*graph.Node
	for _, w := range writes {
		took = append(took, w)
	}
	return took, fmt.Sprintf("written transposed by the body at %s", gr.members[0].Name)
}
