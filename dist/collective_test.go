package dist

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// collectives starts world ranks as goroutines and returns their collectives.
func collectives(t *testing.T, world int) []*TCP {
	t.Helper()
	port := freePort(t)
	out := make([]*TCP, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			c := Config{Rank: r, WorldSize: world, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
			out[r], errs[r] = NewTCP(context.Background(), c, 10*time.Second)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range out {
			c.Close()
		}
	})
	return out
}

// rankData is rank r's buffer: values of very different magnitudes, so that
// the order and precision of summation show in the bits.
func rankData(r, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.Pow(10, float64((i*7+r*3)%9-4))) * float32(1+r) / 3
		if (i+r)%2 == 1 {
			v[i] = -v[i]
		}
	}
	return v
}

// Every rank gets the float64 sum in rank order, cast to float32: the same
// bits on every rank, every call.
func TestTCPAllReduceSum(t *testing.T) {
	const world, n = 3, 1000
	cs := collectives(t, world)
	want := make([]float32, n)
	for i := range want {
		s := 0.0
		for r := range world {
			s += float64(rankData(r, n)[i])
		}
		want[i] = float32(s)
	}
	for round := range 3 {
		bufs := make([][]float32, world)
		errs := make([]error, world)
		var wg sync.WaitGroup
		for r := range world {
			bufs[r] = rankData(r, n)
			wg.Go(func() { errs[r] = cs[r].AllReduceSum(context.Background(), bufs[r]) })
		}
		wg.Wait()
		for r := range world {
			if errs[r] != nil {
				t.Fatalf("round %d rank %d: %v", round, r, errs[r])
			}
			for i := range want {
				if math.Float32bits(bufs[r][i]) != math.Float32bits(want[i]) {
					t.Fatalf("round %d rank %d [%d] = %v, want %v", round, r, i, bufs[r][i], want[i])
				}
			}
		}
	}
	// A barrier with every rank present returns on all of them.
	var wg sync.WaitGroup
	errs := make([]error, world)
	for r := range world {
		wg.Go(func() { errs[r] = cs[r].Barrier(context.Background()) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("barrier, rank %d: %v", r, err)
		}
	}
}

// Ranks that disagree on the buffer's length are refused, not misread.
func TestTCPAllReduceLengthMismatch(t *testing.T) {
	cs := collectives(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var err0 error
	var wg sync.WaitGroup
	wg.Go(func() { err0 = cs[0].AllReduceSum(ctx, make([]float32, 4)) })
	wg.Go(func() { cs[1].AllReduceSum(ctx, make([]float32, 5)) })
	wg.Wait()
	if err0 == nil || !strings.Contains(err0.Error(), "length mismatch") {
		t.Errorf("rank 0: got %v, want a length mismatch", err0)
	}
}

func TestSingleCollective(t *testing.T) {
	var c Collective = Single{}
	buf := []float32{1, 2, 3}
	if err := c.AllReduceSum(context.Background(), buf); err != nil || buf[0] != 1 || buf[1] != 2 || buf[2] != 3 {
		t.Errorf("world of one changed the buffer: %v, %v", buf, err)
	}
	tc, err := NewTCP(context.Background(), Config{WorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 1}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if err := tc.AllReduceSum(context.Background(), buf); err != nil || buf[2] != 3 {
		t.Errorf("TCP world of one: %v, %v", buf, err)
	}
}

// collectiveHelperEnv selects TestCollectiveHelperProcess in a child process.
const collectiveHelperEnv = "FLASHGRAPH_COLLECTIVE_HELPER"

// TestCollectiveHelperProcess is one rank of the process tests: it meets the
// others through the torchrun environment and all-reduces rankData once per
// tick until reduce rounds are done (or forever with "forever"), printing the
// first value of each sum.
func TestCollectiveHelperProcess(t *testing.T) {
	mode := os.Getenv(collectiveHelperEnv)
	if mode == "" {
		t.Skip("helper process of the collective process tests")
	}
	c, err := FromEnv(os.Getenv)
	if err != nil {
		os.Stdout.WriteString("error: " + err.Error() + "\n")
		os.Exit(2)
	}
	tc, err := NewTCP(context.Background(), c, 10*time.Second)
	if err != nil {
		os.Stdout.WriteString("error: " + err.Error() + "\n")
		os.Exit(2)
	}
	for round := 0; mode == "forever" || round < 3; round++ {
		buf := rankData(c.Rank, 16)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := tc.AllReduceSum(ctx, buf)
		cancel()
		if err != nil {
			os.Stdout.WriteString("error: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("sum " + strconv.FormatFloat(float64(buf[0]), 'g', -1, 32) + "\n")
		time.Sleep(20 * time.Millisecond)
	}
	tc.Close()
	os.Exit(0)
}

func collectiveProcess(mode string, rank, world, port int) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestCollectiveHelperProcess$")
	cmd.Env = append(os.Environ(),
		collectiveHelperEnv+"="+mode,
		"RANK="+strconv.Itoa(rank),
		"WORLD_SIZE="+strconv.Itoa(world),
		"MASTER_ADDR=127.0.0.1",
		"MASTER_PORT="+strconv.Itoa(port),
	)
	return cmd
}

// Two processes configured as on two hosts all-reduce over loopback and get
// the same sums.
func TestTCPTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	port := freePort(t)
	var outs [2]strings.Builder
	var cmds [2]*exec.Cmd
	for r := range 2 {
		cmds[r] = collectiveProcess("rounds", r, 2, port)
		cmds[r].Stdout, cmds[r].Stderr = &outs[r], &outs[r]
		if err := cmds[r].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for r, cmd := range cmds {
		if err := waitBounded(t, cmd, 30*time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, outs[r].String())
		}
	}
	want := "sum " + strconv.FormatFloat(float64(float32(float64(rankData(0, 1)[0])+float64(rankData(1, 1)[0]))), 'g', -1, 32) + "\n"
	for r := range 2 {
		if got := outs[r].String(); strings.Count(got, want) != 3 {
			t.Errorf("rank %d printed\n%s\nwant 3 lines %q", r, got, want)
		}
	}
}

// A rank SIGKILLed during the reductions makes the others fail within a
// bounded time with an error naming it, instead of hanging.
func TestTCPKilledRank(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	port := freePort(t)
	const world = 3
	var outs [world]strings.Builder
	var cmds [world]*exec.Cmd
	for r := range world {
		cmds[r] = collectiveProcess("forever", r, world, port)
		cmds[r].Stdout, cmds[r].Stderr = &outs[r], &outs[r]
		if err := cmds[r].Start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			if c.ProcessState == nil {
				c.Process.Kill()
				c.Wait()
			}
		}
	})
	time.Sleep(500 * time.Millisecond)
	cmds[2].Process.Kill()
	cmds[2].Wait()
	start := time.Now()
	// Rank 0 sees rank 2's connection close; rank 1 then sees rank 0 go away
	// (rank 0 exits on its error).
	if err := waitBounded(t, cmds[0], 10*time.Second); err == nil {
		t.Errorf("rank 0 exited cleanly after rank 2 was killed:\n%s", outs[0].String())
	}
	if out := outs[0].String(); !strings.Contains(out, "sum ") || !strings.Contains(out, "rank 2 went away") {
		t.Errorf("rank 0 did not reduce and then fail naming rank 2:\n%s", out)
	}
	if err := waitBounded(t, cmds[1], 10*time.Second); err == nil {
		t.Errorf("rank 1 exited cleanly:\n%s", outs[1].String())
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v to end", d)
	}
}

// waitBounded waits for cmd, killing it (and failing) after limit.
func waitBounded(t *testing.T, cmd *exec.Cmd, limit time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		t.Fatalf("process still running after %v", limit)
		return nil
	}
}

// A rank that never joins an all-reduce (hung) fails it on the others within
// Timeout, with a PeerError naming that rank; rank 0 answers first, the
// others a grace later.
func TestTCPTimeoutNamesSilentRank(t *testing.T) {
	cs := collectives(t, 3)
	for _, c := range cs {
		c.Timeout = 300 * time.Millisecond
	}
	errs := make([]error, 2)
	took := make([]time.Duration, 2)
	var wg sync.WaitGroup
	for r := range 2 { // rank 2 stays silent
		wg.Go(func() {
			start := time.Now()
			errs[r] = cs[r].AllReduceSum(context.Background(), make([]float32, 4))
			took[r] = time.Since(start)
		})
	}
	wg.Wait()
	var pe *PeerError
	if !errors.As(errs[0], &pe) || pe.Rank != 2 || !strings.Contains(errs[0].Error(), "rank 2 sent nothing within the collective timeout") {
		t.Errorf("rank 0: %v, want a PeerError naming rank 2", errs[0])
	}
	if took[0] > 2*time.Second {
		t.Errorf("rank 0 gave up after %v, want about the 300ms timeout", took[0])
	}
	// Rank 1 sent its part to rank 0 and waits for the sum, which rank 0
	// cannot send: it names rank 0, the one it hears from, once rank 0 gives
	// up and closes (Cause adds rank 0's verdict when the job aborts).
	if errs[1] == nil {
		t.Errorf("rank 1: the all-reduce succeeded without rank 2")
	}
}

// NewTCPWith passes each rank's extra bytes (rank 0's NCCL id in a GPU job)
// to every rank, beside the collective's own address.
func TestTCPExtraBytes(t *testing.T) {
	port := freePort(t)
	const world = 3
	out := make([]*TCP, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			c := Config{Rank: r, WorldSize: world, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
			var extra []byte
			if r == 0 {
				extra = []byte("nccl-id-of-rank-0")
			}
			out[r], errs[r] = NewTCPWith(context.Background(), c, 10*time.Second, extra)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer out[r].Close()
	}
	for r := range world {
		if got := string(out[r].Extra(0)); got != "nccl-id-of-rank-0" {
			t.Errorf("rank %d sees rank 0's extra as %q", r, got)
		}
		if got := out[r].Extra(1); len(got) != 0 {
			t.Errorf("rank %d sees rank 1's extra as %q, want none", r, got)
		}
	}
	// The collective itself still works.
	var wg2 sync.WaitGroup
	sums := make([][]float32, world)
	for r := range world {
		wg2.Go(func() {
			sums[r] = []float32{float32(r + 1)}
			errs[r] = out[r].AllReduceSum(context.Background(), sums[r])
		})
	}
	wg2.Wait()
	for r := range world {
		if errs[r] != nil || sums[r][0] != 6 {
			t.Errorf("rank %d: sum %v, %v; want 6", r, sums[r], errs[r])
		}
	}
}
