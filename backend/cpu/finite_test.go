package cpu

import (
	"errors"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/backendtest"
	"github.com/flashgraph/flashgraph/graph"
)

// With CheckFinite, Run names the first node that makes a non-finite value
// from inputs without one: here Sqrt of a negative number, not the Mul and
// Add after it that only pass the NaN on, and not the Add that reads an
// infinity the graph was given.
func TestCheckFiniteNamesTheFirstNode(t *testing.T) {
	g, sqrt, err := backendtest.NonFiniteGraph()
	if err != nil {
		t.Fatal(err)
	}
	feeds := backendtest.NonFiniteFeeds()
	// Without the check the run succeeds with a NaN in its output.
	out, err := compile(t, g, backend.Options{}).Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	if v := out[g.Outputs[0].Name].At(2); v == v {
		t.Fatalf("output[2] = %v, want NaN", v)
	}

	_, err = compile(t, g, backend.Options{CheckFinite: true}).Run(feeds)
	var nf *backend.NonFiniteError
	if !errors.As(err, &nf) {
		t.Fatalf("CheckFinite run: %v, want a NonFiniteError", err)
	}
	if nf.Node != sqrt.Name || nf.Op != "Sqrt" || nf.Out.NaN != 1 || nf.Out.Len != 4 {
		t.Errorf("named %s (%s) with %+v, want %s (Sqrt) with 1 NaN of 4", nf.Node, nf.Op, nf.Out, sqrt.Name)
	}
	if len(nf.Inputs) != 1 || !nf.Inputs[0].Finite() || !strings.Contains(nf.Inputs[0].Kind, "(Neg)") {
		t.Errorf("inputs %+v, want one finite output of the Neg", nf.Inputs)
	}
	for _, s := range []string{sqrt.Name, "(Sqrt)", "1 NaN of 4", "finite"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}

	// Finite data: the checked run gives the unchecked run's outputs.
	feeds["x"] = tensorOf(graph.Float32, graph.Shape{4}, -1, -2, -3, -4)
	out, err = compile(t, g, backend.Options{CheckFinite: true}).Run(feeds)
	if err != nil {
		t.Fatalf("finite run with CheckFinite: %v", err)
	}
	if v := out[g.Outputs[0].Name].At(3); v != 12 { // sqrt(4·4)·4 - 4
		t.Errorf("output[3] = %v, want 12", v)
	}
}
