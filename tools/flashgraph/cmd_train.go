package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/dist"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/internal/units"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/passes"
	"github.com/flashgraph/flashgraph/train"
)

func init() {
	register(&command{name: "train", summary: "train a model on bytes of text (default: tiny, fused, on the Go sources)", run: runTrain})
}

// defaultLR is a peak learning rate that trains each config well with AdamW
// at its own batch size; wider models want smaller steps.
var defaultLR = map[string]float64{"tiny": 3e-3, "small": 1e-3, "gpt2": 6e-4, "gpt2-medium": 3e-4, "gpt3-1.3b": 2e-4}

// defaultPeakLR is -lr's default for the built-in model cfg: its config's
// rate, or, when -dim, -layers, -heads, -head-dim or -ffn resized it, the
// rate of the built-in config nearest in size (non-embedding params, on a
// log scale), since a rate that trains a 64-wide model makes a 1024-wide
// one diverge. The second result names that config ("" when cfg is its
// config's own size).
func defaultPeakLR(cfg model.Config) (float64, string) {
	own, err := model.Lookup(cfg.Name)
	if err == nil && own.Dim == cfg.Dim && own.Layers == cfg.Layers && own.Heads == cfg.Heads &&
		own.HeadDim == cfg.HeadDim && own.FFN == cfg.FFN {
		return defaultLR[cfg.Name], ""
	}
	body := func(c model.Config) float64 {
		return float64(model.ParamCount(c) - 2*int64(c.Vocab)*int64(c.Dim))
	}
	n := body(cfg)
	best, bestDist := cfg.Name, math.Inf(1)
	for _, c := range model.Configs() {
		if _, ok := defaultLR[c.Name]; !ok {
			continue
		}
		if d := math.Abs(math.Log(body(c)) - math.Log(n)); d < bestDist {
			best, bestDist = c.Name, d
		}
	}
	return defaultLR[best], best
}

func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("train", "[FILE]", `Trains a model of docs/MODEL.md on bytes of text: forward, backward and AdamW as one
static training-step graph, compiled once. With no flags it trains the tiny config with
attention fusion on the Go standard library sources for a short run and writes, under -out:
graph.txt and graph.dot (the forward graph), train_graph.txt (the training step), loss.png,
and ckpt/ (safetensors checkpoints; -resume continues the newest one exactly). Ctrl-C
(SIGINT) or SIGTERM finishes the step in flight (or stops reading, compiling or validating at
once), saves a checkpoint and exits with status 130 or 143; a second one aborts at once,
removing what the run created except its last complete checkpoint. -seed seeds both the
weights and the batch sampling. A FILE (our graph text or .onnx) trains that graph instead:
-loss names its loss (or next-token appends one), -tokens, -bind, -train-params and -freeze
say how; train -explain FILE shows what is trained, -resume needs no FILE. -ranks N trains
data parallel: N rank processes, each on 1/N of every -batch rows, gradients averaged after
each step (on the CPU over loopback TCP; -gpus N on GPUs through NCCL, not yet run); -rank,
-world-size, -master-addr and -master-port (or torchrun's variables) make this process one
rank of a job started elsewhere (docs/DISTRIBUTED.md).`, stderr)
	mf := addModelFlags(fs, defaultConfig, false)
	fuse := addFuseFlag(fs, true, "fuse attention into FlashAttention before differentiating (-fuse=false: the graph as built)")
	fuseEW := fs.Bool("fuse-elementwise", true, "with -fuse: also fuse the training step's elementwise chains (FusedElementwise nodes; off: one node per op)")
	recompute := addRecomputeFlag(fs)
	fuseQKV := fs.Bool("fuse-qkv", false, fuseQKVHelp)
	steps := fs.Int64("steps", 200, "total training steps (a resumed run continues up to this many)")
	lr := fs.Float64("lr", 0, "peak learning rate (0: the config's default: tiny 3e-3, small 1e-3, gpt2 6e-4, gpt2-medium 3e-4, gpt3-1.3b 2e-4; a model resized by -dim, -layers, -heads, -head-dim or -ffn takes the rate of the built-in config nearest its size; a graph FILE 1e-3)")
	minLRFrac := fs.Float64("min-lr-frac", 0.1, "learning rate at the last step, as a fraction of -lr (cosine decay; 1: constant)")
	warmup := fs.Int64("warmup", -1, "linear warmup steps (-1: 10% of -steps)")
	wd := fs.Float64("wd", 0.1, "AdamW weight decay of the weight matrices (norm gains are not decayed)")
	data := fs.String("data", "", "what to train on: a text file, a folder whose text files are read (default: the Go sources under go env GOROOT), or a token file (see -data-format)")
	dataFormat := fs.String("data-format", "auto", dataFormatHelp)
	dataOrder := fs.String("data-order", "random", dataOrderHelp)
	valFrac := fs.Float64("val-frac", 0.1, "fraction of the data held out for validation (by file for a folder)")
	evalEvery := fs.Int64("eval-every", 50, "validation loss every N steps (0: only at the start and the end)")
	out := fs.String("out", "out", "folder for the graphs, the loss plot and (by default) the checkpoints")
	ckpt := fs.String("ckpt", "", "checkpoint folder (default: OUT/ckpt; \"none\": no checkpoints)")
	ckptEvery := fs.Int64("ckpt-every", 100, "checkpoint every N steps, besides the end (0: only at the end)")
	keepEvery := fs.Int64("keep-every", 0, "also keep the checkpoints of steps that are multiples of N (0: keep only the newest)")
	resume := fs.Bool("resume", false, "continue from the newest checkpoint in -ckpt: the model (config, sizes, dtype, seed) is the checkpoint's, and model flags may only agree with it; with the same other flags it continues bit for bit")
	force := fs.Bool("force", false, "train even when the memory plan says the run needs more memory than is available")
	device := fs.String("device", defaultDevice, "where to train: cpu, cuda, or auto (CUDA when present, else the CPU)")
	accum := fs.Int("accum", 1, "gradient accumulation: each step runs N micro-batches of -batch rows and applies their mean gradient once (the update of a batch N times larger, in the memory of one micro-batch)")
	clip := fs.Float64("clip", 0, "clip the global gradient norm to this bound, in the step graph, and report the norm (0: no clipping)")
	metricsPath := fs.String("metrics", "", "write a JSON line per step (step, loss, lr, grad_norm with -clip, tok_s, mfu, step_ms) and per validation (val_loss) to FILE; -resume appends")
	df := addDistFlags(fs)
	gf := addGraphTrainFlags(fs)
	if err := checkRecomputeArgs(args); err != nil {
		return err
	}
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	ckptDir := ckptFolder(*ckpt, *out)
	ts, err := gf.resolve(mf, fs.Arg(0), ckptDir, *resume, stderr)
	if err != nil {
		return err
	}
	source := ts.src
	cfg := source.Config
	if gf.explain {
		return explainSource(stdout, ts, train.Hyper{FuseQKV: *fuseQKV}.WithRecompute(recompute.mode))
	}
	// Data parallel flags and environment: one rank is the ordinary run;
	// -ranks N starts N ranks below; a rank of a job trains its rows.
	job, err := df.config(os.Getenv, *device, cfg.Batch)
	if err != nil {
		return err
	}
	world := job.WorldSize
	if world > 1 && !job.launch && job.Rank > 0 {
		// Output is rank 0's; a failing rank's error still reaches stderr
		// through main, and the launcher passes it on.
		stdout, stderr = io.Discard, io.Discard
	}
	peak := *lr
	if peak == 0 {
		var like string
		peak, like = defaultPeakLR(cfg)
		if source.Graph != nil {
			peak, like = defaultGraphLR, ""
		}
		if like != "" {
			fmt.Fprintf(stderr, "lr: %g, the default of %s, the built-in config nearest this model's size (-lr sets it)\n", peak, like)
		}
	}
	if !(*minLRFrac >= 0 && *minLRFrac <= 1) {
		return fmt.Errorf("-min-lr-frac must be in [0, 1], got %v", *minLRFrac)
	}
	if *accum < 1 {
		return fmt.Errorf("-accum must be at least 1 (1: no accumulation), got %d", *accum)
	}
	if !(*clip >= 0) || math.IsInf(*clip, 0) {
		return fmt.Errorf("-clip must be a finite bound of at least 0 (0: no clipping), got %v", *clip)
	}
	if !(*wd >= 0) {
		return fmt.Errorf("-wd must be at least 0, got %v", *wd)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"eval-every", *evalEvery}, {"ckpt-every", *ckptEvery}, {"keep-every", *keepEvery}} {
		if f.v < 0 {
			return fmt.Errorf("-%s must be at least 0, got %d", f.name, f.v)
		}
	}
	wu := *warmup
	if wu < 0 {
		wu = *steps / 10
	}
	h := train.Hyper{LR: peak, MinLR: peak * *minLRFrac, Warmup: wu, Steps: *steps, WeightDecay: *wd, DataSeed: uint64(cfg.Seed), NoFuseElementwise: !*fuseEW, ClipNorm: *clip, Accum: *accum, FuseQKV: *fuseQKV}.WithRecompute(recompute.mode)
	if err := h.Schedule().Validate(); err != nil {
		return err
	}
	if world > 1 {
		h.World, h.BucketBytes, h.ShardOptimizer, h.Rank = world, job.bucketByte, job.shardOpt, job.Rank
		if h.ShardOptimizer && *clip != 0 {
			return errors.New("-shard-optimizer: -clip is not supported with it yet (each rank holds a part of the gradients; the global norm needs one more all-reduce)")
		}
		if source.Graph != nil {
			return errors.New("-ranks: training a graph FILE on several ranks is not supported yet (its batch size is fixed in the file): train it on one rank, or a built-in -config on several")
		}
		if *accum > 1 {
			return errors.New("-ranks: -accum with several ranks is not supported yet: raise -batch instead (the global batch is split over the ranks)")
		}
	}
	if ckptDir == "" && *resume {
		return errors.New("-resume needs checkpoints: drop -ckpt none")
	}
	var fromStep int64 // the step a resumed run starts at
	if *resume {
		if _, step, err := checkpoint.LatestCheckpoint(ckptDir); err == nil {
			fromStep = step
		}
	}
	// Nothing is created or written until the run is set up: a run that
	// fails to start (bad flags, no CUDA, a mismatched or missing
	// checkpoint, not enough memory) leaves -out as it was. Paths that
	// cannot become folders are refused now, before the data is read.
	for _, d := range []struct{ flag, dir string }{{"-out", *out}, {"-ckpt", ckptDir}} {
		if err := checkFolderPath(d.flag, d.dir); err != nil {
			return err
		}
	}

	if job.launch {
		return launchRanks(job, args, stdout, stderr)
	}

	// SIGINT and SIGTERM: acknowledged at once; honoured at once while
	// reading data or compiling, after the step in flight while training
	// (with a checkpoint); a second one aborts (see signals.go).
	sigs := watchSignals(stderr)
	defer sigs.stop()
	dev := *device
	if *df.gpus > 1 {
		dev = "cuda" // -gpus N is -ranks N on CUDA
	}
	be, note, err := resolveDeviceOn(dev, mf.bf16, job.LocalRank)
	if err != nil {
		return err
	}
	defer func() {
		// After a signal, work given up midway (a compilation) may still be
		// using the device; the process is about to exit, which releases it.
		if sigs.err() == nil {
			be.Close()
		}
	}()
	if note != "" {
		fmt.Fprintln(stderr, note)
	}

	src := *data
	if src == "" {
		if src, err = train.DefaultCorpusDir(); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "data: reading %s…\n", src)
	var corpus *train.Corpus
	if err := sigs.do("reading the data", func() (err error) {
		corpus, err = loadTrainData(stderr, src, *valFrac, *dataFormat, cfg)
		return err
	}); err != nil {
		return err
	}
	if h.DataOrder, err = parseDataOrder(*dataOrder); err != nil {
		return err
	}
	fmt.Fprintln(stderr, corpus.DescribeOrder(h.DataOrder, cfg.Batch, cfg.Seq, h.Steps))

	if fuse.require {
		built, err := sourceForward(source)
		if err != nil {
			return err
		}
		if err := passes.RequireFused(built); err != nil {
			return fmt.Errorf("-fuse=require: %w", err)
		}
	}
	var gs *train.Graphs
	rankSource := source // what one rank's step graph trains: its rows
	rankSource.Config.Batch /= world
	if err := sigs.do("building the training graph", func() (err error) {
		gs, err = train.BuildSourceGraphs(be, rankSource, fuse.on, h)
		return err
	}); err != nil {
		return err
	}
	describeSource(stderr, source)
	for _, e := range gs.Log.Filter(passes.PassRecompute, passes.Info) {
		fmt.Fprintln(stderr, e)
	}
	ops := gs.Forward.CountOps()
	fmt.Fprintf(stderr, "model: %s, %s params, %s; forward %d nodes (%d FlashAttention, %d Softmax), training step %d nodes\n",
		source.Name(), trainCount(source.ParamCount()), cfg.DType, len(gs.Forward.Nodes), ops["FlashAttention"], ops["Softmax"], len(gs.Step.Graph.Nodes))
	// The training step and the evaluation graph (its own copy of the
	// weights) are both resident.
	compute := graph.Float32
	if mf.bf16 {
		compute = graph.BFloat16
	}
	var need memoryNeed
	if err := sigs.do("planning memory", func() (err error) {
		need, err = planNeed(compute, []*graph.Graph{gs.Step.Graph, gs.Forward}, []map[string]string{gs.Step.Updates, nil})
		return err
	}); err != nil {
		return err
	}
	if err := checkMemory(stderr, be, need, fmt.Sprintf("training %s at %d×%d tokens", cfg.Name, cfg.Batch, cfg.Seq), *force); err != nil {
		return err
	}
	if *accum > 1 {
		fmt.Fprintf(stderr, "accumulation: each step is %d micro-batches of %d×%d tokens, one update of %d×%d\n", *accum, cfg.Batch, cfg.Seq, *accum*cfg.Batch, cfg.Seq)
	}
	fmt.Fprintf(stderr, "train: %d steps of %d×%d tokens on %s, lr %.2g (warmup %d, cosine to %.2g), weight decay %g\n",
		h.Steps, cfg.Batch, cfg.Seq, be.Name(), h.LR, h.Warmup, h.MinLR, h.WeightDecay)
	if world > 1 {
		how := "averaged in %d all-reduce bucket(s) of up to %s"
		if h.ShardOptimizer {
			how = "averaged and scattered in %d bucket(s) of up to %s, each rank updating its part with its part of the AdamW moments (ZeRO-1)"
		}
		fmt.Fprintf(stderr, "ranks: %s; each trains %d of the %d rows of a batch; gradients "+how+"\n",
			job.Config, cfg.Batch/world, cfg.Batch, countBuckets(gs.Step.Graph), trainBytes(job.bucketByte))
	}
	if be.Name() == "cpu" {
		stepFLOPs := matmulFLOPs(gs.Step.Graph) * float64(*accum)
		left := max(0, h.Steps-fromStep)
		if d, rate, err := estimateCPUTime(stepFLOPs * float64(left)); err == nil {
			fmt.Fprintf(stderr, "time: %s per step on a CPU that multiplies at ~%.0f GFLOP/s: %d steps take roughly %s (the progress lines give the measured ETA)\n",
				formatFLOP(stepFLOPs), rate/1e9, left, roughDuration(d))
			if d > time.Hour {
				fmt.Fprintln(stderr, "note: that is a long run for a CPU: -device auto trains on a GPU when there is one; fewer -steps, a smaller -config or -batch/-seq shorten it (Ctrl-C stops it with a checkpoint)")
			}
		}
	}

	if err := sigs.err(); err != nil {
		return err
	}

	// The folders are made and the graphs written once the run is set up,
	// and before it trains, so that they are there to look at during a long run.
	// A second signal removes what this run made, checkpoints aside.
	var files []string
	var made createdFiles
	var metricsFile *os.File
	defer func() {
		if metricsFile != nil {
			metricsFile.Close()
		}
	}()
	sigs.onAbort(func() {
		// No checkpoint or plot write may start a temporary file after
		// the removal below looks for them.
		checkpoint.StopAtomicWrites()
		made.remove(*out, ckptDir)
	})
	ready := func(*train.Trainer) error {
		if job.Rank > 0 {
			return nil // rank 0 writes the files and the checkpoints
		}
		for _, d := range []struct{ flag, dir string }{{"-out", *out}, {"-ckpt", ckptDir}} {
			if d.dir == "" {
				continue
			}
			made.dir(d.dir)
			if err := os.MkdirAll(d.dir, 0o755); err != nil {
				return fmt.Errorf("%s: %w", d.flag, err)
			}
		}
		for _, f := range []string{"graph.txt", "graph.dot", "train_graph.txt", "loss.png", "train_source.txt"} {
			made.file(filepath.Join(*out, f))
		}
		extra, err := readySource(*out, ckptDir, ts)
		if err != nil {
			return err
		}
		files, err = writeTrainGraphs(*out, gs)
		files = append(files, extra...)
		if err != nil || *metricsPath == "" {
			return err
		}
		metricsFile, err = openMetrics(*metricsPath, *resume, &made)
		return err
	}
	var ranks *dist.TCP
	var comm *gpuComm
	if world > 1 {
		if err := sigs.do("waiting for the other ranks", func() (err error) {
			if be.Name() == "cpu" {
				ranks, err = joinRanks(sigs.ctx, job)
			} else {
				ranks, comm, err = joinGPURanks(sigs.ctx, job, be)
			}
			return err
		}); err != nil {
			return err
		}
	}
	sigs.setPhase("")
	opts := train.Options{
		Config: cfg, Source: &source, Fuse: fuse.on, Hyper: h, EvalEvery: *evalEvery,
		CkptDir: ckptDir, CkptEvery: *ckptEvery, KeepEvery: *keepEvery, Resume: *resume,
		Log: stderr, Bar: train.IsTerminal(stderr), Ready: ready, Peak: devicePeak(be, cfg.DType),
		Metrics: metricsWriter{&metricsFile},
	}
	if ranks != nil {
		opts.Ranks = ranks
	}
	res, err := train.Run(sigs.ctx, be, corpus, opts)
	if comm != nil {
		comm.close(err != nil)
	}
	if ranks != nil {
		if err != nil {
			err = rankFailure(ranks, err)
		} else {
			ranks.Close()
		}
	}
	if err != nil {
		if serr := sigs.err(); serr != nil && !errors.As(err, new(*signalError)) {
			return fmt.Errorf("%w: %v", serr, err)
		}
		return err
	}
	if len(res.Losses) > 0 && job.Rank == 0 {
		p := filepath.Join(*out, "loss.png")
		title := fmt.Sprintf("%s (%s attention), %d steps of %d×%d %ss", cfg.Name, map[bool]string{true: "fused", false: "unfused"}[fuse.on], res.Step, cfg.Batch, cfg.Seq, res.Unit)
		if err := train.PlotLosses(p, title, res.Unit, res.Losses, res.Val); err != nil {
			return err
		}
		files = append(files, p)
	}
	printTrainSummary(stdout, res, files)
	if res.Interrupted {
		return sigs.err() // the exit status says the run did not finish
	}
	return nil
}

// checkFolderPath refuses a folder path that cannot become a folder: an
// existing file, or a path below one. It creates nothing.
func checkFolderPath(flag, dir string) error {
	if dir == "" {
		return nil
	}
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err == nil {
			if !st.IsDir() {
				if p == filepath.Clean(dir) {
					return fmt.Errorf("%s %s: is a file, not a folder", flag, dir)
				}
				return fmt.Errorf("%s %s: %s is a file, not a folder", flag, dir, p)
			}
			return nil
		}
		// Not there (or below a file: ENOTDIR): look at the parent.
		if parent := filepath.Dir(p); parent == p {
			return nil
		}
	}
}

// writeTrainGraphs writes the forward graph (text and DOT) and the training
// step's text into dir, each atomically.
func writeTrainGraphs(dir string, gs *train.Graphs) ([]string, error) {
	dot, err := graph.WriteDOT(gs.Forward)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, f := range []struct{ name, text string }{
		{"graph.txt", graph.Format(gs.Forward)},
		{"graph.dot", dot},
		{"train_graph.txt", graph.Format(gs.Step.Graph)},
	} {
		p := filepath.Join(dir, f.name)
		if err := train.WriteOutputFile("-out", p, []byte(f.text)); err != nil {
			return nil, err
		}
		files = append(files, p)
	}
	return files, nil
}

func printTrainSummary(w io.Writer, r *train.Result, files []string) {
	fmt.Fprintln(w, "summary:")
	row := func(k, format string, args ...any) {
		fmt.Fprintf(w, "  %-17s "+format+"\n", append([]any{k}, args...)...)
	}
	status := ""
	if r.Interrupted {
		status = " (interrupted)"
	}
	row("model", "%s, %s attention, %s, on %s", r.Config.Name, map[bool]string{true: "fused", false: "unfused"}[r.Fused], r.Config.DType, r.Backend)
	row("steps", "%d%s (this run: %d to %d)", r.Step, status, r.StartStep, r.Step)
	if r.World > 1 {
		row("ranks", "%d (data parallel: %d of the %d rows of each batch per rank, gradients averaged)", r.World, r.Config.Batch/r.World, r.Config.Batch)
	}
	if n := len(r.Losses); n > 0 {
		row("train loss", "%.4f (mean of the last %d steps; %.4f at step 1)", r.FinalTrainLoss(), min(10, n), r.Losses[0])
	}
	if v, ok := r.FinalValLoss(); ok {
		var pts []string
		for _, p := range r.Val {
			pts = append(pts, fmt.Sprintf("%d:%.3f", p.Step, p.Loss))
		}
		// A loss per position: per byte of text, per token of a token file.
		row("val loss", "%.4f at step %d (nats/%s; %.3f bits/%s)", v, r.Val[len(r.Val)-1].Step, r.Unit, v/0.6931471805599453, r.Unit)
		row("val trajectory", "%s", strings.Join(pts, " "))
	}
	printThroughput(row, r)
	if r.StartStep > 0 {
		row("wall time", "%v (this run, compile included); %v of training since step 0 over all runs", r.Wall.Round(time.Millisecond), r.TotalElapsed.Round(time.Millisecond))
	} else {
		row("wall time", "%v (compile included)", r.Wall.Round(time.Millisecond))
	}
	row("peak activations", "%s per training step (initializers incl. optimizer state: %s)%s", trainBytes(r.Stats.PeakActivationBytes), trainBytes(r.Stats.InitializerBytes), recomputeNote(r.Recompute))
	switch {
	case r.ShardOptimizer:
		row("optimizer state", "%s per rank (AdamW moments of this rank's 1/%d part: -shard-optimizer)", trainBytes(r.OptimizerStateBytes), r.World)
	case r.World > 1:
		row("optimizer state", "%s per rank (AdamW moments, whole on every rank; -shard-optimizer keeps 1/%d each)", trainBytes(r.OptimizerStateBytes), r.World)
	default:
		row("optimizer state", "%s (AdamW moments)", trainBytes(r.OptimizerStateBytes))
	}
	if r.Checkpoint != "" {
		row("checkpoint", "%s", r.Checkpoint)
	}
	if len(files) > 0 {
		row("files", "%s", strings.Join(files, " "))
	}
}

// trainBytes writes a byte count as train's report and messages do: as
// cuda.FormatBytes, but with one digit after the point in MiB ("12.5 MiB").
func trainBytes(n int64) string { return units.Bytes(n, 1, 1, 2) }

func trainCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fG", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
