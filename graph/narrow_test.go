package graph

import (
	"strings"
	"testing"
)

func TestNarrowInts(t *testing.T) {
	for name, r := range map[string][2]int64{"int8": {-128, 127}, "uint8": {0, 255}, "int16": {-32768, 32767},
		"uint16": {0, 65535}, "int32": {-1 << 31, 1<<31 - 1}, "uint32": {0, 1<<32 - 1},
		"uint64": {0, 1<<63 - 1}} {
		lo, hi, ok := NarrowIntRange(name)
		if !ok || lo != r[0] || hi != r[1] {
			t.Errorf("%s: [%d, %d] %v", name, lo, hi, ok)
		}
	}
	if _, _, ok := NarrowIntRange("int64"); ok {
		t.Error("int64 is not narrow")
	}
	x := NewTensor(Int64, Shape{2})
	x.I64[0], x.I64[1] = 255, 256
	if err := CheckNarrow(x, "uint8"); err == nil || !strings.Contains(err.Error(), "element 1 is 256") {
		t.Errorf("CheckNarrow: %v", err)
	}
	if err := CheckNarrow(x, "int16"); err != nil {
		t.Error(err)
	}
	// A uint64 at or above 2^63 (an int64 below 0 once reinterpreted) is
	// outside what the graph holds.
	x.I64[1] = -1
	if err := CheckNarrow(x, "uint64"); err == nil || !strings.Contains(err.Error(), "element 1 is -1") {
		t.Errorf("CheckNarrow uint64: %v", err)
	}

	// Clone keeps the declared types; Bind checks a bound value against them.
	b := NewBuilder("n")
	in := b.Input("x", Int64, 2)
	b.Output(b.Rename(b.Op("Identity", nil, in), "y"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	g.ElemTypes = map[string]string{"x": "uint8", "y": "uint8"}
	if c := g.Clone(); c.ElemTypes["x"] != "uint8" || len(c.ElemTypes) != 2 {
		t.Errorf("Clone: %v", c.ElemTypes)
	}
	if _, err := Bind(g, "x", x); err == nil || !strings.Contains(err.Error(), "declared uint8") {
		t.Errorf("Bind out of range: %v", err)
	}
	x.I64[1] = 3
	if _, err := Bind(g, "x", x); err != nil {
		t.Error(err)
	}
}
