package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/checkpoint"
)

// faultArgs train for long enough to be stopped from outside, with a
// checkpoint every 5 steps and a short collective timeout.
func faultArgs(data, out string) []string {
	return []string{"train", "-device", "cpu", "-seq", "16", "-batch", "4", "-steps", "100000", "-data", data, "-out", out,
		"-eval-every", "0", "-ckpt-every", "5", "-rank-timeout", "2s"}
}

// handRanks starts world processes of `flashgraph args` configured only by
// the torchrun variables, as a job on several hosts is, and returns them with
// their combined output.
func handRanks(t *testing.T, world int, args []string) ([]*exec.Cmd, []*bytes.Buffer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmds := make([]*exec.Cmd, world)
	outs := make([]*bytes.Buffer, world)
	for r := range world {
		cmd := helperCommand(args)
		cmd.Env = append(cmd.Env, "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(world), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		outs[r] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[r], outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			c.Process.Signal(syscall.SIGCONT)
			c.Process.Kill()
			c.Wait()
		}
	})
	return cmds, outs
}

// waitCheckpoint waits until dir holds a checkpoint of step at least step.
func waitCheckpoint(t *testing.T, dir string, step int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if _, s, err := checkpoint.LatestCheckpoint(dir); err == nil && s >= step {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no checkpoint of step %d in %s within 60 s", step, dir)
}

// exitWithin waits for cmd to exit for up to limit and returns how long it took.
func exitWithin(t *testing.T, cmd *exec.Cmd, limit time.Duration, out *bytes.Buffer) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		t.Fatalf("the process did not exit within %v of the fault:\n%s", limit, out.String())
		return 0
	}
}

// Ranks started by hand (the torchrun form): a rank killed with SIGKILL, or
// hung (SIGSTOP), makes the others exit within a bounded time with an error
// naming it, and the last checkpoint stays intact.
func TestTrainRanksFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	data := trainData(t)
	for _, tc := range []struct {
		name       string
		victim     int
		sig        syscall.Signal
		limit      time.Duration
		wantInSurv string
	}{
		{"rank 1 killed", 1, syscall.SIGKILL, 10 * time.Second, "rank 1 went away"},
		{"rank 0 killed", 0, syscall.SIGKILL, 10 * time.Second, "rank 0"},
		// -rank-timeout 2s: the survivor gives up about then.
		{"rank 1 hung", 1, syscall.SIGSTOP, 15 * time.Second, "rank 1 sent nothing within the collective timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			cmds, outs := handRanks(t, 2, faultArgs(data, out))
			waitCheckpoint(t, filepath.Join(out, "ckpt"), 10)
			if err := cmds[tc.victim].Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			surv := 1 - tc.victim
			took := exitWithin(t, cmds[surv], tc.limit, outs[surv])
			msg := outs[surv].String()
			if code := cmds[surv].ProcessState.ExitCode(); code == 0 {
				t.Errorf("the surviving rank exited 0 after %v:\n%s", took, msg)
			}
			if !strings.Contains(msg, tc.wantInSurv) {
				t.Errorf("rank %d's error does not name rank %d (%q):\n%s", surv, tc.victim, tc.wantInSurv, msg)
			}
			t.Logf("rank %d exited %v after the fault: %s", surv, took.Round(time.Millisecond), lastLine(msg))
			checkpointIntact(t, filepath.Join(out, "ckpt"))
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// childPIDs lists the processes whose parent is pid (Linux /proc).
func childPIDs(t *testing.T, pid int) []int {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// rankOf reads the RANK variable a launched process was given.
func rankOf(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, "RANK="); ok {
			return v
		}
	}
	return ""
}

// train -ranks 2 with rank 1 killed: the launcher ends the job at once with an
// error naming rank 1, no rank outlives it, and the last checkpoint is intact.
func TestTrainRanksLauncherKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("needs Linux /proc to find the ranks")
	}
	data := trainData(t)
	out := filepath.Join(t.TempDir(), "out")
	cmd := helperCommand(append(faultArgs(data, out), "-ranks", "2"))
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitCheckpoint(t, filepath.Join(out, "ckpt"), 10)
	kids := childPIDs(t, cmd.Process.Pid)
	if len(kids) != 2 {
		t.Fatalf("the launcher has %d child processes, want 2 ranks: %v", len(kids), kids)
	}
	victim := -1
	for _, k := range kids {
		if rankOf(k) == "1" {
			victim = k
		}
	}
	if victim < 0 {
		t.Fatalf("no child with RANK=1 among %v", kids)
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := exitWithin(t, cmd, 10*time.Second, &buf)
	if code := cmd.ProcessState.ExitCode(); code == 0 {
		t.Errorf("the launcher exited 0:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), "rank 1 failed: signal: killed") {
		t.Errorf("the launcher does not name rank 1:\n%s", buf.String())
	}
	for _, k := range kids {
		// Reaped by the launcher, a rank is gone from /proc; a zombie or a
		// live one would still be there.
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", k)); err == nil {
			t.Errorf("rank process %d outlived the launcher", k)
		}
	}
	t.Logf("launcher exited %v after the kill", took.Round(time.Millisecond))
	checkpointIntact(t, filepath.Join(out, "ckpt"))
}

// Ctrl-C to train -ranks 2 (SIGINT to the launcher, passed on to the ranks
// once): the ranks agree to stop after the same step, rank 0 saves a
// checkpoint of it, the launcher exits 130, and -resume continues from it.
func TestTrainRanksInterrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	data := trainData(t)
	out := filepath.Join(t.TempDir(), "out")
	ckpt := filepath.Join(out, "ckpt")
	args := faultArgs(data, out)
	args = append(args, "-ranks", "2")
	cmd := helperCommand(args)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// Interrupt once the job is into its steps: its first checkpoint.
	waitCheckpoint(t, ckpt, 5)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	took := exitWithin(t, cmd, 20*time.Second, &buf)
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("exit %d after SIGINT, want 130:\n%s", code, buf.String())
	}
	step := checkpointIntact(t, ckpt)
	if step < 5 || !strings.Contains(buf.String(), fmt.Sprintf("interrupted: stopping after step %d", step)) {
		t.Errorf("the checkpoint is of step %d, not the step the job stopped after:\n%s", step, buf.String())
	}
	t.Logf("stopped %v after SIGINT, checkpoint of step %d", took.Round(time.Millisecond), step)
	// Both ranks saved nothing else and left nothing running: resume.
	var rbuf bytes.Buffer
	resume := helperCommand(append(rankResumeArgs(data, out), "-steps", fmt.Sprint(step+3)))
	resume.Stdout, resume.Stderr = &rbuf, &rbuf
	if err := resume.Run(); err != nil {
		t.Fatalf("resume: %v\n%s", err, rbuf.String())
	}
	if !strings.Contains(rbuf.String(), fmt.Sprintf("resumed from %s", checkpoint.CheckpointPath(ckpt, step))) {
		t.Errorf("the resumed job did not start from step %d:\n%s", step, rbuf.String())
	}
}

func rankResumeArgs(data, out string) []string {
	return []string{"train", "-device", "cpu", "-seq", "16", "-batch", "4", "-data", data, "-out", out, "-eval-every", "0", "-ranks", "2", "-resume"}
}
