package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/train"
)

// trainBenchRow is one line of the training-throughput table (and of -json).
type trainBenchRow struct {
	Kind   string   `json:"kind"` // "train_step"
	Impl   string   `json:"impl"` // flashgraph, flashgraph+qkv, torch-eager, torch-compile, torch-compile-max-autotune
	Config string   `json:"config"`
	B      int      `json:"B"`
	S      int      `json:"S"`
	DType  string   `json:"dtype"`
	StepMs *float64 `json:"step_ms"`
	TokS   *float64 `json:"tok_s"`
	// PeakMemBytes is the peak device memory the step took. Ours: the
	// peak of our own allocations (cuda.Device.PeakAllocatedBytes) from
	// just before compiling to after the timed steps, less what was
	// allocated before compiling: weights, optimizer state, the activation
	// arena, inputs and workspaces. PyTorch's: torch.cuda.max_memory_allocated.
	PeakMemBytes *int64 `json:"peak_mem_bytes"`
	// MemInfoDeltaBytes (ours only) is what peak_mem_bytes was before
	// 2026-12-03 evening: cuMemGetInfo's free memory before compiling minus
	// after the timed steps. Any other process on the GPU moves it (one
	// still releasing its memory made it smaller than our weights alone),
	// so it is kept for reference only.
	MemInfoDeltaBytes *int64   `json:"meminfo_delta_bytes,omitempty"`
	Loss              *float64 `json:"loss"`
	CompileS          *float64 `json:"compile_s,omitempty"`
	// MFU is model FLOPs utilisation: train.GraphFLOPs of our training step
	// per token (the same model for every row) times tok_s over the GPU's
	// peak for the dtype (train.PeakFLOPS); absent when the peak is unknown.
	MFU   *float64 `json:"mfu,omitempty"`
	GPU   string   `json:"gpu,omitempty"`
	Torch string   `json:"torch,omitempty"`
	Error *string  `json:"error"`
}

// TrainOptions are what `flashgraph bench -train` runs with.
type TrainOptions struct {
	Config                      model.Config
	BF16, Fuse, FuseElementwise bool
	Recompute                   train.RecomputeMode
	// FuseQKV lists the variants of our step to time, in order: without
	// (false) and with (true) the fuse_qkv pass (Hyper.FuseQKV); nil is
	// [false]. Both in one run compare them on one GPU state.
	FuseQKV                                 []bool
	Curve                                   int
	Grads                                   bool
	Warmup, Steps                           int
	Profile                                 bool
	Top                                     int
	ProfileOut                              string
	TorchPy, Reference, TorchModes, JSONOut string
	// Data, when set, is the training data our step's batches come from
	// (train.LoadData); by default they are uniform random bytes.
	Data string
}

// RunTrain is `flashgraph bench -train`: our training step against the
// same model in PyTorch eager and torch.compile, on the same shapes, in one
// process and one table.
func RunTrain(stdout, stderr io.Writer, o TrainOptions) error {
	cfg, bf16 := o.Config, o.BF16
	dtName := map[bool]string{true: "bfloat16", false: "float32"}[bf16]
	if o.JSONOut != "" {
		if err := checkpoint.WriteFileAtomic(o.JSONOut, func(io.Writer) error { return nil }); err != nil {
			return fmt.Errorf("-json %s: %w", o.JSONOut, err)
		}
	}
	corpus := benchCorpus(cfg)
	if o.Data != "" {
		var err error
		if corpus, err = train.LoadData(o.Data, 0.1, train.FormatAuto); err != nil {
			return err
		}
	}
	if err := cuda.Available(); err != nil {
		return fmt.Errorf("bench -train needs -device cuda: %v", err)
	}

	variants := o.FuseQKV
	if len(variants) == 0 {
		variants = []bool{false}
	}
	var rows []trainBenchRow
	profs := make([][]cuda.NodeTime, len(variants)) // per variant, with -profile
	for i, qkv := range variants {
		r, p, err := benchOurTrainStep(stderr, cfg, corpus, bf16, o.Fuse, !o.FuseElementwise, o.Recompute, qkv, o.Warmup, o.Steps, o.Profile)
		if err != nil {
			return err
		}
		r.DType = dtName
		rows = append(rows, r)
		profs[i] = p
	}
	ours := rows[0]
	if o.TorchPy != "" {
		tr, terr := runTorchTrainBench(stderr, o.TorchPy, o.Reference, cfg, dtName, o.TorchModes, o.Warmup, o.Steps)
		for i := range tr {
			// The same model: the same FLOPs per token, so MFU scales with tok/s.
			if ours.MFU != nil && tr[i].TokS != nil && *ours.TokS > 0 {
				tr[i].MFU = fptr(*ours.MFU * *tr[i].TokS / *ours.TokS)
			}
		}
		rows = append(rows, tr...)
		if terr != nil {
			fmt.Fprintf(stderr, "bench: PyTorch reference: %v\n", terr)
		}
	}
	printTrainTable(stdout, rows)
	if o.Curve > 0 {
		if err := compareCurves(stdout, stderr, cfg, bf16, o.Curve); err != nil {
			return err
		}
	}
	if o.Grads {
		if err := compareGradients(stdout, stderr, cfg); err != nil {
			return err
		}
	}
	for i, prof := range profs {
		if prof == nil {
			continue
		}
		if len(profs) > 1 {
			fmt.Fprintf(stdout, "\n%s:", rows[i].Impl)
		}
		printProfile(stdout, prof, o.Top)
		if o.ProfileOut != "" {
			if err := writeProfile(profileOutPath(o.ProfileOut, rows[i].Impl, i), prof); err != nil {
				return fmt.Errorf("-profile-out: %w", err)
			}
		}
	}
	if o.JSONOut != "" {
		return checkpoint.WriteFileAtomic(o.JSONOut, func(w io.Writer) error {
			enc := json.NewEncoder(w)
			for _, r := range rows {
				if err := enc.Encode(r); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return nil
}

// benchOurTrainStep compiles cfg's training step on the GPU and times
// Trainer.Step (the loop `train` runs: upload the batch, run, read the
// loss back) over random bytes.
func benchOurTrainStep(stderr io.Writer, cfg model.Config, corpus *train.Corpus, bf16, fuse, noFuseEW bool, recompute train.RecomputeMode, fuseQKV bool, warmup, steps int, profile bool) (trainBenchRow, []cuda.NodeTime, error) {
	row := trainBenchRow{Kind: "train_step", Impl: "flashgraph", Config: cfg.Name, B: cfg.Batch, S: cfg.Seq}
	if fuseQKV {
		row.Impl = "flashgraph+qkv"
	}
	be, err := cuda.NewMixedBackend(bf16)
	if err != nil {
		return row, nil, fmt.Errorf("bench -train needs -device cuda: %w", err)
	}
	defer be.Close()
	cb, ok := be.(*cuda.Backend)
	if !ok {
		return row, nil, errors.New("cuda.NewBackend did not return a *cuda.Backend")
	}
	d := cb.Device()
	row.GPU = d.Name()
	hyper := train.Hyper{LR: 3e-4, MinLR: 3e-5, Warmup: 10, Steps: int64(warmup + steps + 10), WeightDecay: 0.1, DataSeed: 1,
		NoFuseElementwise: noFuseEW, FuseQKV: fuseQKV}.WithRecompute(recompute)
	free0, _, err := d.MemInfo()
	if err != nil {
		return row, nil, err
	}
	// The peak from here on is what compiling and running the step took.
	allocated0 := d.ResetPeakAllocated()
	fmt.Fprintf(stderr, "bench: compiling the %s training step (B=%d S=%d, %s, fuse=%v, fuse-elementwise=%v, recompute=%s, fuse-qkv=%v, data: %s) on %s\n", cfg.Name, cfg.Batch, cfg.Seq,
		map[bool]string{true: "bf16", false: "f32"}[bf16], fuse, fuse && !noFuseEW, recompute, fuseQKV, corpus.Source, d.Name())
	t0 := time.Now()
	tr, err := train.NewTrainer(be, cfg, fuse, hyper, corpus)
	if err != nil {
		return row, nil, err
	}
	defer tr.Close()
	fmt.Fprintf(stderr, "bench: compiled in %.1fs; %d warm-up steps, %d timed\n", time.Since(t0).Seconds(), warmup, steps)
	for range warmup {
		if _, err := tr.Step(); err != nil {
			return row, nil, err
		}
	}
	var loss float64
	start := time.Now()
	for range steps {
		if loss, err = tr.Step(); err != nil {
			return row, nil, err
		}
	}
	ms := float64(time.Since(start).Microseconds()) / 1e3 / float64(steps)
	peak := d.PeakAllocatedBytes()
	free1, _, err := d.MemInfo()
	if err != nil {
		return row, nil, err
	}
	row.StepMs, row.TokS, row.Loss = fptr(ms), fptr(float64(cfg.Batch*cfg.Seq)/(ms*1e-3)), fptr(loss)
	if p, ok := train.PeakFLOPS(d.Name(), train.ComputeDType(be, cfg.DType)); ok {
		perTok := train.GraphFLOPs(tr.Graphs.Step.Graph).Model / float64(cfg.Batch*cfg.Seq)
		row.MFU = fptr(train.MFU(perTok, *row.TokS, p.FLOPS))
	}
	row.setStepMemory(allocated0, peak, free0, free1)
	var prof []cuda.NodeTime
	if profile {
		p, ok := tr.Executable().(cuda.Profiler)
		if !ok {
			return row, nil, errors.New("the CUDA executable cannot be profiled")
		}
		for range 2 { // the first run warms the events up; keep the second
			if prof, err = p.Profile(tr.StepFeeds()); err != nil {
				return row, nil, err
			}
		}
	}
	return row, prof, nil
}

// setStepMemory fills in the memory our step took: peak_mem_bytes from our
// allocations (allocated before compiling, and their peak from then to the
// end of the timed steps), meminfo_delta_bytes from cuMemGetInfo's free
// memory before compiling and after the timed steps (negative when another
// process released more than we took meanwhile).
func (r *trainBenchRow) setStepMemory(allocatedBefore, peakAllocated int64, freeBefore, freeAfter uint64) {
	r.PeakMemBytes = iptr(peakAllocated - allocatedBefore)
	r.MemInfoDeltaBytes = iptr(int64(freeBefore) - int64(freeAfter))
}

// runTorchTrainBench runs tools/reference/train_bench.py and reads its rows.
func runTorchTrainBench(stderr io.Writer, py, script string, cfg model.Config, dtype, modes string, warmup, steps int) ([]trainBenchRow, error) {
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("-reference %s: %w (run from the repository root, or pass -reference)", script, err)
	}
	args := []string{script, "--config", cfg.Name, "--batch", strconv.Itoa(cfg.Batch), "--seq", strconv.Itoa(cfg.Seq),
		"--dtype", dtype, "--modes", modes, "--warmup", strconv.Itoa(max(1, warmup)), "--steps", strconv.Itoa(steps)}
	fmt.Fprintf(stderr, "bench: %s %s\n", py, strings.Join(args, " "))
	cmd := exec.Command(py, args...)
	cmd.Stderr = stderr
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	out, runErr := cmd.Output()
	var rows []trainBenchRow
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var r trainBenchRow
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return rows, fmt.Errorf("%s: bad output line %q: %w", script, line, err)
		}
		r.Kind = "train_step"
		rows = append(rows, r)
	}
	if runErr != nil {
		return rows, fmt.Errorf("%s %s: %w", py, script, runErr)
	}
	return rows, nil
}

// trainMemLegend says under the table what "peak mem" is: on both sides
// the peak of the implementation's own device allocations, so that another
// process on the GPU cannot move it.
const trainMemLegend = "peak mem: flashgraph = peak of our own device allocations from compiling the step to the end of the timed steps (weights, optimizer state, activation arena, inputs, workspaces); torch = max_memory_allocated"

func printTrainTable(w io.Writer, rows []trainBenchRow) {
	ref := map[string]float64{}
	best := "" // the fastest torch.compile mode: what "vs compile" divides by
	for _, r := range rows {
		if r.TokS != nil {
			ref[r.Impl] = *r.TokS
			if strings.HasPrefix(r.Impl, "torch-compile") && *r.TokS > ref["torch-compile(best)"] {
				ref["torch-compile(best)"], best = *r.TokS, r.Impl
			}
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "impl\tconfig\tB×S\tdtype\ttok/s\tMFU\tstep ms\tpeak mem\tvs eager\tvs compile\t")
	for _, r := range rows {
		tok, mfu, ms, mem, ve, vc := "-", "-", "-", "-", "-", "-"
		if r.MFU != nil {
			mfu = fmt.Sprintf("%.1f%%", 100**r.MFU)
		}
		if r.TokS != nil {
			tok = fmt.Sprintf("%.1fk", *r.TokS/1e3)
			if e := ref["torch-eager"]; e > 0 {
				ve = fmt.Sprintf("%.2f×", *r.TokS/e)
			}
			if c := ref["torch-compile(best)"]; c > 0 {
				vc = fmt.Sprintf("%.2f×", *r.TokS/c)
			}
		}
		if r.StepMs != nil {
			ms = fmt.Sprintf("%.2f", *r.StepMs)
		}
		if r.PeakMemBytes != nil {
			mem = cuda.FormatBytes(*r.PeakMemBytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d×%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Impl, r.Config, r.B, r.S, r.DType, tok, mfu, ms, mem, ve, vc)
	}
	tw.Flush()
	for _, r := range rows {
		if r.Error != nil {
			fmt.Fprintf(w, "%s: %s\n", r.Impl, *r.Error)
		}
	}
	fmt.Fprintln(w, trainMemLegend)
	fmt.Fprintln(w, "MFU: model FLOPs of our training step per token (train's count, train.GraphFLOPs) × tok/s over the GPU's dense peak for the dtype; the same model for every row")
	if best != "" {
		fmt.Fprintf(w, "vs compile: against the fastest torch.compile mode timed (%s)\n", best)
	}
}

// profileOutPath is where -profile-out writes the i-th variant's profile:
// the path itself for the first, the variant's name before the extension
// for the others (prof.tsv, prof.flashgraph+qkv.tsv).
func profileOutPath(path, impl string, i int) string {
	if i == 0 {
		return path
	}
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "." + impl + ext
}

// writeProfile writes every node's time (node, op, ms) as TSV.
func writeProfile(path string, prof []cuda.NodeTime) error {
	return checkpoint.WriteFileAtomic(path, func(w io.Writer) error {
		for _, t := range prof {
			if _, err := fmt.Fprintf(w, "%s\t%s\t%.4f\n", t.Node, t.Op, t.Ms); err != nil {
				return err
			}
		}
		return nil
	})
}

// printProfile prints one profiled step: time per op type, then the slowest nodes.
func printProfile(w io.Writer, times []cuda.NodeTime, top int) {
	total := 0.0
	for _, t := range times {
		total += t.Ms
	}
	fmt.Fprintf(w, "\nprofile of one step: %.2f ms of device time over %d nodes\n", total, len(times))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tnodes\tms\tshare\t")
	for _, o := range cuda.ByOp(times) {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.1f%%\t\n", o.Op, o.Nodes, o.Ms, 100*o.Ms/total)
	}
	tw.Flush()
	if top == 0 {
		return
	}
	sorted := append([]cuda.NodeTime(nil), times...)
	sort.SliceStable(sorted, func(a, b int) bool { return sorted[a].Ms > sorted[b].Ms })
	fmt.Fprintf(w, "\nslowest %d nodes\n", min(top, len(sorted)))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "node\top\tms\t")
	for _, t := range sorted[:min(top, len(sorted))] {
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t\n", t.Node, t.Op, t.Ms)
	}
	tw.Flush()
}

// benchCorpus is random bytes: the data does not change the step's time,
// and the bench must not depend on a corpus being present.
func benchCorpus(cfg model.Config) *train.Corpus {
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, max(1<<20, 4*cfg.Batch*(cfg.Seq+1)))
	for i := range data {
		data[i] = byte(rng.IntN(256))
	}
	return &train.Corpus{Source: "random bytes", Train: data, Val: data[:len(data)/8]}
}

// learnableCorpus repeats one random 2 KiB text: a model can learn it, so
// the compared loss curves fall (on random bytes both stay at ln 256).
func learnableCorpus(cfg model.Config) *train.Corpus {
	rng := rand.New(rand.NewPCG(3, 4))
	block := make([]byte, 2048)
	for i := range block {
		block[i] = byte('a' + rng.IntN(26))
	}
	data := make([]byte, max(1<<20, 4*cfg.Batch*(cfg.Seq+1)))
	for i := range data {
		data[i] = block[i%len(block)]
	}
	return &train.Corpus{Source: "a repeated random text", Train: data, Val: data[:len(data)/8]}
}

// compareCurves trains cfg for steps steps twice from the same weights and
// batches, with and without elementwise fusion (attention fused in both),
// and prints how far the loss curves are apart.
func compareCurves(stdout, stderr io.Writer, cfg model.Config, bf16 bool, steps int) error {
	// The runs: elementwise fusion on and off in the benchmark's precision
	// and, for bf16, the unfused step in float32 too: how far bf16 rounding
	// alone moves the curve is the noise the fused curve is judged against.
	// A second noise sample: the unfused step again with every parameter
	// moved by half a bf16 step (2^-9 relative, a fixed pattern of signs),
	// as another rounding of the same weights would move it. A third: the
	// unfused step run again as it is, which differs from the first run
	// because the attention backward sums dQ with atomic adds, in whatever
	// order the blocks finish.
	type run struct {
		name    string
		noEW    bool
		bf16    bool
		perturb bool
	}
	runs := []run{{"fused", false, bf16, false}, {"unfused", true, bf16, false}}
	if bf16 {
		runs = append(runs, run{"unfused f32", true, false, false}, run{"unfused perturbed", true, true, true},
			run{"unfused again", true, true, false})
	}
	curves := make([][]float64, len(runs))
	for k, r := range runs {
		be, err := cuda.NewMixedBackend(r.bf16)
		if err != nil {
			return err
		}
		h := train.Hyper{LR: 1e-3, MinLR: 1e-4, Warmup: int64(min(20, steps/10)), Steps: int64(steps), WeightDecay: 0.1, DataSeed: 1,
			NoFuseElementwise: r.noEW}
		tr, err := train.NewTrainer(be, cfg, true, h, learnableCorpus(cfg))
		if err != nil {
			be.Close()
			return err
		}
		if r.perturb {
			if err := perturbParams(tr.Executable(), tr.Graphs.Step.Graph, 0x1p-9); err != nil {
				tr.Close()
				be.Close()
				return err
			}
		}
		fmt.Fprintf(stderr, "bench: loss curve %d/%d (%s), %d steps\n", k+1, len(runs), r.name, steps)
		for range steps {
			if _, err := tr.Step(); err != nil {
				tr.Close()
				be.Close()
				return err
			}
		}
		curves[k] = tr.Losses()
		tr.Close()
		be.Close()
	}
	prec := map[bool]string{true: "bf16", false: "f32"}[bf16]
	n := len(curves[0])
	fmt.Fprintf(stdout, "\nloss curves, %s %s, %d steps on a repeated random text (relative differences per step)\n", cfg.Name, prec, n)
	fmt.Fprintf(stdout, "%28s  %12s %5s  %12s  %s\n", "pair", "max rel", "step", "mean rel", "loss at steps 1, n/2, n")
	pair := func(name string, a, b []float64) {
		worst, at, sum := 0.0, 0, 0.0
		for i := range a {
			rel := math.Abs(a[i]-b[i]) / math.Max(math.Abs(b[i]), 1e-30)
			sum += rel
			if rel > worst {
				worst, at = rel, i+1
			}
		}
		fmt.Fprintf(stdout, "%28s  %12.3g %5d  %12.3g  %.4f %.4f %.4f vs %.4f %.4f %.4f\n", name, worst, at, sum/float64(len(a)),
			a[0], a[max(0, n/2-1)], a[n-1], b[0], b[max(0, n/2-1)], b[n-1])
	}
	pair("fused vs unfused "+prec, curves[0], curves[1])
	if bf16 {
		pair("unfused bf16 vs f32 (noise)", curves[1], curves[2])
		pair("unfused vs perturbed (noise)", curves[1], curves[3])
		pair("unfused vs again (noise)", curves[1], curves[4])
	}
	return nil
}

// perturbParams multiplies every element of every parameter of g in exe by
// 1 ± rel (the sign from a fixed hash of the parameter and element index).
func perturbParams(exe backend.Executable, g *graph.Graph, rel float64) error {
	for _, v := range g.Initializers() {
		if v.Kind != graph.Param {
			continue
		}
		t, err := exe.Initializer(v.Name)
		if err != nil {
			return fmt.Errorf("perturb %s: %w", v.Name, err)
		}
		h := fnv.New32a()
		h.Write([]byte(v.Name))
		seed := h.Sum32()
		for i := range t.Len() {
			x := uint32(i)*2654435761 ^ seed
			x ^= x >> 15
			sign := 1.0
			if x&1 == 1 {
				sign = -1
			}
			t.Set(i, t.At(i)*(1+sign*rel))
		}
		if err := exe.SetInitializer(v.Name, t); err != nil {
			return fmt.Errorf("perturb %s: %w", v.Name, err)
		}
	}
	return nil
}

// stepGradients compiles cfg's training step on be (elementwise fusion on
// or off), runs it once on a fixed batch from the config's initial weights
// and returns every parameter's gradient.
func stepGradients(be backend.Backend, cfg model.Config, fuseEW bool) (map[string]*graph.Tensor, error) {
	gs, err := train.BuildGraphsFor(be, cfg, true, train.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, WeightDecay: 0.1,
		NoFuseElementwise: !fuseEW})
	if err != nil {
		return nil, err
	}
	g := gs.Step.Graph.Clone()
	var names []string
	for _, n := range g.Nodes {
		for _, o := range n.Outputs {
			if strings.HasPrefix(o.Name, "grad.") && !g.IsOutput(o) {
				g.Outputs = append(g.Outputs, o)
				names = append(names, o.Name)
			}
		}
	}
	exe, err := be.Compile(g, backend.Options{})
	if err != nil {
		return nil, err
	}
	defer exe.Close()
	feeds := map[string]*graph.Tensor{}
	for _, in := range g.Inputs {
		t := graph.NewTensor(in.Type.DType, in.Type.Shape)
		for i := range t.Len() {
			switch {
			case in.Type.DType == graph.Int64: // tokens and targets: a fixed pseudo-random batch
				t.Set(i, float64((i*2654435761+int(len(in.Name)))%cfg.Vocab))
			case in.Name == gs.Step.Step:
				t.Set(i, 1)
			default:
				t.Set(i, 1e-3)
			}
		}
		feeds[in.Name] = t
	}
	out, err := exe.Run(feeds)
	if err != nil {
		return nil, err
	}
	res := map[string]*graph.Tensor{}
	for _, name := range names {
		res[name] = out[name]
	}
	return res, nil
}

// compareGradients prints, per parameter, how far the bf16 step's gradients
// are from the float32 step's, with and without elementwise fusion.
func compareGradients(stdout, stderr io.Writer, cfg model.Config) error {
	type variant struct {
		name         string
		bf16, fuseEW bool
	}
	variants := []variant{{"f32", false, false}, {"bf16 fused", true, true}, {"bf16 unfused", true, false}}
	res := make([]map[string]*graph.Tensor, len(variants))
	for k, v := range variants {
		fmt.Fprintf(stderr, "bench: gradients %d/%d (%s)\n", k+1, len(variants), v.name)
		be, err := cuda.NewMixedBackend(v.bf16)
		if err != nil {
			return err
		}
		res[k], err = stepGradients(be, cfg, v.fuseEW)
		be.Close()
		if err != nil {
			return fmt.Errorf("gradients (%s): %w", v.name, err)
		}
	}
	printGradientTable(stdout, cfg, res[0], res[1], res[2])
	return nil
}

// printGradientTable writes max|x−ref|/max|ref| of each gradient for the two
// bf16 steps against the float32 one, and the means.
func printGradientTable(w io.Writer, cfg model.Config, ref, fused, unfused map[string]*graph.Tensor) {
	names := make([]string, 0, len(ref))
	for n := range ref {
		names = append(names, n)
	}
	slices.Sort(names)
	rel := func(a, r *graph.Tensor) float64 {
		if a == nil || r == nil || a.Len() != r.Len() {
			return math.Inf(1)
		}
		var d, m float64
		for i := range r.Len() {
			d = math.Max(d, math.Abs(a.At(i)-r.At(i)))
			m = math.Max(m, math.Abs(r.At(i)))
		}
		if d != d {
			return math.Inf(1)
		}
		return d / math.Max(m, 1e-30)
	}
	fmt.Fprintf(w, "\nfirst-step gradients, %s, relative to float32 (max|x-f32| / max|f32|)\n", cfg.Name)
	fmt.Fprintf(w, "%36s  %12s  %12s\n", "gradient", "bf16 fused", "bf16 unfused")
	var sf, su float64
	for _, n := range names {
		f, u := rel(fused[n], ref[n]), rel(unfused[n], ref[n])
		sf += f
		su += u
		fmt.Fprintf(w, "%36s  %12.3g  %12.3g\n", n, f, u)
	}
	if len(names) > 0 {
		fmt.Fprintf(w, "%36s  %12.3g  %12.3g\n", "mean", sf/float64(len(names)), su/float64(len(names)))
	}
}
