package onnx

import (
	"bytes"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
	"github.com/flashgraph/flashgraph/passes"
)

func init() {
	// Guarded: another test file of the package may define -update too.
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files under testdata/")
	}
}

func updating() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// GPT2TrilFixture is testdata/byom/gpt2_tril.onnx: a one-layer GPT-2-like
// language model written the way torch.onnx exports HF GPT-2. Its causal
// mask is a registered float buffer ("attn.bias", tril of ones over 2·S
// positions) sliced to the sequence and cast to bool for a Where
// condition, and its positions come from a float buffer cast to int64 for
// the position table's Gather. Both are finite, of moderate magnitude and
// more than one element: by their values alone they look like weights.
const (
	fxB, fxS, fxMax, fxE, fxV = 2, 8, 16, 16, 256
)

func gpt2TrilModel() *onnxpb.Model {
	rng := rand.New(rand.NewPCG(29, 1))
	w := func(name string, dims ...int64) *onnxpb.Tensor {
		n := int64(1)
		for _, d := range dims {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 0.2)
		}
		return onnxpb.NewFloat32(name, dims, v)
	}
	tril := make([]float32, fxMax*fxMax)
	for i := range fxMax {
		for j := 0; j <= i; j++ {
			tril[i*fxMax+j] = 1
		}
	}
	pos := make([]float32, fxMax)
	for i := range pos {
		pos[i] = float32(i)
	}
	ints := func(name string, v ...int64) *onnxpb.Tensor { return onnxpb.NewInt64(name, []int64{int64(len(v))}, v) }
	inits := []*onnxpb.Tensor{
		w("wte", fxV, fxE), w("wpe", fxMax, fxE),
		w("attn.q", fxE, fxE), w("attn.k", fxE, fxE), w("attn.v", fxE, fxE), w("attn.o", fxE, fxE),
		w("lm_head", fxE, fxV),
		onnxpb.NewFloat32("attn.bias", []int64{1, 1, fxMax, fxMax}, tril),
		onnxpb.NewFloat32("position_ids_buffer", []int64{fxMax}, pos),
		onnxpb.NewFloat32("scale", nil, []float32{float32(1 / math.Sqrt(fxE))}),
		onnxpb.NewFloat32("mask_value", nil, []float32{-math.MaxFloat32}),
		ints("zero", 0), ints("seq", fxS), ints("zero2", 0, 0), ints("seq2", fxS, fxS), ints("axes23", 2, 3),
		ints("heads_shape", fxB, fxS, 1, fxE), ints("flat_shape", fxB, fxS, fxE),
	}
	nodes := []*onnxpb.Node{
		nd("Slice", []string{"position_ids_buffer", "zero", "seq"}, []string{"pos_f"}),
		nd("Cast", []string{"pos_f"}, []string{"pos"}, aInt("to", int64(onnxpb.Int64))),
		nd("Gather", []string{"wte", "input_ids"}, []string{"tok_emb"}),
		nd("Gather", []string{"wpe", "pos"}, []string{"pos_emb"}),
		nd("Add", []string{"tok_emb", "pos_emb"}, []string{"h"}),
	}
	for _, p := range []string{"q", "k", "v"} {
		nodes = append(nodes,
			nd("MatMul", []string{"h", "attn." + p}, []string{p + "_flat"}),
			nd("Reshape", []string{p + "_flat", "heads_shape"}, []string{p + "_bshd"}),
		)
	}
	nodes = append(nodes,
		nd("Transpose", []string{"q_bshd"}, []string{"q4"}, aInts("perm", 0, 2, 1, 3)),
		nd("Transpose", []string{"k_bshd"}, []string{"kT"}, aInts("perm", 0, 2, 3, 1)),
		nd("Transpose", []string{"v_bshd"}, []string{"v4"}, aInts("perm", 0, 2, 1, 3)),
		nd("MatMul", []string{"q4", "kT"}, []string{"qk"}),
		nd("Mul", []string{"qk", "scale"}, []string{"scores"}),
		nd("Slice", []string{"attn.bias", "zero2", "seq2", "axes23"}, []string{"bias_s"}),
		nd("Cast", []string{"bias_s"}, []string{"causal"}, aInt("to", int64(onnxpb.Bool))),
		nd("Where", []string{"causal", "scores", "mask_value"}, []string{"masked"}),
		nd("Softmax", []string{"masked"}, []string{"probs"}, aInt("axis", -1)),
		nd("MatMul", []string{"probs", "v4"}, []string{"ctx4"}),
		nd("Transpose", []string{"ctx4"}, []string{"ctx_bshd"}, aInts("perm", 0, 2, 1, 3)),
		nd("Reshape", []string{"ctx_bshd", "flat_shape"}, []string{"ctx"}),
		nd("MatMul", []string{"ctx", "attn.o"}, []string{"attn_out"}),
		nd("Add", []string{"h", "attn_out"}, []string{"resid"}),
		nd("MatMul", []string{"resid", "lm_head"}, []string{"logits"}),
	)
	m := modelOf(17, []*onnxpb.ValueInfo{vi("input_ids", onnxpb.Int64, fxB, fxS)}, inits, []string{"logits"}, nodes...)
	m.ProducerName = "pytorch"
	m.Graph.Name = "gpt2_tril"
	return m
}

// TestGPT2TrilFixture keeps testdata/byom/gpt2_tril.onnx equal to the model
// above (-update rewrites it); other packages' tests train it.
func TestGPT2TrilFixture(t *testing.T) {
	b := onnxpb.Encode(gpt2TrilModel())
	path := filepath.Join("testdata", "byom", "gpt2_tril.onnx")
	if updating() {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./onnx -run TestGPT2TrilFixture -update)", err)
	}
	if !bytes.Equal(got, b) {
		t.Fatalf("%s is stale: run go test ./onnx -run TestGPT2TrilFixture -update", path)
	}
}

// An initializer no gradient can reach is a const, and the attention whose
// mask it is fuses.
func TestUnreachableInitializersAreConsts(t *testing.T) {
	g, err := ImportBytes(onnxpb.Encode(gpt2TrilModel()))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]graph.ValueKind{}
	for _, v := range g.Initializers() {
		kinds[v.Name] = v.Kind
	}
	for _, name := range []string{"wte", "wpe", "attn.q", "attn.k", "attn.v", "attn.o", "lm_head"} {
		if kinds[name] != graph.Param {
			t.Errorf("%s is %v, want param", name, kinds[name])
		}
	}
	for _, name := range []string{"attn.bias", "position_ids_buffer"} {
		if kinds[name] != graph.Const {
			t.Errorf("%s is %v, want const (no gradient reaches it)", name, kinds[name])
		}
	}
	if len(g.Params) != 7 {
		t.Errorf("%d params, want 7", len(g.Params))
	}
	fused, err := passes.Default(true).Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	xs, err := passes.Explain(g)
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) != 1 || !xs[0].Fused {
		t.Fatalf("attention not fused: %v", xs)
	}
	if c := fused.CountOps(); c["FlashAttention"] != 1 || c["Softmax"] != 0 {
		t.Fatalf("fused graph: %v", c)
	}
	// Fused and unfused compute the same logits.
	rng := rand.New(rand.NewPCG(1, 2))
	ids := graph.NewTensor(graph.Int64, graph.Shape{fxB, fxS})
	for i := range ids.I64 {
		ids.I64[i] = int64(rng.IntN(fxV))
	}
	feeds := map[string]*graph.Tensor{"input_ids": ids}
	a, b := runGraph(t, g, feeds)["logits"], runGraph(t, fused, feeds)["logits"]
	for i := range a.Len() {
		if d := math.Abs(a.At(i) - b.At(i)); d > 1e-5+1e-5*math.Abs(a.At(i)) {
			t.Fatalf("logit %d: unfused %v, fused %v", i, a.At(i), b.At(i))
		}
	}
}

// Our own export says which initializers are params; import keeps it so even
// for a param no gradient reaches.
func TestFaithfulImportKeepsParams(t *testing.T) {
	b := graph.NewBuilder("keep")
	x := b.Input("x", graph.Float32, 2, 3)
	p := b.Param("p", graph.Float32, graph.Shape{3}, graph.Ones())
	c := b.Op("Cast", graph.Attrs{"to": graph.Str("int64")}, p)
	b.Output(b.Add(x, b.Op("Cast", graph.Attrs{"to": graph.Str("float32")}, c)))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	data, err := ExportBytes(g)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ImportBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	if graph.Format(back) != graph.Format(g) || len(back.Params) != 1 {
		t.Fatalf("faithful import changed the graph:\n%s", strings.TrimSpace(graph.Format(back)))
	}
}
