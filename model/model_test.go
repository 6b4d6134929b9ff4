package model

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/awalterschulze/gographviz"
	"github.com/flashgraph/flashgraph/graph"
)

var update = flag.Bool("update", false, "rewrite golden files")

func mustBuild(t *testing.T, cfg Config) *graph.Graph {
	t.Helper()
	g, err := Build(cfg)
	if err != nil {
		t.Fatalf("Build(%s): %v", cfg.Name, err)
	}
	return g
}

func TestModelConfigsBuildAndVerify(t *testing.T) {
	if got := strings.Join(Names(), ","); got != "tiny,small,gpt2,gpt2-medium,gpt3-1.3b" {
		t.Fatalf("config names %s", got)
	}
	for _, cfg := range Configs() {
		g := mustBuild(t, cfg)
		if err := graph.Verify(g); err != nil {
			t.Errorf("%s: %v", cfg.Name, err)
		}
		if len(g.Inputs) != 2 || g.Inputs[0].Name != "tokens" || g.Inputs[1].Name != "targets" {
			t.Fatalf("%s: inputs %v", cfg.Name, g.Inputs)
		}
		for _, in := range g.Inputs {
			if want := (graph.TensorType{DType: graph.Int64, Shape: graph.Shape{cfg.Batch, cfg.Seq}}); !in.Type.Equal(want) {
				t.Errorf("%s: input %s is %v, want %v", cfg.Name, in.Name, in.Type, want)
			}
		}
		if len(g.Outputs) != 2 || g.Outputs[0].Name != "loss" || g.Outputs[1].Name != "logits" {
			t.Fatalf("%s: outputs %v", cfg.Name, g.Outputs)
		}
		if want := (graph.TensorType{DType: graph.Float32, Shape: graph.Shape{}}); !g.Outputs[0].Type.Equal(want) {
			t.Errorf("%s: loss is %v", cfg.Name, g.Outputs[0].Type)
		}
		if want := (graph.TensorType{DType: graph.Float32, Shape: graph.Shape{cfg.Batch, cfg.Seq, cfg.Vocab}}); !g.Outputs[1].Type.Equal(want) {
			t.Errorf("%s: logits is %v", cfg.Name, g.Outputs[1].Type)
		}
		// The unfused graph has one Softmax per layer (the attention) and no
		// op of our own domain: fusion is a pass's job, not the builder's.
		ops := g.CountOps()
		if ops["Softmax"] != cfg.Layers {
			t.Errorf("%s: %d Softmax nodes, want %d", cfg.Name, ops["Softmax"], cfg.Layers)
		}
		for _, n := range g.Nodes {
			if n.Spec().Domain != graph.DomainONNX {
				t.Errorf("%s: node %s has non-ONNX op %s", cfg.Name, n.Name, n.Op)
			}
		}
	}
}

func TestModelLookup(t *testing.T) {
	c, err := Lookup("small")
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Name: "small", Vocab: 256, Dim: 256, Layers: 4, Heads: 4, HeadDim: 64, FFN: 768, Seq: 256, Batch: 8, DType: graph.Float32}
	if c != want {
		t.Errorf("Lookup(small) = %+v", c)
	}
	g2, _ := Lookup("gpt2")
	if g2.Dim != 768 || g2.Layers != 12 || g2.Heads != 12 || g2.FFN != 3072 || g2.Seq != 1024 {
		t.Errorf("gpt2 = %+v", g2)
	}
	_, err = Lookup("huge")
	if err == nil || !strings.Contains(err.Error(), "tiny, small, gpt2") {
		t.Errorf("Lookup(huge) error %v should list the known configs", err)
	}
}

func TestModelValidate(t *testing.T) {
	tiny, _ := Lookup("tiny")
	bad := map[string]func(*Config){
		"no name":      func(c *Config) { c.Name = "" },
		"zero heads":   func(c *Config) { c.Heads = 0 },
		"neg seq":      func(c *Config) { c.Seq = -1 },
		"odd head dim": func(c *Config) { c.HeadDim = 15 },
		"int dtype":    func(c *Config) { c.DType = graph.Int64 },
		"neg seed":     func(c *Config) { c.Seed = -1 },
		"newline name": func(c *Config) { c.Name = "a\nb" },
		"huge":         func(c *Config) { c.Seq, c.Batch = 1<<22, 1<<10 },
	}
	for name, mod := range bad {
		c := tiny
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
		if _, err := Build(c); err == nil {
			t.Errorf("%s: Build accepted %+v", name, c)
		}
	}
	// The zero DType means float32.
	c := tiny
	c.DType = 0
	if formatOf(t, c) != formatOf(t, tiny) {
		t.Error("zero DType does not build the float32 model")
	}
}

// formatOf builds cfg and returns its canonical text.
func formatOf(t *testing.T, cfg Config) string {
	t.Helper()
	return graph.Format(mustBuild(t, cfg))
}

func TestModelDeterministicAndRoundTrip(t *testing.T) {
	for _, cfg := range Configs() {
		a, b := formatOf(t, cfg), formatOf(t, cfg)
		if a != b {
			t.Fatalf("%s: two builds differ", cfg.Name)
		}
		g, err := graph.Parse(a)
		if err != nil {
			t.Fatalf("%s: Parse(Format): %v", cfg.Name, err)
		}
		if c := graph.Format(g); c != a {
			t.Fatalf("%s: Format(Parse(Format(g))) differs from Format(g)", cfg.Name)
		}
	}
}

func TestModelSeed(t *testing.T) {
	tiny, _ := Lookup("tiny")
	other := tiny
	other.Seed = 7
	g0, g1 := mustBuild(t, tiny), mustBuild(t, other)
	seen := map[float64]string{}
	for i, p := range g0.Params {
		if p.Init.Fn != "normal" {
			continue
		}
		s := p.Init.Args["seed"]
		if prev, dup := seen[s]; dup {
			t.Errorf("params %s and %s share seed %v", prev, p.Name, s)
		}
		seen[s] = p.Name
		if g1.Params[i].Init.Args["seed"] == s {
			t.Errorf("param %s: cfg.Seed does not change its seed", p.Name)
		}
	}
}

func TestModelParams(t *testing.T) {
	for _, cfg := range Configs() {
		g := mustBuild(t, cfg)
		H, D := cfg.Heads, cfg.HeadDim
		// MODEL.md's parameter table, written out independently of Params().
		want := map[string]graph.Shape{
			"tok_emb": {cfg.Vocab, cfg.Dim}, "final_norm": {cfg.Dim}, "lm_head": {cfg.Dim, cfg.Vocab},
		}
		for i := range cfg.Layers {
			l := "layers." + strconv.Itoa(i) + "."
			want[l+"attn_norm"] = graph.Shape{cfg.Dim}
			want[l+"wq"] = graph.Shape{cfg.Dim, H * D}
			want[l+"wk"] = graph.Shape{cfg.Dim, H * D}
			want[l+"wv"] = graph.Shape{cfg.Dim, H * D}
			want[l+"wo"] = graph.Shape{H * D, cfg.Dim}
			want[l+"q_norm"] = graph.Shape{D}
			want[l+"k_norm"] = graph.Shape{D}
			want[l+"mlp_norm"] = graph.Shape{cfg.Dim}
			want[l+"w_gate"] = graph.Shape{cfg.Dim, cfg.FFN}
			want[l+"w_up"] = graph.Shape{cfg.Dim, cfg.FFN}
			want[l+"w_down"] = graph.Shape{cfg.FFN, cfg.Dim}
		}
		if len(g.Params) != len(want) {
			t.Errorf("%s: %d params, want %d", cfg.Name, len(g.Params), len(want))
		}
		var total int64
		resid := 0.02 / math.Sqrt(2*float64(cfg.Layers))
		for _, p := range g.Params {
			s, ok := want[p.Name]
			if !ok {
				t.Errorf("%s: unexpected param %s", cfg.Name, p.Name)
				continue
			}
			if !p.Type.Shape.Equal(s) || p.Type.DType != graph.Float32 {
				t.Errorf("%s: param %s is %v, want float32%v", cfg.Name, p.Name, p.Type, s)
			}
			total += int64(s.Numel())
			switch {
			case strings.HasSuffix(p.Name, "norm"):
				if p.Init.Fn != "ones" {
					t.Errorf("%s: %s init %s, want ones", cfg.Name, p.Name, p.Init.Fn)
				}
			case strings.HasSuffix(p.Name, ".wo") || strings.HasSuffix(p.Name, ".w_down"):
				if p.Init.Fn != "normal" || p.Init.Args["std"] != resid {
					t.Errorf("%s: %s init %+v, want normal std %v", cfg.Name, p.Name, p.Init, resid)
				}
			default:
				if p.Init.Fn != "normal" || p.Init.Args["std"] != 0.02 {
					t.Errorf("%s: %s init %+v, want normal std 0.02", cfg.Name, p.Name, p.Init)
				}
			}
		}
		if got := ParamCount(cfg); got != total {
			t.Errorf("%s: ParamCount %d, want %d", cfg.Name, got, total)
		}
	}
	// GPT-2-small's body with a byte vocabulary and a SwiGLU MLP.
	gpt2, _ := Lookup("gpt2")
	if n := ParamCount(gpt2); n != 113660160 {
		t.Errorf("gpt2 ParamCount %d", n)
	}
}

func TestModelFloat64(t *testing.T) {
	cfg, _ := Lookup("tiny")
	cfg.DType = graph.Float64
	g := mustBuild(t, cfg)
	for _, v := range g.Initializers() {
		if v.Type.DType != graph.Float64 && v.Type.DType != graph.Int64 {
			t.Errorf("%s is %v in a float64 model", v.Name, v.Type.DType)
		}
	}
	if g.Outputs[0].Type.DType != graph.Float64 {
		t.Errorf("loss is %v", g.Outputs[0].Type)
	}
}

// TestModelAttentionPattern checks each layer's attention is written the way
// exporters write it, since the fusion pass and the reference script rely on
// exactly this chain: MatMul(q, Transpose(k)) → Mul(scale) → Add(mask) →
// Softmax(-1) → MatMul(·, v).
func TestModelAttentionPattern(t *testing.T) {
	cfg, _ := Lookup("small")
	g := mustBuild(t, cfg)
	uses := g.Uses()
	for _, sm := range g.Nodes {
		if sm.Op != "Softmax" {
			continue
		}
		if sm.Attrs.Int("axis", 0) != -1 {
			t.Errorf("%s: axis %d", sm.Name, sm.Attrs.Int("axis", 0))
		}
		add := sm.Inputs[0].Producer
		if add == nil || add.Op != "Add" || add.Inputs[1].Name != "causal_mask" {
			t.Fatalf("%s: input is not Add(·, causal_mask)", sm.Name)
		}
		mul := add.Inputs[0].Producer
		if mul == nil || mul.Op != "Mul" || mul.Inputs[1].Kind != graph.Const || mul.Inputs[1].Type.Shape.Rank() != 0 {
			t.Fatalf("%s: scores are not Mul(·, scalar const)", sm.Name)
		}
		want := 1 / math.Sqrt(float64(cfg.HeadDim))
		if v := mul.Inputs[1].Init.Data[0]; v != want {
			t.Errorf("%s: scale %v, want %v", sm.Name, v, want)
		}
		qk := mul.Inputs[0].Producer
		if qk == nil || qk.Op != "MatMul" {
			t.Fatalf("%s: scores not from MatMul", sm.Name)
		}
		tr := qk.Inputs[1].Producer
		if tr == nil || tr.Op != "Transpose" || !equalInts(tr.Attrs.IntList("perm"), []int64{0, 1, 3, 2}) {
			t.Fatalf("%s: K is not Transpose perm [0,1,3,2]", sm.Name)
		}
		u := uses[sm.Outputs[0]]
		if len(u) != 1 || u[0].Op != "MatMul" || u[0].Inputs[0] != sm.Outputs[0] {
			t.Fatalf("%s: probs not used once as MatMul's left operand", sm.Name)
		}
		if s := sm.Outputs[0].Type.Shape; !s.Equal(graph.Shape{cfg.Batch, cfg.Heads, cfg.Seq, cfg.Seq}) {
			t.Errorf("%s: probs shape %v", sm.Name, s)
		}
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestModelGolden pins each config's graph by the sha256 of its canonical
// text; an intended change is refreshed with `go test ./model -update` and the
// new hashes reviewed like code.
func TestModelGolden(t *testing.T) {
	for _, cfg := range Configs() {
		sum := sha256.Sum256([]byte(formatOf(t, cfg)))
		got := hex.EncodeToString(sum[:]) + "\n"
		path := filepath.Join("testdata", cfg.Name+".sha256")
		if *update {
			if err := os.MkdirAll("testdata", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./model -update)", err)
		}
		if string(want) != got {
			t.Errorf("%s: graph hash %s, golden %s (if intended, go test ./model -update)", cfg.Name, strings.TrimSpace(got), strings.TrimSpace(string(want)))
		}
	}
}

// TestModelDOT renders every config (gpt2's forward graph has hundreds of
// nodes and thousands of edges) and reads the DOT back.
func TestModelDOT(t *testing.T) {
	for _, cfg := range Configs() {
		g := mustBuild(t, cfg)
		start := time.Now()
		text, err := graph.WriteDOT(g)
		if err != nil {
			t.Fatalf("%s: %v", cfg.Name, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: WriteDOT took %v", cfg.Name, d)
		}
		gv, err := gographviz.Read([]byte(text))
		if err != nil {
			t.Fatalf("%s: gographviz cannot read the DOT: %v", cfg.Name, err)
		}
		want := len(g.Inputs) + len(g.Params) + len(g.Consts) + len(g.Nodes) + len(g.Outputs)
		if len(gv.Nodes.Nodes) != want {
			t.Errorf("%s: DOT has %d nodes, want %d", cfg.Name, len(gv.Nodes.Nodes), want)
		}
	}
}

func TestModelFLOPs(t *testing.T) {
	tiny, _ := Lookup("tiny")
	// Per layer: q, k, v, o projections 2·64·64 each, MLP 3·2·64·128, attention
	// scores and weighted sum 2·2·32·64; plus the lm_head 2·64·256.
	want := int64(2*(4*2*64*64+3*2*64*128+2*2*32*64) + 2*64*256)
	if got := tiny.FLOPsPerToken(); got != want {
		t.Errorf("tiny FLOPsPerToken %d, want %d", got, want)
	}
}
