package graph

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// randomGraph builds a random valid graph: a mix of elementwise, matmul,
// shape and reduction ops over float and int values, with literal constants
// holding awkward numbers and names that need quoting.
func randomGraph(seed uint64) (*Graph, error) {
	r := rand.New(rand.NewPCG(seed, 1))
	b := NewBuilder("random " + string(rune('a'+seed%26)))
	dt := []DType{Float32, Float64}[r.IntN(2)]
	n := 2 + r.IntN(3)
	x := b.Input("x", dt, 2, n, 4)
	names := []string{"w", "layer.0/w", "odd name", "-neg", "q\"uote"}
	w := b.Param(names[r.IntN(len(names))], dt, Shape{4, 4}, Normal(0.02, int(seed)))
	awkward := []float64{0, -0.0, 1, -1, 0.1, 1e-30, 5e-324, math.MaxFloat64, math.Inf(1), math.Inf(-1), math.NaN(), 1.0 / 3}
	lit := make([]float64, 4)
	for i := range lit {
		lit[i] = awkward[r.IntN(len(awkward))]
	}
	c := b.Const("c", dt, Shape{4}, Literal(lit...))
	vals := []*Value{x}
	for range 3 + r.IntN(12) {
		v := vals[r.IntN(len(vals))]
		var out *Value
		switch r.IntN(9) {
		case 0:
			out = b.MatMul(v, w)
		case 1:
			out = b.Add(v, c)
		case 2:
			out = b.Mul(v, b.Scalar(dt, r.Float64()))
		case 3:
			out = b.Softmax(v, int64(-1-r.IntN(2)))
		case 4:
			out = b.Transpose(b.Transpose(v, 0, 2, 1), 0, 2, 1)
		case 5:
			out = b.Reshape(b.Reshape(v, 2, -1), 2, n, 4)
		case 6:
			out = b.Op("Sigmoid", nil, v)
		case 7:
			out = b.Op("Concat", Attrs{"axis": Int(1)}, v, v)
			out = b.Slice(out, 1, 0, n)
		case 8:
			out = b.ReduceMean(v, true, -1)
			out = b.Op("Expand", nil, out, b.Ints(2, n, 4))
		}
		vals = append(vals, out)
	}
	y := vals[len(vals)-1]
	fa := b.OpN("FlashAttention", Attrs{"scale": Float(r.Float64()), "causal": Int(int64(r.IntN(2)))}, y, y, y)
	b.Output(y, fa[1])
	return b.Build()
}

func TestFormatParseRoundTripRandom(t *testing.T) {
	for seed := range uint64(300) {
		g, err := randomGraph(seed)
		if err != nil {
			t.Fatalf("seed %d: build: %v", seed, err)
		}
		text := Format(g)
		g2, err := Parse(text)
		if err != nil {
			t.Fatalf("seed %d: parse: %v\n%s", seed, err, text)
		}
		if got := Format(g2); got != text {
			t.Fatalf("seed %d: round trip differs:\n--- first\n%s--- second\n%s", seed, text, got)
		}
		if g.Hash() != g2.Hash() {
			t.Fatalf("seed %d: hash differs", seed)
		}
		if got := Format(g.Clone()); got != text {
			t.Fatalf("seed %d: Clone changes the text", seed)
		}
	}
}

func TestFormatIsDeterministic(t *testing.T) {
	a, _ := randomGraph(7)
	b, _ := randomGraph(7)
	if Format(a) != Format(b) {
		t.Fatal("same builder calls gave different text")
	}
}

func TestParseErrorsNameLineAndProblem(t *testing.T) {
	good, err := randomGraph(3)
	if err != nil {
		t.Fatal(err)
	}
	valid := Format(good)
	lines := strings.Split(valid, "\n")
	replaceLine := func(i int, s string) string {
		l := append([]string{}, lines...)
		l[i] = s
		return strings.Join(l, "\n")
	}
	cases := []struct{ name, text, want string }{
		{"empty", "", "line 1: empty file"},
		{"no header", "graph g\n", "line 1: not a flashgraph graph"},
		{"unknown statement", replaceLine(1, "grph g"), `line 2: unknown statement "grph"`},
		{"bad dtype", "flashgraph 1\ngraph g\ninput x: float33[2]\n", `line 3: unknown dtype "float33"`},
		{"bad dim", "flashgraph 1\ngraph g\ninput x: float32[2,a]\n", `line 3: want an integer, got "a"`},
		{"undefined input", "flashgraph 1\ngraph g\ninput x: float32[2]\nnode n = Neg(y) -> n: float32[2]\n", "line 4: node n: input y is not defined"},
		{"unknown op", "flashgraph 1\ngraph g\ninput x: float32[2]\nnode n = Frobnicate(x) -> n: float32[2]\n", `line 4: unknown op "Frobnicate"`},
		{"wrong type", "flashgraph 1\ngraph g\ninput x: float32[2]\nnode n = Neg(x) -> n: float32[3]\n", "line 4: node n: output n declared float32[3], but Neg gives float32[2]"},
		{"arity", "flashgraph 1\ngraph g\ninput x: float32[2]\nnode n = Add(x) -> n: float32[2]\n", "line 4: node n: Add takes 2 inputs, got 1"},
		{"bad attr", "flashgraph 1\ngraph g\ninput x: float32[2]\nnode n = Softmax(x) {axis=x} -> n: float32[2]\n", `line 4: want an integer, got "x"`},
		{"unknown attr", "flashgraph 1\ngraph g\ninput x: float32[2]\nnode n = Softmax(x) {axes=1} -> n: float32[2]\n", `line 4: Softmax has no attribute "axes"`},
		{"shape mismatch", "flashgraph 1\ngraph g\ninput x: float32[2]\ninput y: float32[3]\nnode n = Add(x, y) -> n: float32[2]\n", "line 5: node n: Add: shapes [[2] [3]] do not broadcast"},
		{"duplicate", "flashgraph 1\ngraph g\ninput x: float32[2]\ninput x: float32[2]\n", "line 4: value x defined twice"},
		{"literal count", "flashgraph 1\ngraph g\nconst c: float32[2] = literal(1)\n", "line 3: const c: literal has 1 values"},
		{"no outputs", "flashgraph 1\ngraph g\ninput x: float32[2]\n", "graph has no outputs"},
		{"unterminated", "flashgraph 1\ngraph \"g\n", "line 2: unterminated string"},
		{"trailing", "flashgraph 1\ngraph g\ninput x: float32[2] extra\n", `line 3: unexpected "extra" at end of line`},
		{"missing output decl", "flashgraph 1\ngraph g\ninput x: float32[2,2,2]\nnode f = flashgraph.FlashAttention(x, x, x) {scale=1.0} -> f#0: float32[2,2,2]\n", "FlashAttention has 2 outputs"},
	}
	for _, c := range cases {
		_, err := ParseFile("", c.text)
		if err == nil {
			t.Errorf("%s: parsed without error", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not contain %q", c.name, err, c.want)
		}
	}
	if _, err := ParseFile("m.graph", "nonsense"); err == nil || !strings.HasPrefix(err.Error(), "m.graph:1: ") {
		t.Errorf("error does not name the file and line: %v", err)
	}
}

// The golden files are fuzz seeds and format references.
func TestGoldenText(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		g, err := randomGraph(seed)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "random"+string(rune('0'+seed))+".graph")
		text := Format(g)
		if *update {
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./graph -update)", err)
		}
		if string(want) != text {
			t.Errorf("%s differs from the built graph (review, then go test ./graph -update)", path)
		}
	}
}

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.graph")
	for _, p := range files {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(string(data))
		}
	}
	f.Add("flashgraph 1\ngraph g\ninput x: float32[2]\nnode n = Neg(x) -> n: float32[2]\noutput n\n")
	f.Fuzz(func(t *testing.T, text string) {
		g, err := Parse(text)
		if err != nil {
			return
		}
		// Whatever parses must round-trip exactly.
		out := Format(g)
		g2, err := Parse(out)
		if err != nil {
			t.Fatalf("formatted graph does not parse: %v\n%s", err, out)
		}
		if Format(g2) != out {
			t.Fatalf("round trip differs")
		}
	})
}

func TestOptionalInputsMayBeOmitted(t *testing.T) {
	b := NewBuilder("gemm")
	a := b.Input("a", Float32, 2, 3)
	w := b.Input("w", Float32, 3, 4)
	y := b.Op("Gemm", nil, a, w)
	b.Output(y)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Nodes[0].Outputs[0].Type.String(); got != "float32[2,4]" {
		t.Fatalf("Gemm without C: %s", got)
	}
}

// Dims whose product overflows must be refused, not materialised (a
// causal_mask of [2^40, 2^40] once looped "forever" inside Parse).
func TestHugeShapesAreRefused(t *testing.T) {
	text := "flashgraph 1\ngraph g\nconst m: float32[1099511627776,1099511627776] = causal_mask()\ninput x: float32[2]\nnode n = Neg(x) -> n: float32[2]\noutput n\n"
	_, err := Parse(text)
	if err == nil || !strings.Contains(err.Error(), "line 3: shape [1099511627776,1099511627776] has more than 2^48 elements") {
		t.Fatalf("got %v", err)
	}
}

// An unnamed graph (no graph statement, or NewBuilder("")) round-trips: its
// name is written as "" (the fuzzer found "graph " that did not parse back).
func TestUnnamedGraphRoundTrips(t *testing.T) {
	b := NewBuilder("")
	b.Output(b.Neg(b.Input("x", Float32, 2)))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	text := Format(g)
	if !strings.Contains(text, "\ngraph \"\"\n") {
		t.Fatalf("unnamed graph written as:\n%s", text)
	}
	g2, err := Parse(text)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if g2.Name != "" || Format(g2) != text {
		t.Fatalf("round trip gave %q:\n%s", g2.Name, Format(g2))
	}
	noStatement := "flashgraph 1\ninput x: float32[2]\nnode n = Neg(x) -> n: float32[2]\noutput n\n"
	g3, err := Parse(noStatement)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(Format(g3)); err != nil {
		t.Fatalf("graph without a graph statement does not round-trip: %v", err)
	}
}

func TestTruncatedLinesSayEndOfLine(t *testing.T) {
	for _, text := range []string{
		"flashgraph 1\ngraph g\ninput x: float32[2]\nnode n = Neg(x) -> n:",
		"flashgraph 1\ngraph g\ninput x: float32[2]\nnode n = Neg(x,",
		"flashgraph 1\ngraph g\ninput",
	} {
		_, err := Parse(text)
		if err == nil || !strings.Contains(err.Error(), "got end of line") {
			t.Errorf("%q: %v", text, err)
		}
	}
}
