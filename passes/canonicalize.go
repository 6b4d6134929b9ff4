package passes

import (
	"fmt"
	"math"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
)

// Canonicalisation brings the attention patterns that exporters and
// hand-written models produce to one form, so that fuse_attention is a few
// rules instead of one per spelling:
//
//	Div(s, c)                       → Mul(s, 1/c)
//	MatMul(Mul(q, c), kᵀ)           → Mul(MatMul(q, kᵀ), c)   (scale pre-applied to Q)
//	MatMul(q, Mul(kᵀ, c))           → Mul(MatMul(q, kᵀ), c)   (... or to K)
//	Transpose(Mul(k, c))            → Mul(Transpose(k), c)    (K scaled before its transpose)
//	Mul(Mul(x, c1), c2)             → Mul(x, c1·c2)           (scale split over Q and K, d^-¼ each)
//	Transpose(Transpose(x, p1), p2) → Transpose(x, p1∘p2), or x when that is the identity
//	Cast(x, to=dtype of x), Identity(x) → x   (around the scores and probs)
//
// c is a constant with one element (Sqrt(64) and other constant expressions
// count). K fed already transposed, or transposed by a perm that also splits
// heads ([0,2,3,1]), and 3-D [BH,S,D] vs 4-D [B,H,S,D] heads need no
// rewrite here: fuse_attention reads K's layout off the transpose perm and
// takes both ranks.
//
// The rules are scoped to the attention cone (the scale/mask chain feeding
// the Softmax of an attention candidate, its scores MatMul and the
// scale/transpose chains of that MatMul's operands), which is derived from
// fuse_attention's patterns (attentionScope). Moving a scale changes
// rounding by an ulp, which is worth it where it enables the fusion and
// pointless elsewhere; and a graph without attention comes out of the
// fusion pipeline byte-identical. (An attention that fuse_attention then
// refuses, say for a banded mask, keeps its canonical spelling: the same
// meaning, up to that rounding.)

// Canonicalize returns the canonicalisation pass.
func Canonicalize() Pass {
	return &RulePass{PassName: PassCanonicalize, Rules: canonicalRules, Scope: attentionScope(attentionRules)}
}

// canonicalRules is the table; order matters only in that the first rule
// whose pattern and conditions hold at a node fires.
var canonicalRules = []Rule{
	{
		Name: "div_by_const", Root: "Div",
		Pattern: Op("Div", Any("x"), Any("c")),
		Where:   []Cond{scalarConst("c", "divisor"), nonZero("c")},
		Rewrite: func(m *Match, e *Edit) error {
			c := m.Value("c")
			inv := e.Literal(c.Type.DType, c.Type.Shape, 1/m.Get("c").(float64))
			return e.replaceRoot(e.Op("Mul", nil, m.Value("x"), inv))
		},
	},
	{
		// A Cast to the dtype the value already has (HF's softmax(dtype=
		// float32).to(q.dtype) exported from a float32 model) is no op.
		Name: "drop_noop_cast", Root: "Cast",
		Pattern: Op("Cast", Any("x")),
		Where:   []Cond{{Name: "cast keeps the dtype", Check: noopCast}},
		Rewrite: replaceRootByInput,
	},
	{
		Name: "drop_identity", Root: "Identity",
		Pattern: Op("Identity", Any("x")),
		Rewrite: replaceRootByInput,
	},
	{
		Name: "transpose_transpose", Root: "Transpose",
		Pattern: Op("Transpose", Op("Transpose", Any("x")).As("inner")),
		Rewrite: func(m *Match, e *Edit) error {
			x := m.Value("x")
			p1, err := graph.TransposePerm(m.Node("inner").Attrs, x.Type.Shape.Rank())
			if err != nil {
				return err
			}
			p2, err := graph.TransposePerm(m.Root.Attrs, x.Type.Shape.Rank())
			if err != nil {
				return err
			}
			// out axis i is inner axis p2[i], which is x axis p1[p2[i]].
			p := make([]int64, len(p2))
			for i := range p2 {
				p[i] = int64(p1[p2[i]])
			}
			if isIdentityPerm(p) {
				e.Replace(m.Root.Outputs[0], x)
				e.Describe(x.Name, "(identity)")
				return nil
			}
			return e.replaceRoot(e.Op("Transpose", graph.Attrs{"perm": graph.Ints(p...)}, x))
		},
	},
	{
		Name: "scale_through_transpose", Root: "Transpose",
		Pattern: Op("Transpose", Op("Mul", Any("x"), Any("c"))),
		Where:   []Cond{scalarConst("c", "scale"), rankAtMost("c", "x")},
		Rewrite: func(m *Match, e *Edit) error {
			t, err := e.Op("Transpose", m.Root.Attrs.Clone(), m.Value("x"))
			if err != nil {
				return err
			}
			return e.replaceRoot(e.Op("Mul", nil, t, m.Value("c")))
		},
	},
	{
		Name: "scale_out_of_matmul_a", Root: "MatMul",
		Pattern: Op("MatMul", Op("Mul", Any("x"), Any("c")), Any("y")),
		Where:   []Cond{scalarConst("c", "scale"), rankAtMost("c", "x")},
		Rewrite: func(m *Match, e *Edit) error {
			return e.scaleAfter(m.Value("x"), m.Value("y"), m.Value("c"))
		},
	},
	{
		Name: "scale_out_of_matmul_b", Root: "MatMul",
		Pattern: Op("MatMul", Any("x"), Op("Mul", Any("y"), Any("c"))),
		Where:   []Cond{scalarConst("c", "scale"), rankAtMost("c", "y")},
		Rewrite: func(m *Match, e *Edit) error {
			return e.scaleAfter(m.Value("x"), m.Value("y"), m.Value("c"))
		},
	},
	{
		Name: "fold_scalar_muls", Root: "Mul",
		Pattern: Op("Mul", Op("Mul", Any("x"), Any("c1")), Any("c2")),
		Where:   []Cond{scalarConst("c1", "inner factor"), scalarConst("c2", "outer factor")},
		Rewrite: func(m *Match, e *Edit) error {
			c1, c2 := m.Value("c1"), m.Value("c2")
			shape := c1.Type.Shape
			if c2.Type.Shape.Rank() > shape.Rank() {
				shape = c2.Type.Shape
			}
			c := e.Literal(m.Root.Outputs[0].Type.DType, shape, m.Get("c1").(float64)*m.Get("c2").(float64))
			return e.replaceRoot(e.Op("Mul", nil, m.Value("x"), c))
		},
	},
}

func noopCast(m *Match) string {
	if to, from := m.Root.Outputs[0].Type.DType, m.Value("x").Type.DType; to != from {
		return fmt.Sprintf("casts %v to %v", from, to)
	}
	return ""
}

func replaceRootByInput(m *Match, e *Edit) error {
	e.Replace(m.Root.Outputs[0], m.Value("x"))
	e.Describe(m.Value("x").Name, "(no op)")
	return nil
}

// replaceRoot replaces the root's output by v (err from making v passes through).
func (e *Edit) replaceRoot(v *graph.Value, err error) error {
	if err != nil {
		return err
	}
	e.Replace(e.m.Root.Outputs[0], v)
	return nil
}

// scaleAfter replaces the root MatMul by Mul(MatMul(x, y), c).
func (e *Edit) scaleAfter(x, y, c *graph.Value) error {
	s, err := e.Op("MatMul", nil, x, y)
	if err != nil {
		return err
	}
	return e.replaceRoot(e.Op("Mul", nil, s, c))
}

// scalarConst requires the value captured as name to be a finite constant
// with one element; its value is Set under name.
func scalarConst(name, role string) Cond {
	return Cond{
		Name: role + " is a constant scalar",
		Check: func(m *Match) string {
			v, why := m.Scalar(m.Value(name))
			if why != "" {
				return role + " " + why
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Sprintf("%s %s is %v", role, m.Value(name).Name, v)
			}
			m.Set(name, v)
			return ""
		},
	}
}

func nonZero(name string) Cond {
	return Cond{Name: name + " is not zero", Check: func(m *Match) string {
		if m.Get(name).(float64) == 0 {
			return m.Value(name).Name + " is zero"
		}
		return ""
	}}
}

// rankAtMost keeps a broadcast scalar from raising the rank of what it scales.
func rankAtMost(c, x string) Cond {
	return Cond{Name: c + " does not broadcast " + x, Check: func(m *Match) string {
		if m.Value(c).Type.Shape.Rank() > m.Value(x).Type.Shape.Rank() {
			return fmt.Sprintf("scale %s (rank %d) would broadcast %s up", m.Value(c).Name, m.Value(c).Type.Shape.Rank(), m.Value(x).Name)
		}
		return ""
	}}
}

func isIdentityPerm(p []int64) bool {
	for i, v := range p {
		if int64(i) != v {
			return false
		}
	}
	return true
}

// The scope is derived from the fusion rules' patterns (patternShape): from
// each node a fusion rule is rooted at, up to the node it reports about
// (MatMul(probs, V) to its Softmax), then along the score chain through
// the ops the patterns have there, to the op whose operands are leaves (the
// scores MatMul) and from there up its operands. On top of the patterns'
// ops it accepts what canonicalize turns into them (below): a second fusion
// rooted elsewhere gets its scope from its own patterns.
var (
	// spelledAs: ops canonicalize rewrites into a chain op of the patterns.
	spelledAs = map[string]string{"Div": "Mul"}
	// dropped may sit on any edge of the score chain (canonicalize removes
	// the no-op ones); between the probs and the root only no-op ones are
	// looked through.
	dropped = map[string]bool{"Identity": true, "Cast": true}
	// operandMoves: on the scores MatMul's operands canonicalize merges
	// transposes and moves constant scales out (to the chain's scale Mul).
	operandMoves = map[string]bool{"Transpose": true, "Identity": true}
)

// maxScopeDepth bounds each walk (chains are a few nodes long).
const maxScopeDepth = 6

// patternShape is what the fusion patterns look like walked down from
// their root.
type patternShape struct {
	root, report string
	// chain maps an op on the way from the reported node to the leaves'
	// op to the argument positions that continue the chain.
	chain map[string][]int
	// ends are the ops whose arguments are all leaves (MatMul(q, kt)).
	ends map[string]bool
}

// shapeOf derives the shape of the rules rooted at root that report about
// another node (fuse_attention's table).
func shapeOf(rules []Rule) patternShape {
	sh := patternShape{chain: map[string][]int{}, ends: map[string]bool{}}
	var walk func(p *Pattern)
	walk = func(p *Pattern) {
		leaves := true
		for i, a := range p.Args {
			if a.Op == "" {
				continue
			}
			leaves = false
			pos := []int{i}
			if commutative[p.Op] && len(p.Args) == 2 {
				pos = []int{0, 1}
			}
			for _, j := range pos {
				if !slices.Contains(sh.chain[p.Op], j) {
					sh.chain[p.Op] = append(sh.chain[p.Op], j)
				}
			}
			walk(a)
		}
		if leaves {
			sh.ends[p.Op] = true
		}
	}
	for i := range rules {
		r := &rules[i]
		rep := r.reportPattern()
		if rep == nil {
			continue
		}
		sh.root, sh.report = r.Root, rep.Op
		for _, a := range rep.Args {
			if a.Op != "" {
				walk(a)
			}
		}
	}
	return sh
}

// attentionScope returns canonicalize's scope for the fusion rules: the
// nodes their patterns walk through (with canonicalize's spellings), from
// every root whose reported node is an attention candidate: a Softmax over
// the last axis of a rank 3 or 4 tensor (a classifier head
// Softmax(x·W·c) read by no MatMul(probs, V) is not one and keeps its
// spelling).
func attentionScope(rules []Rule) func(g *graph.Graph) func(*graph.Node) bool {
	sh := shapeOf(rules)
	return func(g *graph.Graph) func(*graph.Node) bool {
		in := map[*graph.Node]bool{}
		memo := map[*graph.Value]bool{}
		isConst := func(v *graph.Value) bool { return isConstExpr(v, 0, memo) }
		var operand func(v *graph.Value, depth int)
		operand = func(v *graph.Value, depth int) {
			n := v.Producer
			if n == nil || depth > maxScopeDepth || in[n] {
				return
			}
			if operandMoves[n.Op] {
				in[n] = true
				operand(n.Inputs[0], depth+1)
				return
			}
			if n.Op == "Mul" || spelledAs[n.Op] == "Mul" {
				for i, x := range n.Inputs {
					if other := n.Inputs[1-i]; isConst(other) && !isConst(x) {
						in[n] = true
						operand(x, depth+1)
					}
				}
			}
		}
		var chain func(v *graph.Value, depth int)
		chain = func(v *graph.Value, depth int) {
			n := v.Producer
			if n == nil || depth > maxScopeDepth || in[n] {
				return
			}
			op := n.Op
			if s, ok := spelledAs[op]; ok {
				op = s
			}
			switch {
			case sh.ends[op]:
				in[n] = true
				for _, x := range n.Inputs {
					operand(x, 0)
				}
			case dropped[op]:
				in[n] = true
				chain(n.Inputs[0], depth+1)
			case len(sh.chain[op]) > 0:
				in[n] = true
				pos := sh.chain[op]
				if op != n.Op { // a spelling: its arguments are not in the pattern's order
					pos = []int{0, 1}
				}
				for _, i := range pos {
					if i < len(n.Inputs) && !isConst(n.Inputs[i]) {
						chain(n.Inputs[i], depth+1)
					}
				}
			}
		}
		for _, n := range g.Nodes {
			if n.Op != sh.root || len(n.Inputs) == 0 {
				continue
			}
			// the reported node may reach the root through no-op casts and identities.
			var between []*graph.Node
			p := n.Inputs[0]
			for p.Producer != nil && len(between) < 4 && dropped[p.Producer.Op] && p.Type.DType == p.Producer.Inputs[0].Type.DType {
				between = append(between, p.Producer)
				p = p.Producer.Inputs[0]
			}
			rep := p.Producer
			if rep == nil || rep.Op != sh.report || in[rep] {
				continue
			}
			r := rep.Outputs[0].Type.Shape.Rank()
			if a, err := graph.NormAxis(int(rep.Attrs.Int("axis", -1)), r); err != nil || a != r-1 || (r != 3 && r != 4) {
				continue
			}
			in[rep] = true // marks the candidate as walked
			for _, b := range between {
				in[b] = true
			}
			for _, x := range rep.Inputs {
				chain(x, 0)
			}
		}
		return func(n *graph.Node) bool { return in[n] }
	}
}

// isConstExpr reports whether v is a const or computed from consts only by
// ops the constant evaluator knows (without evaluating it). memo keeps
// shared subexpressions from being walked once per path.
func isConstExpr(v *graph.Value, depth int, memo map[*graph.Value]bool) bool {
	switch {
	case v == nil:
		return true
	case v.Kind == graph.Const:
		return true
	case v.Producer == nil || depth > maxConstDepth:
		return false
	}
	if r, ok := memo[v]; ok {
		return r
	}
	_, ok := constOps[v.Producer.Op]
	r := ok && !slices.ContainsFunc(v.Producer.Inputs, func(in *graph.Value) bool { return !isConstExpr(in, depth+1, memo) })
	memo[v] = r
	return r
}
