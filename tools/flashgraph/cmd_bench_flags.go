package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/bench"
	"github.com/flashgraph/flashgraph/model"
)

// The flags of `flashgraph bench` and the wiring to package bench, which
// measures and prints.

func init() {
	register(&command{name: "bench", summary: "time fused vs composed attention vs PyTorch SDPA on the GPU (one run, one table)", run: runBench})
}

// parseInts reads a comma-separated list of positive integers.
func parseInts(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("-%s: %q is not a positive integer", flagName, f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-%s: empty list", flagName)
	}
	return out, nil
}

func parseCausal(s string) ([]bool, error) {
	switch s {
	case "both":
		return []bool{false, true}, nil
	case "causal":
		return []bool{true}, nil
	case "noncausal":
		return []bool{false}, nil
	}
	return nil, fmt.Errorf("-causal %q: want both, causal or noncausal", s)
}

func parseMemShapes(s string) ([]bench.MemShape, error) {
	var out []bench.MemShape
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		a, b, ok := strings.Cut(f, ":")
		sv, err1 := strconv.Atoi(a)
		bv, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || sv <= 0 || bv <= 0 {
			return nil, fmt.Errorf("-memory-shapes: %q is not S:B", f)
		}
		out = append(out, bench.MemShape{S: sv, B: bv})
	}
	if len(out) == 0 {
		return nil, errors.New("-memory-shapes: empty list")
	}
	return out, nil
}

func runBench(args []string, stdout, stderr io.Writer) error {
	for _, a := range args {
		if a == "-train" || a == "--train" || a == "-train=true" || a == "--train=true" {
			return runBenchTrain(args, stdout, stderr)
		}
	}
	fs := newFlags("bench", "",
		"Times, in one run on one GPU and on the same bf16 inputs, attention forward and backward\n"+
			"three ways: our fused kernels (FlashForward/FlashBackward), our composed path (the unfused\n"+
			"graph as the CUDA executor runs it op by op: cuBLAS, scale, mask, softmax, cuBLAS; backward\n"+
			"with SoftmaxGrad) and PyTorch SDPA (FLASH, cuDNN, EFFICIENT; tools/reference/sdpa_bench.py\n"+
			"run as a subprocess). Shapes keep B·S and H·D fixed. Prints one table of TFLOP/s, ratios,\n"+
			"peak memory and the fused-vs-composed error. -memory adds a training-step memory table\n"+
			"(model small, fused vs unfused attention). On a compute capability 9.0 GPU the fused forward is\n"+
			"a Hopper kernel unless "+cuda.FlashSM90Env+"=0, and so is the backward unless "+cuda.FlashSM90BwdEnv+"=0;\n"+
			"-sm90 times FA2 (\"fused\") and each Hopper forward (kernels/flash_sm90_fwd.cu and\n"+
			"kernels/dev/flash_sm90_dev.cu) and prints their forward table. -accuracy measures instead\n"+
			"the fused kernels' error against a float64 reference beside cuDNN's and FLASH's on the same\n"+
			"inputs (tools/reference/sdpa_error.py); -decode times generation-shaped attention.", stderr)
	device := fs.String("device", "cuda", "the device to benchmark (only cuda)")
	seqs := fs.String("seqs", "512,1024,2048,4096,8192,16384", "sequence lengths S")
	dims := fs.String("dims", "64,128", "head dims D")
	causalFlag := fs.String("causal", "both", "both, causal or noncausal")
	iters := fs.Int("iters", 20, "timed iterations per measurement, forward and backward each in a loop of its own (the median is reported)")
	warmup := fs.Int("warmup", 3, "untimed iterations before timing")
	settle := fs.Duration("settle", 500*time.Millisecond, "the device idles this long before each timed loop, ours and PyTorch's (whose\n"+
		"first call of a shape otherwise idles it while cuDNN builds its plan): every loop starts from the same clock")
	rounds := fs.Int("rounds", 3, "times the whole table is measured, ours and PyTorch's taking turns at going first; each\n"+
		"row gives the median (the card's clock follows its load: one round's ratios move by up to 13%)")
	tokens := fs.Int("tokens", 16384, "B·S: B = tokens/S")
	width := fs.Int("width", 2048, "H·D: H = width/D")
	torchPy := fs.String("torch", "python3", `python3 with PyTorch for the SDPA reference ("" skips PyTorch)`)
	reference := fs.String("reference", "tools/reference/sdpa_bench.py", "path of the PyTorch SDPA script")
	torchBackends := fs.String("torch-backends", "flash,cudnn,efficient", "SDPA backends to time")
	jsonOut := fs.String("json", "", "write every row (ours, PyTorch's, -memory's) as JSON lines to FILE")
	quick := fs.Bool("quick", false, "a smoke test: two shapes (S=1024 D=64 causal, S=4096 D=128 non-causal), 5 iterations, one round")
	composed := fs.Bool("composed", true, "time the composed path too (it materialises B·H·S² scores)")
	attention := fs.Bool("attention", true, "run the attention table")
	memory := fs.Bool("memory", false, "also run the training-step memory table (model small, fused vs unfused)")
	memShapesFlag := fs.String("memory-shapes", "4096:8,16384:8,16384:16", "S:B pairs of the -memory table")
	seed := fs.Uint64("seed", 1, "seed of the random inputs")
	sm90 := fs.Bool("sm90", false, "time the fused path once more per Hopper forward, its forward on FA2 (\"fused\") and on\n"+
		"each wgmma kernel of kernels/flash_sm90_fwd.cu and kernels/dev/flash_sm90_dev.cu (rows fused-sm90,\n"+
		"fused-sm90pp, fused-sm90pp3, fused-sm90ppp, fused-sm90ppp3: "+cuda.FlashSM90Env+"=tma, pp, pp3, ppp, ppp3),\n"+
		"and print the forwards beside cuDNN's (needs a compute capability 9.0 GPU)")
	decode := fs.String("decode", "", "time generation instead: these query counts Sq (e.g. 1,16; at most 16 take the\n"+
		"split-K/V decode forward) against S = -seqs keys, forward only, non-causal: FlashForward with and\n"+
		"without the decode forward ("+cuda.FlashDecodeEnv+"=0) and SDPA's backends (sdpa_bench.py --decode-sq)")
	kvHeadsFlag := fs.String("kv-heads", "", "K/V heads H_kv, a comma list (e.g. 8,1; default H: multi-head attention): grouped-query\n"+
		"attention, our fused kernels on K/V of H_kv heads against PyTorch SDPA with enable_gqa=True (torch 2.5 or\n"+
		"later); each must divide H = -width/D, an entry equal to H is multi-head attention; the composed path is\n"+
		"MHA only (skipped for H_kv < H)")
	accuracy := addAccuracyFlags(fs)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var kvHeads []int
	if set["kv-heads"] {
		var err error
		if kvHeads, err = parseInts("kv-heads", *kvHeadsFlag); err != nil {
			return err
		}
		if *decode != "" {
			return errors.New("-kv-heads: -decode times multi-head attention only")
		}
	}
	if *accuracy.on {
		o, err := accuracy.options(args, set, *seqs, *dims, *causalFlag, kvHeads, *seed, *torchPy, *jsonOut, *device)
		if err != nil {
			return err
		}
		return bench.RunAccuracyReport(stdout, stderr, o)
	}
	if *decode != "" {
		o := bench.DecodeOptions{Sqs: *decode, Seqs: *seqs, Dims: *dims, Tokens: *tokens, Width: *width,
			Warmup: *warmup, Iters: *iters, Settle: *settle, Seed: *seed, TorchPy: *torchPy, Reference: *reference, TorchBackends: *torchBackends,
			JSONOut: *jsonOut, Device: *device}
		shapes, err := decodeShapes(o)
		if err != nil {
			return err
		}
		return bench.RunDecode(stdout, stderr, shapes, o)
	}

	var shapes []bench.TableShape
	if *quick {
		for _, q := range []bench.TableShape{{S: 1024, D: 64, Causal: true}, {S: 4096, D: 128, Causal: false}} {
			sh, err := bench.AttentionShapes([]int{q.S}, []int{q.D}, kvHeads, []bool{q.Causal}, *tokens, *width)
			if err != nil {
				return err
			}
			shapes = append(shapes, sh...)
		}
		if !set["iters"] {
			*iters = 5
		}
		if !set["warmup"] {
			*warmup = 2
		}
		if !set["rounds"] {
			*rounds = 1
		}
	} else {
		ss, err := parseInts("seqs", *seqs)
		if err != nil {
			return err
		}
		ds, err := parseInts("dims", *dims)
		if err != nil {
			return err
		}
		cs, err := parseCausal(*causalFlag)
		if err != nil {
			return err
		}
		if shapes, err = bench.AttentionShapes(ss, ds, kvHeads, cs, *tokens, *width); err != nil {
			return err
		}
	}
	memShapes, err := parseMemShapes(*memShapesFlag)
	if err != nil {
		return err
	}
	if *iters < 1 || *warmup < 0 || *rounds < 1 || *settle < 0 {
		return errors.New("-iters and -rounds must be at least 1, -warmup and -settle at least 0")
	}
	if *tokens < 1 || *width < 1 {
		return fmt.Errorf("-tokens and -width must be positive, got %d and %d", *tokens, *width)
	}
	if *device != "cuda" {
		return fmt.Errorf("bench needs -device cuda: -device %s is not benchmarked (the table compares GPU kernels)", *device)
	}
	return bench.RunAttention(stdout, stderr, bench.AttentionOptions{Shapes: shapes, KVHeads: kvHeads, Tokens: *tokens, Width: *width, Warmup: *warmup,
		Iters: *iters, Rounds: *rounds, Settle: *settle, Composed: *composed, SM90: *sm90, Seed: *seed, TorchPy: *torchPy,
		Reference: *reference, TorchBackends: *torchBackends, Attention: *attention, Memory: *memory, MemShapes: memShapes,
		JSONOut: *jsonOut})
}

// runBenchTrain is `flashgraph bench -train`: our training step against the
// same model in PyTorch eager and torch.compile, on the same shapes, in one
// process and one table.
func runBenchTrain(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench -train", "",
		"Times the whole training step (forward, backward, AdamW) of a model config on the GPU and,\n"+
			"through tools/reference/train_bench.py, the same model in PyTorch eager and torch.compile\n"+
			"(SDPA attention, fused AdamW, float32 master weights). Prints one table: tokens/s, step ms,\n"+
			"peak device memory (each side's own allocations: ours counted by the device, PyTorch's\n"+
			"max_memory_allocated), MFU (train's FLOP count) and the ratios (vs compile: the fastest\n"+
			"torch.compile mode timed; -torch-modes eager,compile,max-autotune adds its best mode).\n"+
			"-fuse-qkv both times our step without and with the q/k/v GEMM merge in one run.\n"+
			"-profile adds where our step's time goes, per op type.", stderr)
	fs.Bool("train", true, "the training-step benchmark (this table)")
	cfgName := fs.String("config", "gpt2", "model config: "+strings.Join(model.Names(), ", "))
	batch := fs.Int("batch", 0, "batch size (0: the config's)")
	seq := fs.Int("seq", 0, "sequence length S (0: the config's; long context, e.g. -seq 16384 -batch 1)")
	dtypeFlag := fs.String("dtype", "bf16", "bf16 (mixed precision) or f32")
	fuse := fs.Bool("fuse", true, "fuse attention (FlashAttention kernels)")
	fuseEW := fs.Bool("fuse-elementwise", true, "with -fuse: fuse the step's elementwise chains too")
	recompute := addRecomputeFlag(fs)
	fuseQKV := fs.String("fuse-qkv", "off", "our step with the q/k/v projections as one GEMM (train -fuse-qkv): off, on, or both (times the step without and then with it, two rows in one run)")
	curve := fs.Int("curve", 0, "also train N steps from the same start with and without elementwise fusion and compare the loss curves (with -dtype bf16 also two noise samples: the unfused step in f32, and again with every weight moved by half a bf16 step)")
	grads := fs.Bool("grads", false, "also compare the first step's gradients from the same weights and batch: fused and unfused elementwise in bf16 against float32")
	warmup := fs.Int("warmup", 5, "untimed steps first")
	steps := fs.Int("steps", 30, "timed steps")
	profile := fs.Bool("profile", false, "also print the device time of one step per op type and the slowest nodes")
	top := fs.Int("top", 20, "with -profile: how many of the slowest nodes to list")
	profileOut := fs.String("profile-out", "", "with -profile: also write every node's time (node, op, ms) as TSV to FILE")
	torchPy := fs.String("torch", "python3", `python3 with PyTorch ("" skips PyTorch)`)
	reference := fs.String("reference", "tools/reference/train_bench.py", "path of the PyTorch training-step script")
	torchModes := fs.String("torch-modes", "eager,compile", "PyTorch modes to time: eager, compile (torch.compile's default mode), max-autotune (torch.compile mode=\"max-autotune\": autotunes GEMMs for minutes on a cold inductor cache)")
	jsonOut := fs.String("json", "", "write every row as JSON lines to FILE")
	data := fs.String("data", "", "time our step on batches of this training data (text or token file, as train -data reads it) instead of uniform random bytes: the data decides how often each embedding row is hit")
	if err := checkRecomputeArgs(args); err != nil {
		return err
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	cfg, err := model.Lookup(*cfgName)
	if err != nil {
		return err
	}
	if *batch < 0 || *seq < 0 || *warmup < 0 || *steps < 1 || *top < 0 || *curve < 0 {
		return errors.New("-batch, -seq and -warmup must be at least 0, -steps at least 1, -top at least 0")
	}
	if *batch > 0 {
		cfg.Batch = *batch
	}
	if *seq > 0 {
		cfg.Seq = *seq
	}
	qkv, err := parseFuseQKVVariants(*fuseQKV)
	if err != nil {
		return err
	}
	if err := checkTorchModes(*torchModes); err != nil {
		return err
	}
	bf16 := false
	switch strings.ToLower(*dtypeFlag) {
	case "bf16", "bfloat16":
		bf16 = true
	case "f32", "fp32", "float32":
	default:
		return fmt.Errorf("-dtype %q: want bf16 or f32", *dtypeFlag)
	}
	return bench.RunTrain(stdout, stderr, bench.TrainOptions{Config: cfg, BF16: bf16, Fuse: *fuse, FuseElementwise: *fuseEW,
		Recompute: recompute.mode, FuseQKV: qkv, Curve: *curve, Grads: *grads, Warmup: *warmup, Steps: *steps, Profile: *profile, Top: *top,
		ProfileOut: *profileOut, TorchPy: *torchPy, Reference: *reference, TorchModes: *torchModes, JSONOut: *jsonOut, Data: *data})
}

// parseFuseQKVVariants reads bench -train -fuse-qkv: which variants of our
// step to time.
func parseFuseQKVVariants(s string) ([]bool, error) {
	switch s {
	case "off", "false":
		return []bool{false}, nil
	case "on", "true":
		return []bool{true}, nil
	case "both":
		return []bool{false, true}, nil
	}
	return nil, fmt.Errorf("-fuse-qkv %q: want off, on or both", s)
}

// checkTorchModes refuses a -torch-modes entry train_bench.py does not know,
// before minutes of our own timing.
func checkTorchModes(s string) error {
	for _, m := range strings.Split(s, ",") {
		switch strings.TrimSpace(m) {
		case "", "eager", "compile", "max-autotune":
		default:
			return fmt.Errorf("-torch-modes: unknown mode %q (want eager, compile, max-autotune)", m)
		}
	}
	return nil
}

// decodeShapes lists the -decode shapes: each D, S (the key count) and Sq,
// with B = tokens/S and H = width/D as in the attention table.
func decodeShapes(o bench.DecodeOptions) ([]bench.DecodeShape, error) {
	sqs, err := parseInts("decode", o.Sqs)
	if err != nil {
		return nil, err
	}
	ss, err := parseInts("seqs", o.Seqs)
	if err != nil {
		return nil, err
	}
	ds, err := parseInts("dims", o.Dims)
	if err != nil {
		return nil, err
	}
	if o.Tokens < 1 || o.Width < 1 {
		return nil, fmt.Errorf("-tokens and -width must be positive, got %d and %d", o.Tokens, o.Width)
	}
	var out []bench.DecodeShape
	for _, d := range ds {
		for _, s := range ss {
			if o.Tokens%s != 0 || o.Width%d != 0 {
				return nil, fmt.Errorf("S=%d, D=%d: -tokens %d and -width %d must be multiples of S and D", s, d, o.Tokens, o.Width)
			}
			for _, q := range sqs {
				if q > s {
					return nil, fmt.Errorf("-decode %d: more query rows than the %d keys", q, s)
				}
				out = append(out, bench.DecodeShape{B: o.Tokens / s, H: o.Width / d, Sq: q, Sk: s, D: d})
			}
		}
	}
	return out, nil
}

// accuracyDefaultSeqs replaces -seqs's default under -accuracy: the float64
// reference is S² work per head, and the error settles by S = 4096.
const accuracyDefaultSeqs = "1024,4096"

// accuracyFlags are the flags -accuracy adds to `flashgraph bench`.
type accuracyFlags struct {
	on                     *bool
	heads                  *int
	dtypes, script, keep   *string
	backends, scriptDevice *string
}

func addAccuracyFlags(fs *flag.FlagSet) accuracyFlags {
	return accuracyFlags{
		on: fs.Bool("accuracy", false, "measure error instead of time: our FlashForward/FlashBackward (the kernels the\n"+
			"environment picks) and PyTorch SDPA with cuDNN and with FLASH forced, each against a float64\n"+
			"reference computed from the same 16-bit inputs (tools/reference/sdpa_error.py); B=1,\n"+
			"H=-accuracy-heads, -dims × -seqs (default "+accuracyDefaultSeqs+" here) × -causal × -accuracy-dtypes,\n"+
			"and × -kv-heads (each must divide -accuracy-heads: grouped-query attention, SDPA with enable_gqa=True).\n"+
			"Prints the relative L2 error of O, dQ, dK, dV and ours/cuDNN per output"),
		heads:  fs.Int("accuracy-heads", 4, "-accuracy: heads H (B is 1)"),
		dtypes: fs.String("accuracy-dtypes", "bf16,fp16", "-accuracy: element types (bf16, fp16)"),
		script: fs.String("accuracy-script", "tools/reference/sdpa_error.py", "-accuracy: path of the error script"),
		keep: fs.String("accuracy-dir", "", "-accuracy: write inputs, our outputs, manifest.json and errors.jsonl\n"+
			"into this folder and keep it (default: a temporary folder, removed at the end)"),
		backends:     fs.String("accuracy-backends", "cudnn,flash", "-accuracy: SDPA backends to compare"),
		scriptDevice: fs.String("accuracy-ref-device", "cuda", "-accuracy: where the reference and SDPA run (cuda or cpu)"),
	}
}

// options checks the flags -accuracy uses, the bench's shared ones with it
// (set: the flags given on the command line).
func (f accuracyFlags) options(args []string, set map[string]bool, seqs, dims, causal string, kvHeads []int, seed uint64,
	torchPy, jsonOut, device string) (bench.AccuracyOptions, error) {
	for _, other := range []string{"decode", "memory", "sm90", "quick"} {
		if set[other] {
			return bench.AccuracyOptions{}, fmt.Errorf("-accuracy runs alone: drop -%s", other)
		}
	}
	if device != "cuda" {
		return bench.AccuracyOptions{}, fmt.Errorf("bench -accuracy needs -device cuda: -device %s runs no flash kernels", device)
	}
	if !set["seqs"] {
		seqs = accuracyDefaultSeqs
	}
	cases, err := accuracyCases(seqs, dims, causal, *f.dtypes, *f.heads, kvHeads)
	if err != nil {
		return bench.AccuracyOptions{}, err
	}
	if torchPy == "" {
		return bench.AccuracyOptions{}, errors.New("bench -accuracy needs PyTorch for the float64 reference and cuDNN: -torch is empty")
	}
	return bench.AccuracyOptions{Cases: cases, Seed: seed, TorchPy: torchPy, Script: *f.script, Keep: *f.keep,
		Backends: *f.backends, RefDev: *f.scriptDevice, JSONOut: jsonOut,
		Command: strings.TrimSpace("flashgraph bench " + strings.Join(args, " "))}, nil
}

// accuracyCases lists the cases: each element type, D, K/V head count
// (kvHeads; nil: heads only), S and causal, in that nesting, with B = 1. An
// H_kv equal to heads is multi-head attention (KVHeads 0, once).
func accuracyCases(seqs, dims, causal, dtypes string, heads int, kvHeads []int) ([]bench.AccuracyCase, error) {
	ss, err := parseInts("seqs", seqs)
	if err != nil {
		return nil, err
	}
	ds, err := parseInts("dims", dims)
	if err != nil {
		return nil, err
	}
	cs, err := parseCausal(causal)
	if err != nil {
		return nil, err
	}
	if heads < 1 {
		return nil, fmt.Errorf("-accuracy-heads %d: want at least 1", heads)
	}
	var dts []string
	for _, f := range strings.Split(dtypes, ",") {
		switch strings.TrimSpace(f) {
		case "":
		case "bf16", "bfloat16":
			dts = append(dts, "bfloat16")
		case "fp16", "f16", "float16":
			dts = append(dts, "float16")
		default:
			return nil, fmt.Errorf("-accuracy-dtypes: %q: want bf16 or fp16", f)
		}
	}
	if len(dts) == 0 {
		return nil, errors.New("-accuracy-dtypes: empty list")
	}
	kvs := []int{0}
	if len(kvHeads) > 0 {
		kvs = nil
		for _, kv := range kvHeads {
			if kv < 1 || heads%kv != 0 {
				return nil, fmt.Errorf("-kv-heads %d: must divide -accuracy-heads %d", kv, heads)
			}
			if kv == heads {
				kv = 0
			}
			if !slices.Contains(kvs, kv) {
				kvs = append(kvs, kv)
			}
		}
	}
	var out []bench.AccuracyCase
	for _, dt := range dts {
		for _, d := range ds {
			for _, kv := range kvs {
				for _, s := range ss {
					for _, c := range cs {
						out = append(out, bench.AccuracyCase{DType: dt, B: 1, H: heads, KVHeads: kv, S: s, D: d, Causal: c})
					}
				}
			}
		}
	}
	return out, bench.CheckAccuracyCases(out)
}
