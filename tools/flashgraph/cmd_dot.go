package main

import (
	"io"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/train"
)

func init() {
	register(&command{name: "dot", summary: "write the DOT diagram of a graph (-fuse: before and after side by side)", run: runDot})
}

func runDot(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dot", "[FILE]",
		"Writes the Graphviz DOT diagram of the model of -config (or of FILE). With -fuse, the graph\n"+
			"before and after the fusion pipeline side by side. Render with: dot -Tsvg graph.dot -o graph.svg", stderr)
	mf := addModelFlags(fs, defaultConfig, true)
	pf := addPassFlags(fs, false)
	out := fs.String("o", "", "output file (default stdout)")
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	g, err := mf.load(fs.Arg(0))
	if err != nil {
		return err
	}
	var text string
	if pf.fuse.on || pf.passList != "" {
		after, err := pf.compileGraph(fs, g, stderr)
		if err != nil {
			return err
		}
		text, err = graph.WriteDOTPair(g, after, "as built", "after "+pipelineName(pf))
		if err != nil {
			return err
		}
	} else if text, err = graph.WriteDOT(g); err != nil {
		return err
	}
	if *out == "" {
		_, err = io.WriteString(stdout, text)
		return err
	}
	return train.WriteOutputFile("-o", *out, []byte(text))
}

func pipelineName(pf *passFlags) string {
	if pf.passList != "" {
		return pf.passList
	}
	return "fusion"
}
