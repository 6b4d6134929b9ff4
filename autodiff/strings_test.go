package autodiff

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// A loss that depends on a param through text (a Cast to string and back)
// is refused, naming the string value, rather than given a zero gradient.
func TestGradientsRefuseText(t *testing.T) {
	b := graph.NewBuilder("text")
	w := b.Param("w", graph.Float32, graph.Shape{3}, graph.Ones())
	s := b.Op("Cast", graph.Attrs{"to": graph.Str("string")}, w)
	back := b.Op("Cast", graph.Attrs{"to": graph.Str("float32")}, s)
	loss := b.Op("ReduceSum", graph.Attrs{"keepdims": graph.Int(0)}, b.Mul(back, w))
	b.Output(loss)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = Gradients(g, loss.Name, []string{"w"})
	if err == nil || !strings.Contains(err.Error(), "through the string value "+s.Name) {
		t.Fatalf("Gradients = %v; want a refusal naming %s", err, s.Name)
	}
}
