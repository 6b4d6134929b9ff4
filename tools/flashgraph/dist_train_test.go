package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/dist"
	"github.com/flashgraph/flashgraph/graph"
)

const distTrainHelperEnv = "FLASHGRAPH_DIST_TRAIN_HELPER"

const dtGlobal, dtSteps = 8, 10

// dtModel is a two-layer float32 regression whose loss is the mean over the
// batch, so that equal shards' mean gradients average to the full batch's.
func dtModel(batch int) (*graph.Graph, error) {
	b := graph.NewBuilder("reg")
	x := b.Input("x", graph.Float32, batch, 4)
	y := b.Input("y", graph.Float32, batch, 3)
	w1 := b.Param("w1", graph.Float32, graph.Shape{4, 8}, graph.Normal(0.5, 1))
	w2 := b.Param("w2", graph.Float32, graph.Shape{8, 3}, graph.Normal(0.5, 2))
	d := b.Sub(b.MatMul(b.Sigmoid(b.MatMul(x, w1)), w2), y)
	b.Output(b.Rename(b.ReduceMean(b.Mul(d, d), false), "loss"))
	return b.Build()
}

func dtRows(lo, hi, cols, seed int) *graph.Tensor {
	x := graph.NewTensor(graph.Float32, graph.Shape{hi - lo, cols})
	for i := range x.F32 {
		x.F32[i] = float32(math.Sin(float64((lo*cols+i)*7+seed*13)) * 1.5)
	}
	return x
}

// dtTrain trains rank's shard of the global batch for dtSteps steps through
// c and returns its losses.
func dtTrain(c backend.Collective, rank, world int) ([]float64, error) {
	per := dtGlobal / world
	g, err := dtModel(per)
	if err != nil {
		return nil, err
	}
	ts, err := autodiff.TrainingGraph(g, autodiff.TrainOptions{World: world})
	if err != nil {
		return nil, err
	}
	exe, err := cpu.New().Compile(ts.Graph, backend.Options{Updates: ts.Updates, Collective: c})
	if err != nil {
		return nil, err
	}
	defer exe.Close()
	lo, hi := rank*per, (rank+1)*per
	var losses []float64
	for s := range dtSteps {
		lr, step := graph.NewTensor(graph.Float32, graph.Shape{}), graph.NewTensor(graph.Float32, graph.Shape{})
		lr.F32[0], step.F32[0] = 3e-2, float32(s+1)
		out, err := exe.Run(map[string]*graph.Tensor{"x": dtRows(lo, hi, 4, s), "y": dtRows(lo, hi, 3, 100+s), "lr": lr, "step": step})
		if err != nil {
			return nil, err
		}
		losses = append(losses, float64(out["loss"].F32[0]))
	}
	return losses, nil
}

// TestDistTrainHelperProcess is one rank of TestDistTrainTwoProcesses.
func TestDistTrainHelperProcess(t *testing.T) {
	if os.Getenv(distTrainHelperEnv) == "" {
		t.Skip("helper process of the data-parallel training test")
	}
	c, err := dist.FromEnv(os.Getenv)
	if err == nil {
		var tc *dist.TCP
		if tc, err = dist.NewTCP(context.Background(), c, 10*time.Second); err == nil {
			var losses []float64
			if losses, err = dtTrain(tc, c.Rank, c.WorldSize); err == nil {
				for _, l := range losses {
					fmt.Println("loss", strconv.FormatFloat(l, 'g', -1, 64))
				}
				tc.Close()
				os.Exit(0)
			}
		}
	}
	fmt.Fprintln(os.Stderr, "error:", err)
	os.Exit(1)
}

// Two processes, started by dist.Launch (as train -gpus 2 will) and
// configured only by the torchrun variables, train the same global batch as
// one process, their gradients averaged over loopback TCP: rank 0's losses
// are, to 1e-5 relative over 10 steps, the losses of its rows under the
// one-process run's weights.
func TestDistTrainTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	want, err := dtTrain(nil, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	// The launcher prints rank 0's output only: its losses are those of its
	// half of the batch under the job's weights, which a correct all-reduce
	// keeps equal to the one-process run's (dtShardLosses).
	var out strings.Builder
	l := &dist.Launch{
		Path: os.Args[0], Args: []string{"-test.run=^TestDistTrainHelperProcess$"},
		Env:   append(os.Environ(), distTrainHelperEnv+"=1"),
		World: 2, MasterAddr: "127.0.0.1", MasterPort: port, Stdout: &out, Stderr: &out,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := l.Run(ctx); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var got []float64
	for line := range strings.Lines(out.String()) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "loss "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, f)
		}
	}
	if len(got) != dtSteps {
		t.Fatalf("rank 0 printed %d losses, want %d:\n%s", len(got), dtSteps, out.String())
	}
	// Rank 0's loss at step s is its half's loss under the weights of step
	// s, which the 1-rank run shares: recompute it from a 1-rank run that
	// reports the half's loss alongside.
	half, err := dtShardLosses()
	if err != nil {
		t.Fatal(err)
	}
	for s := range dtSteps {
		if d := math.Abs(got[s] - half[s]); d > 1e-5*math.Abs(half[s]) {
			t.Errorf("step %d: rank 0's loss %.9g, the one-rank run's on rank 0's rows %.9g", s, got[s], half[s])
		}
	}
	if want[dtSteps-1] >= want[0] {
		t.Errorf("the loss did not fall (%g → %g)", want[0], want[dtSteps-1])
	}
}

// dtShardLosses trains on the full batch in one process and, before each
// step, evaluates the loss on rank 0's rows (the first half) with the
// current weights: what rank 0 of a correct 2-rank job reports.
func dtShardLosses() ([]float64, error) {
	full, err := dtModel(dtGlobal)
	if err != nil {
		return nil, err
	}
	ts, err := autodiff.TrainingGraph(full, autodiff.TrainOptions{})
	if err != nil {
		return nil, err
	}
	exe, err := cpu.New().Compile(ts.Graph, backend.Options{Updates: ts.Updates})
	if err != nil {
		return nil, err
	}
	defer exe.Close()
	halfG, err := dtModel(dtGlobal / 2)
	if err != nil {
		return nil, err
	}
	var out []float64
	for s := range dtSteps {
		ev, err := cpu.New().Compile(halfG, backend.Options{})
		if err != nil {
			return nil, err
		}
		for _, p := range []string{"w1", "w2"} {
			w, err := exe.Initializer(p)
			if err == nil {
				err = ev.SetInitializer(p, w)
			}
			if err != nil {
				ev.Close()
				return nil, err
			}
		}
		r, err := ev.Run(map[string]*graph.Tensor{"x": dtRows(0, dtGlobal/2, 4, s), "y": dtRows(0, dtGlobal/2, 3, 100+s)})
		ev.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, float64(r["loss"].F32[0]))
		lr, step := graph.NewTensor(graph.Float32, graph.Shape{}), graph.NewTensor(graph.Float32, graph.Shape{})
		lr.F32[0], step.F32[0] = 3e-2, float32(s+1)
		if _, err := exe.Run(map[string]*graph.Tensor{"x": dtRows(0, dtGlobal, 4, s), "y": dtRows(0, dtGlobal, 3, 100+s), "lr": lr, "step": step}); err != nil {
			return nil, err
		}
	}
	return out, nil
}
