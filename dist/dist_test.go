package dist

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestFromEnv(t *testing.T) {
	c, err := FromEnv(envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Config{Rank: 0, WorldSize: 1, LocalRank: 0, MasterAddr: "127.0.0.1", MasterPort: DefaultMasterPort}); c != want {
		t.Errorf("defaults: got %+v, want %+v", c, want)
	}
	c, err = FromEnv(envOf(map[string]string{"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "1234"}))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Config{Rank: 3, WorldSize: 4, LocalRank: 1, MasterAddr: "10.1.2.3", MasterPort: 1234}); c != want {
		t.Errorf("got %+v, want %+v", c, want)
	}
	if got, want := c.Address(), "10.1.2.3:1234"; got != want {
		t.Errorf("Address() = %q, want %q", got, want)
	}
	c, err = FromEnv(envOf(map[string]string{"RANK": "1", "WORLD_SIZE": "2"}))
	if err != nil || c.LocalRank != 1 {
		t.Errorf("LOCAL_RANK should default to RANK: %+v, %v", c, err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"RANK": "x"}, `RANK="x" is not an integer`},
		{map[string]string{"WORLD_SIZE": "0"}, "world size must be at least 1"},
		{map[string]string{"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside [0, 2)"},
		{map[string]string{"RANK": "-1", "WORLD_SIZE": "2"}, "rank -1 is outside"},
		{map[string]string{"WORLD_SIZE": "2", "LOCAL_RANK": "5"}, "local rank 5"},
		{map[string]string{"MASTER_PORT": "70000"}, "master port 70000"},
		{map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "a b"}, "not a host name"},
	} {
		_, err := FromEnv(envOf(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got error %v, want one containing %q", tc.env, err, tc.want)
		}
	}
}

func TestShard(t *testing.T) {
	for _, tc := range []struct{ b, w int }{{1, 1}, {8, 1}, {8, 2}, {8, 4}, {8, 8}, {12, 3}} {
		seen := make([]int, tc.b)
		prevHi := 0
		for r := range tc.w {
			lo, hi, err := Shard(tc.b, tc.w, r)
			if err != nil {
				t.Fatalf("Shard(%d, %d, %d): %v", tc.b, tc.w, r, err)
			}
			if lo != prevHi || hi-lo != tc.b/tc.w {
				t.Errorf("Shard(%d, %d, %d) = [%d, %d): not the next equal part after %d", tc.b, tc.w, r, lo, hi, prevHi)
			}
			prevHi = hi
			for i := lo; i < hi; i++ {
				seen[i]++
			}
		}
		for i, n := range seen {
			if n != 1 {
				t.Errorf("B=%d W=%d: row %d is in %d shards, want 1", tc.b, tc.w, i, n)
			}
		}
	}
	for _, tc := range []struct {
		b, w, r int
		want    string
	}{
		{10, 4, 0, "does not split evenly over 4 ranks"},
		{8, 0, 0, "world size must be at least 1"},
		{8, 2, 2, "rank 2 is outside [0, 2)"},
		{0, 2, 0, "global batch must be at least 1"},
	} {
		if _, _, err := Shard(tc.b, tc.w, tc.r); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Shard(%d, %d, %d): got %v, want an error containing %q", tc.b, tc.w, tc.r, err, tc.want)
		}
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// idOf is a stand-in for rank r's 128-byte NCCL unique id.
func idOf(r int) []byte {
	b := make([]byte, 128)
	for i := range b {
		b[i] = byte(r*31 + i)
	}
	return b
}

type result struct {
	g   *Group
	err error
}

// meet runs one goroutine per listed rank of a world of size world.
func meet(t *testing.T, world int, ranks []int, timeout time.Duration, cfg func(*Config)) map[int]result {
	t.Helper()
	port := freePort(t)
	var mu sync.Mutex
	res := map[int]result{}
	var wg sync.WaitGroup
	for _, r := range ranks {
		wg.Go(func() {
			c := Config{Rank: r, WorldSize: world, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
			if cfg != nil {
				cfg(&c)
			}
			g, err := Rendezvous(context.Background(), c, idOf(r), timeout)
			mu.Lock()
			res[r] = result{g, err}
			mu.Unlock()
		})
	}
	wg.Wait()
	return res
}

func TestRendezvousGoroutines(t *testing.T) {
	const world = 4
	res := meet(t, world, []int{0, 1, 2, 3}, 10*time.Second, nil)
	for r := range world {
		g, err := res[r].g, res[r].err
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer g.Close()
		if len(g.Blobs) != world {
			t.Fatalf("rank %d got %d blobs, want %d", r, len(g.Blobs), world)
		}
		for q := range world {
			if !bytes.Equal(g.Blobs[q], idOf(q)) {
				t.Errorf("rank %d: blob of rank %d is % x..., want % x...", r, q, g.Blobs[q][:4], idOf(q)[:4])
			}
		}
	}
	for r := range world {
		select {
		case err := <-res[r].g.Failed():
			t.Errorf("rank %d reports a failure with every rank alive: %v", r, err)
		default:
		}
	}
}

func TestRendezvousWorldOfOne(t *testing.T) {
	g, err := Rendezvous(context.Background(), Config{WorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: 1}, idOf(0), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Blobs) != 1 || !bytes.Equal(g.Blobs[0], idOf(0)) {
		t.Errorf("world of one: blobs %v", g.Blobs)
	}
	if err := g.Close(); err != nil {
		t.Error(err)
	}
}

// A rank that never starts makes every other rank fail within the timeout,
// with an error that names it: no hang.
func TestRendezvousMissingRank(t *testing.T) {
	start := time.Now()
	res := meet(t, 3, []int{0, 1}, 700*time.Millisecond, nil)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v to give up with a 700ms timeout", d)
	}
	for _, r := range []int{0, 1} {
		err := res[r].err
		if err == nil || !strings.Contains(err.Error(), "rank 2 never arrived") {
			t.Errorf("rank %d: got %v, want an error saying rank 2 never arrived", r, err)
		}
	}
}

func TestRendezvousNoRankZero(t *testing.T) {
	res := meet(t, 2, []int{1}, 500*time.Millisecond, nil)
	if err := res[1].err; err == nil || !strings.Contains(err.Error(), "could not reach rank 0") {
		t.Errorf("got %v, want an error saying rank 0 could not be reached", err)
	}
}

func TestRendezvousConflicts(t *testing.T) {
	// Two processes both launched as rank 1.
	port := freePort(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, r := range []int{0, 1, 1} {
		wg.Go(func() {
			if i == 2 {
				time.Sleep(200 * time.Millisecond) // arrive second
			}
			_, errs[i] = Rendezvous(context.Background(), Config{Rank: r, WorldSize: 3, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}, idOf(r), 5*time.Second)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "two processes claim rank 1") {
			t.Errorf("process %d: got %v, want an error about two processes claiming rank 1", i, err)
		}
	}

	// Ranks that disagree on the world size.
	port = freePort(t)
	errs = make([]error, 2)
	for r := range 2 {
		wg.Go(func() {
			_, errs[r] = Rendezvous(context.Background(), Config{Rank: r, WorldSize: 2 + r, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}, idOf(r), 5*time.Second)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "says the world size is 3 but rank 0 says 2") {
			t.Errorf("rank %d: got %v, want a world size mismatch", r, err)
		}
	}
}

// die ends g's connections as a crash would: no goodbye.
func (g *Group) die() {
	g.closing.Store(true)
	for _, c := range g.conns {
		c.Close()
	}
	g.wg.Wait()
}

// After the rendezvous, a rank that dies makes every other rank's Failed fire
// with an error naming it.
func TestRankDeathIsReported(t *testing.T) {
	for _, dead := range []int{0, 2} {
		t.Run(fmt.Sprintf("rank%d", dead), func(t *testing.T) {
			res := meet(t, 3, []int{0, 1, 2}, 10*time.Second, nil)
			for r := range 3 {
				if res[r].err != nil {
					t.Fatalf("rank %d: %v", r, res[r].err)
				}
			}
			res[dead].g.die()
			for r := range 3 {
				if r == dead {
					continue
				}
				select {
				case err := <-res[r].g.Failed():
					if !strings.Contains(err.Error(), fmt.Sprintf("rank %d", dead)) || !strings.Contains(err.Error(), "went away") {
						t.Errorf("rank %d: failure %q does not say rank %d went away", r, err, dead)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("rank %d did not notice that rank %d died", r, dead)
				}
				res[r].g.Close()
			}
		})
	}
}

// A clean Close of one rank is not a failure for the others.
func TestCloseIsNotDeath(t *testing.T) {
	res := meet(t, 2, []int{0, 1}, 10*time.Second, nil)
	for r := range 2 {
		if res[r].err != nil {
			t.Fatalf("rank %d: %v", r, res[r].err)
		}
	}
	if err := res[1].g.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res[0].g.Failed():
		t.Errorf("rank 0 took rank 1's Close for a failure: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	res[0].g.Close()
}

func TestAbortReachesEveryRank(t *testing.T) {
	res := meet(t, 3, []int{0, 1, 2}, 10*time.Second, nil)
	for r := range 3 {
		if res[r].err != nil {
			t.Fatalf("rank %d: %v", r, res[r].err)
		}
	}
	res[1].g.Abort(fmt.Errorf("loss is NaN"))
	for _, r := range []int{0, 2} {
		select {
		case err := <-res[r].g.Failed():
			if !strings.Contains(err.Error(), "rank 1: loss is NaN") {
				t.Errorf("rank %d: failure %q does not carry rank 1's reason", r, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("rank %d did not hear rank 1's abort", r)
		}
		res[r].g.Close()
	}
}

func TestRendezvousRejectsBadInput(t *testing.T) {
	c := Config{Rank: 0, WorldSize: 2, LocalRank: 0, MasterAddr: "127.0.0.1", MasterPort: 29500}
	if _, err := Rendezvous(context.Background(), c, make([]byte, MaxBlob+1), time.Second); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("oversized blob: %v", err)
	}
	if _, err := Rendezvous(context.Background(), c, nil, 0); err == nil || !strings.Contains(err.Error(), "timeout must be positive") {
		t.Errorf("zero timeout: %v", err)
	}
	c.Rank = 5
	if _, err := Rendezvous(context.Background(), c, nil, time.Second); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("bad rank: %v", err)
	}
}
