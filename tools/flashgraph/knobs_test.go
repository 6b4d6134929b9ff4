package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
)

// -metrics writes a JSON line per step and per validation; -clip adds the
// gradient norm to each step's line.
func TestTrainMetricsAndClip(t *testing.T) {
	dir := t.TempDir()
	out, mpath := filepath.Join(dir, "out"), filepath.Join(dir, "m.jsonl")
	runCLI(t, tinyTrainArgs(trainData(t), out, "6", "-clip", "0.5", "-metrics", mpath)...)
	f, err := os.Open(mpath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var steps, vals int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		step, _ := l["step"].(float64)
		if _, ok := l["val_loss"]; ok {
			vals++
			continue
		}
		steps++
		for _, k := range []string{"loss", "lr", "grad_norm", "step_ms"} {
			if v, ok := l[k].(float64); !ok || !(v > 0) {
				t.Errorf("step %v: %s = %v", step, k, l[k])
			}
		}
		// The steady state leaves the first step out: no rate on it.
		if _, ok := l["tok_s"]; ok == (step == 1) {
			t.Errorf("step %v: tok_s present %v", step, ok)
		}
		if _, ok := l["mfu"]; ok {
			t.Errorf("step %v: MFU on the CPU, which has no peak", step)
		}
	}
	if steps != 6 || vals < 2 {
		t.Errorf("%d step lines and %d validation lines, want 6 and at least 2", steps, vals)
	}

	// A resumed run appends.
	runCLI(t, tinyTrainArgs(trainData(t), out, "8", "-clip", "0.5", "-metrics", mpath, "-resume")...)
	b, _ := os.ReadFile(mpath)
	if !strings.Contains(string(b), `"step":8,"loss"`) || !strings.Contains(string(b), `"step":1,"loss"`) {
		t.Errorf("-resume did not append:\n%s", b)
	}
	if code, _, stderr := runCode(tinyTrainArgs(trainData(t), filepath.Join(dir, "o2"), "2", "-clip", "-1")...); code != 1 || !strings.Contains(stderr, "-clip") {
		t.Errorf("-clip -1: exit %d, %s", code, stderr)
	}
}

// A run whose loss or gradient norm stops being finite stops at that step,
// names it, exits non-zero and keeps the last good checkpoint.
func TestTrainDivergenceGuard(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	code, _, stderr := runCode(tinyTrainArgs(trainData(t), out, "30", "-lr", "1e6", "-warmup", "0", "-clip", "1", "-ckpt-every", "1", "-eval-every", "0")...)
	m := regexp.MustCompile(`step (\d+): (loss|the gradient norm) is (NaN|[+-]Inf) \(diverged`).FindStringSubmatch(stderr)
	if code != 1 || m == nil || !strings.Contains(stderr, "last good checkpoint") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	bad, _ := strconv.Atoi(m[1])
	// The step is re-run from the kept checkpoint with every node checked,
	// and the first node that made a non-finite value is named, with its op
	// and its inputs' finiteness.
	first := regexp.MustCompile(`first non-finite value \(step (\d+) re-run from checkpoint \S+step-0*(\d+)\.safetensors on cpu, every node checked\): node (\S+) \((\w+)\) is the first to make a non-finite value: its output \S+ has [^;]*(NaN|Inf) of \d+; its inputs: \S+ \(.*(finite|of \d+)\)`).FindStringSubmatch(stderr)
	if first == nil || first[1] != m[1] || first[2] != strconv.Itoa(bad-1) {
		t.Fatalf("diverged at step %d; no first non-finite node re-run from step %d named:\n%s", bad, bad-1, stderr)
	}
	p, step, err := checkpoint.LatestCheckpoint(filepath.Join(out, "ckpt"))
	if err != nil || p == "" || step != int64(bad-1) {
		t.Fatalf("diverged at step %d; newest checkpoint %q (step %d, %v), want step %d", bad, p, step, err, bad-1)
	}
	ts, _, err := checkpoint.LoadCheckpoint(p)
	if err != nil {
		t.Fatal(err)
	}
	for name, x := range ts.Tensors {
		for i := range x.Len() {
			if v := x.At(i); v != v {
				t.Fatalf("the kept checkpoint has NaN in %s[%d]", name, i)
			}
		}
	}
}

// Without a checkpoint the diagnosis re-runs from the initial weights: the
// first non-finite value may come steps before the loss stops being finite
// (weights overflow, a norm turns them back to finite numbers), and is
// named at its own step.
func TestDivergenceNamesTheFirstNodeFromTheStart(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	code, _, stderr := runCode(tinyTrainArgs(trainData(t), out, "30", "-lr", "1e6", "-warmup", "0", "-eval-every", "0")...)
	m := regexp.MustCompile(`step (\d+): loss is (NaN|[+-]Inf) \(diverged`).FindStringSubmatch(stderr)
	first := regexp.MustCompile(`first non-finite value \(step (\d+) re-run from the initial weights on cpu, every node checked\): node (\S+) \((\w+)\) is the first`).FindStringSubmatch(stderr)
	if code != 1 || m == nil || first == nil || !strings.Contains(stderr, "no checkpoint of this run") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if bad, at := atoi(t, m[1]), atoi(t, first[1]); at < 1 || at > bad {
		t.Errorf("the loss diverged at step %d, the first non-finite value is named at step %d", bad, at)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// -resume builds the checkpoint's model: no model flags needed; flags that
// disagree with it are named, all of them, in one error, and nothing runs.
func TestResumeTakesTheCheckpointsModel(t *testing.T) {
	data := trainData(t)
	out := filepath.Join(t.TempDir(), "out")
	runCLI(t, tinyTrainArgs(data, out, "2", "-layers", "1", "-seed", "3")...)
	stdout, stderr := runCLI(t, "train", "-data", data, "-out", out, "-steps", "3", "-resume")
	if !strings.Contains(stdout, "this run: 2 to 3") || !strings.Contains(stderr, "2×16 tokens") {
		t.Errorf("resume without model flags:\n%s\n%s", stdout, stderr)
	}
	// The time estimate is for the steps left, not all of them.
	if !strings.Contains(stderr, ": 1 steps take roughly") {
		t.Errorf("the estimate of a resumed run is not of the one step left:\n%s", stderr)
	}
	// Flags that agree are fine.
	runCLI(t, "train", "-data", data, "-out", out, "-steps", "4", "-resume", "-layers", "1", "-seq", "16", "-dtype", "float32")
	code, _, stderr := runCode("train", "-data", data, "-out", out, "-steps", "5", "-resume", "-config", "small", "-seq", "16", "-batch", "3", "-seed", "4")
	if code != 1 || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("conflicting flags: exit %d, want one error line:\n%s", code, stderr)
	}
	for _, want := range []string{"-config small (the checkpoint's: tiny)", "-batch 3 (the checkpoint's: 2)", "-seed 4 (the checkpoint's: 3)", "drop those flags"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the error lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "-seq 16") {
		t.Errorf("an agreeing flag named as a conflict:\n%s", stderr)
	}
}

// train -accum 4 -batch 2 follows the -batch 8 curve (the defaults: fused,
// with clipping), step by step from the metrics files.
func TestTrainAccumFlag(t *testing.T) {
	data, dir := trainData(t), t.TempDir()
	losses := func(name string, args ...string) []float64 {
		m := filepath.Join(dir, name+".jsonl")
		runCLI(t, append([]string{"train", "-seq", "16", "-steps", "6", "-data", data, "-out", filepath.Join(dir, name), "-eval-every", "0", "-clip", "1", "-metrics", m}, args...)...)
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		var ls []float64
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var l struct {
				Loss *float64 `json:"loss"`
			}
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				t.Fatal(err)
			}
			if l.Loss != nil {
				ls = append(ls, *l.Loss)
			}
		}
		return ls
	}
	whole, acc := losses("whole", "-batch", "8"), losses("acc", "-batch", "2", "-accum", "4")
	if len(whole) != 6 || len(acc) != 6 {
		t.Fatalf("%d and %d step losses", len(whole), len(acc))
	}
	for i := range whole {
		if rel := (acc[i] - whole[i]) / whole[i]; rel > 1e-5 || rel < -1e-5 {
			t.Errorf("step %d: %v accumulated, %v whole", i+1, acc[i], whole[i])
		}
	}
	if code, _, stderr := runCode("train", "-accum", "0", "-data", data, "-out", filepath.Join(dir, "x")); code != 1 || !strings.Contains(stderr, "-accum must be at least 1") {
		t.Errorf("-accum 0: exit %d: %s", code, stderr)
	}
}

// -accum and -clip work on a graph FILE too, whose batch inputs have their
// own names (here ids and next, not tokens and targets): -accum 4 on a
// file of batch 2 follows the same model at batch 8 step by step, and the
// metrics carry the clipped step's gradient norm.
func TestTrainFileAccumAndClip(t *testing.T) {
	data, dir := trainData(t), t.TempDir()
	bigram := func(batch int) string {
		p := filepath.Join(dir, fmt.Sprintf("bigram%d.txt", batch))
		if err := os.WriteFile(p, []byte(graphText(t, func(b *graph.Builder) {
			x := b.Input("ids", graph.Int64, batch, 4)
			y := b.Input("next", graph.Int64, batch, 4)
			tab := b.Param("emb", graph.Float32, graph.Shape{256, 256}, graph.Normal(0.1, 1))
			l := b.Reshape(b.Gather(tab, x, 0), batch*4, 256)
			b.Output(b.Rename(b.Op("SoftmaxCrossEntropyLoss", nil, l, b.Reshape(y, batch*4)), "loss"))
		})), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	type line struct {
		Loss     *float64 `json:"loss"`
		GradNorm *float64 `json:"grad_norm"`
	}
	run := func(name, file string, args ...string) []line {
		m := filepath.Join(dir, name+".jsonl")
		runCLI(t, append(append([]string{"train", "-steps", "5", "-data", data, "-out", filepath.Join(dir, name), "-eval-every", "0", "-lr", "0.1",
			"-loss", "loss", "-tokens", "ids", "-targets", "next", "-clip", "1", "-metrics", m}, args...), file)...)
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		var ls []line
		for _, s := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var l line
			if err := json.Unmarshal([]byte(s), &l); err != nil {
				t.Fatal(err)
			}
			if l.Loss != nil {
				ls = append(ls, l)
			}
		}
		return ls
	}
	whole, acc := run("whole", bigram(8)), run("acc", bigram(2), "-accum", "4")
	if len(whole) != 5 || len(acc) != 5 {
		t.Fatalf("%d and %d step losses", len(whole), len(acc))
	}
	for i := range whole {
		w, a := *whole[i].Loss, *acc[i].Loss
		if rel := (a - w) / w; rel > 1e-5 || rel < -1e-5 {
			t.Errorf("step %d: %v accumulated, %v whole", i+1, a, w)
		}
		if acc[i].GradNorm == nil || !(*acc[i].GradNorm > 0) {
			t.Errorf("step %d: no gradient norm with -clip", i+1)
		}
	}
}
