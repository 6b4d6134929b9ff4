package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/checkpoint"
)

// useHelperRanks makes train -ranks N, run in this process, start its ranks
// as helper processes of the test binary.
func useHelperRanks(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	old := rankCommand
	rankCommand = helperRankCommand
	t.Cleanup(func() { rankCommand = old })
	t.Setenv("FLASHGRAPH_TRAIN_HELPER", "1")
}

// metricLosses reads the per-step losses of a -metrics file, by step.
func metricLosses(t *testing.T, path string) []float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m struct {
			Step int64    `json:"step"`
			Loss *float64 `json:"loss"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if m.Loss == nil {
			continue
		}
		if int64(len(out)) != m.Step-1 {
			t.Fatalf("%s: step %d after %d steps", path, m.Step, len(out))
		}
		out = append(out, *m.Loss)
	}
	return out
}

// rankArgs are a small data-parallel run: the tiny model on short rows.
func rankArgs(data, out string, steps string, extra ...string) []string {
	return append([]string{"train", "-device", "cpu", "-seq", "16", "-batch", "4", "-steps", steps, "-data", data, "-out", out,
		"-eval-every", "0", "-metrics", filepath.Join(out, "metrics.jsonl")}, extra...)
}

// train -ranks 2 starts two rank processes that train one job: the output is
// rank 0's alone (one summary, one progress), rank 0 alone writes the files
// and the checkpoint, and the losses are the one-process run's on the same
// global batch.
func TestTrainRanksLaunch(t *testing.T) {
	useHelperRanks(t)
	data := trainData(t)
	dir := t.TempDir()
	one, two := filepath.Join(dir, "one"), filepath.Join(dir, "two")
	runCLI(t, rankArgs(data, one, "100")...)
	stdout, stderr := runCLI(t, rankArgs(data, two, "100", "-ranks", "2", "-bucket-mb", "0.1")...)
	if n := strings.Count(stdout, "summary:"); n != 1 {
		t.Errorf("%d summaries, want rank 0's only:\n%s", n, stdout)
	}
	if !strings.Contains(stdout, "ranks             2 (data parallel: 2 of the 4 rows") {
		t.Errorf("the summary does not say the job had 2 ranks:\n%s", stdout)
	}
	if n := strings.Count(stderr, "step 100/100"); n != 1 {
		t.Errorf("the last step is reported %d times, want once (rank 0):\n%s", n, stderr)
	}
	for _, f := range []string{"loss.png", "train_graph.txt", "ckpt/step-00000100.safetensors"} {
		if _, err := os.Stat(filepath.Join(two, f)); err != nil {
			t.Errorf("rank 0 did not write %s: %v", f, err)
		}
	}
	// -bucket-mb 0.1 splits the tiny model's 450 KiB of gradients into 5
	// buckets, one AllReduce each, which the DOT of the step shows.
	if !strings.Contains(stderr, "gradients averaged in 5 all-reduce bucket(s) of up to 102.4 KiB") {
		t.Errorf("the run does not report its 5 buckets:\n%s", stderr)
	}
	dot, _ := runCLI(t, "dot", filepath.Join(two, "train_graph.txt"))
	if n := strings.Count(dot, `label="flashgraph.AllReduce`); n != 5 || !strings.Contains(dot, "bucket=4, reduce=") {
		t.Errorf("the DOT of the rank's step has %d AllReduce nodes, want 5 buckets (0 to 4)", n)
	}
	a, b := metricLosses(t, filepath.Join(one, "metrics.jsonl")), metricLosses(t, filepath.Join(two, "metrics.jsonl"))
	if len(a) != 100 || len(b) != 100 {
		t.Fatalf("losses: %d steps on one rank, %d on two, want 100", len(a), len(b))
	}
	worst := 0.0
	for i := range a {
		d := math.Abs(a[i]-b[i]) / math.Abs(a[i])
		worst = max(worst, d)
		if d > 1e-5 {
			t.Errorf("step %d: loss %.9g on one rank, %.9g on two", i+1, a[i], b[i])
		}
	}
	t.Logf("100 steps, one rank vs two: largest relative loss difference %.2g (loss %.4f → %.4f)", worst, a[0], a[99])
}

// compile -plan -ranks N plans one rank's step and lists its all-reduce
// buckets, each with where it is final; -explain adds their gradients.
func TestCompilePlanBuckets(t *testing.T) {
	out, _ := runCLI(t, "compile", "-plan", "-explain", "-ranks", "2", "-bucket-mb", "0.1", "-config", "tiny")
	if !strings.Contains(out, "gradient all-reduce over 2 ranks: 5 bucket(s) of up to 102.4 KiB, 449.5 KiB in all") {
		t.Fatalf("no bucket report:\n%s", out)
	}
	grads := 0
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "    grad.") {
			grads++
		}
	}
	for b := range 5 {
		if !strings.Contains(out, fmt.Sprintf("  bucket %d: ", b)) {
			t.Errorf("bucket %d is not listed", b)
		}
	}
	if grads != 25 { // the tiny model's params
		t.Errorf("-explain lists %d gradients in the buckets, want the 25 params'", grads)
	}
	if code, _, stderr := runCode("compile", "-plan", "-ranks", "0"); code == 0 || !strings.Contains(stderr, "-ranks must be at least 1") {
		t.Errorf("-ranks 0: exit %d\n%s", code, stderr)
	}
}

// sameTensors says two checkpoints hold the same tensors, bit for bit.
func sameTensors(t *testing.T, a, b string) {
	t.Helper()
	ta, _, err := checkpoint.LoadCheckpoint(a)
	if err != nil {
		t.Fatal(err)
	}
	tb, _, err := checkpoint.LoadCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(ta.Tensors) != len(tb.Tensors) {
		t.Fatalf("%d tensors in %s, %d in %s", len(ta.Tensors), a, len(tb.Tensors), b)
	}
	for name, x := range ta.Tensors {
		y, ok := tb.Tensors[name]
		if !ok {
			t.Fatalf("%s: no %s", b, name)
		}
		if !slices.Equal(x.F32, y.F32) || !slices.Equal(x.F64, y.F64) {
			t.Errorf("%s differs between %s and %s", name, a, b)
		}
	}
}

// A 2-rank run resumed from its step-4 checkpoint by every rank continues bit
// for bit: its losses and its final weights and moments are those of the run
// that went straight to step 8. The checkpoint is the job's state, not a
// rank's: resuming it on one rank or on four works too, and follows the
// same curve (to rounding).
func TestTrainRanksResume(t *testing.T) {
	useHelperRanks(t)
	data := trainData(t)
	out := filepath.Join(t.TempDir(), "out")
	ckpt := filepath.Join(out, "ckpt")
	straight := filepath.Join(t.TempDir(), "straight8.safetensors")
	runCLI(t, rankArgs(data, out, "8", "-ranks", "2", "-ckpt-every", "4", "-keep-every", "4")...)
	want := metricLosses(t, filepath.Join(out, "metrics.jsonl"))
	if err := os.Rename(checkpoint.CheckpointPath(ckpt, 8), straight); err != nil {
		t.Fatal(err)
	}
	for _, ranks := range []string{"2", "1", "4"} {
		metrics := filepath.Join(t.TempDir(), "resumed.jsonl")
		args := rankArgs(data, out, "8", "-ranks", ranks, "-resume", "-ckpt-every", "4", "-keep-every", "4", "-metrics", metrics)
		_, stderr := runCLI(t, args...)
		if !strings.Contains(stderr, "resumed from") {
			t.Fatalf("-ranks %s: not resumed:\n%s", ranks, stderr)
		}
		var got []float64
		for _, l := range strings.Split(strings.TrimSpace(mustRead(t, metrics)), "\n") {
			var m struct{ Loss *float64 }
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatal(err)
			}
			if m.Loss != nil {
				got = append(got, *m.Loss)
			}
		}
		if len(got) != 4 {
			t.Fatalf("-ranks %s: %d steps after the resume, want 4", ranks, len(got))
		}
		for i, l := range got {
			w := want[4+i]
			if ranks == "2" && l != w {
				t.Errorf("-ranks 2: step %d after the resume: loss %.9g, straight %.9g (want the same bits)", 5+i, l, w)
			}
			if d := math.Abs(l - w); d > 1e-5*math.Abs(w) {
				t.Errorf("-ranks %s: step %d after the resume: loss %.9g, straight %.9g", ranks, 5+i, l, w)
			}
		}
		if ranks == "2" {
			sameTensors(t, straight, checkpoint.CheckpointPath(ckpt, 8))
		}
		if err := os.Remove(checkpoint.CheckpointPath(ckpt, 8)); err != nil {
			t.Fatal(err)
		}
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// optimizerState reads the per-rank optimizer state bytes of a summary.
func optimizerState(t *testing.T, stdout string) string {
	t.Helper()
	for line := range strings.Lines(stdout) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "optimizer state"); ok {
			return strings.Fields(v)[0] + " " + strings.Fields(v)[1]
		}
	}
	t.Fatalf("no optimizer state in the summary:\n%s", stdout)
	return ""
}

// -shard-optimizer (ZeRO-1) computes the same steps as the unsharded job, bit
// for bit: the same losses, and checkpoints (moments gathered from the
// ranks' parts) that are the same files' tensors; a sharded run resumed
// from its checkpoint continues bit for bit; and each rank keeps half the
// AdamW moments.
func TestTrainRanksShardOptimizer(t *testing.T) {
	useHelperRanks(t)
	data := trainData(t)
	dir := t.TempDir()
	plain, zero := filepath.Join(dir, "plain"), filepath.Join(dir, "zero")
	common := []string{"-ranks", "2", "-bucket-mb", "0.1", "-ckpt-every", "6", "-keep-every", "6"}
	stdoutA, _ := runCLI(t, rankArgs(data, plain, "12", common...)...)
	stdoutB, stderrB := runCLI(t, rankArgs(data, zero, "12", append(common, "-shard-optimizer")...)...)
	if !strings.Contains(stderrB, "scattered in 5 bucket(s)") {
		t.Errorf("the sharded run does not report its 5 buckets:\n%s", stderrB)
	}
	a, b := metricLosses(t, filepath.Join(plain, "metrics.jsonl")), metricLosses(t, filepath.Join(zero, "metrics.jsonl"))
	if !slices.Equal(a, b) || len(a) != 12 {
		t.Errorf("losses differ with -shard-optimizer:\n%v\n%v", a, b)
	}
	for _, step := range []int64{6, 12} {
		sameTensors(t, checkpoint.CheckpointPath(filepath.Join(plain, "ckpt"), step), checkpoint.CheckpointPath(filepath.Join(zero, "ckpt"), step))
	}
	// The tiny model's moments are 2 × 449.5 KiB: whole on every rank
	// without sharding, half of them on each of two ranks with it.
	if sa, sb := optimizerState(t, stdoutA), optimizerState(t, stdoutB); sa != "899.0 KiB" || sb != "449.5 KiB" {
		t.Errorf("optimizer state per rank: %s unsharded, %s sharded; want 899.0 KiB and 449.5 KiB", sa, sb)
	}
	// Resume the sharded run at step 6, sharded: the same step-12 state.
	final := filepath.Join(dir, "zero12.safetensors")
	if err := os.Rename(checkpoint.CheckpointPath(filepath.Join(zero, "ckpt"), 12), final); err != nil {
		t.Fatal(err)
	}
	runCLI(t, rankArgs(data, zero, "12", append(common, "-shard-optimizer", "-resume", "-metrics", filepath.Join(dir, "m.jsonl"))...)...)
	sameTensors(t, final, checkpoint.CheckpointPath(filepath.Join(zero, "ckpt"), 12))
}
