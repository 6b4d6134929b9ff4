package passes

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Tests of the attention fusion as rules rooted at MatMul(probs, V), and of
// canonicalize's scope derived from them.

// fzAttnInputs builds Q, K, V [B,H,S,D] in b.
func fzAttnInputs(b *graph.Builder, dt graph.DType) fzAttn {
	a := fzAttn{
		q: b.Input("q", dt, fzB, fzH, fzS, fzD), k: b.Input("k", dt, fzB, fzH, fzS, fzD), v: b.Input("v", dt, fzB, fzH, fzS, fzD),
		dt: dt,
	}
	a.scale = b.Scalar(dt, 0.25)
	a.mask = b.Const("mask", dt, graph.Shape{fzS, fzS}, graph.CausalMask())
	return a
}

func TestAttentionRulesRootedAtPV(t *testing.T) {
	for _, r := range attentionRules {
		rep := r.reportPattern()
		if r.Root != "MatMul" || rep == nil || rep.Op != "Softmax" || r.Pattern.Args[0] != rep {
			t.Errorf("rule %s: pattern %v is not MatMul(Softmax(..):probs, V)", r.Name, r.Pattern)
		}
	}
}

// The scope's shape comes from the patterns: a change to them changes it.
func TestScopeShapeFromPatterns(t *testing.T) {
	sh := shapeOf(attentionRules)
	if sh.root != "MatMul" || sh.report != "Softmax" {
		t.Errorf("root %q, report %q", sh.root, sh.report)
	}
	if ends := slices.Sorted(maps.Keys(sh.ends)); !slices.Equal(ends, []string{"MatMul"}) {
		t.Errorf("ends %v, want the scores MatMul", ends)
	}
	if ops := slices.Sorted(maps.Keys(sh.chain)); !slices.Equal(ops, []string{"Add", "Mul", "Where"}) {
		t.Errorf("chain ops %v", ops)
	}
	if w := slices.Sorted(slices.Values(sh.chain["Where"])); !slices.Equal(w, []int{1, 2}) {
		t.Errorf("Where continues the chain at %v, want 1 (keep) and 2 (fill), never the condition", w)
	}
	// A toy fusion rooted elsewhere gets its own shape.
	toy := []Rule{{Name: "toy", Root: "Relu", Report: "e", Pattern: Op("Relu", Op("Exp", Op("Neg", Any("x"))).As("e")), Rewrite: replaceRootByInput}}
	if ts := shapeOf(toy); ts.root != "Relu" || ts.report != "Exp" || !ts.ends["Neg"] || len(ts.chain) != 0 {
		t.Errorf("toy shape %+v", ts)
	}
}

// Two MatMul(probs, V) reading one Softmax: one report about the Softmax
// (the first root's), naming the other reader, as when the fusion scanned
// the Softmax's users.
func TestProbsReadByTwoPV(t *testing.T) {
	dt := graph.Float64
	b := graph.NewBuilder("two_pv")
	a := fzAttnInputs(b, dt)
	p := b.Softmax(b.Add(a.scores(b), a.mask), -1)
	o1 := b.MatMul(p, a.v)
	o2 := b.MatMul(p, a.q)
	b.Output(o1, o2)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	fused, log := fzRun(t, Default(true), g)
	if fzCount(fused, "FlashAttention") != 0 {
		t.Fatal("fused probs that two MatMuls read")
	}
	refused := log.Filter(PassFuseAttention, Refused)
	if len(refused) != 1 || refused[0].Node != "Softmax_0" || refused[0].Reason != "probs also used by node "+o2.Producer.Name {
		t.Errorf("refusals %v, want one about Softmax_0 naming %s", refused, o2.Producer.Name)
	}
}

// The scope follows the patterns: a scale under an op no pattern has (Sub)
// keeps its spelling, the same scale under the mask Add is canonicalised.
func TestCanonicalScopeFollowsPatterns(t *testing.T) {
	for _, c := range []struct {
		op      string
		wantDiv int
	}{{"Add", 0}, {"Sub", 1}} {
		dt := graph.Float64
		b := graph.NewBuilder("scope_" + c.op)
		a := fzAttnInputs(b, dt)
		s := b.Div(b.MatMul(a.q, b.Transpose(a.k, 0, 1, 3, 2)), b.Scalar(dt, 4))
		b.Output(b.MatMul(b.Softmax(b.Op(c.op, nil, s, a.mask), -1), a.v))
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		out, err := Canonicalize().Run(g, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n := fzCount(out, "Div"); n != c.wantDiv {
			t.Errorf("%s mask: %d Div left, want %d:\n%s", c.op, n, c.wantDiv, graph.Format(out))
		}
		fzSameOutputs(t, g, out, dt)
	}
}

func TestRuleReportMustBeCaptured(t *testing.T) {
	bad := Rule{Name: "bad", Root: "Mul", Report: "nope", Pattern: Op("Mul", Any("x"), Any("c")), Rewrite: replaceRootByInput}
	_, err := fzRules("toy", bad).Run(fzToy(t, false), nil)
	if err == nil || !strings.Contains(err.Error(), "captures no op node as nope") {
		t.Errorf("err %v", err)
	}
}
