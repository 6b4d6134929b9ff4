package dist

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// helperEnv selects what TestDistHelperProcess does in a child process.
const helperEnv = "FLASHGRAPH_DIST_HELPER"

// rankProcess starts the test binary as one rank, configured only through the
// torchrun-style environment, exactly as a launcher on another host would.
func rankProcess(t *testing.T, mode string, rank, world, port int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDistHelperProcess$")
	cmd.Env = append(os.Environ(),
		helperEnv+"="+mode,
		"RANK="+strconv.Itoa(rank),
		"WORLD_SIZE="+strconv.Itoa(world),
		"MASTER_ADDR=127.0.0.1",
		"MASTER_PORT="+strconv.Itoa(port),
	)
	return cmd
}

// TestDistHelperProcess is one rank of the multi-process tests. Mode "print"
// meets the others, prints every rank's blob in hex and closes cleanly; "die"
// meets them and exits at once without closing, like a crashed rank; "watch"
// meets them and waits for a failure, which it prints before exiting 1.
func TestDistHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("helper process of the multi-process rendezvous tests")
	}
	c, err := FromEnv(os.Getenv)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	g, err := Rendezvous(context.Background(), c, idOf(c.Rank), 20*time.Second)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	switch mode {
	case "print":
		for r, b := range g.Blobs {
			fmt.Printf("blob %d %s\n", r, hex.EncodeToString(b))
		}
		g.Close()
		os.Exit(0)
	case "die":
		os.Exit(3)
	case "watch":
		select {
		case err := <-g.Failed():
			fmt.Println("failed:", err)
			os.Exit(1)
		case <-time.After(30 * time.Second):
			fmt.Println("no failure reported within 30s")
			os.Exit(4)
		}
	}
	os.Exit(5)
}

// Two processes with rank / world size / rendezvous address in the environment
// meet over TCP on loopback and get each other's ids: the path two hosts take.
func TestRendezvousTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	port := freePort(t)
	// Rank 1 starts first: it must wait for rank 0 rather than give up.
	p1 := rankProcess(t, "print", 1, 2, port)
	var out1 strings.Builder
	p1.Stdout, p1.Stderr = &out1, &out1
	if err := p1.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	out0, err0 := rankProcess(t, "print", 0, 2, port).CombinedOutput()
	err1 := p1.Wait()
	if err0 != nil || err1 != nil {
		t.Fatalf("rank 0: %v\n%s\nrank 1: %v\n%s", err0, out0, err1, out1.String())
	}
	want := fmt.Sprintf("blob 0 %s\nblob 1 %s\n", hex.EncodeToString(idOf(0)), hex.EncodeToString(idOf(1)))
	for r, out := range []string{string(out0), out1.String()} {
		if !strings.Contains(out, want) {
			t.Errorf("rank %d printed\n%s\nwant it to contain\n%s", r, out, want)
		}
	}
}

// A rank process that crashes after the rendezvous makes the others exit with
// an error naming it, instead of waiting forever.
func TestRankProcessDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	port := freePort(t)
	var outs [3]strings.Builder
	var cmds [3]*exec.Cmd
	for r, mode := range []string{"watch", "watch", "die"} {
		cmds[r] = rankProcess(t, mode, r, 3, port)
		cmds[r].Stdout, cmds[r].Stderr = &outs[r], &outs[r]
		if err := cmds[r].Start(); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for r, cmd := range cmds {
		err := cmd.Wait()
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err == nil {
			code = 0
		}
		want := 1
		if r == 2 {
			want = 3
		}
		if code != want {
			t.Errorf("rank %d exited with %d, want %d:\n%s", r, code, want, outs[r].String())
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the surviving ranks took %v to notice", d)
	}
	for r := range 2 {
		if out := outs[r].String(); !strings.Contains(out, "rank 2") || !strings.Contains(out, "went away") {
			t.Errorf("rank %d's failure does not say that rank 2 went away:\n%s", r, out)
		}
	}
}
