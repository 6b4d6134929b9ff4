package main

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/checkpoint"
)

// signalRun starts `flashgraph train -config tiny` in a process of its own,
// sends sig (then SIGTERM, with again) as soon as a stderr line satisfies when,
// and returns the exit status, the time from the (first) signal to the exit,
// and stderr.
func signalRun(t *testing.T, args []string, when func(line string) bool, sig syscall.Signal, again bool) (int, time.Duration, string) {
	t.Helper()
	cmd := helperCommand(append([]string{"train", "-config", "tiny"}, args...))
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill := time.AfterFunc(90*time.Second, func() { cmd.Process.Kill() })
	defer kill.Stop()
	sc := bufio.NewScanner(pipe)
	var log strings.Builder
	var sent time.Time
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if sent.IsZero() && when(sc.Text()) {
			sent = time.Now()
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if again {
				// Another signal, so that the two cannot coalesce into one
				// pending signal.
				cmd.Process.Signal(syscall.SIGTERM)
			}
		}
	}
	cmd.Wait()
	took := time.Since(sent)
	if sent.IsZero() {
		t.Fatalf("the run ended before the moment to signal it:\n%s", log.String())
	}
	return cmd.ProcessState.ExitCode(), took, log.String() + stdout.String()
}

// checkpointIntact says that dir's newest checkpoint exists and loads.
func checkpointIntact(t *testing.T, dir string) int64 {
	t.Helper()
	p, step, err := checkpoint.LatestCheckpoint(dir)
	if err != nil || p == "" {
		t.Fatalf("no checkpoint in %s: %v", dir, err)
	}
	if _, _, err := checkpoint.LoadCheckpoint(p); err != nil {
		t.Fatalf("checkpoint %s: %v", p, err)
	}
	tmps, _ := filepath.Glob(filepath.Join(dir, ".*.tmp-*"))
	if len(tmps) != 0 {
		t.Errorf("half-written files left: %v", tmps)
	}
	return step
}

// SIGTERM outside a step ends the run within 2 s with status 143: while the
// data is read, while the step compiles (resuming a checkpoint, which stays
// as it was), and between steps (a checkpoint of the steps done is written).
func TestTrainSIGTERMEndsTheRunQuickly(t *testing.T) {
	data := trainData(t)
	short := []string{"-seq", "16", "-batch", "2", "-data", data, "-eval-every", "0", "-ckpt-every", "0"}

	t.Run("reading data", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out")
		code, took, log := signalRun(t, append([]string{"-out", out, "-steps", "5"}, short...),
			func(l string) bool { return strings.HasPrefix(l, "data: reading") }, syscall.SIGTERM, false)
		if code != 143 || took > 2*time.Second {
			t.Fatalf("exit %d after %v (want 143 within 2s):\n%s", code, took, log)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("a run stopped before training created %s", out)
		}
	})

	t.Run("between steps", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out")
		code, took, log := signalRun(t, append([]string{"-out", out, "-steps", "1000000"}, short...),
			func(l string) bool { return strings.HasPrefix(l, "step ") && strings.Contains(l, "/1000000") }, syscall.SIGTERM, false)
		if code != 143 || took > 2*time.Second {
			t.Fatalf("exit %d after %v (want 143 within 2s):\n%s", code, took, log)
		}
		if !strings.Contains(log, "interrupted (SIGTERM): stopping after step") || !strings.Contains(log, "(interrupted)") {
			t.Errorf("no acknowledgement or summary:\n%s", log)
		}
		if step := checkpointIntact(t, filepath.Join(out, "ckpt")); step < 1 {
			t.Errorf("checkpoint at step %d", step)
		}

		// Resuming it, interrupted while the step compiles: the checkpoint
		// stays as it was.
		p, step, _ := checkpoint.LatestCheckpoint(filepath.Join(out, "ckpt"))
		ckptBytes, _ := os.ReadFile(p)
		code, took, log = signalRun(t, append([]string{"-out", out, "-steps", "1000000", "-resume"}, short...),
			func(l string) bool { return strings.HasPrefix(l, "compiling the training step") }, syscall.SIGTERM, false)
		if code != 143 || took > 2*time.Second {
			t.Fatalf("resume: exit %d after %v (want 143 within 2s):\n%s", code, took, log)
		}
		p2, step2, _ := checkpoint.LatestCheckpoint(filepath.Join(out, "ckpt"))
		after, _ := os.ReadFile(p)
		if step2 < step || (p2 == p && !bytes.Equal(after, ckptBytes)) {
			t.Errorf("resume interrupted while compiling: checkpoint %s (step %d) became %s (step %d)", p, step, p2, step2)
		}
		checkpointIntact(t, filepath.Join(out, "ckpt"))
		t.Logf("resume interrupted while compiling:\n%s", log)
	})
}

// A second signal aborts at once: the files this run created go, the last
// complete checkpoint stays.
func TestTrainSecondSignalAborts(t *testing.T) {
	data := trainData(t)
	out := filepath.Join(t.TempDir(), "out")
	// Checkpoints every 2 steps, so that one is likely being written when
	// the abort comes; the signals come at step 100 of 2000.
	code, took, log := signalRun(t, []string{"-seq", "16", "-batch", "2", "-data", data, "-eval-every", "0", "-ckpt-every", "2", "-out", out, "-steps", "2000"},
		func(l string) bool { return strings.HasPrefix(l, "step  100/2000") }, syscall.SIGINT, true)
	// SIGINT and SIGTERM are sent back to back, and the process may take
	// them in either order: the one it takes second aborts, and the exit
	// status is that signal's.
	want := 0
	switch {
	case strings.Contains(log, "SIGTERM: a second signal: aborting now"):
		want = 143
	case strings.Contains(log, "SIGINT: a second signal: aborting now"):
		want = 130
	default:
		t.Fatalf("no abort message (exit %d):\n%s", code, log)
	}
	if code != want || took > 2*time.Second {
		t.Fatalf("exit %d after %v (want %d, the second signal's, within 2s):\n%s", code, took, want, log)
	}
	for _, f := range []string{"graph.txt", "graph.dot", "train_graph.txt", "loss.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); !os.IsNotExist(err) {
			t.Errorf("%s left behind after the abort", f)
		}
	}
	checkpointIntact(t, filepath.Join(out, "ckpt"))
}
