package passes

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

func fzModel(t testing.TB, name string, dt graph.DType) (model.Config, *graph.Graph) {
	t.Helper()
	cfg, err := model.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	if dt != graph.InvalidDType {
		cfg.DType = dt
	}
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, g
}

// TestFuseModel: every config of MODEL.md fuses to exactly one
// FlashAttention per layer, causal with scale 1/√D, no Softmax left, every
// Softmax explained as fused, and the mask const dropped.
func TestFuseModel(t *testing.T) {
	for _, name := range model.Names() {
		t.Run(name, func(t *testing.T) {
			cfg, g := fzModel(t, name, graph.InvalidDType)
			before := graph.Format(g)
			fused, log := fzRun(t, Default(true), g)
			if graph.Format(g) != before {
				t.Fatal("the pipeline modified the model graph")
			}
			ops := fused.CountOps()
			if ops["FlashAttention"] != cfg.Layers || ops["Softmax"] != 0 {
				t.Fatalf("%d layers: %d FlashAttention, %d Softmax", cfg.Layers, ops["FlashAttention"], ops["Softmax"])
			}
			for _, n := range fzNodes(fused, "FlashAttention") {
				if n.Attrs.Int("causal", 0) != 1 || n.Attrs.Float("scale", 0) != float64(float32(1/math.Sqrt(float64(cfg.HeadDim)))) { // an ONNX float attribute is a float32
					t.Errorf("%s: attrs %v", n.Name, n.Attrs)
				}
			}
			// The output MatMul's value name is kept: downstream reads it.
			for i := range cfg.Layers {
				v := fused.Value("layers." + strconv.Itoa(i) + "/attn/o")
				if v == nil || v.Producer == nil || v.Producer.Op != "FlashAttention" {
					t.Errorf("layer %d: attention output is %v", i, v)
				}
			}
			if fused.Value("causal_mask") != nil {
				t.Error("the causal mask const survived fusion")
			}
			xs := ExplainLog(g, log)
			if len(xs) != cfg.Layers {
				t.Fatalf("%d explanations", len(xs))
			}
			for _, x := range xs {
				if !x.Fused || x.Rule != "attention_add_mask" {
					t.Errorf("%v", x)
				}
			}
			// The canonical text of the fused graph round-trips.
			back, err := graph.Parse(graph.Format(fused))
			if err != nil || graph.Format(back) != graph.Format(fused) {
				t.Fatalf("fused graph does not round-trip: %v", err)
			}
		})
	}
}

// TestFuseModelNumerics: the tiny model fused and unfused on the same random
// tokens gives the same loss and logits on the CPU backend.
func TestFuseModelNumerics(t *testing.T) {
	for _, dt := range []graph.DType{graph.Float64, graph.Float32} {
		t.Run(dt.String(), func(t *testing.T) {
			_, g := fzModel(t, "tiny", dt)
			fused, _ := fzRun(t, Default(true), g)
			fzSameOutputs(t, g, fused, dt)
		})
	}
}

// TestFuseModelNumericsSmall is TestFuseModelNumerics on the small config
// (4 layers, S=256, 64-wide heads) in float32: a few seconds on the CPU.
func TestFuseModelNumericsSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("small model on the CPU backend takes seconds; run without -short")
	}
	_, g := fzModel(t, "small", graph.Float32)
	fused, _ := fzRun(t, Default(true), g)
	fzSameOutputs(t, g, fused, graph.Float32)
}

// TestPassOffByteIdentical: without fusion the compiled graph is the built
// graph byte for byte (and the graph itself is returned: nothing copied).
func TestPassOffByteIdentical(t *testing.T) {
	for _, name := range model.Names() {
		_, g := fzModel(t, name, graph.InvalidDType)
		before, hash := graph.Format(g), g.Hash()
		for _, p := range []Pipeline{Default(false), {Name: "empty"}} {
			out, _ := fzRun(t, p, g)
			if graph.Format(out) != before || out.Hash() != hash {
				t.Errorf("%s: pipeline %s changed the graph", name, p.Name)
			}
			dot0, err0 := graph.WriteDOT(g)
			dot1, err1 := graph.WriteDOT(out)
			if err0 != nil || err1 != nil || dot0 != dot1 {
				t.Errorf("%s: pipeline %s changed the DOT (%v, %v)", name, p.Name, err0, err1)
			}
		}
	}
}

// fzNoAttention is an MLP with a softmax classifier head: nothing to fuse.
func fzNoAttention(t *testing.T) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("mlp")
	x := b.Input("x", graph.Float32, 4, 16)
	w1 := b.Param("w1", graph.Float32, graph.Shape{16, 32}, graph.Normal(0.1, 1))
	w2 := b.Param("w2", graph.Float32, graph.Shape{32, 10}, graph.Normal(0.1, 2))
	h := b.Op("Relu", nil, b.MatMul(x, w1))
	h = b.Div(h, b.Scalar(graph.Float32, 3)) // a Div by a constant outside attention stays
	logits := b.Mul(b.MatMul(h, w2), b.Scalar(graph.Float32, 0.5))
	b.Output(b.Softmax(logits, -1))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestFusionWithoutAttentionByteIdentical: the fusion pipeline changes no
// byte of a graph with no attention, and says why its Softmax stayed.
func TestFusionWithoutAttentionByteIdentical(t *testing.T) {
	g := fzNoAttention(t)
	before := graph.Format(g)
	out, log := fzRun(t, Default(true), g)
	if graph.Format(out) != before {
		t.Errorf("fusion pipeline changed a graph without attention:\n%s", graph.Format(out))
	}
	xs := ExplainLog(g, log)
	if len(xs) != 1 || xs[0].Fused || !strings.Contains(xs[0].Reason, "probs are a graph output") {
		t.Errorf("explanations %v", xs)
	}
}

// TestVerifyAfterEveryPass: a pass that breaks the graph is caught by the
// pipeline's verifier, naming the pass.
func TestVerifyAfterEveryPass(t *testing.T) {
	g := fzNoAttention(t)
	bad := passFunc{"break", func(g *graph.Graph, _ *Log) (*graph.Graph, error) {
		c := g.Clone()
		c.Nodes = c.Nodes[1:] // the next node reads an undefined value
		return c, nil
	}}
	p := Pipeline{Name: "bad", Passes: []Pass{DCE{}, bad, DCE{}}, Verify: true}
	if _, err := p.Run(g, nil); err == nil || !strings.Contains(err.Error(), "after pass break") {
		t.Errorf("err = %v, want the verifier to name pass break", err)
	}
	p.Verify = false
	if _, err := p.Run(g, nil); err != nil {
		t.Logf("without the verifier: %v", err)
	}
	failing := passFunc{"fail", func(*graph.Graph, *Log) (*graph.Graph, error) { return nil, errors.New("boom") }}
	if _, err := (Pipeline{Passes: []Pass{failing}}).Run(g, nil); err == nil || !strings.Contains(err.Error(), "pass fail: boom") {
		t.Errorf("err = %v", err)
	}
}

type passFunc struct {
	name string
	run  func(*graph.Graph, *Log) (*graph.Graph, error)
}

func (p passFunc) Name() string                                     { return p.name }
func (p passFunc) Run(g *graph.Graph, l *Log) (*graph.Graph, error) { return p.run(g, l) }

func TestSelectAndParseList(t *testing.T) {
	if got := ParseList(" canonicalize, fuse_attention,,dce "); !slices.Equal(got, []string{"canonicalize", "fuse_attention", "dce"}) {
		t.Errorf("ParseList = %q", got)
	}
	if got := ParseList("none"); len(got) != 0 {
		t.Errorf("ParseList(none) = %q", got)
	}
	p, err := Select([]string{"fuse_attention", "dce"})
	if err != nil || !slices.Equal(p.PassNames(), []string{"fuse_attention", "dce"}) {
		t.Fatalf("Select: %v %v", p.PassNames(), err)
	}
	if _, err := Select([]string{"fuse_attention", "nope"}); err == nil || !strings.Contains(err.Error(), `unknown pass "nope"`) {
		t.Errorf("Select(nope): %v", err)
	}
	for _, n := range []string{PassCheckConsts, PassCanonicalize, PassFuseAttention, PassDCE} {
		if !slices.Contains(Names(), n) {
			t.Errorf("pass %s not registered", n)
		}
	}
	d, err := Default(true).Select([]string{"dce", "canonicalize"})
	if err != nil || !slices.Equal(d.PassNames(), []string{"dce", "canonicalize"}) {
		t.Errorf("Pipeline.Select: %v %v", d.PassNames(), err)
	}
	if _, err := Default(false).Select([]string{"dce"}); err == nil {
		t.Error("Default(false) has no dce, Select should say so")
	}
	if got := Default(true).PassNames(); !slices.Equal(got, []string{"check_consts", "canonicalize", "fuse_attention", "dce"}) {
		t.Errorf("Default(true) = %v", got)
	}
	// Fusion alone (no canonicalize) still fuses the model's canonical form;
	// without dce the dead chain is already gone (rewrites sweep what they kill).
	_, g := fzModel(t, "tiny", graph.InvalidDType)
	only, err := Select([]string{"fuse_attention"})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := fzRun(t, only, g)
	if ops := out.CountOps(); ops["FlashAttention"] != 2 || ops["Softmax"] != 0 || ops["Add"] != g.CountOps()["Add"]-2 {
		t.Errorf("fuse_attention alone: %v", ops)
	}
}

// TestDumpAfter writes text and DOT after the named passes.
func TestDumpAfter(t *testing.T) {
	dir := t.TempDir()
	_, g := fzModel(t, "tiny", graph.InvalidDType)
	p := Default(true)
	p.DumpAfter = []string{"fuse_attention"}
	p.Dump = DirDumper{Dir: dir}
	out, _ := fzRun(t, p, g)
	text, err := os.ReadFile(filepath.Join(dir, "02-fuse_attention.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), "flashgraph.FlashAttention") {
		t.Error("dumped text has no FlashAttention")
	}
	dot, err := os.ReadFile(filepath.Join(dir, "02-fuse_attention.dot"))
	if err != nil || !strings.HasPrefix(string(dot), "digraph") {
		t.Fatalf("dot: %v %.40q", err, dot)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("dumped %d files, want 2 (only after fuse_attention)", len(entries))
	}
	// After the last pass the dump is the result.
	p.DumpAfter = []string{"all"}
	dir2 := t.TempDir()
	p.Dump = DirDumper{Dir: dir2, DOT: func(*graph.Graph) (string, error) { return "digraph {}\n", nil }}
	fzRun(t, p, g)
	last, err := os.ReadFile(filepath.Join(dir2, "03-dce.txt"))
	if err != nil || string(last) != graph.Format(out) {
		t.Errorf("dump after dce is not the result: %v", err)
	}
	p.DumpAfter = []string{"no_such_pass"}
	if _, err := p.Run(g, nil); err == nil {
		t.Error("-dump-after of an unknown pass should fail")
	}
}

func TestDCE(t *testing.T) {
	b := graph.NewBuilder("dead")
	x := b.Input("x", graph.Float32, 4)
	unusedIn := b.Input("unused", graph.Float32, 4)
	w := b.Param("w", graph.Float32, graph.Shape{4}, graph.Ones())
	dw := b.Param("dead_w", graph.Float32, graph.Shape{4}, graph.Ones())
	c := b.Const("dead_c", graph.Float32, graph.Shape{4}, graph.Zeros())
	y := b.Mul(x, w)
	dead := b.Add(b.Mul(x, dw), c) // a dead chain of two nodes
	_ = dead
	_ = unusedIn
	b.Output(y)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	before := graph.Format(g)
	log := &Log{}
	out, err := DCE{}.Run(g, log)
	if err != nil {
		t.Fatal(err)
	}
	if graph.Format(g) != before {
		t.Fatal("DCE modified its input")
	}
	if err := graph.Verify(out); err != nil {
		t.Fatal(err)
	}
	if len(out.Nodes) != 1 || out.Nodes[0].Op != "Mul" || out.Nodes[0].Inputs[1].Name != "w" {
		t.Errorf("nodes after DCE: %s", graph.Format(out))
	}
	if len(out.Params) != 1 || len(out.Consts) != 0 || len(out.Inputs) != 2 {
		t.Errorf("params %d consts %d inputs %d, want 1 0 2 (inputs stay)", len(out.Params), len(out.Consts), len(out.Inputs))
	}
	if !strings.Contains(log.String(), "removed 2 nodes and 2 initializers") {
		t.Errorf("log: %s", log)
	}
	// Nothing dead: the same graph comes back.
	again, _ := DCE{}.Run(out, nil)
	if again != out {
		t.Error("DCE copied a graph with nothing dead")
	}
}

func TestCheckConsts(t *testing.T) {
	mk := func(dt graph.DType, init graph.Init, shape ...int) *graph.Graph {
		// Built by hand: the builder would (rightly) refuse some of these.
		v := &graph.Value{Name: "c", Type: graph.TensorType{DType: dt, Shape: shape}, Kind: graph.Const, Init: &init}
		return &graph.Graph{Name: "consts", Consts: []*graph.Value{v}, Outputs: []*graph.Value{v}}
	}
	if _, err := (CheckConsts{}).Run(mk(graph.Int64, graph.Literal(1, 2.5), 2), nil); err == nil || !strings.Contains(err.Error(), "not an integer") {
		t.Errorf("int64 2.5: %v", err)
	}
	if _, err := (CheckConsts{}).Run(mk(graph.Bool, graph.Literal(1, 2), 2), nil); err == nil || !strings.Contains(err.Error(), "not 0 or 1") {
		t.Errorf("bool 2: %v", err)
	}
	if _, err := (CheckConsts{}).Run(mk(graph.Float32, graph.CausalMask(), 2, 2, 2), nil); err == nil {
		t.Error("a rank-3 causal mask should not materialise")
	}
	log := &Log{}
	g := mk(graph.Float32, graph.Literal(1, math.NaN()), 2)
	out, err := (CheckConsts{}).Run(g, log)
	if err != nil || out != g {
		t.Fatalf("NaN literal: %v", err)
	}
	if w := log.Filter(PassCheckConsts, Warning); len(w) != 1 || !strings.Contains(w[0].Reason, "NaN") {
		t.Errorf("warnings %v", w)
	}
	_, m := fzModel(t, "tiny", graph.InvalidDType)
	if out, err := (CheckConsts{}).Run(m, nil); err != nil || out != m {
		t.Errorf("model consts: %v", err)
	}
}
