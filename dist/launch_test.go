package dist

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const launchHelperEnv = "FLASHGRAPH_LAUNCH_HELPER"

// TestLaunchHelperProcess is one rank started by Launch.Run. It says hello
// with its rank and world size from the environment; the rank named by
// FLASHGRAPH_LAUNCH_HELPER=die:R then fails with a message, and with "ok"
// every rank exits 0. The other ranks of a "die" job wait (up to 30s), to be
// killed by the launcher.
func TestLaunchHelperProcess(t *testing.T) {
	mode := os.Getenv(launchHelperEnv)
	if mode == "" {
		t.Skip("helper process of the launcher tests")
	}
	c, err := FromEnv(os.Getenv)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Printf("hello from rank %d of %d (local %d, %s)\n", c.Rank, c.WorldSize, c.LocalRank, c.Address())
	if mode == "ok" {
		os.Exit(0)
	}
	if mode == "peer-killed" {
		// Rank 0 fails at once the way a rank whose peer died does;
		// rank 1 dies by SIGKILL a little later.
		if c.Rank == 0 {
			fmt.Fprintln(os.Stderr, "all-reduce: rank 1 went away")
			os.Exit(1)
		}
		time.Sleep(300 * time.Millisecond)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if mode == "die:"+strconv.Itoa(c.Rank) {
		time.Sleep(200 * time.Millisecond)
		fmt.Fprintln(os.Stderr, "boom: out of memory on this rank")
		os.Exit(3)
	}
	time.Sleep(30 * time.Second)
	os.Exit(0)
}

func helperLaunch(mode string, world int) (*Launch, *strings.Builder, *[]int) {
	var out strings.Builder
	var mu sync.Mutex
	pids := &[]int{}
	return &Launch{
		Path:       os.Args[0],
		Args:       []string{"-test.run=^TestLaunchHelperProcess$"},
		Env:        append(os.Environ(), launchHelperEnv+"="+mode),
		World:      world,
		MasterAddr: "127.0.0.1",
		MasterPort: 12345,
		Stdout:     &out,
		Stderr:     &out,
		Started: func(_, pid int) {
			mu.Lock()
			*pids = append(*pids, pid)
			mu.Unlock()
		},
	}, &out, pids
}

func TestLaunchAllSucceed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	l, out, pids := helperLaunch("ok", 3)
	if err := l.Run(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(*pids) != 3 {
		t.Errorf("started %d ranks, want 3", len(*pids))
	}
	// Only rank 0's output is printed.
	if got := out.String(); !strings.Contains(got, "hello from rank 0 of 3 (local 0, 127.0.0.1:12345)") || strings.Contains(got, "rank 1") || strings.Contains(got, "rank 2") {
		t.Errorf("launcher printed\n%s\nwant rank 0's hello only", got)
	}
}

// A failing rank ends the job at once: the others are killed, none outlives
// Run, and the error names the rank and repeats its message.
func TestLaunchRankFails(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	l, out, pids := helperLaunch("die:2", 3)
	start := time.Now()
	err := l.Run(context.Background())
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v to end the job", d)
	}
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 2 {
		t.Fatalf("got %v, want a RankError for rank 2\n%s", err, out.String())
	}
	if msg := err.Error(); !strings.Contains(msg, "rank 2 failed: exit status 3") || !strings.Contains(msg, "boom: out of memory") {
		t.Errorf("error %q does not name rank 2 and repeat its message", msg)
	}
	for _, pid := range *pids {
		// Reaped by Run: the pid no longer names a live process of ours.
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("process %d outlived the job", pid)
		}
	}
}

// A rank killed by a signal is the job's failure even when a peer's failure
// (its own error because the killed rank went away) is reaped first.
func TestLaunchNamesTheKilledRank(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	l, out, _ := helperLaunch("peer-killed", 2)
	err := l.Run(context.Background())
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 1 || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("got %v, want rank 1's death by SIGKILL named\n%s", err, out.String())
	}
}

// Cancelling the launcher's context kills every rank.
func TestLaunchCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	l, _, pids := helperLaunch("die:-1", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := l.Run(ctx)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want the context's error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v to stop", d)
	}
	for _, pid := range *pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("process %d outlived the job", pid)
		}
	}
}
