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

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda"
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
	if j.onCUDA {
		n, err := cuda.DeviceCount()
		if err != nil {
			return fmt.Errorf("-gpus %d: %w", j.WorldSize, err)
		}
		if n < j.WorldSize {
			return fmt.Errorf("-gpus %d: this host has %d GPU(s); one rank drives one GPU", j.WorldSize, n)
		}
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

// gpuComm is a GPU rank's NCCL communicator and the watchdog that aborts it
// when the job fails: a collective waiting on a dead peer would otherwise
// hold this rank's stream, and the step with it, forever.
type gpuComm struct {
	comm *cuda.Comm
	done chan struct{}
}

// joinGPURanks makes this process a GPU rank: the rendezvous and the CPU
// collective (which the loop's scalars go through) carry rank 0's NCCL id to
// every rank, and each joins the communicator on its own GPU, which the
// backend's AllReduce nodes then reduce through.
func joinGPURanks(ctx context.Context, j rankJob, be backend.Backend) (*dist.TCP, *gpuComm, error) {
	cb, ok := be.(*cuda.Backend)
	if !ok {
		return nil, nil, fmt.Errorf("ranks on %s: only the CUDA backend reduces through NCCL", be.Name())
	}
	var extra []byte
	if j.Rank == 0 {
		id, err := cuda.NewNCCLUniqueID()
		if err != nil {
			return nil, nil, fmt.Errorf("rank 0: making the NCCL id: %w", err)
		}
		extra = id[:]
	}
	t, err := dist.NewTCPWith(ctx, j.Config, j.timeout, extra)
	if err != nil {
		return nil, nil, err
	}
	t.Timeout = j.timeout
	var id cuda.NCCLUniqueID
	if n := copy(id[:], t.Extra(0)); n != len(id) {
		t.Close()
		return nil, nil, fmt.Errorf("rank %d: rank 0 sent an NCCL id of %d bytes, want %d", j.Rank, n, len(id))
	}
	comm, err := cb.Device().NewComm(id, j.WorldSize, j.Rank)
	if err != nil {
		t.Group().Abort(err)
		return nil, nil, err
	}
	if err := cb.SetComm(comm); err != nil {
		comm.Abort()
		t.Group().Abort(err)
		return nil, nil, err
	}
	g := &gpuComm{comm: comm, done: make(chan struct{})}
	go g.watch(t)
	return t, g, nil
}

// watch aborts the communicator when another rank dies (the group hears of
// it) or NCCL reports an error of its own in the background.
func (g *gpuComm) watch(t *dist.TCP) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-g.done:
			return
		case <-t.Group().Failed():
			g.comm.Abort()
			return
		case <-tick.C:
			if g.comm.AsyncError() != nil {
				g.comm.Abort()
				return
			}
		}
	}
}

// close ends the watchdog and the communicator: at once (abort) after a
// failure, once the queued work is done otherwise.
func (g *gpuComm) close(failed bool) {
	close(g.done)
	if failed {
		g.comm.Abort()
		return
	}
	g.comm.Close()
}
