package main

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/backend/cuda"
)

// needTwoGPUs skips a test unless this machine has two GPUs and NCCL.
func needTwoGPUs(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts GPU rank processes")
	}
	if n, err := cuda.DeviceCount(); err != nil || n < 2 {
		t.Skipf("needs 2 GPUs: %d, %v", n, err)
	}
	if _, err := cuda.NCCLVersion(); err != nil {
		t.Skip(err)
	}
}

// gpuRankArgs train tiny in float32 on CUDA with a global batch of 8.
func gpuRankArgs(data, out, steps string, extra ...string) []string {
	return append([]string{"train", "-device", "cuda", "-seq", "64", "-batch", "8", "-steps", steps, "-data", data, "-out", out,
		"-eval-every", "0", "-metrics", filepath.Join(out, "metrics.jsonl")}, extra...)
}

// train -gpus 2 (two ranks, gradients averaged by NCCL) follows one GPU's
// float32 loss curve on the same global batch: 1e-5 relative over 100 steps.
func TestTrainGPURanksMatchOneGPU(t *testing.T) {
	needTwoGPUs(t)
	useHelperRanks(t)
	data := trainData(t)
	dir := t.TempDir()
	one, two := filepath.Join(dir, "one"), filepath.Join(dir, "two")
	runCLI(t, gpuRankArgs(data, one, "100")...)
	args := gpuRankArgs(data, two, "100", "-gpus", "2", "-bucket-mb", "0.1")
	args = append(args[:1], args[3:]...) // -gpus implies -device cuda
	runCLI(t, args...)
	a, b := metricLosses(t, filepath.Join(one, "metrics.jsonl")), metricLosses(t, filepath.Join(two, "metrics.jsonl"))
	if len(a) != 100 || len(b) != 100 {
		t.Fatalf("%d and %d losses, want 100", len(a), len(b))
	}
	worst := 0.0
	for i := range a {
		d := math.Abs(a[i]-b[i]) / math.Abs(a[i])
		worst = max(worst, d)
		if d > 1e-5 {
			t.Errorf("step %d: loss %.9g on one GPU, %.9g on two", i+1, a[i], b[i])
		}
	}
	t.Logf("100 steps, one GPU vs two: largest relative loss difference %.2g", worst)
}

// train -gpus 2 with rank 1 SIGKILLed ends within 60 s, naming rank 1, with
// no rank left and the last checkpoint intact.
func TestTrainGPURanksKill(t *testing.T) {
	needTwoGPUs(t)
	data := trainData(t)
	out := filepath.Join(t.TempDir(), "out")
	args := gpuRankArgs(data, out, "1000000", "-gpus", "2", "-ckpt-every", "20")
	args = append(args[:1], args[3:]...)
	cmd := helperCommand(args)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitCheckpoint(t, filepath.Join(out, "ckpt"), 20)
	victim := -1
	for _, k := range childPIDs(t, cmd.Process.Pid) {
		if rankOf(k) == "1" {
			victim = k
		}
	}
	if victim < 0 {
		t.Fatal("no rank 1 among the launcher's children")
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := exitWithin(t, cmd, 60*time.Second, &buf)
	if cmd.ProcessState.ExitCode() == 0 || !strings.Contains(buf.String(), "rank 1 failed") {
		t.Errorf("exit %d after rank 1 was killed:\n%s", cmd.ProcessState.ExitCode(), buf.String())
	}
	t.Logf("the job ended %v after rank 1 was killed", took.Round(time.Millisecond))
	checkpointIntact(t, filepath.Join(out, "ckpt"))
}
