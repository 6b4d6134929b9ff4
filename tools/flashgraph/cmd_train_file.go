package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/onnx"
	"github.com/flashgraph/flashgraph/passes"
	"github.com/flashgraph/flashgraph/train"
)

// `train FILE`: a graph brought by the user (our text format or ONNX),
// prepared for training by train.PrepareGraph, with its loss, inputs and
// params chosen by the flags below.

// defaultGraphLR is the peak learning rate of a graph FILE without -lr.
const defaultGraphLR = 1e-3

// listFlag is a flag that may be given several times, or as a
// comma-separated list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// dimsFlag collects -dims NAME=N.
type dimsFlag map[string]int

func (d dimsFlag) String() string {
	var out []string
	for k, v := range d {
		out = append(out, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func (d dimsFlag) Set(s string) error {
	for _, kv := range strings.Split(s, ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(kv), "=")
		v, err := strconv.Atoi(n)
		if !ok || name == "" || err != nil || v <= 0 {
			return fmt.Errorf("want NAME=N with N > 0, got %q", kv)
		}
		d[name] = v
	}
	return nil
}

// bindFlag collects -bind NAME=FILE (run, compile and train FILE): graph
// inputs given fixed values; an input bound twice is an error.
type bindFlag map[string]string

func (b bindFlag) String() string {
	var out []string
	for k, v := range b {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func (b bindFlag) Set(s string) error {
	name, file, ok := strings.Cut(s, "=")
	if !ok || name == "" || file == "" {
		return fmt.Errorf("want NAME=FILE, got %q", s)
	}
	if _, dup := b[name]; dup {
		return fmt.Errorf("input %s bound twice", name)
	}
	b[name] = file
	return nil
}

type graphTrainFlags struct {
	fs          *flag.FlagSet
	dims        dimsFlag
	loss        string
	tokens      string
	targets     string
	bind        bindFlag
	trainParams listFlag
	freeze      listFlag
	untie       bool
	retie       bool
	explain     bool
}

func addGraphTrainFlags(fs *flag.FlagSet) *graphTrainFlags {
	gf := &graphTrainFlags{fs: fs, bind: bindFlag{}, dims: dimsFlag{}}
	fs.Var(gf.dims, "dims", "with an .onnx FILE: NAME=N sizes its symbolic dimension NAME (dim_param: batch, sequence_length, s0, ...); comma-separated or repeated")
	fs.StringVar(&gf.loss, "loss", "", "with a graph FILE: the loss, a scalar output of the graph, or \"next-token\": append the cross-entropy of the logits [B,S,V] against the next token (the built-in model's loss)")
	fs.StringVar(&gf.tokens, "tokens", "", "with a graph FILE: the input that takes the tokens (default: the input called tokens, input_ids or idx, or the only int64 [B,S] input)")
	fs.StringVar(&gf.targets, "targets", "", "with a graph FILE and -loss NAME: the input that takes the next tokens (default: one called targets or labels, if any)")
	fs.Var(gf.bind, "bind", "with a graph FILE: NAME=FILE.safetensors gives graph input NAME a fixed value (the tensor called NAME, or the file's only tensor); repeatable")
	fs.Var(&gf.trainParams, "train-params", "with a graph FILE: train only the params matching these name patterns (path.Match: layers.*.w*; comma-separated or repeated; default: every float param the loss reaches)")
	fs.Var(&gf.freeze, "freeze", "with a graph FILE: do not train the params matching these name patterns")
	fs.BoolVar(&gf.untie, "untie", false, "with a graph FILE: give each node that reads a shared param whose elements are all one value (a norm gain's ones, a bias's zeros: initializers an exporter merged by value) its own copy NAME.1, NAME.2, ..., so they train apart as in the PyTorch model")
	fs.BoolVar(&gf.retie, "retie", false, "with a graph FILE: read a param that is element for element the transpose (or a copy) of another through that param, so a tied weight whose Transpose an exporter folded into a second initializer (GPT-2's lm_head and token embedding, torch.onnx dynamo) trains as one")
	fs.BoolVar(&gf.explain, "explain", false, "print how the training graph is made (inputs, appended loss, params trained and frozen, attention fusion per Softmax) and exit without training")
	return gf
}

// graphFlagsSet lists the graph-only flags given on the command line.
func (gf *graphTrainFlags) graphFlagsSet() []string {
	var set []string
	gf.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "loss", "tokens", "targets", "bind", "train-params", "freeze", "dims", "untie", "retie":
			set = append(set, "-"+f.Name)
		}
	})
	return set
}

// trainSource is what `train` trains, and what its checkpoint folder must
// keep to rebuild a graph (the model file's bytes and the bound inputs).
type trainSource struct {
	src   train.Source
	data  []byte
	binds map[string]*graph.Tensor
}

// resolve decides what train trains: the built-in model of cfg; the graph of
// file; or, with -resume and no file, the graph the newest checkpoint in
// ckptDir was trained from (its own copy of the file, so no flags are needed).
func (gf *graphTrainFlags) resolve(mf *modelFlags, file, ckptDir string, resume bool, log io.Writer) (*trainSource, error) {
	if file == "" && resume && ckptDir != "" {
		spec, ckpt, err := train.CheckpointSpec(ckptDir)
		if err != nil {
			return nil, err
		}
		if spec != nil {
			if set := append(gf.graphFlagsSet(), modelFlagsSet(mf, true)...); len(set) > 0 {
				return nil, fmt.Errorf("-resume: %s was trained from %s, whose loss, inputs, params and shapes the checkpoint records: drop %s", ckpt, spec.File, strings.Join(set, ", "))
			}
			data, binds, err := train.LoadSourceFiles(ckptDir, *spec)
			if err != nil {
				return nil, fmt.Errorf("-resume: %w", err)
			}
			return prepareSource(train.SourceFile(ckptDir, *spec), data, *spec, binds)
		}
	}
	if file == "" {
		if set := gf.graphFlagsSet(); len(set) > 0 {
			return nil, fmt.Errorf("%s: only with a graph FILE (train [flags] model.onnx)", strings.Join(set, ", "))
		}
		cfg, err := trainModelConfig(mf, resume, ckptDir, log)
		if err != nil {
			return nil, err
		}
		return &trainSource{src: train.BuiltIn(cfg)}, nil
	}
	if set := modelFlagsSet(mf, true); len(set) > 0 {
		return nil, fmt.Errorf("%s: %s: only for the model built from -config; a graph FILE keeps its own shapes and dtypes (-seed seeds the batches, -dtype bf16 runs it in mixed precision on CUDA)", file, strings.Join(set, ", "))
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("cannot read graph: %w", err)
	}
	spec := train.GraphSpec{
		File: file, SHA256: train.FileSHA256(data), Format: graphFormat(file), Dims: gf.dims, Loss: gf.loss,
		Tokens: gf.tokens, Targets: gf.targets, TrainParams: gf.trainParams, Freeze: gf.freeze, Untie: gf.untie, Retie: gf.retie,
	}
	binds := map[string]*graph.Tensor{}
	names := make([]string, 0, len(gf.bind))
	for name := range gf.bind {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t, err := readSafetensorsTensor(gf.bind[name], name)
		if err != nil {
			return nil, fmt.Errorf("-bind %s: %w", name, err)
		}
		binds[name] = t
		if spec.Bind == nil {
			spec.Bind = map[string]string{}
		}
		spec.Bind[name] = train.TensorSHA256(t)
	}
	return prepareSource(file, data, spec, binds)
}

// prepareSource parses a model file and prepares it as spec says.
func prepareSource(path string, data []byte, spec train.GraphSpec, binds map[string]*graph.Tensor) (*trainSource, error) {
	if len(spec.Dims) > 0 && spec.Format != "onnx" {
		return nil, fmt.Errorf("-dims: only for an .onnx FILE (a graph text has static shapes)")
	}
	g, err := parseGraphFile(path, data, spec.Format, spec.Dims)
	if err != nil {
		return nil, err
	}
	m, err := train.PrepareGraph(g, spec, binds)
	if err != nil {
		return nil, err
	}
	return &trainSource{src: train.GraphSource(m), data: data, binds: binds}, nil
}

func graphFormat(file string) string {
	if strings.EqualFold(filepath.Ext(file), ".onnx") {
		return "onnx"
	}
	return "text"
}

// parseGraphFile reads a graph from a file's bytes: ONNX (external data
// resolved next to path) or our text format.
func parseGraphFile(path string, data []byte, format string, dims map[string]int) (*graph.Graph, error) {
	if format == "onnx" {
		g, err := onnx.ImportWith(path, onnx.Options{Dims: dims, FoldMemory: compileMemory()})
		if err != nil && strings.Contains(err.Error(), "Options.Dims") {
			err = fmt.Errorf("%w (train and export: -dims NAME=N)", err)
		}
		return g, err
	}
	return graph.ParseFile(path, string(data))
}

// modelFlagsSet lists the model flags given that do not apply to a graph
// FILE: every flag addModelFlags defines except -seed (it seeds the batches)
// and, with withDType, -dtype float32 or bf16 (bf16 runs the graph in mixed
// precision on CUDA); without it -dtype is listed too.
func modelFlagsSet(mf *modelFlags, withDType bool) []string {
	own := flag.NewFlagSet("", flag.ContinueOnError)
	addModelFlags(own, defaultConfig, true)
	var set []string
	mf.fs.Visit(func(f *flag.Flag) {
		if own.Lookup(f.Name) == nil || f.Name == "seed" {
			return
		}
		if f.Name == "dtype" && withDType {
			if dt, err := mf.graphDType(); err == nil && (mf.bf16 || dt == graph.Float32) {
				return
			}
		}
		set = append(set, "-"+f.Name)
	})
	return set
}

// ckptFolder is the checkpoint folder train's -ckpt and -out flags name (""
// for none).
func ckptFolder(ckpt, out string) string {
	switch ckpt {
	case "none":
		return ""
	case "":
		return filepath.Join(out, "ckpt")
	}
	return ckpt
}

// describeSource is the line train prints about a graph FILE's training
// graph: its inputs, its loss and what was appended for it.
func describeSource(w io.Writer, s train.Source) {
	m := s.Graph
	if m == nil {
		return
	}
	loss := fmt.Sprintf("loss %s (a graph output)", m.Loss)
	if m.Spec.Loss == train.LossNextToken {
		loss = fmt.Sprintf("loss %s appended: mean cross-entropy of %s against the next token (input %s)", m.Loss, m.Logits, m.Targets)
	}
	fmt.Fprintf(w, "graph: %s: tokens %s, %s; %d params trained, %d frozen (train -explain FILE lists them)\n", m.Spec.File, m.Tokens, loss, len(m.Params), len(m.Frozen))
	for _, n := range m.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// explainSource writes what `train -explain` prints: how the training graph
// is made and, per Softmax, whether the attention fuses.
func explainSource(w io.Writer, s *trainSource, h train.Hyper) error {
	m := s.src.Graph
	if m == nil {
		fmt.Fprintf(w, "train the built-in model %s\n", s.src.Config.Name)
	} else {
		fmt.Fprint(w, m.Explain())
	}
	fwd := s.src.Graph
	var g *graph.Graph
	if fwd != nil {
		g = fwd.Forward
	} else {
		built, err := model.Build(s.src.Config)
		if err != nil {
			return err
		}
		g = built
	}
	xs, err := passes.Explain(g)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "attention: %d Softmax\n", len(xs))
	for _, x := range xs {
		fmt.Fprintf(w, "  %s\n", x)
	}
	fmt.Fprintf(w, "recompute: %s\n", recomputeMeaning[h.RecomputeMode()])
	return explainFuseQKV(w, g, h.FuseQKV)
}

// sourceForward is the forward graph a source trains, before the passes.
func sourceForward(s train.Source) (*graph.Graph, error) {
	if s.Graph != nil {
		return s.Graph.Forward, nil
	}
	return model.Build(s.Config)
}

// readySource is train's setup of a graph FILE once the run starts: the
// checkpoint folder gets the model file and the bound inputs (so that
// -resume and export need no FILE), and -out gets train_source.txt, what
// -explain says of the training graph. It returns the files written to -out.
func readySource(out, ckptDir string, s *trainSource) ([]string, error) {
	m := s.src.Graph
	if m == nil {
		return nil, nil
	}
	if ckptDir != "" {
		if err := train.SaveSourceFiles(ckptDir, m.Spec, s.data, s.binds); err != nil {
			return nil, err
		}
	}
	p := filepath.Join(out, "train_source.txt")
	if err := train.WriteOutputFile("-out", p, []byte(m.Explain())); err != nil {
		return nil, err
	}
	return []string{p}, nil
}
