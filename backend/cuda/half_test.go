package cuda

import (
	"math"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

func TestHalfConversions(t *testing.T) {
	// Every finite 16-bit pattern survives a round trip through float32, and the
	// midpoint between two neighbours rounds to the even one.
	for _, c := range []struct {
		name     string
		to       func(uint16) float32
		from     func(float32) uint16
		maxFinit uint16
	}{
		{"bf16", BF16ToFloat32, BF16FromFloat32, 0x7f7f},
		{"f16", F16ToFloat32, F16FromFloat32, 0x7bff},
	} {
		for _, sign := range []uint16{0, 0x8000} {
			for h := uint16(0); h <= c.maxFinit; h++ {
				x := sign | h
				f := c.to(x)
				if got := c.from(f); got != x {
					t.Fatalf("%s: %#04x -> %v -> %#04x", c.name, x, f, got)
				}
				if h == c.maxFinit {
					break
				}
				next := c.to(x + 1)
				mid := float32((float64(f) + float64(next)) / 2) // exact in float32
				want := x
				if x&1 == 1 {
					want = x + 1
				}
				if got := c.from(mid); got != want {
					t.Fatalf("%s: midpoint of %#04x and %#04x (%v) rounds to %#04x, want %#04x", c.name, x, x+1, mid, got, want)
				}
			}
		}
		inf := float32(math.Inf(1))
		if got := c.to(c.from(inf)); !math.IsInf(float64(got), 1) {
			t.Errorf("%s: +Inf -> %v", c.name, got)
		}
		if got := c.to(c.from(float32(math.NaN()))); !math.IsNaN(float64(got)) {
			t.Errorf("%s: NaN -> %v", c.name, got)
		}
		if got := c.to(c.from(3e38)); !math.IsInf(float64(got), 1) && c.name == "f16" {
			t.Errorf("%s: 3e38 -> %v, want +Inf", c.name, got)
		}
	}
	if got := graph.F16ToFloat32(graph.F16FromFloat32(1e-9)); got != 0 {
		t.Errorf("f16: 1e-9 -> %v, want 0", got)
	}
	if got := graph.BF16ToFloat32(graph.BF16FromFloat32(1.0 + 1.0/256)); got != 1 {
		t.Errorf("bf16: 1+2^-8 (a tie) -> %v, want 1 (even)", got)
	}
}
