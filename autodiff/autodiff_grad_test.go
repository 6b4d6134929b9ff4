package autodiff

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// Finite-difference checks of every gradient rule, in float64 on the CPU
// backend. Each case is a small graph y = f(inputs); the checked loss is
// sum(y·R) with R a fixed random tensor, so the cotangent reaching the rule
// is not uniform (a uniform one hides transposition and broadcasting bugs).

// Tolerances. Central differences with step fdStep in float64 have a
// truncation error ~h² times the third derivative ≈ 1e-10 and a rounding error ~1e-16·|loss|/h ≈
// 1e-11·|loss|, far below fdRel.
const (
	fdStep = 1e-5
	fdRel  = 1e-6
	// fdAbs is relative to the largest gradient entry (or 1, the scale of
	// the inputs and of R, when all are smaller): it admits the rounding
	// noise on entries that are exactly zero (masked, clipped, or dQ and dK
	// of attention over one key, which the kernel computes as ~1e-16).
	fdAbs = 1e-9
)

// domain says where an input's random values lie, keeping every function
// smooth within fdStep of them.
type domain int

const (
	anyReal  domain = iota // normal(0, 1)
	positive               // [0.5, 2]
	awayZero               // ±[0.2, 2]
	inUnit                 // ±[0.05, 0.9]: Asin, Acos, Atanh
	aboveOne               // [1.2, 3]: Acosh
)

type gcInput struct {
	name  string
	shape graph.Shape
	dom   domain
}

type gradCase struct {
	name   string
	inputs []gcInput
	build  func(b *graph.Builder, in []*graph.Value) *graph.Value
}

func in(name string, dom domain, shape ...int) gcInput { return gcInput{name, shape, dom} }

func op(op string, attrs graph.Attrs) func(b *graph.Builder, in []*graph.Value) *graph.Value {
	return func(b *graph.Builder, in []*graph.Value) *graph.Value { return b.Op(op, attrs, in...) }
}

// gradCases covers every rule of gradRules, broadcasting both ways, every
// MatMul batching form and every optional operand the model uses.
func gradCases() []gradCase {
	i64 := func(b *graph.Builder, name string, shape graph.Shape, v ...int64) *graph.Value {
		return b.Const(name, graph.Int64, shape, graph.LiteralInts(v...))
	}
	cases := []gradCase{
		{"Add", []gcInput{in("a", anyReal, 2, 3, 4), in("b", anyReal, 3, 1)}, op("Add", nil)},
		{"AddSame", []gcInput{in("a", anyReal, 2, 3)}, func(b *graph.Builder, x []*graph.Value) *graph.Value { return b.Add(x[0], x[0]) }},
		{"Sub", []gcInput{in("a", anyReal, 3, 1), in("b", anyReal, 2, 1, 4)}, op("Sub", nil)},
		{"Mul", []gcInput{in("a", anyReal, 2, 3, 4), in("b", anyReal, 4)}, op("Mul", nil)},
		{"MulScalar", []gcInput{in("a", anyReal), in("b", anyReal, 2, 3)}, op("Mul", nil)},
		{"Div", []gcInput{in("a", anyReal, 2, 3), in("b", awayZero, 2, 1)}, op("Div", nil)},
		{"PowConst", []gcInput{in("a", positive, 2, 3)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("Pow", nil, x[0], b.Scalar(graph.Float64, 2.5))
		}},
		{"Pow", []gcInput{in("a", positive, 2, 3), in("b", anyReal, 3)}, op("Pow", nil)},
		{"Neg", []gcInput{in("x", anyReal, 2, 3)}, op("Neg", nil)},
		{"Sqrt", []gcInput{in("x", positive, 2, 3)}, op("Sqrt", nil)},
		{"Reciprocal", []gcInput{in("x", awayZero, 2, 3)}, op("Reciprocal", nil)},
		{"Exp", []gcInput{in("x", anyReal, 2, 3)}, op("Exp", nil)},
		{"Log", []gcInput{in("x", positive, 2, 3)}, op("Log", nil)},
		{"Sigmoid", []gcInput{in("x", anyReal, 2, 3)}, op("Sigmoid", nil)},
		{"Tanh", []gcInput{in("x", anyReal, 2, 3)}, op("Tanh", nil)},
		{"Relu", []gcInput{in("x", awayZero, 3, 4)}, op("Relu", nil)},
		{"Erf", []gcInput{in("x", anyReal, 2, 3)}, op("Erf", nil)},
		{"Softplus", []gcInput{in("x", anyReal, 2, 3)}, op("Softplus", nil)},
		{"Abs", []gcInput{in("x", awayZero, 2, 3)}, op("Abs", nil)},
		{"Identity", []gcInput{in("x", anyReal, 2, 3)}, op("Identity", nil)},
		{"CastSame", []gcInput{in("x", anyReal, 2, 3)}, op("Cast", graph.Attrs{"to": graph.Str("float64")})},
		{"MatMul2D", []gcInput{in("a", anyReal, 3, 4), in("b", anyReal, 4, 5)}, op("MatMul", nil)},
		{"MatMulWeight", []gcInput{in("a", anyReal, 2, 3, 4), in("b", anyReal, 4, 5)}, op("MatMul", nil)},
		{"MatMulBatched", []gcInput{in("a", anyReal, 2, 3, 3, 4), in("b", anyReal, 2, 3, 4, 2)}, op("MatMul", nil)},
		{"MatMulBroadcast", []gcInput{in("a", anyReal, 2, 1, 3, 4), in("b", anyReal, 3, 4, 2)}, op("MatMul", nil)},
		{"MatMulLeft2D", []gcInput{in("a", anyReal, 3, 4), in("b", anyReal, 2, 4, 5)}, op("MatMul", nil)},
		{"MatMulVecLeft", []gcInput{in("a", anyReal, 4), in("b", anyReal, 2, 4, 3)}, op("MatMul", nil)},
		{"MatMulVecRight", []gcInput{in("a", anyReal, 2, 3, 4), in("b", anyReal, 4)}, op("MatMul", nil)},
		{"MatMulDot", []gcInput{in("a", anyReal, 4), in("b", anyReal, 4)}, op("MatMul", nil)},
		{"Gemm", []gcInput{in("a", anyReal, 3, 4), in("b", anyReal, 4, 5), in("c", anyReal, 1, 5)}, op("Gemm", nil)},
		{"GemmTrans", []gcInput{in("a", anyReal, 4, 3), in("b", anyReal, 5, 4), in("c", anyReal, 3, 1)},
			op("Gemm", graph.Attrs{"transA": graph.Int(1), "transB": graph.Int(1), "alpha": graph.Float(0.7), "beta": graph.Float(-1.5)})},
		// C omitted as an explicit nil: graph's Gemm inference indexes in[2]
		// unguarded when only two inputs are given (reported to graph/).
		{"GemmNoC", []gcInput{in("a", anyReal, 4, 3), in("b", anyReal, 4, 5)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("Gemm", graph.Attrs{"transA": graph.Int(1)}, x[0], x[1], nil)
		}},
		{"Transpose", []gcInput{in("x", anyReal, 2, 3, 4)}, op("Transpose", graph.Attrs{"perm": graph.Ints(1, 2, 0)})},
		{"TransposeDefault", []gcInput{in("x", anyReal, 2, 3, 4)}, op("Transpose", nil)},
		{"Reshape", []gcInput{in("x", anyReal, 2, 3, 4)}, func(b *graph.Builder, x []*graph.Value) *graph.Value { return b.Reshape(x[0], 6, -1) }},
		{"Unsqueeze", []gcInput{in("x", anyReal, 2, 3)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("Unsqueeze", nil, x[0], b.Ints(0, 2))
		}},
		{"Squeeze", []gcInput{in("x", anyReal, 2, 1, 3, 1)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("Squeeze", nil, x[0], b.Ints(1))
		}},
		{"SqueezeAll", []gcInput{in("x", anyReal, 2, 1, 3, 1)}, op("Squeeze", nil)},
		{"Expand", []gcInput{in("x", anyReal, 3, 1)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("Expand", nil, x[0], b.Ints(2, 3, 4))
		}},
		{"Concat", []gcInput{in("a", anyReal, 2, 3), in("b", anyReal, 2, 1), in("c", anyReal, 2, 4)}, op("Concat", graph.Attrs{"axis": graph.Int(-1)})},
		{"ConcatConst", []gcInput{in("a", anyReal, 2, 3)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			k := b.Const("k", graph.Float64, graph.Shape{1, 3}, graph.Ones())
			return b.Concat(0, k, x[0], k)
		}},
		{"Slice", []gcInput{in("x", anyReal, 4, 6)}, func(b *graph.Builder, x []*graph.Value) *graph.Value { return b.Slice(x[0], -1, 2, 5) }},
		{"Slice2Axes", []gcInput{in("x", anyReal, 4, 5, 6)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("Slice", nil, x[0], b.Ints(1, -4), b.Ints(3, 100), b.Ints(0, 2))
		}},
		{"SliceRope", []gcInput{in("x", anyReal, 2, 3, 8)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			// rotate_half as the model writes it.
			lo, hi := b.Slice(x[0], -1, 0, 4), b.Slice(x[0], -1, 4, 8)
			return b.Concat(-1, b.Neg(hi), lo)
		}},
		{"Gather", []gcInput{in("x", anyReal, 5, 3)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Gather(x[0], i64(b, "idx", graph.Shape{2, 4}, 0, 4, 4, 2, 1, 0, 4, 3), 0)
		}},
		{"GatherAxis1", []gcInput{in("x", anyReal, 2, 5, 3)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Gather(x[0], i64(b, "idx", graph.Shape{3}, 1, 1, 4), 1)
		}},
		{"ReduceSum", []gcInput{in("x", anyReal, 2, 3, 4)}, func(b *graph.Builder, x []*graph.Value) *graph.Value { return b.ReduceSum(x[0], false, 0, 2) }},
		{"ReduceSumKeep", []gcInput{in("x", anyReal, 2, 3, 4)}, func(b *graph.Builder, x []*graph.Value) *graph.Value { return b.ReduceSum(x[0], true, -1) }},
		{"ReduceSumAll", []gcInput{in("x", anyReal, 2, 3)}, op("ReduceSum", graph.Attrs{"keepdims": graph.Int(0)})},
		{"ReduceMean", []gcInput{in("x", anyReal, 2, 3, 4)}, func(b *graph.Builder, x []*graph.Value) *graph.Value { return b.ReduceMean(x[0], true, -1) }},
		{"ReduceMeanAxes", []gcInput{in("x", anyReal, 2, 3, 4)}, func(b *graph.Builder, x []*graph.Value) *graph.Value { return b.ReduceMean(x[0], false, 1, 0) }},
		{"Softmax", []gcInput{in("x", anyReal, 2, 3, 5)}, op("Softmax", graph.Attrs{"axis": graph.Int(-1)})},
		{"SoftmaxAxis1", []gcInput{in("x", anyReal, 2, 3, 5)}, op("Softmax", graph.Attrs{"axis": graph.Int(1)})},
		{"LogSoftmax", []gcInput{in("x", anyReal, 3, 5)}, op("LogSoftmax", graph.Attrs{"axis": graph.Int(-1)})},
		{"SoftmaxCrossEntropyLoss", []gcInput{in("x", anyReal, 4, 5)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("SoftmaxCrossEntropyLoss", nil, x[0], i64(b, "labels", graph.Shape{4}, 3, 0, 4, 3))
		}},
		{"SoftmaxCrossEntropyLossSum", []gcInput{in("x", anyReal, 4, 5)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("SoftmaxCrossEntropyLoss", graph.Attrs{"reduction": graph.Str("sum")}, x[0], i64(b, "labels", graph.Shape{4}, 1, 2, 0, 2))
		}},
		{"Where", []gcInput{in("x", anyReal, 2, 3), in("y", anyReal, 3)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			cond := b.Const("cond", graph.Bool, graph.Shape{2, 3}, graph.Literal(1, 0, 0, 1, 1, 0))
			return b.Op("Where", nil, cond, x[0], x[1])
		}},
		// Elementwise ops with kinks (cases away from them), domains, two
		// operands, or attributes at other values than their defaults.
		{"LeakyRelu", []gcInput{in("x", awayZero, 3, 4)}, op("LeakyRelu", graph.Attrs{"alpha": graph.Float(0.3)})},
		{"Elu", []gcInput{in("x", awayZero, 3, 4)}, op("Elu", graph.Attrs{"alpha": graph.Float(0.7)})},
		{"Celu", []gcInput{in("x", awayZero, 3, 4)}, op("Celu", graph.Attrs{"alpha": graph.Float(1.5)})},
		{"Selu", []gcInput{in("x", awayZero, 3, 4)}, op("Selu", nil)},
		{"HardSigmoid", []gcInput{in("x", anyReal, 3, 4)}, op("HardSigmoid", graph.Attrs{"alpha": graph.Float(0.3), "beta": graph.Float(0.4)})},
		{"HardSwish", []gcInput{in("x", anyReal, 3, 4)}, op("HardSwish", nil)},
		{"ThresholdedRelu", []gcInput{in("x", awayZero, 3, 4)}, op("ThresholdedRelu", graph.Attrs{"alpha": graph.Float(0.1)})},
		{"Shrink", []gcInput{in("x", awayZero, 3, 4)}, op("Shrink", graph.Attrs{"bias": graph.Float(0.5), "lambd": graph.Float(0.1)})},
		{"Gelu", []gcInput{in("x", anyReal, 3, 4)}, op("Gelu", nil)},
		{"GeluTanh", []gcInput{in("x", anyReal, 3, 4)}, op("Gelu", graph.Attrs{"approximate": graph.Str("tanh")})},
		{"Sign", []gcInput{in("x", awayZero, 3, 4)}, op("Sign", nil)},
		{"Asin", []gcInput{in("x", inUnit, 3, 4)}, op("Asin", nil)},
		{"Acos", []gcInput{in("x", inUnit, 3, 4)}, op("Acos", nil)},
		{"Atanh", []gcInput{in("x", inUnit, 3, 4)}, op("Atanh", nil)},
		{"Acosh", []gcInput{in("x", aboveOne, 3, 4)}, op("Acosh", nil)},
		{"Tan", []gcInput{in("x", inUnit, 3, 4)}, op("Tan", nil)},
		{"Min", []gcInput{in("a", anyReal, 2, 3, 4), in("b", anyReal, 3, 1)}, op("Min", nil)},
		{"Max", []gcInput{in("a", anyReal, 3, 1), in("b", anyReal, 2, 3, 4)}, op("Max", nil)},
		{"PRelu", []gcInput{in("x", awayZero, 2, 3, 4), in("slope", anyReal, 3, 1)}, op("PRelu", nil)},
		{"Mod", []gcInput{in("a", awayZero, 3, 4), in("b", awayZero, 4)}, op("Mod", graph.Attrs{"fmod": graph.Int(1)})},
		{"Trilu", []gcInput{in("x", anyReal, 2, 4, 4)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("Trilu", graph.Attrs{"upper": graph.Int(0)}, x[0], i64(b, "k", graph.Shape{}, -1))
		}},
		{"CumSum", []gcInput{in("x", anyReal, 3, 4)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("CumSum", nil, x[0], b.Ints(-1))
		}},
		{"CumSumReverseExclusive", []gcInput{in("x", anyReal, 2, 3, 4)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("CumSum", graph.Attrs{"exclusive": graph.Int(1), "reverse": graph.Int(1)}, x[0], b.Ints(1))
		}},
		{"ReverseSequence", []gcInput{in("x", anyReal, 4, 3, 2)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("ReverseSequence", nil, x[0], i64(b, "lens", graph.Shape{3}, 4, 0, 2))
		}},
		{"GatherElementsRepeats", []gcInput{in("x", anyReal, 3, 4)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("GatherElements", graph.Attrs{"axis": graph.Int(1)}, x[0], i64(b, "idx", graph.Shape{3, 5}, 0, 3, 3, -1, 1, 2, 2, 0, 1, 1, 3, 0, 0, 0, 2))
		}},
		{"GatherNDRepeats", []gcInput{in("x", anyReal, 3, 4, 2)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			return b.Op("GatherND", nil, x[0], i64(b, "idx", graph.Shape{4, 2}, 0, 1, 2, 3, 0, 1, -1, 0))
		}},
		// Composites the model is made of.
		{"RMSNorm", []gcInput{in("x", anyReal, 2, 3, 8), in("w", anyReal, 8)}, func(b *graph.Builder, x []*graph.Value) *graph.Value {
			ms := b.ReduceMean(b.Mul(x[0], x[0]), true, -1)
			inv := b.Reciprocal(b.Sqrt(b.Add(ms, b.Scalar(graph.Float64, 1e-5))))
			return b.Mul(b.Mul(x[0], inv), x[1])
		}},
		{"SiLU", []gcInput{in("x", anyReal, 2, 5)}, func(b *graph.Builder, x []*graph.Value) *graph.Value { return b.Mul(x[0], b.Sigmoid(x[0])) }},
		{"MaskedAttention", []gcInput{in("q", anyReal, 1, 2, 5, 4), in("k", anyReal, 1, 2, 5, 4), in("v", anyReal, 1, 2, 5, 4)},
			func(b *graph.Builder, x []*graph.Value) *graph.Value {
				mask := b.Const("mask", graph.Float64, graph.Shape{5, 5}, graph.CausalMask())
				s := b.Mul(b.MatMul(x[0], b.Transpose(x[1], 0, 1, 3, 2)), b.Scalar(graph.Float64, 0.5))
				return b.MatMul(b.Softmax(b.Add(s, mask), -1), x[2])
			}},
	}
	// FlashAttention at lengths below, at and across a 64-row tile, both
	// masks, [B,H,S,D] and [BH,S,D].
	for _, s := range []int{1, 5, 64, 67} {
		for _, causal := range []int64{0, 1} {
			shape := []int{1, 2, s, 4}
			if s == 5 {
				shape = []int{3, s, 8}
			}
			cases = append(cases, gradCase{
				name:   fmt.Sprintf("FlashAttention/S=%d/causal=%d/rank=%d", s, causal, len(shape)),
				inputs: []gcInput{in("q", anyReal, shape...), in("k", anyReal, shape...), in("v", anyReal, shape...)},
				build: op("FlashAttention", graph.Attrs{
					"causal": graph.Int(causal), "scale": graph.Float(1 / math.Sqrt(float64(shape[len(shape)-1])))}),
			})
		}
	}
	// Grouped-query FlashAttention: 4 query heads on 2 K/V heads and on 1
	// (multi-query), so dK and dV sum over each group; one [BH,S,D] case.
	for _, kv := range []int{2, 1} {
		for _, s := range []int{5, 67} {
			for _, causal := range []int64{0, 1} {
				cases = append(cases, gradCase{
					name:   fmt.Sprintf("FlashAttention/H=4/H_kv=%d/S=%d/causal=%d", kv, s, causal),
					inputs: []gcInput{in("q", anyReal, 1, 4, s, 4), in("k", anyReal, 1, kv, s, 4), in("v", anyReal, 1, kv, s, 4)},
					build:  op("FlashAttention", graph.Attrs{"causal": graph.Int(causal), "scale": graph.Float(0.5)}),
				})
			}
		}
	}
	cases = append(cases, gradCase{
		name:   "FlashAttention/BH=6/BH_kv=2/rank=3",
		inputs: []gcInput{in("q", anyReal, 6, 5, 8), in("k", anyReal, 2, 5, 8), in("v", anyReal, 2, 5, 8)},
		build:  op("FlashAttention", graph.Attrs{"causal": graph.Int(1), "scale": graph.Float(0.35)}),
	})
	// Every other op defined by an expression, with one input, on
	// normal(0, 1) values: its rule is derived, so a new activation is
	// checked without a line here (an op smooth only on part of the line
	// gets an explicit case above, with its domain).
	named := map[string]bool{}
	for _, c := range cases {
		named[c.name] = true
	}
	for _, spec := range graph.ExprOps() {
		if _, ok := gradRules[spec.Name]; ok && !named[spec.Name] && len(spec.Inputs) == 1 {
			cases = append(cases, gradCase{spec.Name, []gcInput{in("x", anyReal, 3, 4)}, op(spec.Name, nil)})
		}
	}
	return cases
}

// buildCase makes the case's graph with loss = sum(y·R).
func buildCase(t *testing.T, c gradCase) (*graph.Graph, []string) {
	t.Helper()
	b := graph.NewBuilder("gradcheck")
	var ins []*graph.Value
	var names []string
	for _, x := range c.inputs {
		ins = append(ins, b.Input(x.name, graph.Float64, x.shape...))
		names = append(names, x.name)
	}
	y := c.build(b, ins)
	if b.Err() != nil {
		t.Fatal(b.Err())
	}
	r := b.Const("r", graph.Float64, y.Type.Shape, graph.Normal(1, 7))
	loss := b.Rename(b.Op("ReduceSum", graph.Attrs{"keepdims": graph.Int(0)}, b.Mul(y, r)), "loss")
	b.Output(loss)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g, names
}

func randomFeed(rng *rand.Rand, x gcInput) *graph.Tensor {
	t := graph.NewTensor(graph.Float64, x.shape)
	for i := range t.F64 {
		switch x.dom {
		case anyReal:
			t.F64[i] = rng.NormFloat64()
		case positive:
			t.F64[i] = 0.5 + 1.5*rng.Float64()
		case awayZero:
			v := 0.2 + 1.8*rng.Float64()
			if rng.IntN(2) == 0 {
				v = -v
			}
			t.F64[i] = v
		case inUnit:
			v := 0.05 + 0.85*rng.Float64()
			if rng.IntN(2) == 0 {
				v = -v
			}
			t.F64[i] = v
		case aboveOne:
			t.F64[i] = 1.2 + 1.8*rng.Float64()
		}
	}
	return t
}

func compile(t *testing.T, g *graph.Graph, opts backend.Options) backend.Executable {
	t.Helper()
	exe, err := cpu.New().Compile(g, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exe.Close() })
	return exe
}

func run(t *testing.T, exe backend.Executable, feeds map[string]*graph.Tensor) map[string]*graph.Tensor {
	t.Helper()
	out, err := exe.Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fdResult is the worst disagreement of one gradient with finite differences.
type fdResult struct {
	checked int
	worst   float64 // max |fd − ad| / (|ad| + fdAbs/fdRel·max(‖ad‖∞, 1))
}

// sampleIndices returns every index when n <= max, else max of them spread
// over the tensor with both ends included.
func sampleIndices(rng *rand.Rand, n, max int) []int {
	if n <= max {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		return idx
	}
	idx := []int{0, n - 1}
	for len(idx) < max {
		idx = append(idx, rng.IntN(n))
	}
	slices.Sort(idx)
	return slices.Compact(idx)
}

// checkFD compares gradient ad of loss with respect to feed name against
// central differences of lossAt, on a sample of entries, and fails on any
// entry outside fdRel·|ad| + fdAbs·‖ad‖∞.
func checkFD(t *testing.T, rng *rand.Rand, what string, x *graph.Tensor, ad *graph.Tensor, max int, lossAt func() float64) fdResult {
	t.Helper()
	if !ad.Type().Equal(x.Type()) {
		t.Fatalf("%s: gradient is %v, value is %v", what, ad.Type(), x.Type())
	}
	scale := 1.0
	for _, v := range ad.F64 {
		scale = math.Max(scale, math.Abs(v))
	}
	res := fdResult{}
	bad := 0
	for _, i := range sampleIndices(rng, x.Len(), max) {
		x0 := x.F64[i]
		x.F64[i] = x0 + fdStep
		fp := lossAt()
		x.F64[i] = x0 - fdStep
		fm := lossAt()
		x.F64[i] = x0
		fd := (fp - fm) / (2 * fdStep)
		a := ad.F64[i]
		tol := fdRel*math.Abs(a) + fdAbs*scale
		res.checked++
		res.worst = math.Max(res.worst, math.Abs(fd-a)/(tol/fdRel))
		if !(math.Abs(fd-a) <= tol) {
			if bad++; bad <= 5 {
				t.Errorf("%s[%d]: autodiff %.12g, finite difference %.12g (|diff| %.3g > %.3g)", what, i, a, fd, math.Abs(fd-a), tol)
			}
		}
	}
	return res
}

func TestGradRulesFiniteDifference(t *testing.T) {
	covered := map[string]bool{}
	for ci, c := range gradCases() {
		t.Run(c.name, func(t *testing.T) {
			g, wrt := buildCase(t, c)
			gg, grads, err := Gradients(g, "loss", wrt)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range g.Nodes {
				covered[n.Op] = true
			}
			rng := rand.New(rand.NewPCG(uint64(ci), 99))
			feeds := map[string]*graph.Tensor{}
			for _, x := range c.inputs {
				feeds[x.name] = randomFeed(rng, x)
			}
			out := run(t, compile(t, gg, backend.Options{PoisonOutputs: true}), feeds)
			fwd := compile(t, g, backend.Options{})
			lossAt := func() float64 { return run(t, fwd, feeds)["loss"].At(0) }
			if l := lossAt(); l != out["loss"].At(0) {
				t.Errorf("loss of the gradient graph %v differs from the forward graph's %v", out["loss"].At(0), l)
			}
			for _, w := range wrt {
				r := checkFD(t, rng, w, feeds[w], out[grads[w]], 150, lossAt)
				t.Logf("d/d%s: %d entries, worst relative error %.2g", w, r.checked, r.worst)
			}
		})
	}
	for r := range gradRules {
		if !covered[r] {
			t.Errorf("rule %s has no finite-difference case", r)
		}
	}
}

// TestGradCastRoundTrip: Cast through float32 cannot be checked by finite
// differences at 1e-6 (the float32 rounding dominates); its gradient is
// known exactly: the cotangent cast the same way back.
func TestGradCastRoundTrip(t *testing.T) {
	b := graph.NewBuilder("cast")
	x := b.Input("x", graph.Float64, 2, 3)
	y := b.Op("Cast", graph.Attrs{"to": graph.Str("float64")}, b.Op("Cast", graph.Attrs{"to": graph.Str("float32")}, x))
	r := b.Const("r", graph.Float64, graph.Shape{2, 3}, graph.Normal(1, 3))
	b.Output(b.Rename(b.ReduceSum(b.Mul(y, r), false), "loss"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	gg, grads, err := Gradients(g, "loss", []string{"x"})
	if err != nil {
		t.Fatal(err)
	}
	if n := gg.CountOps()["Cast"]; n != 4 {
		t.Errorf("%d Cast nodes, want 2 forward + 2 backward", n)
	}
	feed := randomFeed(rand.New(rand.NewPCG(1, 1)), in("x", anyReal, 2, 3))
	out := run(t, compile(t, gg, backend.Options{}), map[string]*graph.Tensor{"x": feed})
	rt, _ := graph.Normal(1, 3).Materialize(graph.TensorType{DType: graph.Float64, Shape: graph.Shape{2, 3}})
	for i, v := range out[grads["x"]].F64 {
		if want := float64(float32(rt.F64[i])); v != want {
			t.Errorf("dx[%d] = %v, want %v", i, v, want)
		}
	}
}
