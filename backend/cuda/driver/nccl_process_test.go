package driver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/dist"
)

// ncclHelperEnv marks a child process of TestNCCLTwoProcesses.
const ncclHelperEnv = "FLASHGRAPH_NCCL_HELPER"

// Two processes, each configured only by the torchrun variables, meet through
// dist.Rendezvous over TCP, pass rank 0's NCCL unique id, build one NCCL
// communicator on GPUs 0 and 1, and all-reduce: the path two hosts take, on one
// host. It needs two GPUs and NCCL 2.23+, and runs on the two-GPU machine:
//
//	go test ./backend/cuda/driver -run TestNCCLTwoProcesses -v
func TestNCCLTwoProcesses(t *testing.T) {
	gpu(t)
	if n, err := DeviceCount(); err != nil || n < 2 {
		t.Skipf("needs 2 GPUs: %d, %v", n, err)
	}
	if _, err := NCCLVersion(); err != nil {
		t.Skip(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmds := make([]*exec.Cmd, 2)
	outs := make([]strings.Builder, 2)
	for r := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNCCLHelperProcess$")
		cmd.Env = append(os.Environ(), ncclHelperEnv+"=1", "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r),
			"WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("rank %d: %v\n%s", r, err, outs[r].String())
		} else if !strings.Contains(outs[r].String(), "all-reduce ok") {
			t.Errorf("rank %d did not report success:\n%s", r, outs[r].String())
		}
	}
}

// TestNCCLHelperProcess is one rank of TestNCCLTwoProcesses.
func TestNCCLHelperProcess(t *testing.T) {
	if os.Getenv(ncclHelperEnv) == "" {
		t.Skip("helper process of TestNCCLTwoProcesses")
	}
	if err := ncclRank(); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("all-reduce ok")
	os.Exit(0)
}

func ncclRank() error {
	c, err := dist.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	var id NCCLUniqueID
	if c.Rank == 0 {
		if id, err = NewNCCLUniqueID(); err != nil {
			return err
		}
	}
	g, err := dist.Rendezvous(context.Background(), c, id[:], 60*time.Second)
	if err != nil {
		return err
	}
	defer g.Close()
	if len(g.Blobs[0]) != len(id) {
		return fmt.Errorf("rank 0's id is %d bytes, want %d", len(g.Blobs[0]), len(id))
	}
	copy(id[:], g.Blobs[0])
	d := testGPU.Device()
	if c.LocalRank != 0 {
		if d, err = Open(c.LocalRank); err != nil {
			return err
		}
		defer d.Close()
	}
	comm, err := d.NewComm(id, c.WorldSize, c.Rank)
	if err != nil {
		return err
	}
	defer comm.Close()
	const n = 1 << 20
	h := make([]float32, n)
	for i := range h {
		h[i] = float32(c.Rank+1) * float32(i%97)
	}
	p, err := Upload(d, h)
	if err != nil {
		return err
	}
	defer d.Free(p)
	if err := comm.AllReduceSum(GemmF32, p, p, n); err != nil {
		return err
	}
	if err := Download(d, p, h); err != nil {
		return err
	}
	// Ranks 1..W contribute rank+1 times i%97: the sum is W(W+1)/2 times it.
	k := float32(c.WorldSize * (c.WorldSize + 1) / 2)
	for i, v := range h {
		if want := k * float32(i%97); v != want {
			return fmt.Errorf("element %d: got %v, want %v", i, v, want)
		}
	}
	return comm.AsyncError()
}
