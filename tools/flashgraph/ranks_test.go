package main

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
