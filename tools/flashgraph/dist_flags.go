package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/dist"
)

// distFlags are train's data parallel flags. Each process of a job is one rank
// driving one GPU (as torchrun launches PyTorch): a rank is then an ordinary
// single-GPU process plus a communicator, the same on one host and on many,
// and a rank that crashes takes down one process, which the others detect
// through the rendezvous connections. The flags override the torchrun
// environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
type distFlags struct {
	fs         *flag.FlagSet
	gpus       *int
	rank       *int
	worldSize  *int
	masterAddr *string
	masterPort *int
}

func addDistFlags(fs *flag.FlagSet) *distFlags {
	return &distFlags{
		fs:         fs,
		gpus:       fs.Int("gpus", 1, "GPUs of this host to train on, one process (rank) each (data parallel; needs NCCL)"),
		rank:       fs.Int("rank", 0, "this process's rank in a multi-process job (default: $RANK, else 0)"),
		worldSize:  fs.Int("world-size", 1, "number of ranks (processes, one per GPU) in the job, over all hosts (default: $WORLD_SIZE, else 1)"),
		masterAddr: fs.String("master-addr", "127.0.0.1", "host of rank 0, where the ranks meet (default: $MASTER_ADDR)"),
		masterPort: fs.Int("master-port", dist.DefaultMasterPort, "TCP port of rank 0's rendezvous (default: $MASTER_PORT)"),
	}
}

// errNotWired is the honest answer to a multi-GPU request today.
var errNotWired = errors.New("multi-GPU training is not available yet: the rank bootstrap, launcher and CPU collective (package dist), the AllReduce nodes of the training step and the NCCL all-reduce (backend/cuda) exist, but they are not wired into the training loop; train on one GPU (drop -gpus, -world-size and the RANK/WORLD_SIZE variables)")

// The CPU test transport is a collective the CPU executor can call.
var _ backend.Collective = (*dist.TCP)(nil)

// config resolves the job from the environment and the flags given, checks it
// against the device and the global batch, and returns it. A job of one rank
// (the default) is the ordinary single-process run. A job of several is
// validated and then refused with errNotWired.
func (f *distFlags) config(getenv func(string) string, device string, globalBatch int) (dist.Config, error) {
	c, err := dist.FromEnv(getenv)
	if err != nil {
		return c, err
	}
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if *f.gpus < 1 {
		return c, fmt.Errorf("-gpus must be at least 1, got %d", *f.gpus)
	}
	if set["gpus"] && (set["rank"] || set["world-size"]) {
		return c, errors.New("-gpus N starts N ranks on this host by itself: give either -gpus, or -rank and -world-size for each process, not both")
	}
	if set["rank"] {
		c.Rank = *f.rank
		if getenv(dist.EnvLocalRank) == "" {
			c.LocalRank = c.Rank
		}
	}
	if set["world-size"] {
		c.WorldSize = *f.worldSize
	}
	if set["master-addr"] {
		c.MasterAddr = *f.masterAddr
	}
	if set["master-port"] {
		c.MasterPort = *f.masterPort
	}
	if *f.gpus > 1 {
		c.WorldSize = *f.gpus
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	if c.WorldSize == 1 {
		return c, nil
	}
	if device == "cpu" {
		return c, fmt.Errorf("a job of %d ranks trains on CUDA GPUs through NCCL: drop -device cpu", c.WorldSize)
	}
	if _, _, err := dist.Shard(globalBatch, c.WorldSize, c.Rank); err != nil {
		return c, fmt.Errorf("-batch: %w", err)
	}
	return c, fmt.Errorf("%s: %w", c, errNotWired)
}
