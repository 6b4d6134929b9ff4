package graph

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/awalterschulze/gographviz"
)

// update rewrites golden files in package graph (DOT here, text in
// text_test.go): go test ./graph -update.
var update = flag.Bool("update", false, "rewrite golden files")

// dotAttentionGraph is a small model of what DOT is for: attention blocks
// written out as exporters emit them (fused=false), or with FlashAttention in
// their place (fused=true), between a param projection and the output. A
// const with a quote and a backslash in its name checks escaping.
func dotAttentionGraph(t testing.TB, layers int, fused bool) *Graph {
	t.Helper()
	const B, H, S, D = 1, 2, 4, 8
	b := NewBuilder("attention")
	x := b.Input("x", Float32, B, S, H*D)
	mask := b.Const("causal_mask", Float32, Shape{S, S}, CausalMask())
	odd := b.Const(`odd "name"\x`, Float32, Shape{H * D}, Fill(0.5))
	for i := range layers {
		b.Push(fmt.Sprintf("layers.%d", i))
		w := b.Param(fmt.Sprintf("layers.%d.wqkv", i), Float32, Shape{H * D, 3 * H * D}, Normal(0.02, i+1))
		qkv := b.MatMul(x, w)
		heads := func(k int) *Value {
			part := b.Slice(qkv, -1, k*H*D, (k+1)*H*D)
			return b.Transpose(b.Reshape(part, B, S, H, D), 0, 2, 1, 3)
		}
		q, k, v := heads(0), heads(1), heads(2)
		b.Rename(q, fmt.Sprintf("layers.%d/q", i))
		var o *Value
		if fused {
			o = b.OpN("FlashAttention", Attrs{"causal": Int(1), "scale": Float(0.25)}, q, k, v)[0]
		} else {
			s := b.MatMul(q, b.Transpose(k, 0, 1, 3, 2))
			s = b.Add(b.Mul(s, b.Scalar(Float32, 0.25)), mask)
			o = b.MatMul(b.Softmax(s, -1), v)
		}
		o = b.Reshape(b.Transpose(o, 0, 2, 1, 3), B, S, H*D)
		x = b.Add(x, b.Mul(o, odd))
		b.Pop()
	}
	b.Output(b.Rename(x, "y"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if fused { // a fusion pass leaves the mask unused and dead-code elimination drops it
		g.Consts = g.Consts[1:]
	}
	return g
}

func mustDOT(t testing.TB, g *Graph) string {
	t.Helper()
	s, err := WriteDOT(g)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustDOTPair(t testing.TB, a, b *Graph) string {
	t.Helper()
	s, err := WriteDOTPair(a, b, "before", "after fuse_attention")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDOTGolden(t *testing.T) {
	unfused, fused := dotAttentionGraph(t, 1, false), dotAttentionGraph(t, 1, true)
	for name, text := range map[string]string{
		"attention.dot":       mustDOT(t, unfused),
		"attention_fused.dot": mustDOT(t, fused),
		"attention_pair.dot":  mustDOTPair(t, unfused, fused),
	} {
		path := filepath.Join("testdata", name)
		if *update {
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./graph -run DOT -update)", err)
		}
		if string(want) != text {
			t.Errorf("%s differs from WriteDOT's output (review, then go test ./graph -run DOT -update)", path)
		}
	}
}

// TestDOTParses reads the output back with gographviz and checks it holds
// one node per value source and sink and one edge per use.
func TestDOTParses(t *testing.T) {
	for _, fused := range []bool{false, true} {
		g := dotAttentionGraph(t, 2, fused)
		gv, err := gographviz.Read([]byte(mustDOT(t, g)))
		if err != nil {
			t.Fatalf("fused=%v: gographviz cannot read the DOT: %v", fused, err)
		}
		nodes, edges := dotCounts(g)
		if len(gv.Nodes.Nodes) != nodes || len(gv.Edges.Edges) != edges {
			t.Errorf("fused=%v: %d nodes, %d edges; want %d, %d", fused, len(gv.Nodes.Nodes), len(gv.Edges.Edges), nodes, edges)
		}
		p := gv.Nodes.Lookup["p0"]
		if p == nil || p.Attrs["shape"] != "box" || p.Attrs["style"] != "filled" || p.Attrs["fillcolor"] == "" {
			t.Errorf("param node is not a filled box: %v", p)
		}
		for _, id := range []string{"i0", "c0"} {
			if n := gv.Nodes.Lookup[id]; n == nil || n.Attrs["shape"] == "box" || n.Attrs["fillcolor"] == p.Attrs["fillcolor"] {
				t.Errorf("%s looks like a param: %v", id, n)
			}
		}
		var flash int
		for k, n := range g.Nodes {
			a := gv.Nodes.Lookup["n"+fmt.Sprint(k)].Attrs
			if !strings.HasPrefix(a["label"], `"`+n.Spec().QualifiedName()+`\n`) {
				t.Errorf("node %s label %s does not start with its op", n.Name, a["label"])
			}
			if !strings.Contains(a["label"], n.Outputs[0].Type.String()) {
				t.Errorf("node %s label %s lacks its output type", n.Name, a["label"])
			}
			if n.Op == "FlashAttention" {
				flash++
				if !strings.HasPrefix(a["label"], `"flashgraph.FlashAttention`) || a["fillcolor"] != "orange" {
					t.Errorf("FlashAttention node not highlighted: %v", a)
				}
			}
		}
		if want := map[bool]int{false: 0, true: 2}[fused]; flash != want {
			t.Errorf("fused=%v: %d FlashAttention nodes", fused, flash)
		}
	}
	// Escaped names read back as written.
	gv, err := gographviz.Read([]byte(mustDOT(t, dotAttentionGraph(t, 1, false))))
	if err != nil {
		t.Fatal(err)
	}
	if l := gv.Nodes.Lookup["c1"].Attrs["label"]; !strings.HasPrefix(l, `"odd \"name\"\\x\n`) {
		t.Errorf("odd const label %s", l)
	}
}

// dotCounts is what WriteDOT must draw: a node per input, param, const, op
// node and graph output; an edge per (non-omitted) input of a node and per
// graph output.
func dotCounts(g *Graph) (nodes, edges int) {
	nodes = len(g.Inputs) + len(g.Params) + len(g.Consts) + len(g.Nodes) + len(g.Outputs)
	edges = len(g.Outputs)
	for _, n := range g.Nodes {
		for _, v := range n.Inputs {
			if v != nil {
				edges++
			}
		}
	}
	return nodes, edges
}

func TestDOTPairParses(t *testing.T) {
	a, b := dotAttentionGraph(t, 2, false), dotAttentionGraph(t, 2, true)
	gv, err := gographviz.Read([]byte(mustDOTPair(t, a, b)))
	if err != nil {
		t.Fatalf("gographviz cannot read the pair: %v", err)
	}
	na, ea := dotCounts(a)
	nb, eb := dotCounts(b)
	if len(gv.Nodes.Nodes) != na+nb || len(gv.Edges.Edges) != ea+eb {
		t.Errorf("%d nodes, %d edges; want %d, %d", len(gv.Nodes.Nodes), len(gv.Edges.Edges), na+nb, ea+eb)
	}
	for cluster, want := range map[string]int{"cluster_before": na, "cluster_after": nb} {
		if !gv.IsSubGraph(cluster) {
			t.Fatalf("no subgraph %s", cluster)
		}
		if got := len(gv.Relations.ParentToChildren[cluster]); got != want {
			t.Errorf("%s holds %d nodes, want %d", cluster, got, want)
		}
	}
	if gv.Relations.ParentToChildren["cluster_before"]["before_n0"] != true || gv.Relations.ParentToChildren["cluster_after"]["after_n0"] != true {
		t.Error("node IDs are not prefixed by their cluster")
	}
}

func TestDOTErrors(t *testing.T) {
	if _, err := WriteDOT(nil); err == nil {
		t.Error("WriteDOT(nil) succeeded")
	}
	if _, err := WriteDOTPair(nil, &Graph{}, "a", "b"); err == nil {
		t.Error("WriteDOTPair(nil, ...) succeeded")
	}
	stray := &Value{Name: "stray", Type: TensorType{Float32, Shape{2}}}
	n, err := NewNode("neg", "Neg", nil, stray)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteDOT(&Graph{Name: "bad", Nodes: []*Node{n}}); err == nil || !strings.Contains(err.Error(), "stray") {
		t.Errorf("undefined input: error %v should name it", err)
	}
}

// TestDOTDeterministic repeats the rendering: Go randomises map iteration on
// every range, so any map order leaking into the text would show here.
func TestDOTDeterministic(t *testing.T) {
	a, b := dotAttentionGraph(t, 3, false), dotAttentionGraph(t, 3, true)
	first, firstPair := mustDOT(t, a), mustDOTPair(t, a, b)
	for range 20 {
		if mustDOT(t, a) != first || mustDOTPair(t, a, b) != firstPair {
			t.Fatal("WriteDOT output differs between calls")
		}
	}
	if mustDOT(t, dotAttentionGraph(t, 3, false)) != first {
		t.Fatal("WriteDOT output differs between two builds of the same graph")
	}
}

const dotChildEnv = "FLASHGRAPH_DOT_HASH_CHILD"

// dotHash is the sha256 of the DOT of a fixed graph and pair.
func dotHash(t testing.TB) string {
	a, b := dotAttentionGraph(t, 4, false), dotAttentionGraph(t, 4, true)
	sum := sha256.Sum256([]byte(mustDOT(t, a) + mustDOTPair(t, a, b)))
	return hex.EncodeToString(sum[:])
}

// TestDOTHashChild only runs as the subprocess of TestDOTAcrossProcesses.
func TestDOTHashChild(t *testing.T) {
	if os.Getenv(dotChildEnv) != "1" {
		t.Skip("runs as a subprocess of TestDOTAcrossProcesses")
	}
	fmt.Printf("dothash=%s\n", dotHash(t))
}

// TestDOTAcrossProcesses compares the output of two fresh processes (fresh
// map seeds, fresh allocation addresses) with this one's.
func TestDOTAcrossProcesses(t *testing.T) {
	if os.Getenv(dotChildEnv) == "1" {
		t.Skip("already the child")
	}
	want := dotHash(t)
	for i := range 2 {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestDOTHashChild$", "-test.count", "1")
		cmd.Env = append(os.Environ(), dotChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, out)
		}
		_, after, ok := strings.Cut(string(out), "dothash=")
		if !ok {
			t.Fatalf("child %d printed no hash:\n%s", i, out)
		}
		if got := strings.Fields(after)[0]; got != want {
			t.Errorf("child %d: DOT hash %s, this process %s", i, got, want)
		}
	}
}

// TestDOTLarge checks a graph the size of gpt2's training graph (thousands
// of nodes) renders in well under a second and still parses.
func TestDOTLarge(t *testing.T) {
	g := dotAttentionGraph(t, 200, false)
	if len(g.Nodes) < 3000 {
		t.Fatalf("only %d nodes", len(g.Nodes))
	}
	start := time.Now()
	text := mustDOT(t, g)
	pair := mustDOTPair(t, g, g)
	if d := time.Since(start); d > time.Second {
		t.Errorf("WriteDOT + WriteDOTPair of %d nodes took %v", len(g.Nodes), d)
	}
	gv, err := gographviz.Read([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	nodes, edges := dotCounts(g)
	if len(gv.Nodes.Nodes) != nodes || len(gv.Edges.Edges) != edges {
		t.Errorf("%d nodes, %d edges; want %d, %d", len(gv.Nodes.Nodes), len(gv.Edges.Edges), nodes, edges)
	}
	if !strings.Contains(pair, "after_n2999 ") {
		t.Error("pair lacks the last node of the second graph")
	}
}
