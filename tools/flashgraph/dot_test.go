package main

import (
	"bytes"
	"encoding/xml"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/graph/picture"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

// TestDotWritesByExtension: -o NAME.svg and NAME.png draw the picture,
// -o NAME.dot (and stdout) write the DOT, which is WriteDOTPair's text.
func TestDotWritesByExtension(t *testing.T) {
	dir := t.TempDir()
	stdout, _ := runCLI(t, "dot", "-fuse")
	files := map[string][]byte{}
	for _, name := range []string{"g.dot", "g.svg", "g.png", "G.SVG"} {
		path := filepath.Join(dir, name)
		runCLI(t, "dot", "-fuse", "-o", path)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	if !bytes.Equal(files["g.dot"], []byte(stdout)) {
		t.Error("dot -o g.dot differs from dot's stdout")
	}
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fused, err := passes.Default(true).Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := graph.WriteDOTPair(g, fused, "as built", "after fusion")
	if err != nil {
		t.Fatal(err)
	}
	if stdout != want {
		t.Error("dot -fuse's DOT is not WriteDOTPair's")
	}
	d, err := graph.NewDiagramPair(g, fused, "as built", "after fusion")
	if err != nil {
		t.Fatal(err)
	}
	svg, err := picture.SVG(d)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(files["g.svg"], svg) || !bytes.Equal(files["G.SVG"], svg) {
		t.Error("dot -o g.svg is not picture.SVG of the pair")
	}
	dec := xml.NewDecoder(bytes.NewReader(files["g.svg"]))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("g.svg is not XML: %v", err)
		}
	}
	if _, err := png.Decode(bytes.NewReader(files["g.png"])); err != nil {
		t.Errorf("g.png: %v", err)
	}
}
