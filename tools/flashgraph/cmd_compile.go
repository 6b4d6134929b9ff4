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
			"and writes the canonical text to -o (or stdout), an .onnx model when -o ends in .onnx.\n"+
			"With -explain or -plan the report is the output: it goes to stdout and the graph text\n"+
			"only where -o says (-o - : the graph on stdout, the report on stderr).", stderr)
	mf := addModelFlags(fs, defaultConfig, true)
	addBoundaryFlags(fs, mf)
	pf := addPassFlags(fs, true)
	out := fs.String("o", "", "output file: canonical text (.txt or any other name) or ONNX (.onnx); \"-\": stdout; default stdout unless -explain or -plan")
	dot := fs.String("dot", "", "also write the DOT diagram of the compiled graph to this file")
	plan := fs.Bool("plan", false, "print the device memory plan: peak activation memory and the largest tensors (with -explain: also the planning facts it was made from)")
	bind := addBindFlag(fs)
	ranks := fs.Int("ranks", 1, "with -plan: plan one rank's training step of a data-parallel job of N ranks (train -ranks N): its gradient all-reduce buckets are listed, with -explain their gradients")
	bucketMB := fs.Float64("bucket-mb", 25, "with -plan -ranks N: gradient MiB per all-reduce bucket (train -bucket-mb)")
	traffic := fs.Float64("traffic", 0, "with -plan: also the bytes each op type reads and writes in the training step (the forward without one), each operand once per node, and their time at this many TB/s of memory bandwidth (4.8 for an H200): a floor for the memory-bound kernels")
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	if *ranks < 1 {
		return fmt.Errorf("-ranks must be at least 1, got %d", *ranks)
	}
	if *traffic < 0 || *traffic > 1000 || (*traffic != 0 && !*plan) {
		return fmt.Errorf("-traffic wants -plan and a bandwidth in TB/s in (0, 1000], got %v (plan %v)", *traffic, *plan)
	}
	if !(*bucketMB > 0) || *bucketMB > 1<<20 {
		return fmt.Errorf("-bucket-mb must be in (0, 1048576], got %v", *bucketMB)
	}
	// The graph text goes to stdout when asked for (-o -) or when no report
	// was asked for; a report then goes to stderr, otherwise to stdout.
	graphToStdout := *out == "-" || (*out == "" && !pf.explain && !*plan)
	report := stdout
	if graphToStdout {
		report = stderr
	}
	for _, o := range []struct{ flag, path string }{{"-o", *out}, {"-dot", *dot}} {
		if o.path != "-" {
			if err := train.CheckOutputFile(o.flag, o.path); err != nil {
				return err
			}
		}
	}
	g, err := mf.load(fs.Arg(0))
	if err != nil {
		return err
	}
	if g, err = bind.apply(g); err != nil {
		return err
	}
	g, err = pf.compileGraph(fs, g, report)
	if err != nil {
		return err
	}
	fmt.Fprintln(stderr, summary(g))
	if *plan {
		compute := graph.Float32
		if mf.bf16 {
			compute = graph.BFloat16
		}
		if err := printPlan(report, g, compute, pf.explain, pf.fuseQKV, *ranks, max(1, int64(*bucketMB*(1<<20))), *traffic); err != nil {
			return err
		}
	}
	if *dot != "" {
		d, err := graph.WriteDOT(g)
		if err != nil {
			return err
		}
		if err := train.WriteOutputFile("-dot", *dot, []byte(d)); err != nil {
			return err
		}
	}
	switch {
	case graphToStdout:
		_, err = io.WriteString(stdout, graph.Format(g))
		return err
	case *out == "":
		return nil
	case strings.EqualFold(filepath.Ext(*out), ".onnx"):
		b, err := onnx.ExportBytesWith(g, onnx.ExportOptions{MaxBytes: compileMemory()})
		if err != nil {
			return fmt.Errorf("-o %s: %w", *out, err)
		}
		return train.WriteOutputFile("-o", *out, b)
	default:
		return train.WriteOutputFile("-o", *out, []byte(graph.Format(g)))
	}
}
