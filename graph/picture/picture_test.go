package picture

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

func buildModel(t testing.TB, name string) *graph.Graph {
	t.Helper()
	cfg, err := model.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// labelsIn checks the SVG is well-formed XML and holds every node's label
// lines as text.
func checkSVG(t *testing.T, svg []byte, d *graph.Diagram) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	var text strings.Builder
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not XML: %v", err)
		}
		if cd, ok := tok.(xml.CharData); ok {
			text.Write(cd)
			text.WriteByte('\n')
		}
	}
	all := text.String()
	for _, c := range d.Clusters {
		for _, n := range c.Nodes {
			for _, l := range n.Lines {
				if !strings.Contains(all, l) {
					t.Fatalf("the SVG lacks %s's label line %q", n.ID, l)
				}
			}
		}
	}
}

// TestSVGTiming renders gpt2's forward graph, its fused pair and its
// training graph within a bound, twice each: the same bytes.
func TestSVGTiming(t *testing.T) {
	if testing.Short() {
		t.Skip("gpt2 graphs: not in -short")
	}
	g := buildModel(t, "gpt2")
	fused, err := passes.Default(true).Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := autodiff.TrainingGraph(g, autodiff.TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		g    *graph.Graph
		pair bool
	}{{"gpt2 forward", g, false}, {"gpt2 fused pair", fused, true}, {"gpt2 training step", ts.Graph, false}} {
		d, err := graph.NewDiagram(c.g)
		if c.pair {
			d, err = graph.NewDiagramPair(g, c.g, "as built", "after fusion")
		}
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		svg, err := SVG(d)
		if err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		t.Logf("%s: %d nodes, SVG %d bytes in %v", c.name, len(d.Clusters[0].Nodes), len(svg), el)
		checkSVG(t, svg, d)
	}
}
