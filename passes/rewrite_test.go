package passes

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Tests of the rewrite engine itself, with toy rules.

// fzToy is x·c + y with c a scalar const, and y·x feeding the output too.
func fzToy(t *testing.T, constFirst bool) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("toy")
	x := b.Input("x", graph.Float64, 3)
	y := b.Input("y", graph.Float64, 3)
	c := b.Scalar(graph.Float64, 2)
	var m *graph.Value
	if constFirst {
		m = b.Mul(c, x)
	} else {
		m = b.Mul(x, c)
	}
	b.Output(b.Rename(b.Add(m, y), "out"), b.Mul(y, x))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// doubleToAdd rewrites Mul(x, 2) to Add(x, x).
var doubleToAdd = Rule{
	Name: "double_to_add", Root: "Mul",
	Pattern: Op("Mul", Any("x"), Any("c")),
	Where: []Cond{scalarConst("c", "factor"), {Name: "factor is 2", Check: func(m *Match) string {
		if m.Get("c").(float64) != 2 {
			return "factor is not 2"
		}
		return ""
	}}},
	Rewrite: func(m *Match, e *Edit) error {
		return e.replaceRoot(e.Op("Add", nil, m.Value("x"), m.Value("x")))
	},
}

func fzRules(name string, rules ...Rule) *RulePass { return &RulePass{PassName: name, Rules: rules} }

func TestRuleCommutativeMatch(t *testing.T) {
	for _, constFirst := range []bool{false, true} {
		g := fzToy(t, constFirst)
		log := &Log{}
		out, err := fzRules("toy", doubleToAdd).Run(g, log)
		if err != nil {
			t.Fatal(err)
		}
		if err := graph.Verify(out); err != nil {
			t.Fatal(err)
		}
		ops := out.CountOps()
		if ops["Mul"] != 1 || ops["Add"] != 2 {
			t.Errorf("constFirst=%v: ops %v, want the scalar Mul rewritten and Mul(y, x) kept", constFirst, ops)
		}
		// Mul(y, x): both orders tried, both refused (x and y are inputs).
		refused := log.Filter("toy", Refused)
		if len(refused) != 1 || refused[0].Node != "Mul_1" || !strings.Contains(refused[0].Reason, "factor input x is not a scalar") {
			t.Errorf("refusals %v", refused)
		}
		if f := log.Filter("toy", Fired); len(f) != 1 || f[0].Rule != "double_to_add" || f[0].Node != "Mul_0" {
			t.Errorf("firings %v", f)
		}
		// The replaced value keeps its name; the const nobody reads is gone.
		if out.Nodes[0].Op != "Add" || out.Nodes[0].Outputs[0].Name != "Mul_0" || len(out.Consts) != 0 {
			t.Errorf("after rewrite:\n%s", graph.Format(out))
		}
		fzSameOutputs(t, g, out, graph.Float64)
	}
}

func TestRuleRefusalLeavesGraph(t *testing.T) {
	g := fzToy(t, false)
	r := doubleToAdd
	r.Where = append(r.Where, Cond{Name: "never", Check: func(*Match) string { return "not today" }})
	log := &Log{}
	out, err := fzRules("toy", r).Run(g, log)
	if err != nil {
		t.Fatal(err)
	}
	if out != g {
		t.Error("a pass that fired nothing returned a copy")
	}
	if !strings.Contains(log.String(), "toy: Mul_0 (Mul): refused double_to_add: not today") {
		t.Errorf("log:\n%s", log)
	}
}

func TestFirstMatchWins(t *testing.T) {
	g := fzToy(t, false)
	second := doubleToAdd
	second.Name = "second"
	second.Rewrite = func(m *Match, e *Edit) error { return e.replaceRoot(e.Op("Sub", nil, m.Value("x"), m.Value("x"))) }
	log := &Log{}
	out, err := fzRules("toy", doubleToAdd, second).Run(g, log)
	if err != nil {
		t.Fatal(err)
	}
	if out.CountOps()["Sub"] != 0 || len(log.Filter("toy", Fired)) != 1 {
		t.Errorf("the second rule fired:\n%s", log)
	}
	// A failing rewrite is a refusal and the next rule gets its turn.
	failing := doubleToAdd
	failing.Name = "failing"
	failing.Rewrite = func(m *Match, e *Edit) error {
		_, err := e.Op("MatMul", nil, m.Value("x")) // wrong arity: refused, nothing applied
		return err
	}
	log = &Log{}
	out, err = fzRules("toy", failing, second).Run(g, log)
	if err != nil {
		t.Fatal(err)
	}
	if out.CountOps()["Sub"] != 1 || len(out.Nodes) != 3 {
		t.Errorf("after a failing rewrite:\n%s\n%s", graph.Format(out), log)
	}
}

func TestPatternOptionalAndSameValue(t *testing.T) {
	b := graph.NewBuilder("opt")
	x := b.Input("x", graph.Float64, 3)
	sq := b.Mul(x, x)
	neg := b.Neg(b.Mul(sq, b.Scalar(graph.Float64, 3)))
	b.Output(neg, b.Neg(sq), b.Neg(b.Mul(x, b.Input("y", graph.Float64, 3))))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	// Neg([Mul(Mul(a, a), _)]) : square with an optional scale, a bound twice.
	var seen []string
	r := Rule{
		Name: "neg_square", Root: "Neg",
		Pattern: Op("Neg", Maybe("Mul", Op("Mul", Any("a"), Any("a")).As("sq"), Any("k")).As("scaled")),
		Rewrite: func(m *Match, e *Edit) error {
			seen = append(seen, m.Root.Name+":"+map[bool]string{true: "scaled", false: "plain"}[m.Has("scaled")])
			return e.replaceRoot(e.Op("Neg", nil, m.Root.Inputs[0]))
		},
	}
	// The rewrite makes a fresh Neg of the same form; one sweep is enough
	// to see the matches, so bound the sweeps and expect the fixpoint error.
	p := fzRules("opt", r)
	p.MaxSweeps = 1
	_, err = p.Run(g, nil)
	if err == nil || !strings.Contains(err.Error(), "no fixpoint") {
		t.Errorf("err = %v, want no fixpoint", err)
	}
	if strings.Join(seen, " ") != "Neg_0:scaled Neg_1:plain" {
		t.Errorf("matches %v: want Neg_0 with the optional Mul, Neg_1 without, not Neg_2 (x·y)", seen)
	}
}

func TestRuleTableChecked(t *testing.T) {
	bad := doubleToAdd
	bad.Root = "Add"
	if _, err := fzRules("bad", bad).Run(fzToy(t, false), nil); err == nil || !strings.Contains(err.Error(), "not rooted at a Add node") {
		t.Errorf("err = %v", err)
	}
	bad = doubleToAdd
	bad.Pattern = Op("Mul", Op("NoSuchOp"), Any("c"))
	if _, err := fzRules("bad", bad).Run(fzToy(t, false), nil); err == nil || !strings.Contains(err.Error(), "unknown op NoSuchOp") {
		t.Errorf("err = %v", err)
	}
	for _, rules := range [][]Rule{canonicalRules, attentionRules, qkvRules, disjointSumRules} {
		for i := range rules {
			if err := rules[i].check(); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestRewriteGraphOutput: a rewrite of a value that is a graph output keeps
// the output's name; replacing it by an existing value is refused.
func TestRewriteGraphOutput(t *testing.T) {
	b := graph.NewBuilder("out")
	x := b.Input("x", graph.Float64, 2, 3)
	tt := b.Rename(b.Transpose(b.Transpose(x, 1, 0), 1, 0), "result")
	b.Output(tt)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	p := &RulePass{PassName: "tt", Rules: []Rule{fzRule(t, canonicalRules, "transpose_transpose")}} // unscoped
	log := &Log{}
	out, err := p.Run(g, log)
	if err != nil {
		t.Fatal(err)
	}
	if out != g || !strings.Contains(log.String(), "result is a graph output and would lose its name") {
		t.Errorf("identity transpose of an output: %s", log)
	}
	b = graph.NewBuilder("out2")
	x = b.Input("x", graph.Float64, 2, 3, 4)
	b.Output(b.Rename(b.Transpose(b.Transpose(x, 1, 0, 2), 0, 2, 1), "result"))
	g, _ = b.Build()
	out, err = p.Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Nodes) != 1 || out.Outputs[0].Name != "result" || !slicesEqual(out.Nodes[0].Attrs.IntList("perm"), []int64{1, 2, 0}) {
		t.Errorf("composed transpose:\n%s", graph.Format(out))
	}
	fzSameOutputs(t, g, out, graph.Float64)
}

// TestCanonicalizeForms checks canonical forms directly (scoped to
// attention: the same graph with the Softmax replaced is left alone).
func TestCanonicalizeForms(t *testing.T) {
	g := attnCase{name: "canon", rank: 4, scale: "qk", k: "t", mask: "recipe", layers: 1}.build(t, graph.Float64)
	out, log := fzRun(t, Pipeline{Passes: []Pass{Canonicalize()}}, g)
	ops := out.CountOps()
	// Q·d^-¼ and K·d^-¼ become one Mul by d^-½ on the scores.
	if ops["Mul"] != 1 {
		t.Errorf("ops %v\n%s", ops, log)
	}
	for _, rule := range []string{"scale_through_transpose", "scale_out_of_matmul_a", "scale_out_of_matmul_b", "fold_scalar_muls"} {
		if !strings.Contains(log.String(), "fired "+rule) {
			t.Errorf("rule %s did not fire:\n%s", rule, log)
		}
	}
	fzSameOutputs(t, g, out, graph.Float64)
}

func fzRule(t *testing.T, rules []Rule, name string) Rule {
	t.Helper()
	for _, r := range rules {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no rule %s", name)
	return Rule{}
}
