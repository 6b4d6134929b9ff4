package main

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/dist"
)

// distFlags are train's data parallel flags. Each process of a job is one rank
// (as torchrun launches PyTorch): a rank is then an ordinary single-device
// process plus a communicator, the same on one host and on many, and a rank
// that crashes takes down one process, which the others detect through their
// connections. -ranks N starts N such processes on this host; the torchrun
// form (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or the flags,
// which override them) makes this process one rank of a job started
// elsewhere.
type distFlags struct {
	fs          *flag.FlagSet
	ranks       *int
	gpus        *int
	rank        *int
	worldSize   *int
	masterAddr  *string
	masterPort  *int
	rankTimeout *time.Duration
	bucketMB    *float64
	shardOpt    *bool
}

func addDistFlags(fs *flag.FlagSet) *distFlags {
	return &distFlags{
		fs:          fs,
		ranks:       fs.Int("ranks", 1, "data parallel: start N rank processes on this host, each training 1/N of every -batch rows on -device, their gradients averaged after every step; output comes from rank 0. On -device cpu the ranks talk over loopback TCP"),
		gpus:        fs.Int("gpus", 1, "GPUs of this host to train on, one rank each: -ranks N on -device cuda, the gradients averaged by NCCL (needs libnccl 2.23 or later; not yet measured on several GPUs)"),
		rank:        fs.Int("rank", 0, "this process's rank in a job whose ranks are started one by one, e.g. on several hosts (default: $RANK, else 0)"),
		worldSize:   fs.Int("world-size", 1, "number of ranks in such a job, over all hosts (default: $WORLD_SIZE, else 1)"),
		masterAddr:  fs.String("master-addr", "127.0.0.1", "host of rank 0, where the ranks meet (default: $MASTER_ADDR)"),
		masterPort:  fs.Int("master-port", dist.DefaultMasterPort, "TCP port of rank 0's rendezvous (default: $MASTER_PORT; with -ranks: a free port)"),
		rankTimeout: fs.Duration("rank-timeout", 5*time.Minute, "how long a rank waits for the others to meet, and within a step for a silent (hung or stopped) rank, before the job stops with an error naming it; a rank that dies is noticed at once"),
		bucketMB:    fs.Float64("bucket-mb", 25, "with several ranks: gradient MiB per all-reduce bucket (each bucket is reduced once its last gradient is final)"),
		shardOpt:    fs.Bool("shard-optimizer", false, "with several ranks: ZeRO-1, each rank keeps the AdamW moments of its 1/N part of the gradients only (reduce-scatter the gradients, update the part, all-gather the weights); the same steps, less optimizer memory per rank"),
	}
}

// ncclVersion reports the NCCL library's version, or why it cannot be
// loaded (a variable: tests stand in for a machine with or without NCCL).
var ncclVersion = cuda.NCCLVersion

// The CPU test transport is a collective the CPU executor can call.
var _ backend.Collective = (*dist.TCP)(nil)

// rankJob is what the data parallel flags and environment ask of this
// process: to be one rank of Config (World 1: the ordinary single-process
// run), or, with launch, to start Config.WorldSize ranks on this host.
type rankJob struct {
	dist.Config
	launch     bool
	portGiven  bool // -master-port or MASTER_PORT chose the port
	timeout    time.Duration
	bucketByte int64
	shardOpt   bool
	onCUDA     bool // the ranks train on GPUs (NCCL)
}

// config resolves the job from the environment and the flags given and
// checks it against the device and the global batch.
func (f *distFlags) config(getenv func(string) string, device string, globalBatch int) (rankJob, error) {
	c, err := dist.FromEnv(getenv)
	j := rankJob{Config: c, timeout: *f.rankTimeout, portGiven: getenv(dist.EnvMasterPort) != ""}
	if err != nil {
		return j, err
	}
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if *f.gpus < 1 {
		return j, fmt.Errorf("-gpus must be at least 1, got %d", *f.gpus)
	}
	if *f.ranks < 1 {
		return j, fmt.Errorf("-ranks must be at least 1, got %d", *f.ranks)
	}
	if set["gpus"] && set["ranks"] {
		return j, errors.New("-gpus N is -ranks N on CUDA GPUs: give one of them")
	}
	if (set["gpus"] || set["ranks"]) && (set["rank"] || set["world-size"]) {
		return j, errors.New("-ranks N (or -gpus N) starts N ranks on this host by itself: give either it, or -rank and -world-size for each process, not both")
	}
	if !(*f.rankTimeout > 0) {
		return j, fmt.Errorf("-rank-timeout must be positive, got %v", *f.rankTimeout)
	}
	if !(*f.bucketMB > 0) || *f.bucketMB > 1<<20 {
		return j, fmt.Errorf("-bucket-mb must be in (0, 1048576], got %v", *f.bucketMB)
	}
	j.bucketByte = max(1, int64(*f.bucketMB*(1<<20)))
	if set["rank"] {
		j.Rank = *f.rank
		if getenv(dist.EnvLocalRank) == "" {
			j.LocalRank = j.Rank
		}
	}
	if set["world-size"] {
		j.WorldSize = *f.worldSize
	}
	if set["master-addr"] {
		j.MasterAddr = *f.masterAddr
	}
	if set["master-port"] {
		j.MasterPort = *f.masterPort
		j.portGiven = true
	}
	n := max(*f.ranks, *f.gpus)
	if *f.gpus > 1 {
		device = "cuda"
	}
	if n > 1 {
		if getenv(dist.EnvWorldSize) != "" {
			// A rank of a job that -ranks (or torchrun) started: the
			// environment says which one.
			if j.WorldSize != n {
				return j, fmt.Errorf("-ranks %d, but WORLD_SIZE=%d: a launched rank's job has the launcher's size", n, j.WorldSize)
			}
		} else {
			j.launch, j.WorldSize, j.Rank, j.LocalRank = true, n, 0, 0
		}
	}
	if err := j.Validate(); err != nil {
		return j, err
	}
	if j.WorldSize == 1 {
		if *f.shardOpt {
			return j, errors.New("-shard-optimizer shards the optimizer state over the ranks of a job: give -ranks N (or -world-size N) with N > 1")
		}
		return j, nil
	}
	j.shardOpt = *f.shardOpt
	j.onCUDA = device == "cuda"
	if device == "cuda" {
		// The gradients of GPU ranks go through NCCL: without it there is
		// nothing to train with, and the job is refused before it starts.
		if _, err := ncclVersion(); err != nil {
			return j, fmt.Errorf("%s on -device cuda: the ranks average their gradients through NCCL, which cannot be used here: %w (-ranks N -device cpu trains N ranks on the CPU)", j.Config, err)
		}
		if j.shardOpt {
			return j, fmt.Errorf("%s on -device cuda: -shard-optimizer is not available on GPUs yet (its reduce-scatter and all-gather are not lowered to NCCL): drop it, or train on -device cpu", j.Config)
		}
	}
	if _, _, err := dist.Shard(globalBatch, j.WorldSize, j.Rank); err != nil {
		return j, fmt.Errorf("-batch: %w", err)
	}
	return j, nil
}
