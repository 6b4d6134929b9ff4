package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/flashgraph/flashgraph/dist"
	"github.com/flashgraph/flashgraph/graph"
)

// rankCommand is how the launcher starts a rank: this program, with a prefix
// before "train" (tests run the CLI inside the test binary, which needs its
// own arguments first).
var rankCommand = func() (path string, prefix []string, err error) {
	p, err := os.Executable()
	return p, nil, err
}

// launchRanks is train -ranks N: it starts N processes of this program with
// the same arguments, each told its rank by the torchrun variables, and
// watches them. Rank 0's output is this command's; a rank that fails ends
// the job (the others are killed) and its message is passed on. Signals are
// passed on to the ranks, which agree to stop after the same step and save
// a checkpoint; a second signal aborts them.
func launchRanks(j rankJob, args []string, stdout, stderr io.Writer) error {
	path, prefix, err := rankCommand()
	if err != nil {
		return fmt.Errorf("-ranks: finding this program to start the ranks: %w", err)
	}
	port := j.MasterPort
	if !j.portGiven {
		if port, err = freePort(j.MasterAddr); err != nil {
			return fmt.Errorf("-ranks: %w", err)
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	l := &dist.Launch{
		Path: path, Args: append(append(prefix, "train"), args...), Env: os.Environ(),
		World: j.WorldSize, MasterAddr: j.MasterAddr, MasterPort: port,
		Stdout: stdout, Stderr: stderr, Signals: sigs,
		// A rank stopped by a signal saved its part (rank 0 the checkpoint)
		// and the others stop after the same step: let them finish.
		Graceful: func(_ int, err error) bool { return interruptStatus(err) != 0 },
	}
	fmt.Fprintf(stderr, "ranks: starting %d rank processes on this host (rendezvous %s:%d); the output is rank 0's\n", j.WorldSize, j.MasterAddr, port)
	err = l.Run(context.Background())
	var re *dist.RankError
	if errors.As(err, &re) {
		if s := interruptStatus(re.Err); s != 0 {
			return &signalError{s}
		}
		if re.Rank == 0 {
			// Its own words are already on stderr.
			return fmt.Errorf("rank 0 failed: %v", re.Err)
		}
	}
	return err
}

// interruptStatus is the signal a rank's exit status says it was stopped by
// as asked (130: SIGINT, 143: SIGTERM), 0 for any other end.
func interruptStatus(err error) syscall.Signal {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 0
	}
	switch ee.ExitCode() {
	case 128 + int(syscall.SIGINT):
		return syscall.SIGINT
	case 128 + int(syscall.SIGTERM):
		return syscall.SIGTERM
	}
	return 0
}

// freePort asks the system for a port that no one listens on now, for the
// ranks' rendezvous (another job's default port would make them meet the
// wrong rank 0).
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port for the rendezvous: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// joinRanks makes this process rank j.Rank of its job: the rendezvous (which
// waits up to -rank-timeout for the others) and the CPU collective.
func joinRanks(ctx context.Context, j rankJob) (*dist.TCP, error) {
	t, err := dist.NewTCP(ctx, j.Config, j.timeout)
	if err != nil {
		return nil, err
	}
	t.Timeout = j.timeout
	return t, nil
}

// rankFailure is a rank's error once the job has failed: the reason the
// group heard (another rank named as dead) is joined to it, and the other
// ranks are told that this one is giving up.
func rankFailure(t *dist.TCP, err error) error {
	err = t.Cause(err, 2*time.Second)
	t.Group().Abort(err)
	return err
}

// countBuckets is the number of gradient buckets of a step graph: its
// AllReduce nodes, or with a sharded optimizer its ReduceScatter nodes.
func countBuckets(g *graph.Graph) int {
	seen := map[int64]bool{}
	for _, n := range g.Nodes {
		if n.Op == "AllReduce" || n.Op == "ReduceScatter" {
			seen[n.Attrs.Int("bucket", 0)] = true
		}
	}
	return len(seen)
}
