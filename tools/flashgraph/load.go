package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/onnx"
)

// The defaults every command shares, so that `compile`, `dot`, `run`,
// `train` and `generate` with no flags talk about the same model on the same
// device. tiny builds, compiles and trains in seconds on any machine; the CPU
// is the reference backend and gives the same numbers everywhere (a GPU run
// is asked for with -device cuda or auto). parity and bench compare against
// PyTorch on a GPU and default to -device cuda (parity to -config small,
// where the comparison means something); their help says so.
const (
	defaultConfig = "tiny"
	defaultDevice = "cpu"
)

// modelFlags are the flags that choose a graph: a file, or a model config
// with overrides.
type modelFlags struct {
	fs     *flag.FlagSet
	config string
	dtype  string
	bf16   bool // -dtype bf16: a float32 graph run in mixed precision on CUDA
	batch  int
	seq    int
	layers int
	seed   int
	size   sizeFlags
	// boundary, when the command has them, is -sequence and -absent, for an
	// ONNX FILE's sequence and optional inputs.
	boundary *boundaryFlags
}

// addModelFlags adds the model flags; withFile says the command also takes a
// graph FILE, which the config flags do not apply to.
func addModelFlags(fs *flag.FlagSet, defConfig string, withFile bool) *modelFlags {
	m := &modelFlags{fs: fs}
	about := "model config: "
	if withFile {
		about = "model config when no FILE is given: "
	}
	fs.StringVar(&m.config, "config", defConfig, about+strings.Join(model.Names(), ", "))
	fs.StringVar(&m.dtype, "dtype", "float32", "float32, float64, or bf16: mixed precision on CUDA (bfloat16 activations and GEMMs, float32 master weights and optimizer state)")
	fs.IntVar(&m.batch, "batch", 0, "batch size (0: the config's)")
	fs.IntVar(&m.seq, "seq", 0, "sequence length (0: the config's)")
	fs.IntVar(&m.layers, "layers", 0, "number of layers (0: the config's)")
	fs.IntVar(&m.seed, "seed", 0, "parameter initialisation seed")
	m.size.add(fs)
	return m
}

// modelConfig resolves the config with the overrides applied.
func (m *modelFlags) modelConfig() (model.Config, error) {
	return m.modelConfigOn(nil)
}

// modelConfigOn is modelConfig starting from base (a checkpoint's config)
// instead of -config's table entry, unless -config is given: -dtype and
// -seed then apply only when given, and the other flags override as usual.
func (m *modelFlags) modelConfigOn(base *model.Config) (model.Config, error) {
	given := map[string]bool{}
	m.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["config"] {
		base = nil
	}
	var cfg model.Config
	var err error
	if base != nil {
		cfg = *base
	} else if cfg, err = model.Lookup(m.config); err != nil {
		return cfg, err
	}
	dt, err := m.graphDType()
	if err != nil {
		return cfg, err
	}
	if base == nil || given["dtype"] {
		cfg.DType = dt
	}
	for _, o := range []struct {
		name string
		v    int
		dst  *int
	}{{"batch", m.batch, &cfg.Batch}, {"seq", m.seq, &cfg.Seq}, {"layers", m.layers, &cfg.Layers}} {
		if o.v < 0 {
			return cfg, fmt.Errorf("-%s must be positive, got %d", o.name, o.v)
		}
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if base == nil || given["seed"] {
		cfg.Seed = m.seed
	}
	if err := m.size.apply(&cfg); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// graphDType reads -dtype: the dtype graphs are built in, and whether the run
// is mixed precision (bf16: a float32 graph, bfloat16 compute on CUDA).
func (m *modelFlags) graphDType() (graph.DType, error) {
	m.bf16 = m.dtype == "bf16" || m.dtype == "bfloat16"
	if m.bf16 {
		return graph.Float32, nil
	}
	dt, err := graph.ParseDType(m.dtype)
	if err != nil || (dt != graph.Float32 && dt != graph.Float64) {
		return graph.InvalidDType, fmt.Errorf("-dtype %q: want float32, float64 or bf16", m.dtype)
	}
	return dt, nil
}

// load returns the graph from file (canonical text or .onnx), or the model
// built from the config when file is empty.
func (m *modelFlags) load(file string) (*graph.Graph, error) {
	if file == "" && m.boundary.given() {
		return nil, fmt.Errorf("-dims, -sequence and -absent are for an ONNX model's inputs (a .onnx FILE); the model of -config has none")
	}
	if file == "" {
		cfg, err := m.modelConfig()
		if err != nil {
			return nil, err
		}
		return model.Build(cfg)
	}
	dt, err := m.graphDType()
	if err != nil {
		return nil, err
	}
	// A FILE has its own config and dtype: flags that shape the built model
	// would be ignored, so they are refused rather than silently dropped.
	var ignored []string
	m.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "config", "batch", "seq", "layers", "seed", "dim", "heads", "kv-heads", "head-dim", "ffn", "vocab":
			ignored = append(ignored, "-"+f.Name)
		case "dtype":
			if !m.bf16 && dt != graph.Float32 {
				ignored = append(ignored, "-"+f.Name)
			}
		}
	})
	if len(ignored) > 0 {
		return nil, fmt.Errorf("%s: %s: only for the model built from -config; a graph FILE keeps its own config, shapes and dtypes (drop the flags, or the FILE)", file, strings.Join(ignored, ", "))
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("cannot read graph: %w", err)
	}
	if strings.EqualFold(filepath.Ext(file), ".onnx") {
		opts := onnx.Options{FoldMemory: compileMemory()}
		m.boundary.apply(&opts)
		g, err := onnx.ImportWith(file, opts)
		return g, explainImportError(file, err)
	}
	if m.boundary.given() {
		return nil, fmt.Errorf("%s: -dims, -sequence and -absent are for an ONNX model's inputs (a .onnx FILE)", file)
	}
	return graph.ParseFile(file, string(data))
}
