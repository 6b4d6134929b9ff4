package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
)

// trainData writes a small text file to train on.
func trainData(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "data.txt")
	var b strings.Builder
	for i := range 300 {
		b.WriteString("for i := 0; i < n; i++ { sum += i } // ")
		b.WriteString(strings.Repeat("ab", i%5))
		b.WriteByte('\n')
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// tinyTrainArgs are quick settings: a short sequence, a small batch, a few steps.
func tinyTrainArgs(data, out string, steps string, extra ...string) []string {
	return append([]string{"train", "-seq", "16", "-batch", "2", "-steps", steps, "-data", data, "-out", out, "-eval-every", "3"}, extra...)
}

func runCLI(t *testing.T, args ...string) (string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := realMain(args, &stdout, &stderr); code != 0 {
		t.Fatalf("flashgraph %s: exit %d\nstderr:\n%s", strings.Join(args, " "), code, stderr.String())
	}
	return stdout.String(), stderr.String()
}

func TestTrainCLIEndToEnd(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	// The defaults: fusion on.
	stdout, stderr := runCLI(t, tinyTrainArgs(trainData(t), out, "6")...)
	for _, f := range []string{"graph.txt", "graph.dot", "train_graph.txt", "loss.png", "ckpt/step-00000006.safetensors"} {
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil || st.Size() == 0 {
			t.Errorf("%s: missing or empty (%v)", f, err)
		}
	}
	for _, want := range []string{"summary:", "train loss", "val loss", "val trajectory", "tokens/s", "wall time", "peak activations", "checkpoint", "(nats/byte; "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "validation loss") {
		t.Errorf("no validation lines on stderr:\n%s", stderr)
	}
	// The written graphs are the real ones: they parse back, and the
	// checkpoint holds the training step's state.
	text, _ := os.ReadFile(filepath.Join(out, "train_graph.txt"))
	g, err := graph.Parse(string(text))
	if err != nil {
		t.Fatalf("train_graph.txt does not parse: %v", err)
	}
	if ops := g.CountOps(); ops["FlashAttentionGrad"] != 2 || ops["SoftmaxGrad"] != 0 {
		t.Errorf("training graph has %d FlashAttentionGrad and %d SoftmaxGrad nodes; want the fused backward in both layers", ops["FlashAttentionGrad"], ops["SoftmaxGrad"])
	}
	fwd, _ := os.ReadFile(filepath.Join(out, "graph.txt"))
	if !strings.Contains(string(fwd), "FlashAttention") {
		t.Error("graph.txt is not the fused graph")
	}
	ts, step, err := checkpoint.LoadCheckpoint(filepath.Join(out, "ckpt", "step-00000006.safetensors"))
	if err != nil || step != 6 {
		t.Fatalf("checkpoint: step %d, %v", step, err)
	}
	if len(ts.Tensors) != 3*len(g.Params) {
		t.Errorf("checkpoint has %d tensors, training graph %d params (want params and two moments each)", len(ts.Tensors), len(g.Params))
	}
	png, _ := os.ReadFile(filepath.Join(out, "loss.png"))
	if !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Error("loss.png is not a PNG")
	}
}

func TestTrainCLIErrors(t *testing.T) {
	data := trainData(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-device", "tpu"}, "want cpu, cuda or auto"},
		{[]string{"-config", "huge"}, "unknown config"},
		{[]string{"-lr", "-1"}, "learning rate"},
		{[]string{"-resume"}, "no checkpoint"},
		{[]string{"-resume", "-ckpt", "none"}, "-resume needs checkpoints: drop -ckpt none"},
		{[]string{"-data", filepath.Join(t.TempDir(), "missing")}, "no such file"},
		{[]string{"-data", os.Args[0]}, "is not text"},
		{[]string{"-wd", "-0.1"}, "-wd must be at least 0"},
		{[]string{"-eval-every", "-1"}, "-eval-every must be at least 0"},
		{[]string{"-ckpt-every", "-1"}, "-ckpt-every must be at least 0"},
		{[]string{"-ckpt", filepath.Join(data, "ckpt")}, "-ckpt " + filepath.Join(data, "ckpt") + ": " + data + " is a file, not a folder"},
	} {
		var stdout, stderr bytes.Buffer
		args := tinyTrainArgs(data, t.TempDir(), "2", append([]string{"-fuse=false"}, c.args...)...)
		if code := realMain(args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error mentioning %q", c.args, code, stderr.String(), c.want)
		}
	}
	// -device cuda on a machine without a usable GPU says why; auto falls
	// back to the CPU and says so.
	if why := cuda.Available(); why != nil {
		var stdout, stderr bytes.Buffer
		if code := realMain(tinyTrainArgs(data, t.TempDir(), "1", "-fuse=false", "-device", "cuda"), &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "-device cuda: "+why.Error()) {
			t.Errorf("-device cuda without CUDA: exit %d, %q; want the reason %q", code, stderr.String(), why)
		}
		_, se := runCLI(t, tinyTrainArgs(data, t.TempDir(), "1", "-fuse=false", "-device", "auto")...)
		if !strings.Contains(se, "CUDA unavailable") || !strings.Contains(se, "running on the CPU") {
			t.Errorf("-device auto without CUDA does not say it falls back: %q", se)
		}
	}
}

// TestTrainCLIResumeNewProcess: 8 steps in one process give bit for bit the
// weights of 4 steps in one process and 4 more in another one resuming from
// its checkpoint. The learning rate is constant so that the first run's
// schedule does not depend on its own -steps.
func TestTrainCLIResumeNewProcess(t *testing.T) {
	data := trainData(t)
	constLR := []string{"-fuse=false", "-warmup", "0", "-min-lr-frac", "1"}
	straight := filepath.Join(t.TempDir(), "straight")
	runCLI(t, tinyTrainArgs(data, straight, "8", constLR...)...)

	split := filepath.Join(t.TempDir(), "split")
	for _, args := range [][]string{tinyTrainArgs(data, split, "4", constLR...), tinyTrainArgs(data, split, "8", append(constLR, "-resume")...)} {
		if out, err := helperCommand(args).CombinedOutput(); err != nil {
			t.Fatalf("subprocess %v: %v\n%s", args, err, out)
		}
	}
	a, _, err := checkpoint.LoadCheckpoint(filepath.Join(straight, "ckpt", "step-00000008.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := checkpoint.LoadCheckpoint(filepath.Join(split, "ckpt", "step-00000008.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Metadata[checkpoint.MetaLosses] != b.Metadata[checkpoint.MetaLosses] {
		t.Errorf("loss histories differ:\nstraight %s\nresumed  %s", a.Metadata[checkpoint.MetaLosses], b.Metadata[checkpoint.MetaLosses])
	}
	for n, x := range a.Tensors {
		y := b.Tensors[n]
		if y == nil || len(x.F32) != len(y.F32) {
			t.Fatalf("%s: missing or reshaped in the resumed checkpoint", n)
		}
		for i := range x.F32 {
			if math.Float32bits(x.F32[i]) != math.Float32bits(y.F32[i]) {
				t.Fatalf("%s[%d]: straight %v, resumed %v", n, i, x.F32[i], y.F32[i])
			}
		}
	}
}

// TestTrainCLIInterrupt sends SIGINT to a training process: it must finish
// the step in flight, save a checkpoint of it, print the summary and exit
// with status 130 (128 + SIGINT: the run did not finish);
// the checkpoint then resumes.
func TestTrainCLIInterrupt(t *testing.T) {
	data := trainData(t)
	out := filepath.Join(t.TempDir(), "out")
	cmd := helperCommand(tinyTrainArgs(data, out, "1000000", "-fuse=false", "-eval-every", "0", "-ckpt-every", "0"))
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer kill.Stop()
	sc := bufio.NewScanner(stderr)
	var log strings.Builder
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "step ") && strings.Contains(sc.Text(), "tok/s") {
			break // training is under way
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
	}
	if err := cmd.Wait(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 130 {
		t.Fatalf("after SIGINT: %v (want exit status 130)\nstderr:\n%s", err, log.String())
	}
	if !strings.Contains(stdout.String(), "(interrupted)") || !strings.Contains(log.String(), "interrupted: stopping after step") {
		t.Errorf("no interrupt in the output:\n%s\n%s", stdout.String(), log.String())
	}
	p, step, err := checkpoint.LatestCheckpoint(filepath.Join(out, "ckpt"))
	if err != nil || p == "" || step < 1 {
		t.Fatalf("no checkpoint after SIGINT: %q step %d %v", p, step, err)
	}
	if _, _, err := checkpoint.LoadCheckpoint(p); err != nil {
		t.Fatal(err)
	}
	t.Logf("interrupted at step %d", step)
	so, _ := runCLI(t, tinyTrainArgs(data, out, fmt.Sprint(step+2), "-fuse=false", "-resume")...)
	if !strings.Contains(so, fmt.Sprintf("this run: %d to %d", step, step+2)) {
		t.Errorf("resume after the interrupt:\n%s", so)
	}
}

// helperCommand runs the CLI with args in a new process (the test binary,
// through TestTrainCLIHelperProcess).
// helperRankCommand starts a rank of train -ranks N as a helper process.
func helperRankCommand() (string, []string, error) {
	return os.Args[0], []string{"-test.run=^TestTrainCLIHelperProcess$", "--"}, nil
}

func helperCommand(args []string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestTrainCLIHelperProcess$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), "FLASHGRAPH_TRAIN_HELPER=1")
	return cmd
}

// TestTrainCLIHelperProcess is the child of TestTrainCLIResumeNewProcess: it
// runs the CLI with the arguments after "--".
func TestTrainCLIHelperProcess(t *testing.T) {
	if os.Getenv("FLASHGRAPH_TRAIN_HELPER") == "" {
		t.Skip("helper process of the CLI tests that need a process of their own")
	}
	// A launcher (train -ranks N) in this process starts its ranks as
	// helper processes too.
	rankCommand = helperRankCommand
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(realMain(args, os.Stdout, os.Stderr))
}
