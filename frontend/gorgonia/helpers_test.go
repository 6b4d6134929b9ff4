package gorgonia

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// rtol64 is the float64 agreement asked of every translation: gorgonia and
// the CPU backend compute the same functions with float64 rounding.
const rtol64 = 1e-12

func must(n *G.Node, err error) *G.Node {
	if err != nil {
		panic(err)
	}
	return n
}

// randData returns n values, normal with standard deviation std.
func randData(rng *rand.Rand, n int, std float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = std * rng.NormFloat64()
	}
	return out
}

func dense(shape []int, data []float64) *tensor.Dense {
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(data))
}

func dense32(shape []int, data []float64) *tensor.Dense {
	f := make([]float32, len(data))
	for i, x := range data {
		f[i] = float32(x)
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
}

// runGorgonia runs g on gorgonia's TapeMachine with the values bound now
// and returns the outputs' values, copied.
func runGorgonia(t *testing.T, g *G.ExprGraph, outs []*G.Node) []*graph.Tensor {
	t.Helper()
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatalf("gorgonia run: %v", err)
	}
	res := make([]*graph.Tensor, len(outs))
	for i, o := range outs {
		v, err := ToTensor(o.Value())
		if err != nil {
			t.Fatalf("gorgonia output %d (%s): %v", i, o.Name(), err)
		}
		res[i] = v
	}
	return res
}

// runCPU runs an imported graph on the CPU backend (outputs poisoned with
// NaN first, so an unwritten element shows) and returns its outputs in order.
func runCPU(t *testing.T, g *graph.Graph, feeds map[string]*graph.Tensor) []*graph.Tensor {
	t.Helper()
	exe, err := cpu.New().Compile(g, backend.Options{PoisonOutputs: true})
	if err != nil {
		t.Fatalf("cpu compile: %v", err)
	}
	defer exe.Close()
	res, err := exe.Run(feeds)
	if err != nil {
		t.Fatalf("cpu run: %v", err)
	}
	out := make([]*graph.Tensor, len(g.Outputs))
	for i, o := range g.Outputs {
		if out[i] = res[o.Name]; out[i] == nil {
			t.Fatalf("cpu run: no output %s", o.Name)
		}
	}
	return out
}

// assertClose checks |got − want| ≤ rtol·|want| element by element (so a
// zero must be exactly zero), with equal types.
func assertClose(t *testing.T, what string, got, want *graph.Tensor, rtol float64) {
	t.Helper()
	if !got.Type().Equal(want.Type()) {
		t.Fatalf("%s: got %v, want %v", what, got.Type(), want.Type())
	}
	bad := 0
	for i := range want.Len() {
		g, w := got.At(i), want.At(i)
		if g == w || math.Abs(g-w) <= rtol*math.Abs(w) {
			continue
		}
		if bad < 5 {
			t.Errorf("%s[%d]: got %.17g, want %.17g (rel %.3g)", what, i, g, w, math.Abs(g-w)/math.Abs(w))
		}
		bad++
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d elements differ by more than %g relative", what, bad, want.Len(), rtol)
	}
}

// checkAgainstGorgonia imports outs of g, runs the import on the CPU with the
// values bound in gorgonia now, runs gorgonia, and compares.
func checkAgainstGorgonia(t *testing.T, g *G.ExprGraph, outs []*G.Node, opts Options, rtol float64) *graph.Graph {
	t.Helper()
	fg, names, err := ImportWithNames(g, outs, opts)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	feeds, err := Feeds(fg, names)
	if err != nil {
		t.Fatalf("feeds: %v", err)
	}
	got := runCPU(t, fg, feeds)
	want := runGorgonia(t, g, outs)
	for i, o := range outs {
		// The import follows gorgonia's static shapes. Gorgonia's values can
		// disagree with them between vector shapes ((4) for a node typed
		// (1, 4)); the data is the same, so it is compared as the node's type.
		if s := graph.Shape(o.Shape()); !want[i].Shape.Equal(s) && want[i].Len() == s.Numel() {
			t.Logf("%s: gorgonia computed a %v value for a node typed %v", fg.Outputs[i].Name, want[i].Shape, s)
			want[i].Shape = s.Clone()
		}
		assertClose(t, fg.Outputs[i].Name, got[i], want[i], rtol)
	}
	return fg
}
