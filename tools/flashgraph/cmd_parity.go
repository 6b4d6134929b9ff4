package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
)

func init() {
	register(&command{name: "parity", summary: "compare loss, logits and every gradient with the PyTorch model (tools/reference)", run: runParity})
}

func runParity(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("parity", "",
		"Builds the model of -config, computes loss, logits and the gradient of every parameter on\n"+
			"-device, runs the same model in PyTorch (tools/reference/torch_model.py) on the same weights\n"+
			"and batch, and prints the relative error of each (max |ours - torch| / max |torch|).\n"+
			"Fails when the loss differs by more than -loss-tol or any tensor by more than -tol.\n"+
			"Unlike the other commands it defaults to -config small and -device cuda: it is a check of\n"+
			"the GPU path at a size where rounding differences show, run on the GPU machine.", stderr)
	mf := addModelFlags(fs, "small", false)
	fuse := fs.Bool("fuse", false, "compile with the attention fusion (torch then uses SDPA)")
	device := fs.String("device", "cuda", "where to run ours: cpu, cuda or auto (-dtype bf16 runs mixed precision on CUDA; torch then runs bfloat16)")
	python := fs.String("python", "python3", "python with torch")
	script := fs.String("reference", "tools/reference/torch_model.py", "the PyTorch model script")
	torchDevice := fs.String("torch-device", "cuda", "device for PyTorch: cuda or cpu")
	lossTol := fs.Float64("loss-tol", 1e-5, "relative tolerance of the loss")
	tol := fs.Float64("tol", 1e-3, "relative tolerance of logits and gradients")
	keep := fs.String("dir", "", "keep the exchanged safetensors files in this directory")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	cfg, err := mf.modelConfig()
	if err != nil {
		return err
	}
	if _, err := os.Stat(*script); err != nil {
		if !filepath.IsAbs(*script) {
			return fmt.Errorf("-reference: %w (a relative path: run from the repository root)", err)
		}
		return fmt.Errorf("-reference: %w", err)
	}
	fwd, err := model.Build(cfg)
	if err != nil {
		return err
	}
	if fwd, err = passes.Default(*fuse).Run(fwd, &passes.Log{}); err != nil {
		return err
	}
	var wrt []string
	for _, p := range fwd.Params {
		wrt = append(wrt, p.Name)
	}
	g, grads, err := autodiff.Gradients(fwd, "loss", wrt)
	if err != nil {
		return err
	}
	be, note, err := resolveDevice(*device, mf.bf16)
	if err != nil {
		return err
	}
	if note != "" {
		fmt.Fprintln(stderr, note)
	}
	defer be.Close()
	exe, err := be.Compile(g, backend.Options{})
	if err != nil {
		return err
	}
	defer exe.Close()

	// The batch: random bytes from a fixed seed.
	r := rand.New(rand.NewPCG(uint64(cfg.Seed), 99))
	tokens := graph.NewTensor(graph.Int64, graph.Shape{cfg.Batch, cfg.Seq})
	targets := graph.NewTensor(graph.Int64, graph.Shape{cfg.Batch, cfg.Seq})
	for i := range tokens.I64 {
		tokens.I64[i], targets.I64[i] = int64(r.IntN(cfg.Vocab)), int64(r.IntN(cfg.Vocab))
	}
	outs, err := exe.Run(map[string]*graph.Tensor{"tokens": tokens, "targets": targets})
	if err != nil {
		return err
	}

	dir := *keep
	if dir == "" {
		if dir, err = os.MkdirTemp("", "flashgraph-parity"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	weights := &checkpoint.Tensors{Tensors: map[string]*graph.Tensor{}, Metadata: map[string]string{"config": torchConfigJSON(cfg)}}
	for _, p := range fwd.Params {
		if weights.Tensors[p.Name], err = exe.Initializer(p.Name); err != nil {
			return err
		}
	}
	batch := &checkpoint.Tensors{Tensors: map[string]*graph.Tensor{"tokens": tokens, "targets": targets}}
	wPath, bPath, oPath := filepath.Join(dir, "weights.safetensors"), filepath.Join(dir, "batch.safetensors"), filepath.Join(dir, "torch.safetensors")
	for path, ts := range map[string]*checkpoint.Tensors{wPath: weights, bPath: batch} {
		if err := checkpoint.WriteFileAtomic(path, func(w io.Writer) error { return checkpoint.WriteSafetensors(w, ts) }); err != nil {
			return err
		}
	}
	attn, tdt := "composed", "float32"
	if *fuse {
		attn = "sdpa"
	}
	if mf.bf16 {
		tdt = "bfloat16"
	}
	cmd := exec.Command(*python, *script, "--weights", wPath, "--batch", bPath, "--out", oPath, "--attn", attn, "--dtype", tdt, "--device", *torchDevice)
	cmd.Stderr = stderr
	if out, err := cmd.Output(); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	} else {
		fmt.Fprint(stderr, string(out))
	}
	ref, err := checkpoint.ReadSafetensorsFile(oPath)
	if err != nil {
		return fmt.Errorf("-reference %s output: %w", *script, err)
	}
	if ref.Tensors["loss"] == nil || ref.Tensors["loss"].Len() != 1 {
		return fmt.Errorf("-reference %s output %s has no scalar loss", *script, oPath)
	}

	type row struct {
		name string
		err  float64
		tol  float64
	}
	rows := []row{{"loss", relErr(outs["loss"], ref.Tensors["loss"]), *lossTol}, {"logits", relErr(outs["logits"], ref.Tensors["logits"]), *tol}}
	names := make([]string, 0, len(grads))
	for p := range grads {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		rows = append(rows, row{"grad." + p, relErr(outs[grads[p]], ref.Tensors["grad."+p]), *tol})
	}
	fmt.Fprintf(stdout, "parity %s (%s, %s attention) on %s vs PyTorch %s on %s: loss ours %.8g, torch %.8g\n",
		cfg.Name, tdt, attn, be.Name(), attn, *torchDevice, outs["loss"].At(0), ref.Tensors["loss"].At(0))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "tensor\trel error\ttolerance\t")
	bad := 0
	worst := row{}
	for _, rw := range rows {
		mark := ""
		if !(rw.err <= rw.tol) {
			mark, bad = "FAIL", bad+1
		}
		if rw.name != "loss" && rw.err > worst.err {
			worst = rw
		}
		if rw.name == "loss" || rw.name == "logits" || mark != "" || strings.HasPrefix(rw.name, "grad.layers.0.") || !strings.HasPrefix(rw.name, "grad.layers.") {
			fmt.Fprintf(tw, "%s\t%.3g\t%.0e\t%s\n", rw.name, rw.err, rw.tol, mark)
		}
	}
	tw.Flush()
	fmt.Fprintf(stdout, "%d tensors compared (rows of layers other than 0 shown only when failing); worst %s %.3g\n", len(rows), worst.name, worst.err)
	if bad > 0 {
		return fmt.Errorf("%d of %d tensors outside tolerance", bad, len(rows))
	}
	return nil
}

// relErr is max |a - b| / max |b| (a norm-wise relative error: elementwise
// relative errors blow up on gradient entries that are nearly zero); +Inf
// when shapes differ or a tensor is missing.
func relErr(a, b *graph.Tensor) float64 {
	if a == nil || b == nil || a.Len() != b.Len() {
		return math.Inf(1)
	}
	var num, den float64
	for i := range a.Len() {
		d := math.Abs(a.At(i) - b.At(i))
		if math.IsNaN(d) {
			return math.NaN()
		}
		num = max(num, d)
		den = max(den, math.Abs(b.At(i)))
	}
	if den == 0 {
		return num
	}
	return num / den
}

func torchConfigJSON(c model.Config) string {
	m := map[string]int{"vocab": c.Vocab, "dim": c.Dim, "layers": c.Layers, "heads": c.Heads, "head_dim": c.HeadDim, "ffn": c.FFN}
	if c.KVHeads > 0 {
		m["kv_heads"] = c.KVHeads
	}
	b, _ := json.Marshal(m)
	return string(b)
}
