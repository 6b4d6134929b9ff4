package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The data parallel flags are checked before anything is read or written, and
// a job of several ranks is refused with a message that says why, rather than
// training one rank's worth and pretending it was data parallel.
func TestTrainDistFlags(t *testing.T) {
	noNCCL(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-gpus", "0"}, []string{"-gpus must be at least 1"}},
		{[]string{"-ranks", "0"}, []string{"-ranks must be at least 1"}},
		{[]string{"-gpus", "2", "-ranks", "2"}, []string{"give one of them"}},
		{[]string{"-gpus", "2", "-rank", "1"}, []string{"either it, or -rank and -world-size"}},
		{[]string{"-ranks", "2", "-world-size", "2"}, []string{"either it, or -rank and -world-size"}},
		{[]string{"-ranks", "2", "-rank-timeout", "0s"}, []string{"-rank-timeout must be positive"}},
		{[]string{"-ranks", "2", "-bucket-mb", "0"}, []string{"-bucket-mb must be in"}},
		{[]string{"-world-size", "2", "-rank", "2", "-device", "cuda"}, []string{"rank 2 is outside [0, 2)"}},
		{[]string{"-world-size", "2", "-master-port", "0", "-device", "cuda"}, []string{"master port 0"}},
		{[]string{"-ranks", "3", "-batch", "8"}, []string{"global batch 8 does not split evenly over 3 ranks"}},
		{[]string{"-ranks", "2", "-batch", "4", "-accum", "2"}, []string{"-accum with several ranks is not supported yet"}},
		{[]string{"-world-size", "2", "-rank", "1", "-master-addr", "10.0.0.1", "-device", "cuda"}, []string{"rank 1/2 (local 1) via 10.0.0.1:29500", "through NCCL, which cannot be used here: no NCCL in this test", "-ranks N -device cpu trains N ranks on the CPU"}},
		{[]string{"-gpus", "2"}, []string{"rank 0/2", "through NCCL, which cannot be used here"}},
		{[]string{"-shard-optimizer"}, []string{"-shard-optimizer shards the optimizer state over the ranks"}},
		{[]string{"-ranks", "2", "-shard-optimizer", "-clip", "1"}, []string{"-clip is not supported with it yet"}},
	} {
		out := filepath.Join(t.TempDir(), "out")
		args := append([]string{"train", "-out", out}, tc.args...)
		code, _, stderr := runCode(args...)
		if code == 0 {
			t.Errorf("%v: exit 0, want an error", tc.args)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr does not contain %q:\n%s", tc.args, w, stderr)
			}
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v: a refused run created -out", tc.args)
		}
	}
}

// noNCCL makes the test's process one without NCCL, as this machine is and
// a GPU machine is not: a job on -device cuda is then refused before it
// starts, whichever machine runs the test.
func noNCCL(t *testing.T) {
	old := ncclVersion
	ncclVersion = func() (int, error) { return 0, errors.New("no NCCL in this test") }
	t.Cleanup(func() { ncclVersion = old })
}

// With NCCL, a GPU job passes the checks, except what NCCL does not do yet.
func TestTrainDistGPUChecks(t *testing.T) {
	old := ncclVersion
	ncclVersion = func() (int, error) { return 22703, nil }
	t.Cleanup(func() { ncclVersion = old })
	code, _, stderr := runCode("train", "-out", filepath.Join(t.TempDir(), "o"), "-gpus", "2", "-shard-optimizer")
	if code == 0 || !strings.Contains(stderr, "-shard-optimizer is not available on GPUs yet") {
		t.Errorf("-gpus 2 -shard-optimizer: exit %d\n%s", code, stderr)
	}
}

// The torchrun variables are read too, and flags override them.
func TestTrainDistEnv(t *testing.T) {
	noNCCL(t)
	t.Setenv("RANK", "x")
	if code, _, stderr := runCode("train", "-out", filepath.Join(t.TempDir(), "o")); code == 0 || !strings.Contains(stderr, `RANK="x" is not an integer`) {
		t.Errorf("RANK=x: exit %d\n%s", code, stderr)
	}
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "4")
	t.Setenv("MASTER_ADDR", "host0")
	t.Setenv("MASTER_PORT", "1234")
	if code, _, stderr := runCode("train", "-device", "cuda", "-batch", "8", "-out", filepath.Join(t.TempDir(), "o")); code == 0 || !strings.Contains(stderr, "rank 1/4 (local 1) via host0:1234") {
		t.Errorf("torchrun environment: exit %d\n%s", code, stderr)
	}
	// A launched rank's -ranks must be its job's size.
	if code, _, stderr := runCode("train", "-ranks", "2", "-batch", "8", "-out", filepath.Join(t.TempDir(), "o")); code == 0 || !strings.Contains(stderr, "-ranks 2, but WORLD_SIZE=4") {
		t.Errorf("torchrun environment: exit %d\n%s", code, stderr)
	}
	if code, _, stderr := runCode("train", "-device", "cuda", "-batch", "8", "-rank", "3", "-master-port", "999", "-out", filepath.Join(t.TempDir(), "o")); code == 0 || !strings.Contains(stderr, "rank 3/4 (local 3) via host0:999") {
		t.Errorf("flags over the environment: exit %d\n%s", code, stderr)
	}
}

// A world of one, from the environment as torchrun sets it for one process,
// is the ordinary single-process run.
func TestTrainDistWorldOfOneTrains(t *testing.T) {
	t.Setenv("RANK", "0")
	t.Setenv("WORLD_SIZE", "1")
	data := trainData(t)
	out := filepath.Join(t.TempDir(), "out")
	runCLI(t, tinyTrainArgs(data, out, "2", "-world-size", "1")...)
	if _, err := os.Stat(filepath.Join(out, "loss.png")); err != nil {
		t.Errorf("the run wrote no loss plot: %v", err)
	}
}
