package passes

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Compile-time evaluation holds at most maxConstHeld elements: a value that
// would take it past the limit is not computed (no allocation), and the
// reason names the value, its type, its size and the node that makes it.
func TestConstEvalHoldsBounded(t *testing.T) {
	b := graph.NewBuilder("masks")
	x := b.Input("x", graph.Float32, 8, 8)
	c := b.Const("c", graph.Float32, graph.Shape{8, 8}, graph.Ones())
	y := b.Add(c, c)
	b.Output(b.Mul(x, y))
	if _, err := b.Build(); err != nil {
		t.Fatal(err)
	}

	ce := newConstEval()
	got, err := ce.eval(y)
	if err != nil || got.At(63) != 2 || ce.held != 128 {
		t.Fatalf("within the limit: %v, %v, held %d (want 2 and 128)", got, err, ce.held)
	}

	ce = newConstEval()
	ce.held = maxConstHeld - 100 // the const fits, the Add's result does not
	_, err = ce.eval(y)
	if err == nil {
		t.Fatal("computed past the limit")
	}
	for _, want := range []string{y.Name, "float32[8,8]", "64 elements", y.Producer.Name, "(Add)", "at most 67108864"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if ce.held != maxConstHeld-100+64 {
		t.Errorf("held %d after the refusal, want the const's 64 only", ce.held-(maxConstHeld-100))
	}
}
