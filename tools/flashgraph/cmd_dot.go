package main

import (
	"io"
	"path/filepath"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/graph/picture"
	"github.com/flashgraph/flashgraph/train"
)

func init() {
	register(&command{name: "dot", summary: "write the DOT diagram of a graph, or draw it (-o g.svg, g.png; -fuse: before and after side by side)", run: runDot})
}

func runDot(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dot", "[FILE]",
		"Writes the Graphviz DOT diagram of the model of -config (or of FILE). With -fuse, the graph\n"+
			"before and after the fusion pipeline side by side. -o NAME.svg or NAME.png draws the\n"+
			"picture itself (no Graphviz needed; hover a node in the SVG for what it computes, an\n"+
			"edge for its value; a PNG too large for its size limit is scaled down without labels);\n"+
			"any other -o name, or stdout, gets DOT.", stderr)
	mf := addModelFlags(fs, defaultConfig, true)
	addBoundaryFlags(fs, mf)
	pf := addPassFlags(fs, false)
	out := fs.String("o", "", "output file: .svg or .png draws the picture, anything else is DOT (default stdout)")
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	g, err := mf.load(fs.Arg(0))
	if err != nil {
		return err
	}
	var d *graph.Diagram
	if pf.fuse.on || pf.passList != "" {
		after, err := pf.compileGraph(fs, g, stderr)
		if err != nil {
			return err
		}
		d, err = graph.NewDiagramPair(g, after, "as built", "after "+pipelineName(pf))
		if err != nil {
			return err
		}
	} else if d, err = graph.NewDiagram(g); err != nil {
		return err
	}
	var data []byte
	switch strings.ToLower(filepath.Ext(*out)) {
	case ".svg":
		data, err = picture.SVG(d)
	case ".png":
		data, err = picture.PNG(d)
	default:
		var text string
		text, err = graph.WriteDiagramDOT(d)
		data = []byte(text)
	}
	if err != nil {
		return err
	}
	if *out == "" {
		_, err = stdout.Write(data)
		return err
	}
	return train.WriteOutputFile("-o", *out, data)
}

func pipelineName(pf *passFlags) string {
	if pf.passList != "" {
		return pf.passList
	}
	return "fusion"
}
