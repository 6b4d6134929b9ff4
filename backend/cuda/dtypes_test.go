package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// A graph with a string value is refused before planning or lowering, with
// an error that wraps backend.ErrUnsupported and names the dtype; it needs
// no GPU, since the memory plan refuses it too.
func TestStringGraphRefused(t *testing.T) {
	b := graph.NewBuilder("s")
	x := b.Input("x", graph.Float32, 3)
	b.Output(b.Op("Cast", graph.Attrs{"to": graph.Str("string")}, x))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	err = CheckDTypes(g)
	if err == nil || !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), "dtype string is not supported on CUDA") {
		t.Fatalf("CheckDTypes = %v; want an ErrUnsupported naming dtype string", err)
	}
	if _, err := PlanMemory(g); err == nil || !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("PlanMemory = %v; want the same refusal", err)
	}
	// A string op with no kernel: the dtype is named, not the op.
	b = graph.NewBuilder("n")
	w := b.Const("w", graph.String, graph.Shape{2}, graph.LiteralStrings("a", "B"))
	b.Output(b.Op("StringNormalizer", graph.Attrs{"case_change_action": graph.Str("UPPER")}, w))
	g, err = b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDTypes(g); err == nil || !strings.Contains(err.Error(), `value "w" is a string tensor`) {
		t.Fatalf("CheckDTypes = %v; want the const w named", err)
	}
}
