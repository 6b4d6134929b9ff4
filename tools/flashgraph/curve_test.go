package main

import (
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// The noise sample of bench -train -curve moves every parameter element by
// exactly ±rel relative, with both signs, and leaves constants alone.
func TestPerturbParams(t *testing.T) {
	b := graph.NewBuilder("p")
	x := b.Input("x", graph.Float32, 4)
	w := b.Param("w", graph.Float32, graph.Shape{4}, graph.Normal(1, 3))
	c := b.Const("c", graph.Float32, graph.Shape{4}, graph.Ones())
	b.Output(b.Mul(b.Mul(x, w), c))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	before, _ := exe.Initializer("w")
	const rel = 0x1p-9
	if err := perturbParams(exe, g, rel); err != nil {
		t.Fatal(err)
	}
	after, _ := exe.Initializer("w")
	signs := map[bool]int{}
	for i := range 4 {
		r := after.At(i)/before.At(i) - 1
		if math.Abs(math.Abs(r)-rel) > 1e-6 {
			t.Errorf("w[%d]: moved by %g relative, want ±%g", i, r, rel)
		}
		signs[r > 0]++
	}
	if signs[true] == 0 || signs[false] == 0 {
		t.Errorf("all four elements moved the same way: %v", signs)
	}
	if cv, _ := exe.Initializer("c"); cv.At(0) != 1 {
		t.Errorf("the constant moved: %v", cv.At(0))
	}
}
