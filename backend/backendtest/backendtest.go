// Package backendtest is the conformance suite every backend runs: each op
// of the op table on small random graphs, the gradient and optimizer ops,
// FlashAttention against a naive S×S attention, the composed attention block
// and a small model and training step. Results are compared element by
// element with the op table's float64 reference (each op's Eval, run through
// graph.Eval; ref.go adapts it to the suite's arrays), as
// |got − ref| ≤ atol + rtol·|ref|, after running with PoisonOutputs so that
// an element a kernel forgets to write shows up as NaN.
//
// A backend's test calls Run:
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, cpu.New, backendtest.DefaultTolerances())
//	}
package backendtest

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// Tol is one comparison tolerance: |got − ref| ≤ Atol + Rtol·|ref|.
type Tol struct{ Atol, Rtol float64 }

// Tolerances gives the tolerance for each float dtype a backend computes;
// the float dtypes listed are the ones the suite runs (cases that use only
// int64 and bool run regardless). Int64 and bool outputs are always compared
// exactly.
type Tolerances map[graph.DType]Tol

// DefaultTolerances fits a backend that computes float32 in float32 (GEMM
// sums of up to ~100 products), float64 in float64, and bfloat16/float16 in
// float32 with each op's outputs rounded to the narrow type: half an ulp
// (2⁻⁸ relative for bfloat16, 2⁻¹¹ for float16; for float16 subnormals 2⁻²⁵
// absolute) plus float32 compute error, which is the Float32 tolerance
// itself. The absolute part matters where an op cancels: FlashAttentionGrad's
// dS = P·(dP − D) subtracts two float32 dot products, so a dQ that is exactly 0
// (a causal row that sees one key) comes out as ±1e-7-ish from a backend whose
// two sums run in different orders (the CUDA kernels), which a correctly
// rounded narrow-type bound alone would wrongly call a bug. A backend without
// a dtype deletes its entry.
func DefaultTolerances() Tolerances {
	f32 := Tol{Atol: 1e-5, Rtol: 1e-5}
	return Tolerances{
		graph.Float32:  f32,
		graph.Float64:  {Atol: 1e-12, Rtol: 1e-12},
		graph.BFloat16: {Atol: f32.Atol, Rtol: 1.0/256 + f32.Rtol},
		graph.Float16:  {Atol: f32.Atol, Rtol: 1.0/2048 + f32.Rtol},
	}
}

// floatDTypes returns the tested float dtypes in a fixed order.
func (tol Tolerances) floatDTypes() []graph.DType {
	var out []graph.DType
	for _, dt := range []graph.DType{graph.Float32, graph.Float64, graph.BFloat16, graph.Float16} {
		if _, ok := tol[dt]; ok {
			out = append(out, dt)
		}
	}
	return out
}

// opCase is one small graph around one op. fn declares inputs, builds the
// graph and states the expected outputs through the ctx.
type opCase struct {
	op   string
	name string
	// dts, when set, are the only dtypes the case runs with (an int64 or
	// bool case); otherwise it runs with every tested float dtype.
	dts []graph.DType
	fn  func(c *ctx)
}

// Run runs the conformance suite against the backends newBackend makes.
func Run(t *testing.T, newBackend func() backend.Backend, tol Tolerances) {
	if len(tol.floatDTypes()) == 0 {
		t.Fatal("backendtest: Tolerances lists no float dtype to test")
	}
	be := newBackend()
	defer be.Close()
	cases := opCases()
	t.Run("coverage", func(t *testing.T) {
		have := map[string]bool{}
		for _, c := range cases {
			if _, ok := graph.LookupOp(c.op); !ok {
				t.Errorf("case %s/%s is for op %s, which the op table does not have", c.op, c.name, c.op)
			}
			have[c.op] = true
		}
		for _, s := range graph.Ops() {
			if !have[s.Name] {
				t.Errorf("op %s has no conformance case", s.QualifiedName())
			}
		}
	})
	for _, oc := range cases {
		dts := oc.dts
		if dts == nil {
			dts = tol.floatDTypes()
		}
		for _, dt := range dts {
			t.Run(oc.op+"/"+oc.name+"/"+dt.String(), func(t *testing.T) {
				runCase(t, be, dt, tol, oc.op+"/"+oc.name, oc.fn)
			})
		}
	}
	for _, gc := range graphCases() {
		for _, dt := range tol.floatDTypes() {
			if gc.skip != nil {
				if why := gc.skip(dt); why != "" {
					continue
				}
			}
			t.Run("graph/"+gc.name+"/"+dt.String(), func(t *testing.T) {
				runCase(t, be, dt, tol, "graph/"+gc.name, gc.fn)
			})
		}
	}
	t.Run("training_step", func(t *testing.T) { trainingStep(t, be, tol) })
}

// ctx builds one test graph with its feeds and expected outputs.
type ctx struct {
	t     *testing.T
	dt    graph.DType
	b     *graph.Builder
	rng   *rand.Rand
	feeds map[string]*graph.Tensor
	want  []expect
	tol   Tol // the case dtype's tolerance
	// wantText are string outputs and their expected text (string_cases.go).
	wantText []expectText
}

type expect struct {
	v   *graph.Value
	ref *arr
	tol Tol
}

// newRand seeds a case's inputs from its name, so that a failure reproduces
// and cases do not share inputs.
func newRand(name string, dt graph.DType) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%v", name, dt)
	return rand.New(rand.NewPCG(h.Sum64(), 7))
}

func runCase(t *testing.T, be backend.Backend, dt graph.DType, tol Tolerances, name string, fn func(c *ctx)) {
	c := &ctx{t: t, dt: dt, b: graph.NewBuilder("case"), rng: newRand(name, dt),
		feeds: map[string]*graph.Tensor{}}
	if tt, ok := tol[dt]; ok {
		c.tol = tt
	} else {
		c.tol = tol[tol.floatDTypes()[0]] // int/bool-only case: floats, if any, are exact
	}
	fn(c)
	for _, w := range c.want {
		c.b.Output(w.v)
	}
	for _, w := range c.wantText {
		c.b.Output(w.v)
	}
	g, err := c.b.Build()
	if err != nil {
		t.Fatalf("building the case graph: %v", err)
	}
	exe, err := be.Compile(g, backend.Options{PoisonOutputs: true})
	if err != nil && errors.Is(err, backend.ErrUnsupported) && be.Name() != "cpu" {
		// An op this backend has no kernel for yet (the CPU backend has all).
		t.Skipf("compile: %v", err)
	}
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	defer exe.Close()
	out, err := exe.Run(c.feeds)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, w := range c.want {
		got, ok := out[w.v.Name]
		if !ok {
			t.Errorf("output %s missing", w.v.Name)
			continue
		}
		compare(t, w.v.Name, got, w.v.Type, w.ref, w.tol)
	}
	for _, w := range c.wantText {
		compareText(t, w, out[w.v.Name])
	}
	// A second run on the same feeds must give the same bits: kernels are
	// deterministic (no racy reductions, no state left behind).
	again, err := exe.Run(c.feeds)
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	for _, w := range c.want {
		if a, b := out[w.v.Name], again[w.v.Name]; a != nil && b != nil && !sameBits(a, b) {
			t.Errorf("output %s differs between two runs on the same inputs", w.v.Name)
		}
	}
}

func roundFn(dt graph.DType) func(float32) float32 {
	switch dt {
	case graph.BFloat16:
		return graph.RoundBF16
	case graph.Float16:
		return graph.RoundF16
	}
	return nil
}

func sameBits(a, b *graph.Tensor) bool {
	if a.DType == graph.String || b.DType == graph.String {
		return slices.Equal(a.S, b.S)
	}
	for i := range a.Len() {
		x, y := a.At(i), b.At(i)
		if math.Float64bits(x) != math.Float64bits(y) && !(math.IsNaN(x) && math.IsNaN(y)) {
			return false
		}
	}
	return true
}

// compare checks a backend output against the reference, element by element.
func compare(t *testing.T, name string, got *graph.Tensor, typ graph.TensorType, ref *arr, tol Tol) {
	t.Helper()
	if !got.Type().Equal(typ) {
		t.Errorf("%s: got a %v tensor, the graph says %v", name, got.Type(), typ)
		return
	}
	if err := got.Check(); err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	if !slices.Equal(ref.shape, []int(typ.Shape)) {
		t.Fatalf("%s: test bug: reference shape %v, graph says %v", name, ref.shape, typ.Shape)
	}
	exact := !typ.DType.IsFloat()
	bad := 0
	// Narrow floats are held as float32 values already rounded to their
	// type; an unrounded value would be a different number on a device.
	if narrow := roundFn(typ.DType); narrow != nil {
		for i, v := range got.F32 {
			if narrow(v) != v && v == v {
				t.Errorf("%s%v: %v is not a %v value", name, unravel(i, ref.shape), v, typ.DType)
				return
			}
		}
	}
	for i, r := range ref.data {
		g := got.At(i)
		var ok bool
		if narrow := roundFn(typ.DType); narrow != nil && !math.IsInf(r, 0) && math.IsInf(float64(narrow(float32(r))), 0) {
			r = float64(narrow(float32(r))) // beyond the type's range: the value is ±Inf
		}
		switch {
		case exact:
			ok = g == r
		case math.IsNaN(r):
			ok = math.IsNaN(g)
		case math.IsInf(r, 0):
			ok = g == r
		default:
			ok = math.Abs(g-r) <= tol.Atol+tol.Rtol*math.Abs(r)
		}
		if !ok {
			if bad < 5 {
				t.Errorf("%s%v: got %v, want %v (|diff| %.3g, allowed %.3g)", name, unravel(i, ref.shape), g, r,
					math.Abs(g-r), tol.Atol+tol.Rtol*math.Abs(r))
			}
			bad++
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d elements out of tolerance", name, bad, len(ref.data))
	}
}

// Input generators.
type gen func(r *rand.Rand) float64

func normal(r *rand.Rand) float64 { return r.NormFloat64() }

// positive values in [0.1, 4): Log, Sqrt, Pow bases.
func positive(r *rand.Rand) float64 { return 0.1 + 3.9*r.Float64() }

// awayFromZero: |x| in [0.5, 2.5): denominators.
func awayFromZero(r *rand.Rand) float64 {
	x := 0.5 + 2*r.Float64()
	if r.IntN(2) == 0 {
		return -x
	}
	return x
}

// fewValues draws from a small set so that Equal finds equal pairs.
func fewValues(r *rand.Rand) float64 { return float64(r.IntN(4)) - 1.5 }

func ints(lo, hi int) gen {
	return func(r *rand.Rand) float64 { return float64(lo + r.IntN(hi-lo)) }
}

func coin(r *rand.Rand) float64 { return float64(r.IntN(2)) }

func scaled(s float64, g gen) gen { return func(r *rand.Rand) float64 { return s * g(r) } }

// input declares a graph input of type dt filled from g (rounded to dt) and
// returns it with its reference data (the rounded values).
func (c *ctx) input(dt graph.DType, g gen, shape ...int) (*graph.Value, *arr) {
	name := fmt.Sprintf("in%d", len(c.feeds))
	v := c.b.Input(name, dt, shape...)
	t := graph.NewTensor(dt, graph.Shape(shape))
	for i := range t.Len() {
		t.Set(i, g(c.rng))
	}
	c.feeds[name] = t
	return v, fromTensor(t)
}

// rand returns random reference data of dtype dt without declaring an input.
func (c *ctx) rand(dt graph.DType, g gen, shape ...int) *arr {
	t := graph.NewTensor(dt, graph.Shape(shape))
	for i := range t.Len() {
		t.Set(i, g(c.rng))
	}
	return fromTensor(t)
}

// x declares an input of the case dtype with normal values.
func (c *ctx) x(shape ...int) (*graph.Value, *arr) { return c.input(c.dt, normal, shape...) }

// param declares a param and returns its materialised reference data.
func (c *ctx) param(name string, dt graph.DType, shape graph.Shape, init graph.Init) (*graph.Value, *arr) {
	v := c.b.Param(name, dt, shape, init)
	t, err := init.Materialize(graph.TensorType{DType: dt, Shape: shape})
	if err != nil {
		c.t.Fatalf("param %s: %v", name, err)
	}
	return v, fromTensor(t)
}

// expect makes v a graph output that must match ref (values rounded to v's
// dtype first, as the graph's type requires).
func (c *ctx) expect(v *graph.Value, ref *arr) {
	if c.b.Err() != nil {
		c.t.Fatalf("building the case graph: %v", c.b.Err())
	}
	r := &arr{shape: ref.shape, data: make([]float64, len(ref.data))}
	for i, x := range ref.data {
		r.data[i] = x
		if !v.Type.DType.IsFloat() {
			r.data[i] = roundTo(v.Type.DType, x)
		}
	}
	c.want = append(c.want, expect{v: v, ref: r, tol: c.tol})
}

func (c *ctx) op(op string, attrs graph.Attrs, ins ...*graph.Value) *graph.Value {
	return c.b.Op(op, attrs, ins...)
}

func (c *ctx) opN(op string, attrs graph.Attrs, ins ...*graph.Value) []*graph.Value {
	return c.b.OpN(op, attrs, ins...)
}

// tensorFrom turns reference data into a tensor of dt (a feed made from a
// reference result, e.g. FlashAttentionGrad's Y and L).
func tensorFrom(dt graph.DType, a *arr) *graph.Tensor {
	t := graph.NewTensor(dt, graph.Shape(a.shape))
	for i, v := range a.data {
		t.Set(i, v)
	}
	return t
}

// feed declares an input whose data is given (rounded to dt).
func (c *ctx) feed(dt graph.DType, a *arr) (*graph.Value, *arr) {
	name := fmt.Sprintf("in%d", len(c.feeds))
	v := c.b.Input(name, dt, a.shape...)
	t := tensorFrom(dt, a)
	c.feeds[name] = t
	return v, fromTensor(t)
}
