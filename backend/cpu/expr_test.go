package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// TestExprKernelsCoverPrims: every primitive a row may use has a block loop
// (blockLoop panics for one without).
func TestExprKernelsCoverPrims(t *testing.T) {
	buf := func() []float64 { return make([]float64, exprBlock) }
	for _, p := range graph.Prims() {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("primitive %v: %v", p, r)
				}
			}()
			blockLoop(p, buf(), [][]float64{buf(), buf(), buf()})(exprBlock)
		}()
	}
}

// TestExprKernelsBitExact: the compiled kernel of every op defined by an
// expression gives exactly the op table's reference, in float32 and
// float64, with broadcasting, on values that reach each op's special
// regions (negative arguments of Sqrt and Log give NaN in both).
// An op whose expression reads attributes runs at values other than its
// defaults too (exprTestAttrs; Mod's floats need fmod=1); the logical ops
// run on bool data, the integer ones (BitShift) on int64.
func TestExprKernelsBitExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	type run struct {
		s     *graph.OpSpec
		attrs graph.Attrs
	}
	var runs []run
	for _, s := range graph.ExprOps() {
		if s.Name != "Mod" {
			runs = append(runs, run{s, nil})
		}
		for _, a := range exprTestAttrs[s.Name] {
			runs = append(runs, run{s, a})
		}
	}
	for _, r := range runs {
		s := r.s
		if _, ok := kernels[s.Name]; !ok {
			t.Errorf("%s: no CPU kernel", s.Name)
			continue
		}
		for _, dt := range []graph.DType{graph.Float32, graph.Float64} {
			if logicalOps[s.Name] {
				dt = graph.Bool
			}
			if s.IntegerOnly() {
				dt = graph.Int64
			}
			n := len(s.Inputs)
			in := make([]*graph.Tensor, n)
			for i := range in {
				shape := graph.Shape{3, 700} // a run longer than one block
				if i == 1 {
					shape = graph.Shape{700}
				}
				if s.Name == "Where" && i == 0 {
					in[i] = graph.NewTensor(graph.Bool, graph.Shape{3, 1})
					in[i].B[0], in[i].B[2] = true, true
					continue
				}
				in[i] = graph.NewTensor(dt, shape)
				for j := range in[i].Len() {
					v := rng.NormFloat64() * 4
					switch {
					case j%97 == 0:
						v = math.Round(v) // ties for Equal, Max and Greater
					case j%89 == 0:
						v = math.Inf(1 - 2*(j%2)) // IsInf, Sign
					case j%83 == 0:
						v = math.NaN()
					case j%79 == 0:
						v = math.Round(v) + 0.5 // Round's halves
					case s.Name == "Acosh":
						v = 1 + math.Abs(v)
					case s.Name == "Asin" || s.Name == "Acos" || s.Name == "Atanh":
						v /= 10
					}
					if dt == graph.Bool {
						v = float64(rng.IntN(2))
					}
					if dt == graph.Int64 { // BitShift: values and shift amounts past 63
						v = float64(rng.IntN(1 << 20))
						if i == 1 {
							v = float64(rng.IntN(70))
						}
					}
					in[i].Set(j, v)
				}
			}
			want, err := graph.Eval(s.Name, r.attrs, in...)
			if err != nil {
				t.Fatalf("%s: %v", s.Name, err)
			}
			got := graph.NewTensor(want[0].DType, want[0].Shape)
			if err := kernels[s.Name](&graph.Node{Op: s.Name, Attrs: r.attrs}, in, []*graph.Tensor{got}); err != nil {
				t.Fatalf("%s %v: %v", s.Name, dt, err)
			}
			if got.I64 != nil && !slices.Equal(got.I64, want[0].I64) {
				t.Errorf("%s%v %v: the kernel's int64 results differ from the definition's", s.Name, r.attrs, dt)
			}
			for j := range got.Len() {
				g, w := got.At(j), want[0].At(j)
				if g != w && !(g != g && w != w) {
					t.Errorf("%s%v %v: element %d is %v, the definition gives %v", s.Name, r.attrs, dt, j, g, w)
					break
				}
			}
			if dt == graph.Bool || dt == graph.Int64 {
				break
			}
		}
	}
}

// logicalOps take bool data.
var logicalOps = map[string]bool{"And": true, "Or": true, "Xor": true, "Not": true}

// exprTestAttrs are attribute values the kernels run at besides the
// defaults.
var exprTestAttrs = map[string][]graph.Attrs{
	"LeakyRelu":       {{"alpha": graph.Float(0.3)}},
	"Elu":             {{"alpha": graph.Float(0.5)}},
	"Celu":            {{"alpha": graph.Float(2)}},
	"Selu":            {{"alpha": graph.Float(2), "gamma": graph.Float(3)}},
	"HardSigmoid":     {{"alpha": graph.Float(0.5), "beta": graph.Float(0.25)}},
	"ThresholdedRelu": {{"alpha": graph.Float(-0.5)}},
	"Shrink":          {{"bias": graph.Float(1.5), "lambd": graph.Float(1)}},
	"Gelu":            {{"approximate": graph.Str("tanh")}},
	"IsInf":           {{"detect_negative": graph.Int(0)}, {"detect_positive": graph.Int(0)}},
	"Mod":             {{"fmod": graph.Int(1)}},
	"BitShift":        {{"direction": graph.Str("RIGHT")}},
}

// BenchmarkElementwise times the kernels the model's graphs run most, on a
// 1M-element float32 activation (the broadcast operand is a bias row).
func BenchmarkElementwise(b *testing.B) {
	const rows, cols = 1024, 1024
	x := graph.NewTensor(graph.Float32, graph.Shape{rows, cols})
	y := graph.NewTensor(graph.Float32, graph.Shape{rows, cols})
	bias := graph.NewTensor(graph.Float32, graph.Shape{cols})
	cond := graph.NewTensor(graph.Bool, graph.Shape{rows, cols})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range x.F32 {
		x.F32[i], y.F32[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		cond.B[i] = i%3 == 0
	}
	for i := range bias.F32 {
		bias.F32[i] = float32(rng.NormFloat64())
	}
	for _, c := range []struct {
		op string
		in []*graph.Tensor
	}{
		{"Add", []*graph.Tensor{x, y}}, {"Mul", []*graph.Tensor{x, bias}},
		{"Neg", []*graph.Tensor{x}}, {"Relu", []*graph.Tensor{x}}, {"Sigmoid", []*graph.Tensor{x}},
		{"Tanh", []*graph.Tensor{x}}, {"Softplus", []*graph.Tensor{x}}, {"Where", []*graph.Tensor{cond, x, y}},
	} {
		b.Run(c.op, func(b *testing.B) {
			out := graph.NewTensor(graph.Float32, graph.Shape{rows, cols})
			k := kernels[c.op]
			n := &graph.Node{Op: c.op}
			b.SetBytes(int64(4 * rows * cols * (len(c.in) + 1)))
			for b.Loop() {
				if err := k(n, c.in, []*graph.Tensor{out}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
