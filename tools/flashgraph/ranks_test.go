package main

import (
	"bufio"
	"encoding/json"
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
	runCLI(t, rankArgs(data, one, "8")...)
	stdout, stderr := runCLI(t, rankArgs(data, two, "8", "-ranks", "2")...)
	if n := strings.Count(stdout, "summary:"); n != 1 {
		t.Errorf("%d summaries, want rank 0's only:\n%s", n, stdout)
	}
	if !strings.Contains(stdout, "ranks             2 (data parallel: 2 of the 4 rows") {
		t.Errorf("the summary does not say the job had 2 ranks:\n%s", stdout)
	}
	if n := strings.Count(stderr, "step 8/8"); n != 1 {
		t.Errorf("the last step is reported %d times, want once (rank 0):\n%s", n, stderr)
	}
	for _, f := range []string{"loss.png", "train_graph.txt", "ckpt/step-00000008.safetensors"} {
		if _, err := os.Stat(filepath.Join(two, f)); err != nil {
			t.Errorf("rank 0 did not write %s: %v", f, err)
		}
	}
	if g, err := os.ReadFile(filepath.Join(two, "train_graph.txt")); err != nil || !strings.Contains(string(g), "AllReduce") {
		t.Errorf("the rank's training step has no AllReduce (%v)", err)
	}
	a, b := metricLosses(t, filepath.Join(one, "metrics.jsonl")), metricLosses(t, filepath.Join(two, "metrics.jsonl"))
	if len(a) != 8 || len(b) != 8 {
		t.Fatalf("losses: %d steps on one rank, %d on two, want 8", len(a), len(b))
	}
	for i := range a {
		if d := math.Abs(a[i] - b[i]); d > 1e-5*math.Abs(a[i]) {
			t.Errorf("step %d: loss %.9g on one rank, %.9g on two", i+1, a[i], b[i])
		}
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
