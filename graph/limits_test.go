package graph

import (
	"strings"
	"testing"
)

// TestParseInitElementsBounded: recipes that declare more than
// MaxInitElements in total are refused at parse time, naming the value; a
// graph just under the bound parses (nothing is materialised by Parse).
func TestParseInitElementsBounded(t *testing.T) {
	head := "flashgraph 1\ngraph g\n"
	under := head + "param w: float32[65536,131072] = normal(seed=1, std=0.02)\n" + // 2^33
		"const c: float32[65536,131072] = zeros()\n" + // 2^34 in all
		"input x: float32[2]\nnode n = Neg(x) -> y: float32[2]\noutput y\n"
	if _, err := Parse(under); err != nil {
		t.Fatalf("a graph declaring exactly MaxInitElements: %v", err)
	}
	over := head + "param w: float32[65536,131072] = normal(seed=1, std=0.02)\n" +
		"const c: float32[65536,131072] = zeros()\n" +
		"const d: float32[1] = zeros()\n" +
		"input x: float32[2]\nnode n = Neg(x) -> y: float32[2]\noutput y\n"
	_, err := Parse(over)
	if err == nil || !strings.Contains(err.Error(), "const d") || !strings.Contains(err.Error(), "graph.MaxInitElements") {
		t.Fatalf("want an error naming const d and the limit, got %v", err)
	}
}
