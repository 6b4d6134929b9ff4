package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx"
	"github.com/flashgraph/flashgraph/train"
)

func init() {
	register(&command{name: "compile", summary: "build or read a graph, run the passes, write its text, ONNX or DOT", run: runCompile})
}

func runCompile(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("compile", "[FILE]",
		"Builds the model of -config (or reads FILE: canonical text or .onnx), runs the pass pipeline\n"+
			"(-fuse: attention fusion; without it the graph is byte-identical to the graph as built)\n"+
			"and writes the canonical text to -o (or stdout), an .onnx model when -o ends in .onnx.", stderr)
	mf := addModelFlags(fs, "small", true)
	pf := addPassFlags(fs, true)
	out := fs.String("o", "", "output file: canonical text (.txt or any other name) or ONNX (.onnx); default stdout")
	dot := fs.String("dot", "", "also write the DOT diagram of the compiled graph to this file")
	plan := fs.Bool("plan", false, "print the device memory plan: peak activation memory and the largest tensors")
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	g, err := mf.load(fs.Arg(0))
	if err != nil {
		return err
	}
	g, err = pf.compileGraph(fs, g, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stderr, summary(g))
	if *plan {
		compute := graph.Float32
		if mf.bf16 {
			compute = graph.BFloat16
		}
		if err := printPlan(stderr, g, compute); err != nil {
			return err
		}
	}
	if *dot != "" {
		d, err := graph.WriteDOT(g)
		if err != nil {
			return err
		}
		if err := writeFileAtomic("-dot", *dot, []byte(d)); err != nil {
			return err
		}
	}
	switch {
	case *out == "":
		_, err = io.WriteString(stdout, graph.Format(g))
		return err
	case strings.EqualFold(filepath.Ext(*out), ".onnx"):
		b, err := onnx.ExportBytes(g)
		if err != nil {
			return fmt.Errorf("-o %s: %w", *out, err)
		}
		return writeFileAtomic("-o", *out, b)
	default:
		return writeFileAtomic("-o", *out, []byte(graph.Format(g)))
	}
}

// writeFileAtomic writes the output file of flag through a temp file and a
// rename, so that a failed write never leaves half a file where a good one
// was. Errors name the flag and the file, not the temp file.
func writeFileAtomic(flag, path string, data []byte) error {
	err := train.WriteFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return nil
}
