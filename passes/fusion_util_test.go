package passes

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// Helpers of the rewrite/fusion tests (prefixed fz so that they stay clear
// of the autodiff tests' helpers in this package).

func init() {
	// Guarded: another test file of the package may define -update too.
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files under testdata/")
	}
}

func fzUpdate() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// fzGolden compares got with testdata/name, or rewrites it with -update.
func fzGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if fzUpdate() {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./passes/ -run %s -update to create it)", err, t.Name())
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (rerun with -update and review the diff):\n--- got\n%s", path, got)
	}
}

// fzRun runs pipeline p with the verifier after every pass.
func fzRun(t *testing.T, p Pipeline, g *graph.Graph) (*graph.Graph, *Log) {
	t.Helper()
	p.Verify = true
	log := &Log{}
	out, err := p.Run(g, log)
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	return out, log
}

// fzFeeds makes random inputs: floats normal(0, 1), int64 in [0, 256)
// (token ids of the byte-level model), bools fair coins.
func fzFeeds(g *graph.Graph, seed uint64) map[string]*graph.Tensor {
	rng := rand.New(rand.NewPCG(seed, 7))
	feeds := map[string]*graph.Tensor{}
	for _, in := range g.Inputs {
		t := graph.NewTensor(in.Type.DType, in.Type.Shape)
		for i := range t.Len() {
			switch {
			case in.Type.DType.IsFloat():
				t.Set(i, rng.NormFloat64())
			case in.Type.DType == graph.Int64:
				t.Set(i, float64(rng.IntN(256)))
			default:
				t.Set(i, float64(rng.IntN(2)))
			}
		}
		feeds[in.Name] = t
	}
	return feeds
}

func fzCPU(t *testing.T, g *graph.Graph, feeds map[string]*graph.Tensor) map[string]*graph.Tensor {
	t.Helper()
	exe, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	out, err := exe.Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fzRelDiff is the norm-wise relative difference max|a−b| / max|ref|; NaN
// or a shape mismatch give +Inf.
func fzRelDiff(a, ref *graph.Tensor) float64 {
	if !a.Shape.Equal(ref.Shape) || a.DType != ref.DType {
		return math.Inf(1)
	}
	var diff, scale float64
	for i := range ref.Len() {
		x, y := a.At(i), ref.At(i)
		if math.IsNaN(x) != math.IsNaN(y) {
			return math.Inf(1)
		}
		if x == y || math.IsNaN(x) { // equal infinities; NaN in both
			continue
		}
		diff = max(diff, math.Abs(x-y))
		scale = max(scale, math.Abs(y))
	}
	if scale == 0 {
		return diff
	}
	return diff / scale
}

// fzTolerance is the tolerance of fused vs unfused results: 1e-10 for
// float64 (the fused kernel sums in another order, nothing else differs),
// 1e-5 for float32.
func fzTolerance(dt graph.DType) float64 {
	if dt == graph.Float64 {
		return 1e-10
	}
	return 1e-5
}

// fzSameOutputs runs both graphs on the same random inputs and requires
// every output to agree within the dtype's tolerance.
func fzSameOutputs(t *testing.T, unfused, fused *graph.Graph, dt graph.DType) {
	t.Helper()
	feeds := fzFeeds(unfused, 1)
	want := fzCPU(t, unfused, feeds)
	got := fzCPU(t, fused, feeds)
	if len(got) != len(want) {
		t.Fatalf("fused graph has %d outputs, unfused %d", len(got), len(want))
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Fatalf("fused graph lost output %s", name)
		}
		if d := fzRelDiff(g, w); !(d <= fzTolerance(dt)) {
			t.Errorf("output %s: fused and unfused differ by %.3g (relative), tolerance %g", name, d, fzTolerance(dt))
		}
	}
}

func fzCount(g *graph.Graph, op string) int { return g.CountOps()[op] }

// fzNodes returns the nodes of op in g.
func fzNodes(g *graph.Graph, op string) []*graph.Node {
	var out []*graph.Node
	for _, n := range g.Nodes {
		if n.Op == op {
			out = append(out, n)
		}
	}
	return out
}

// attnCase is one hand-written attention graph, in the spellings exporters
// and people use.
type attnCase struct {
	name string
	rank int // 4: [B,H,S,D]; 3: [BH,S,D]
	// scale: "mul" Mul(s, c), "cmul" Mul(c, s), "div" Div(s, √D),
	// "divsqrt" Div(s, Sqrt(D)), "q" Mul(q, c), "qdiv" Div(q, √D),
	// "k" Mul(k, c) before the transpose, "qk" D^-¼ on both Q and K,
	// "post" Mul after the mask, "none".
	scale string
	// k: "t" Transpose(k, last two swapped), "pre" an input laid out
	// [.., D, S], "bshd" Transpose([B,S,H,D], [0,2,3,1]) (GPT-2 export),
	// "tt" Transpose(Transpose(k_bshd, [0,2,1,3]), [0,1,3,2]).
	k string
	// mask: "recipe" graph.CausalMask, "inf" a literal, "1e4" literal
	// −1e4, "finfo" float32's lowest, "trilu" Trilu(fill −inf, k=1),
	// "sub" (1 − tril(ones))·−1e9, "bcast4" Reshape(mask, [1,1,S,S]),
	// "where" Where(tril bool, s, −inf), "wherefill" Where(triu bool, −inf, s),
	// "slice" GPT-2's bool buffer [1,1,M,M] sliced to S, "none".
	mask   string
	layers int
	// noops puts a Cast to the same dtype before the Softmax and an
	// Identity plus such a Cast between it and the MatMul with V.
	noops bool
}

const (
	fzB, fzH, fzS, fzD = 2, 3, 8, 8
)

// build returns the graph: inputs q, k (or kt), v; each layer's output is
// the next layer's Q.
func (c attnCase) build(t *testing.T, dt graph.DType) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder(c.name)
	B, H, S, D := fzB, fzH, fzS, fzD
	heads := func(a, z int) []int {
		if c.rank == 3 {
			return []int{B * H, a, z}
		}
		return []int{B, H, a, z}
	}
	q := b.Input("q", dt, heads(S, D)...)
	var k *graph.Value
	switch c.k {
	case "pre":
		k = b.Input("kt", dt, heads(D, S)...)
	case "bshd", "tt":
		k = b.Input("k", dt, B, S, H, D)
	default:
		k = b.Input("k", dt, heads(S, D)...)
	}
	v := b.Input("v", dt, heads(S, D)...)
	r := int64(c.rank)
	swap := make([]int64, r)
	for i := range swap {
		swap[i] = int64(i)
	}
	swap[r-2], swap[r-1] = r-1, r-2
	invSqrtD := 1 / math.Sqrt(fzD)
	quarter := math.Pow(fzD, -0.25)

	maskData := func(above float64) []float64 {
		d := make([]float64, S*S)
		for i := range S {
			for j := range S {
				if j > i {
					d[i*S+j] = above
				}
			}
		}
		return d
	}
	var mask, cond, fill *graph.Value
	switch c.mask {
	case "recipe":
		mask = b.Const("mask", dt, graph.Shape{S, S}, graph.CausalMask())
	case "inf":
		mask = b.Const("mask", dt, graph.Shape{S, S}, graph.Literal(maskData(math.Inf(-1))...))
	case "1e4":
		mask = b.Const("mask", dt, graph.Shape{S, S}, graph.Literal(maskData(-1e4)...))
	case "finfo":
		mask = b.Const("mask", dt, graph.Shape{S, S}, graph.Literal(maskData(-math.MaxFloat32)...))
	case "trilu":
		mask = b.Op("Trilu", graph.Attrs{"upper": graph.Int(1)},
			b.Const("neg_inf", dt, graph.Shape{S, S}, graph.Fill(math.Inf(-1))), b.Scalar(graph.Int64, 1))
	case "sub":
		ones := b.Const("ones", dt, graph.Shape{S, S}, graph.Ones())
		tril := b.Op("Trilu", graph.Attrs{"upper": graph.Int(0)}, ones)
		mask = b.Mul(b.Sub(ones, tril), b.Scalar(dt, -1e9))
	case "bcast4":
		mask = b.Reshape(b.Const("mask", dt, graph.Shape{S, S}, graph.CausalMask()), 1, 1, S, S)
	case "where":
		cond = b.Op("Trilu", graph.Attrs{"upper": graph.Int(0)}, b.Const("ones", graph.Bool, graph.Shape{S, S}, graph.Ones()))
		fill = b.Scalar(dt, math.Inf(-1))
	case "wherefill":
		cond = b.Op("Trilu", graph.Attrs{"upper": graph.Int(1)}, b.Const("ones", graph.Bool, graph.Shape{S, S}, graph.Ones()), b.Scalar(graph.Int64, 1))
		fill = b.Scalar(dt, math.Inf(-1))
	case "slice":
		const M = 16
		buf := make([]float64, M*M)
		for i := range M {
			for j := range i + 1 {
				buf[i*M+j] = 1
			}
		}
		bias := b.Const("bias", graph.Bool, graph.Shape{1, 1, M, M}, graph.Literal(buf...))
		cond = b.Op("Slice", nil, bias, b.Ints(0, 0), b.Ints(S, S), b.Ints(2, 3))
		fill = b.Scalar(dt, -math.MaxFloat32)
	}

	x := q
	for l := range c.layers {
		b.Push(fmt.Sprintf("l%d", l))
		if c.scale == "mul" && c.k == "t" && mask != nil && !c.noops {
			// The canonical spelling, as the model writes it: the shared
			// builder.
			x = b.Attention(x, k, v, invSqrtD, mask).Out
			b.Pop()
			continue
		}
		qq, kk := x, k
		switch c.scale {
		case "q":
			qq = b.Mul(qq, b.Scalar(dt, invSqrtD))
		case "qdiv":
			qq = b.Div(qq, b.Scalar(dt, math.Sqrt(fzD)))
		case "k":
			kk = b.Mul(kk, b.Scalar(dt, invSqrtD))
		case "qk":
			qq = b.Mul(qq, b.Scalar(dt, quarter))
			kk = b.Mul(kk, b.Scalar(dt, quarter))
		}
		var kt *graph.Value
		switch c.k {
		case "pre":
			kt = kk
		case "bshd":
			kt = b.Transpose(kk, 0, 2, 3, 1)
		case "tt":
			kt = b.Transpose(b.Transpose(kk, 0, 2, 1, 3), swap...)
		default:
			kt = b.Transpose(kk, swap...)
		}
		s := b.MatMul(qq, kt)
		switch c.scale {
		case "mul":
			s = b.Mul(s, b.Scalar(dt, invSqrtD))
		case "cmul":
			s = b.Mul(b.Scalar(dt, invSqrtD), s)
		case "div":
			s = b.Div(s, b.Scalar(dt, math.Sqrt(fzD)))
		case "divsqrt":
			s = b.Div(s, b.Sqrt(b.Scalar(dt, fzD)))
		}
		switch {
		case mask != nil:
			s = b.Add(s, mask)
		case c.mask == "where" || c.mask == "slice":
			s = b.Op("Where", nil, cond, s, fill)
		case c.mask == "wherefill":
			s = b.Op("Where", nil, cond, fill, s)
		}
		if c.scale == "post" {
			s = b.Mul(s, b.Scalar(dt, invSqrtD))
		}
		if c.noops {
			s = b.Op("Cast", graph.Attrs{"to": graph.Str(dt.String())}, s)
		}
		p := b.Softmax(s, -1)
		if c.noops {
			p = b.Op("Cast", graph.Attrs{"to": graph.Str(dt.String())}, b.Op("Identity", nil, p))
		}
		x = b.MatMul(p, v)
		b.Pop()
	}
	b.Output(x)
	g, err := b.Build()
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	return g
}

// wantScale is the fused scale attribute, computed from the constants as
// the graph stores them (rounded to dt).
func (c attnCase) wantScale(dt graph.DType) float64 {
	round := func(x float64) float64 {
		tt := graph.NewTensor(dt, graph.Shape{})
		tt.Set(0, x)
		return tt.At(0)
	}
	switch c.scale {
	case "none":
		return 1
	case "qk":
		return round(math.Pow(fzD, -0.25)) * round(math.Pow(fzD, -0.25))
	case "div", "divsqrt", "qdiv":
		// Div(s, c) becomes Mul(s, 1/c) with 1/c stored in dt.
		return round(1 / round(math.Sqrt(fzD)))
	}
	return round(1 / math.Sqrt(fzD))
}
