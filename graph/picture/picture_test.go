package picture

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"os"
	"os/exec"
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

// checkSVG checks the SVG is well-formed XML and holds every node's label
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

// TestTinyPictures: the tiny model's diagram and its fused pair draw as
// SVG and PNG, the same bytes twice; the SVG is XML with every label, the
// fused node has the DOT's flash style, and the PNG decodes at full size.
func TestTinyPictures(t *testing.T) {
	g := buildModel(t, "tiny")
	fused, err := passes.Default(true).Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	single, err := graph.NewDiagram(g)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := graph.NewDiagramPair(g, fused, "as built", "after fusion")
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]*graph.Diagram{"single": single, "pair": pair} {
		svg, err := SVG(d)
		if err != nil {
			t.Fatal(err)
		}
		again, err := SVG(d)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(svg, again) {
			t.Errorf("%s: two SVGs of one diagram differ", name)
		}
		checkSVG(t, svg, d)
		p, err := PNG(d)
		if err != nil {
			t.Fatal(err)
		}
		p2, err := PNG(d)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p, p2) {
			t.Errorf("%s: two PNGs of one diagram differ", name)
		}
		img, err := png.Decode(bytes.NewReader(p))
		if err != nil {
			t.Fatalf("%s: the PNG does not decode: %v", name, err)
		}
		s, err := newScene(d)
		if err != nil {
			t.Fatal(err)
		}
		if b := img.Bounds(); PNGScale(s.w, s.h) != 1 || b.Dx() != int(math.Ceil(s.w)) || b.Dy() != int(math.Ceil(s.h)) {
			t.Errorf("%s: PNG %v for a %gx%g picture", name, b, s.w, s.h)
		}
		// The orange of FlashAttention (the DOT's fillcolor) is in the PNG
		// of the pair only.
		orange := color.RGBA{255, 165, 0, 255}
		has := false
		pal := img.(*image.Paletted)
		for _, px := range pal.Pix {
			if pal.Palette[px] == orange {
				has = true
				break
			}
		}
		if has != (name == "pair") {
			t.Errorf("%s: orange (FlashAttention) drawn: %v", name, has)
		}
	}
	svg, err := SVG(pair)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<g id="cluster_before">`, `<g id="cluster_after">`, `fill="#ffa500" stroke="#ff0000" stroke-width="2"`, "flashgraph.FlashAttention"} {
		if !bytes.Contains(svg, []byte(want)) {
			t.Errorf("the pair's SVG lacks %q", want)
		}
	}
}

// TestPictureErrors: a style the renderer does not know is an error naming
// it, not a wrong picture.
func TestPictureErrors(t *testing.T) {
	d := &graph.Diagram{Title: "x", Clusters: []*graph.DiagramCluster{{Nodes: []graph.DiagramNode{
		{ID: "n0", Style: map[string]string{"shape": "box", "style": "filled", "fillcolor": "chartreuse"}, Lines: []string{"a"}},
	}}}}
	if _, err := SVG(d); err == nil || !strings.Contains(err.Error(), "chartreuse") {
		t.Errorf("unknown colour: %v", err)
	}
	d.Clusters[0].Nodes[0].Style = map[string]string{"shape": "trapezium"}
	if _, err := PNG(d); err == nil || !strings.Contains(err.Error(), "trapezium") {
		t.Errorf("unknown shape: %v", err)
	}
	if _, err := SVG(&graph.Diagram{}); err == nil {
		t.Error("empty diagram: no error")
	}
}

// TestGPT2Pictures renders gpt2's forward graph, its fused pair and its
// training step (thousands of nodes) within a time bound, and checks the
// SVG. Measured on a shared 2-core machine (SVG, PNG): forward 0.04 s,
// 0.4 s; fused pair 0.05 s, 0.4 s; training step (3853 nodes) 1.6 s, 1.9 s.
// The bounds leave room for a loaded machine.
func TestGPT2Pictures(t *testing.T) {
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
		name  string
		g     *graph.Graph
		pair  bool
		bound time.Duration
	}{{"gpt2 forward", g, false, 5 * time.Second}, {"gpt2 fused pair", fused, true, 5 * time.Second}, {"gpt2 training step", ts.Graph, false, 20 * time.Second}} {
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
		start = time.Now()
		p, err := PNG(d)
		if err != nil {
			t.Fatal(err)
		}
		elPNG := time.Since(start)
		n := 0
		for _, cl := range d.Clusters {
			n += len(cl.Nodes)
		}
		t.Logf("%s: %d nodes, SVG %d bytes in %v, PNG %d bytes in %v", c.name, n, len(svg), el, len(p), elPNG)
		if el > c.bound || elPNG > c.bound {
			t.Errorf("%s: SVG took %v, PNG %v; bound %v", c.name, el, elPNG, c.bound)
		}
		checkSVG(t, svg, d)
	}
}

const pictureChildEnv = "FLASHGRAPH_PICTURE_HASH_CHILD"

// pictureHash is the sha256 of the SVG and PNG of tiny's fused pair.
func pictureHash(t testing.TB) string {
	g := buildModel(t, "tiny")
	fused, err := passes.Default(true).Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := graph.NewDiagramPair(g, fused, "as built", "after fusion")
	if err != nil {
		t.Fatal(err)
	}
	svg, err := SVG(d)
	if err != nil {
		t.Fatal(err)
	}
	p, err := PNG(d)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	h.Write(svg)
	h.Write(p)
	return hex.EncodeToString(h.Sum(nil))
}

// TestPictureHashChild only runs as the subprocess of
// TestPicturesAcrossProcesses.
func TestPictureHashChild(t *testing.T) {
	if os.Getenv(pictureChildEnv) != "1" {
		t.Skip("runs as a subprocess of TestPicturesAcrossProcesses")
	}
	fmt.Printf("picturehash=%s\n", pictureHash(t))
}

// TestPicturesAcrossProcesses compares the pictures two fresh processes
// (fresh map seeds, fresh addresses) draw with this one's.
func TestPicturesAcrossProcesses(t *testing.T) {
	if os.Getenv(pictureChildEnv) == "1" {
		t.Skip("already the child")
	}
	want := pictureHash(t)
	for i := range 2 {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestPictureHashChild$", "-test.count", "1")
		cmd.Env = append(os.Environ(), pictureChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, out)
		}
		_, after, ok := strings.Cut(string(out), "picturehash=")
		if !ok {
			t.Fatalf("child %d printed no hash:\n%s", i, out)
		}
		if got := strings.Fields(after)[0]; got != want {
			t.Errorf("child %d: picture hash %s, this process %s", i, got, want)
		}
	}
}
