package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx"
	"github.com/flashgraph/flashgraph/passes"
	"github.com/flashgraph/flashgraph/train"
)

func init() {
	register(&command{name: "export", summary: "write a trained checkpoint as an ONNX model or safetensors weights", run: runExport})
}

// WeightsFormat names the safetensors files `export -o X.safetensors` writes.
const WeightsFormat = "flashgraph-weights/1"

func runExport(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("export", "[FILE]", `Writes what a checkpoint trained. -o model.onnx: the model's forward graph with the
trained weights as initializers (a model trained from a graph FILE: that graph, with its
trained initializers); by default opset 23 with each fused attention written as the standard
Attention op, -opset 17 writes the attention decomposed (MatMul, Softmax, ...) so older
runtimes load it. -o model.safetensors: the trained weights alone. -reference FILE writes
inputs and the logits flashgraph computes from the checkpoint on the CPU, which
tools/reference/check_onnx.py compares with ONNX Runtime's. A FILE, when given, must be the
model the checkpoint was trained from.`, stderr)
	ckpt := fs.String("ckpt", filepath.Join("out", "ckpt"), "checkpoint folder (its newest checkpoint) or a checkpoint file")
	out := fs.String("o", "", "output file: .onnx (the model) or .safetensors (the weights)")
	opset := fs.Int("opset", onnx.MaxExportOpset, fmt.Sprintf("ONNX opset of -o X.onnx: %d (attention as the Attention op) down to %d (attention decomposed)", onnx.MaxExportOpset, onnx.MinExportOpset))
	ref := fs.String("reference", "", "also write FILE.safetensors: random inputs (input.NAME) and the outputs flashgraph computes on them (output.NAME), for tools/reference/check_onnx.py")
	seed := fs.Uint64("seed", 1, "seed of the -reference inputs")
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("-o is required: model.onnx or model.safetensors")
	}
	ext := strings.ToLower(filepath.Ext(*out))
	if ext != ".onnx" && ext != ".safetensors" {
		return fmt.Errorf("-o %s: want a .onnx or .safetensors file", *out)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["opset"] && ext != ".onnx" {
		return fmt.Errorf("-opset is for -o X.onnx, not %s", *out)
	}
	if *opset < onnx.MinExportOpset || *opset > onnx.MaxExportOpset {
		return fmt.Errorf("-opset %d: want %d to %d", *opset, onnx.MinExportOpset, onnx.MaxExportOpset)
	}
	for _, f := range []struct{ flag, path string }{{"-o", *out}, {"-reference", *ref}} {
		if err := train.CheckOutputFile(f.flag, f.path); err != nil {
			return err
		}
	}
	if *ref != "" && !strings.EqualFold(filepath.Ext(*ref), ".safetensors") {
		return fmt.Errorf("-reference %s: want a .safetensors file", *ref)
	}

	tr, err := train.LoadTrained(*ckpt)
	if err != nil {
		return err
	}
	g, inputs, err := trainedForward(tr, fs.Arg(0))
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "export: %s, step %d, from %s\n", tr.Name(), tr.Step, tr.Path)

	// Everything is computed before anything is written: a failure leaves
	// no half of the outputs behind.
	var data []byte
	switch ext {
	case ".onnx":
		eg := g
		if *opset >= 23 {
			// The fused graph: each attention the fusion recognises becomes
			// one Attention op.
			if eg, err = passes.Default(true).Run(g, nil); err != nil {
				return err
			}
		}
		if data, err = onnx.ExportBytesWith(eg, onnx.ExportOptions{Opset: *opset, MaxBytes: compileMemory()}); err != nil {
			return err
		}
		ops := eg.CountOps()
		fmt.Fprintf(stderr, "export: ONNX opset %d, %d nodes (%d attention as Attention, %d Softmax)\n", *opset, len(eg.Nodes), ops["FlashAttention"], ops["Softmax"])
	case ".safetensors":
		var buf bytes.Buffer
		ts := &checkpoint.Tensors{Tensors: tr.Weights, Metadata: map[string]string{
			"format": WeightsFormat, "model": tr.Config.Name, "step": strconv.FormatInt(tr.Step, 10),
		}}
		if tr.Spec != nil {
			ts.Metadata["source_sha256"] = tr.Spec.SHA256
		}
		if err := checkpoint.WriteSafetensors(&buf, ts); err != nil {
			return err
		}
		data = buf.Bytes()
	}
	var refData []byte
	if *ref != "" {
		if refData, err = referenceData(g, inputs, tr.Config.Vocab, *seed); err != nil {
			return err
		}
	}
	if err := train.WriteOutputFile("-o", *out, data); err != nil {
		return err
	}
	files := []string{*out}
	if *ref != "" {
		if err := train.WriteOutputFile("-reference", *ref, refData); err != nil {
			return err
		}
		files = append(files, *ref)
	}
	fmt.Fprintf(stdout, "wrote %s\n", strings.Join(files, " "))
	return nil
}

// trainedForward is the forward graph a checkpoint trained, unfused, with
// its trained weights, and the values of its inputs that are fixed (a
// graph's bound inputs). file, when given, must be the checkpoint's model.
func trainedForward(tr *train.Trained, file string) (*graph.Graph, map[string]*graph.Tensor, error) {
	if tr.Spec == nil {
		if file != "" {
			return nil, nil, fmt.Errorf("%s: the checkpoint is of the built-in model %s, not of a model file", file, tr.Config.Name)
		}
		g, err := tr.BuiltInForward()
		return g, nil, err
	}
	data, binds, err := train.LoadSourceFiles(tr.Dir, *tr.Spec)
	path := train.SourceFile(tr.Dir, *tr.Spec)
	if file != "" {
		fdata, ferr := os.ReadFile(file)
		if ferr != nil {
			return nil, nil, fmt.Errorf("cannot read graph: %w", ferr)
		}
		if sum := train.FileSHA256(fdata); sum != tr.Spec.SHA256 {
			return nil, nil, fmt.Errorf("%s is not the model the checkpoint was trained from (sha256 %.16s…, the checkpoint's model %s has %.16s…): the checkpoint is of another model", file, sum, tr.Spec.File, tr.Spec.SHA256)
		}
		if err != nil && len(tr.Spec.Bind) == 0 {
			data, err, path = fdata, nil, file
		}
	}
	if err != nil {
		return nil, nil, err
	}
	src, err := parseGraphFile(path, data, tr.Spec.Format, tr.Spec.Dims)
	if err != nil {
		return nil, nil, err
	}
	if tr.Spec.Untie || tr.Spec.Retie {
		// The params the checkpoint trained, by the same names.
		src = src.Clone()
		if tr.Spec.Untie {
			train.UntieShared(src)
		}
		if tr.Spec.Retie {
			train.RetieTransposed(src)
		}
	}
	g, err := train.WithWeights(src, tr.Weights)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", tr.Path, err)
	}
	return g, binds, nil
}

// referenceData runs g on the CPU on random inputs (token ids in [0,
// vocab) for int64 inputs, fixed ones from inputs) and returns a
// safetensors file of the inputs (input.NAME) and outputs (output.NAME).
func referenceData(g *graph.Graph, fixed map[string]*graph.Tensor, vocab int, seed uint64) ([]byte, error) {
	if vocab <= 0 {
		vocab = train.Vocab
	}
	rng := rand.New(rand.NewPCG(seed, 0x7265_6600))
	feeds := map[string]*graph.Tensor{}
	for _, in := range g.Inputs {
		if t, ok := fixed[in.Name]; ok {
			feeds[in.Name] = t
			continue
		}
		t := graph.NewTensor(in.Type.DType, in.Type.Shape)
		for i := range t.Len() {
			switch {
			case in.Type.DType == graph.Int64:
				t.Set(i, float64(rng.IntN(vocab)))
			case in.Type.DType.IsFloat():
				t.Set(i, rng.NormFloat64())
			default:
				t.Set(i, 1)
			}
		}
		feeds[in.Name] = t
	}
	exe, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		return nil, fmt.Errorf("-reference: %w", err)
	}
	defer exe.Close()
	outs, err := exe.Run(feeds)
	if err != nil {
		return nil, fmt.Errorf("-reference: %w", err)
	}
	ts := &checkpoint.Tensors{Tensors: map[string]*graph.Tensor{}, Metadata: map[string]string{"format": "flashgraph-reference/1", "model": g.Name}}
	var names []string
	for n, t := range feeds {
		ts.Tensors["input."+n] = t
		names = append(names, n)
	}
	sort.Strings(names)
	ins, _ := json.Marshal(names)
	ts.Metadata["inputs"] = string(ins)
	var onames []string
	for _, o := range g.Outputs {
		ts.Tensors["output."+o.Name] = outs[o.Name]
		onames = append(onames, o.Name)
	}
	outNames, _ := json.Marshal(onames)
	ts.Metadata["outputs"] = string(outNames)
	var buf bytes.Buffer
	if err := checkpoint.WriteSafetensors(&buf, ts); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
