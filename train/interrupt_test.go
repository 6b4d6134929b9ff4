package train

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
)

var errTestSignal = errors.New("interrupted (SIGTEST)")

// Work that cannot stop midway is given up at once when the context is done;
// its result is released when it ends.
func TestUntilDoneGivesUpAtOnce(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	released := make(chan int, 1)
	go func() {
		time.Sleep(20 * time.Millisecond)
		cancel(errTestSignal)
	}()
	t0 := time.Now()
	_, err := untilDone(ctx, "compiling", func() (int, error) {
		time.Sleep(2 * time.Second)
		return 7, nil
	}, func(v int) error { released <- v; return nil })
	if took := time.Since(t0); took > time.Second {
		t.Fatalf("returned after %v", took)
	}
	if !errors.Is(err, errTestSignal) || !strings.Contains(err.Error(), "while compiling") {
		t.Fatalf("err = %v", err)
	}
	select {
	case v := <-released:
		if v != 7 {
			t.Fatalf("released %d", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the abandoned result was not released")
	}
	v, err := untilDone(context.Background(), "x", func() (int, error) { return 3, nil }, nil)
	if v != 3 || err != nil {
		t.Fatalf("uncancelled: %v %v", v, err)
	}
}

// A run cancelled before it starts returns the cause at once and creates
// nothing.
func TestRunCancelledWhileCompiling(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errTestSignal)
	var log strings.Builder
	dir := t.TempDir()
	_, err := Run(ctx, cpu.New(), testCorpus(t), Options{Config: testConfig(t, graph.Float32), Hyper: testHyper(5), CkptDir: dir, Log: &log})
	if !errors.Is(err, errTestSignal) {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(log.String(), "interrupted (SIGTEST): stopping now (the training step was compiling") {
		t.Errorf("no acknowledgement:\n%s", log.String())
	}
	if old, _ := checkpoint.ListCheckpoints(dir); len(old) != 0 {
		t.Errorf("checkpoints %v", old)
	}
}

// A cancellation during a validation gives the validation up, records no
// point for it, and saves the steps done.
func TestRunCancelledDuringValidation(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cfg := testConfig(t, graph.Float32)
	dir := t.TempDir()
	var log strings.Builder
	res, err := Run(ctx, cpu.New(), testCorpus(t), Options{Config: cfg, Hyper: testHyper(10), EvalEvery: 3, CkptDir: dir, Log: &log,
		OnStep: func(step int64, _ float64) {
			if step == 3 {
				cancel(errTestSignal) // before the validation of step 3
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Interrupted || res.Step != 3 || res.Checkpoint != checkpoint.CheckpointPath(dir, 3) {
		t.Fatalf("interrupted %v at step %d, checkpoint %q", res.Interrupted, res.Step, res.Checkpoint)
	}
	for _, v := range res.Val {
		if v.Step == 3 {
			t.Errorf("a validation point at the interrupted step: %v", res.Val)
		}
	}
	// The acknowledgement comes from another goroutine: it may see the run
	// before or in the validation.
	if !strings.Contains(log.String(), "interrupted (SIGTEST): stopping the validation at step 3, then saving a checkpoint") &&
		!strings.Contains(log.String(), "interrupted (SIGTEST): stopping after step 3, then saving a checkpoint") {
		t.Errorf("acknowledgement:\n%s", log.String())
	}
}
