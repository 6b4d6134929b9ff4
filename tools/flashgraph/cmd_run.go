package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/graph"
)

func init() {
	register(&command{name: "run", summary: "run the forward pass once and print the loss and the outputs", run: runRun})
}

func runRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run", "[FILE]",
		"Compiles the model of -config (or FILE) and runs its forward pass once on random inputs\n"+
			"(token ids in [0, vocab) for int64 inputs, normal values for float inputs), or on -inputs\n"+
			"(safetensors, or an ONNX test_data_set_N folder); prints the loss and a summary of every\n"+
			"output. -outputs saves them; -expect DIR compares them with DIR's output_K.pb and exits\n"+
			"non-zero on a mismatch; -bind NAME=FILE makes an input a constant before the passes.", stderr)
	mf := addModelFlags(fs, defaultConfig, true)
	addBoundaryFlags(fs, mf)
	pf := addPassFlags(fs, true)
	device := fs.String("device", defaultDevice, "where to run: cpu, cuda, or auto (CUDA when present, else the CPU)")
	inputSeed := fs.Uint64("input-seed", 1, "seed of the random inputs")
	rio := addRunIOFlags(fs)
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	if err := rio.prepareONNX(fs.Arg(0), mf.boundary); err != nil {
		return err
	}
	g, err := mf.load(fs.Arg(0))
	if err != nil {
		return err
	}
	order := inputNames(g)
	if g, err = rio.bind.apply(g); err != nil {
		return err
	}
	if g, err = pf.compileGraph(fs, g, stderr); err != nil {
		return err
	}
	fmt.Fprintln(stderr, summary(g))
	be, note, err := resolveDevice(*device, mf.bf16)
	if err != nil {
		return err
	}
	if note != "" {
		fmt.Fprintln(stderr, note)
	}
	defer be.Close()
	if err := rio.checkMemory(stderr, be, g, mf.bf16, runMemoryHint(fs.NArg() > 0)); err != nil {
		return err
	}
	// A forward pass of a large model takes minutes on a CPU: say so before
	// going quiet.
	flops := matmulFLOPs(g)
	what := fmt.Sprintf("run: forward pass of %s (%s of matrix products) on %s", g.Name, formatFLOP(flops), be.Name())
	if be.Name() == "cpu" {
		if d, _, err := estimateCPUTime(flops); err == nil {
			what += ", roughly " + roughDuration(d) + " on this CPU"
		}
	}
	fmt.Fprintln(stderr, what+"...")
	t0 := time.Now()
	exe, err := be.Compile(g, backend.Options{})
	if err != nil {
		return fmt.Errorf("compile on %s: %w", be.Name(), err)
	}
	defer exe.Close()
	compiled := time.Since(t0)
	feeds, err := rio.feeds(g, order, *inputSeed)
	if err != nil {
		return err
	}
	t1 := time.Now()
	outs, err := exe.Run(feeds)
	if err != nil {
		return fmt.Errorf("run on %s: %w", be.Name(), err)
	}
	ran := time.Since(t1)
	fmt.Fprintf(stdout, "device %s: compiled in %v, forward in %v, peak activations %s\n",
		be.Name(), compiled.Round(time.Millisecond), ran.Round(time.Millisecond), cuda.FormatBytes(exe.Stats().PeakActivationBytes))
	names := make([]string, 0, len(outs))
	for n := range outs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := outs[n]
		if t.Len() == 1 {
			fmt.Fprintf(stdout, "%s: %v = %.6g\n", n, t.Type(), t.At(0))
			continue
		}
		mean, std, lo, hi := stats(t)
		fmt.Fprintf(stdout, "%s: %v mean %.4g std %.4g min %.4g max %.4g\n", n, t.Type(), mean, std, lo, hi)
	}
	if err := rio.finish(stdout, g, outs); err != nil {
		return err
	}
	if l, ok := outs["loss"]; ok && l.Len() == 1 && rio.inputs == "" {
		if v := g.Value("logits"); v != nil && v.Type.Shape.Rank() > 0 {
			vocab := v.Type.Shape[v.Type.Shape.Rank()-1]
			fmt.Fprintf(stdout, "ln(vocab) = %.6g (the loss of an untrained model on uniform predictions)\n", math.Log(float64(vocab)))
		}
	}
	return nil
}

func stats(t *graph.Tensor) (mean, std, lo, hi float64) {
	n := t.Len()
	lo, hi = math.Inf(1), math.Inf(-1)
	for i := range n {
		v := t.At(i)
		mean += v
		lo, hi = min(lo, v), max(hi, v)
	}
	mean /= float64(n)
	for i := range n {
		d := t.At(i) - mean
		std += d * d
	}
	return mean, math.Sqrt(std / float64(n)), lo, hi
}
