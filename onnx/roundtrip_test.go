package onnx

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// roundTrip exports g, decodes the bytes, imports them, and requires the
// canonical text to come back byte for byte.
func roundTrip(t *testing.T, g *graph.Graph) *onnxpb.Model {
	t.Helper()
	b, err := ExportBytes(g)
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	m, err := onnxpb.Decode(b)
	if err != nil {
		t.Fatalf("decode our export: %v", err)
	}
	back, err := ImportBytes(b)
	if err != nil {
		t.Fatalf("import our export: %v", err)
	}
	want, got := graph.Format(g), graph.Format(back)
	if got != want {
		wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
		for i := range min(len(wl), len(gl)) {
			if wl[i] != gl[i] {
				t.Fatalf("round trip changed line %d:\n got %.300s\nwant %.300s", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("round trip changed the line count: %d, want %d", len(gl), len(wl))
	}
	if g.Hash() != back.Hash() {
		t.Fatal("hashes differ")
	}
	return m
}

func TestRoundTripModel(t *testing.T) {
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := roundTrip(t, g)
	if v, _ := m.Opset(""); v != exportOpset || m.IRVersion != exportIRVersion || m.ProducerName != Producer {
		t.Fatalf("model header: opset %d, ir %d, producer %q", v, m.IRVersion, m.ProducerName)
	}
	// Params carry their recipes (normal, ones), so the export reads back
	// without a literal in sight.
	kinds := map[string]int{}
	for _, in := range m.Graph.Initializer {
		kinds[meta(in.MetadataProps, metaKind)]++
	}
	if kinds["param"] != len(g.Params) || kinds["const"] != len(g.Consts) {
		t.Fatalf("initializer kinds %v, graph has %d params, %d consts", kinds, len(g.Params), len(g.Consts))
	}
}

// Our own ops in our domain, with float hyper-parameters float32 cannot hold
// (AdamW), int lists (GatherGrad's shape) and several outputs.
func TestRoundTripOurOps(t *testing.T) {
	b := graph.NewBuilder("ours")
	emb := b.Param("emb", graph.Float32, graph.Shape{10, 4}, graph.Normal(0.02, 3))
	tok := b.Input("tok", graph.Int64, 2, 3)
	dy := b.Input("dy", graph.Float32, 2, 3, 4)
	g := b.Op("GatherGrad", graph.Attrs{"axis": graph.Int(0), "shape": graph.Ints(10, 4)}, dy, tok)
	m := b.Const("m", graph.Float32, graph.Shape{10, 4}, graph.Zeros())
	v := b.Const("v", graph.Float32, graph.Shape{10, 4}, graph.Zeros())
	lr := b.Input("lr", graph.Float32)
	step := b.Input("step", graph.Float32)
	upd := b.OpN("AdamW", graph.Attrs{"beta1": graph.Float(0.9), "beta2": graph.Float(0.95), "eps": graph.Float(1e-8), "weight_decay": graph.Float(0.1)}, emb, g, m, v, lr, step)
	q := b.Input("q", graph.Float32, 2, 5, 4)
	fa := b.OpN("FlashAttention", graph.Attrs{"scale": graph.Float(0.5)}, q, q, q)
	dq := b.OpN("FlashAttentionGrad", graph.Attrs{"scale": graph.Float(0.5)}, q, q, q, fa[0], fa[1], fa[0])
	sm := b.Softmax(q, -1)
	sg := b.Op("SoftmaxGrad", graph.Attrs{"axis": graph.Int(-1)}, sm, dq[0])
	b.Output(upd[0], upd[1], upd[2], sg, dq[1], dq[2])
	gr, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	pm := roundTrip(t, gr)
	ours := map[string]bool{}
	for _, n := range pm.Graph.Node {
		if n.Domain == graph.DomainFlashgraph {
			ours[n.OpType] = true
		}
	}
	// 3-D FlashAttention has no standard equivalent: it stays ours.
	for _, op := range []string{"AdamW", "GatherGrad", "FlashAttention", "FlashAttentionGrad", "SoftmaxGrad"} {
		if !ours[op] {
			t.Errorf("%s not exported in our domain (have %v)", op, ours)
		}
	}
}

// The graph package's random graphs have odd names, NaN and ±inf literals,
// values float32 cannot hold, and FlashAttention nodes.
func TestRoundTripRandomGraphs(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "graph", "testdata", "*.graph"))
	if len(files) == 0 {
		t.Skip("no graph/testdata")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			g, err := graph.Parse(string(text))
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, g)
		})
	}
}

// Every fixture, once imported, survives export and import unchanged.
func TestRoundTripFixtures(t *testing.T) {
	for _, path := range fixtures(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			g, err := Import(path)
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, g)
		})
	}
}

// attentionGraph builds Q, K, V [2,3,5,4] → FlashAttention; withLSE also makes
// the logsumexp a graph output.
func attentionGraph(t *testing.T, withLSE bool, scale float64) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("attn")
	q := b.Input("q", graph.Float32, 2, 3, 5, 4)
	k := b.Input("k", graph.Float32, 2, 3, 5, 4)
	v := b.Input("v", graph.Float32, 2, 3, 5, 4)
	outs := b.OpN("FlashAttention", graph.Attrs{"causal": graph.Int(1), "scale": graph.Float(scale)}, q, k, v)
	y := b.Mul(outs[0], b.Scalar(graph.Float32, 0.1)) // 0.1 is not a float32: the recipe keeps it
	b.Output(y)
	if withLSE {
		b.Output(outs[1])
	}
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestExportAttention(t *testing.T) {
	scale := 1 / math.Sqrt(3) // not a float32: travels exactly in metadata
	m := roundTrip(t, attentionGraph(t, false, scale))
	if v, _ := m.Opset(""); v != exportAttentionOpset {
		t.Fatalf("opset %d, want %d for Attention", v, exportAttentionOpset)
	}
	n := m.Graph.Node[0]
	if n.OpType != "Attention" || n.Domain != "" || len(n.Output) != 1 {
		t.Fatalf("FlashAttention exported as %s/%q with outputs %v", n.Domain, n.OpType, n.Output)
	}
	attrs := map[string]*onnxpb.Attribute{}
	for _, a := range n.Attribute {
		attrs[a.Name] = a
	}
	if attrs["is_causal"].I != 1 || attrs["scale"].F != float32(scale) || len(attrs) != 2 {
		t.Fatalf("attributes %+v", n.Attribute)
	}
	if _, ours := m.Opset(graph.DomainFlashgraph); ours {
		t.Fatal("flashgraph domain imported but unused")
	}

	// Grouped-query (K, V of 1 head for Q's 3): the standard op too, which
	// groups K/V heads as FlashAttention does; the round trip gives it back.
	b := graph.NewBuilder("gqa")
	q := b.Input("q", graph.Float32, 2, 3, 5, 4)
	k, v := b.Input("k", graph.Float32, 2, 1, 5, 4), b.Input("v", graph.Float32, 2, 1, 5, 4)
	b.Output(b.OpN("FlashAttention", graph.Attrs{"causal": graph.Int(1), "scale": graph.Float(0.5)}, q, k, v)[0])
	gqa, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if n := roundTrip(t, gqa).Graph.Node[0]; n.OpType != "Attention" {
		t.Fatalf("grouped-query FlashAttention exported as %q", n.OpType)
	}

	// With the logsumexp in use it stays our op.
	m = roundTrip(t, attentionGraph(t, true, 0.5))
	n = m.Graph.Node[0]
	if n.OpType != "FlashAttention" || n.Domain != graph.DomainFlashgraph || len(n.Output) != 2 {
		t.Fatalf("FlashAttention with LSE exported as %s/%q", n.Domain, n.OpType)
	}
	if v, ok := m.Opset(graph.DomainFlashgraph); !ok || v != ourOpsetVersion {
		t.Fatal("flashgraph domain not imported")
	}
}

// Narrow float types, bools, float64 and exactness of attribute values.
func TestRoundTripTypes(t *testing.T) {
	for _, dt := range []graph.DType{graph.Float32, graph.Float64, graph.Float16, graph.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			b := graph.NewBuilder("types")
			x := b.Input("x", dt, 3, 4)
			w := b.Param("w", dt, graph.Shape{4, 2}, graph.Normal(0.02, 7))
			c := b.Const("c", dt, graph.Shape{2}, graph.Literal(0.1, -3.3))
			mask := b.Const("mask", graph.Bool, graph.Shape{3, 2}, graph.Literal(1, 0, 0, 1, 1, 0))
			y := b.Add(b.MatMul(x, w), c)
			y = b.Op("Where", nil, mask, y, b.Scalar(dt, math.Inf(-1)))
			y = b.Op("Gemm", graph.Attrs{"alpha": graph.Float(1.0 / 3), "transB": graph.Int(0)}, y, b.Op("Cast", graph.Attrs{"to": graph.Str(dt.String())}, b.Transpose(y, 1, 0)), b.Scalar(dt, 0.7))
			b.Output(b.Softmax(y, -1), b.ReduceSum(y, true, 1))
			g, err := b.Build()
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, g)
		})
	}
}
