package graph

import "testing"

func TestGradientReach(t *testing.T) {
	b := NewBuilder("reach")
	x := b.Input("x", Float32, 2, 3)
	w := b.Param("w", Float32, Shape{3}, Ones())
	mask := b.Param("mask", Float32, Shape{3}, Ones())
	pos := b.Param("pos", Float32, Shape{2}, Ones())
	table := b.Param("table", Float32, Shape{4, 3}, Ones())
	unused := b.Param("other", Float32, Shape{3}, Ones())
	cond := b.Op("Cast", Attrs{"to": Str("bool")}, mask)
	idx := b.Op("Cast", Attrs{"to": Str("int64")}, pos)
	y := b.Op("Where", nil, cond, b.Mul(x, w), b.Gather(table, idx, 0))
	b.Output(y, b.Op("Cast", Attrs{"to": Str("int64")}, unused))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	r := GradientReach(g, nil)
	for _, p := range g.Params {
		want := p.Name == "w" || p.Name == "table"
		if r[p] != want {
			t.Errorf("%s: reached %v, want %v", p.Name, r[p], want)
		}
	}
	if !r[x] {
		t.Error("the float input x is reached")
	}
}
