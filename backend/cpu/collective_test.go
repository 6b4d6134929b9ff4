package cpu

import (
	"math"
	"strings"
	"sync"
	"testing"

	"context"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// hub is an in-process collective shared by goroutine ranks: the last rank
// to arrive sums every rank's buffer in float64 in rank order and hands the
// float32 sum to all, as dist.TCP does between processes.
type hub struct {
	mu      sync.Mutex
	cond    *sync.Cond
	bufs    [][]float32
	arrived int
	gen     int
}

type hubRank struct {
	h    *hub
	rank int
}

func newHub(world int) *hub {
	h := &hub{bufs: make([][]float32, world)}
	h.cond = sync.NewCond(&h.mu)
	return h
}

func (r hubRank) WorldSize() int { return len(r.h.bufs) }

func (r hubRank) AllReduceSum(_ context.Context, buf []float32) error {
	h := r.h
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bufs[r.rank] = buf
	h.arrived++
	gen := h.gen
	if h.arrived == len(h.bufs) {
		sum := make([]float64, len(buf))
		for _, b := range h.bufs {
			for i, v := range b {
				sum[i] += float64(v)
			}
		}
		for _, b := range h.bufs {
			for i := range b {
				b[i] = float32(sum[i])
			}
		}
		h.arrived = 0
		h.gen++
		h.cond.Broadcast()
		return nil
	}
	for h.gen == gen {
		h.cond.Wait()
	}
	return nil
}

// tinyRegression is a two-layer float32 model with a mean squared error over
// the whole batch, so that the mean of equal shards' losses (and gradients)
// is the full batch's.
func tinyRegression(t *testing.T, batch int) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("reg")
	x := b.Input("x", graph.Float32, batch, 4)
	y := b.Input("y", graph.Float32, batch, 3)
	w1 := b.Param("w1", graph.Float32, graph.Shape{4, 8}, graph.Normal(0.5, 1))
	w2 := b.Param("w2", graph.Float32, graph.Shape{8, 3}, graph.Normal(0.5, 2))
	d := b.Sub(b.MatMul(b.Sigmoid(b.MatMul(x, w1)), w2), y)
	b.Output(b.Rename(b.ReduceMean(b.Mul(d, d), false), "loss"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func rows(batch, cols, seed int) *graph.Tensor {
	x := graph.NewTensor(graph.Float32, graph.Shape{batch, cols})
	for i := range x.F32 {
		x.F32[i] = float32(math.Sin(float64(i*7+seed*13)) * 1.5)
	}
	return x
}

func part(x *graph.Tensor, lo, hi int) *graph.Tensor {
	cols := x.Shape[1]
	p := graph.NewTensor(graph.Float32, graph.Shape{hi - lo, cols})
	copy(p.F32, x.F32[lo*cols:hi*cols])
	return p
}

func scalar32(v float64) *graph.Tensor {
	s := graph.NewTensor(graph.Float32, graph.Shape{})
	s.F32[0] = float32(v)
	return s
}

// The same global batch on one rank and on two (each training on its half,
// the gradients averaged by AllReduce through a collective) gives the same
// loss curve and the same weights to 1e-5 relative over 10 steps.
func TestAllReduceTwoRanksMatchOneRank(t *testing.T) {
	const global, steps, world = 8, 10, 2
	train := func(batch, w int) (*autodiff.TrainStep, error) {
		return autodiff.TrainingGraph(tinyRegression(t, batch), autodiff.TrainOptions{World: w})
	}
	batches := make([][2]*graph.Tensor, steps)
	for s := range steps {
		batches[s] = [2]*graph.Tensor{rows(global, 4, s), rows(global, 3, 100+s)}
	}
	feeds := func(s, lo, hi int) map[string]*graph.Tensor {
		return map[string]*graph.Tensor{"x": part(batches[s][0], lo, hi), "y": part(batches[s][1], lo, hi), "lr": scalar32(3e-2), "step": scalar32(float64(s + 1))}
	}

	ts1, err := train(global, 1)
	if err != nil {
		t.Fatal(err)
	}
	exe1, err := New().Compile(ts1.Graph, backend.Options{Updates: ts1.Updates})
	if err != nil {
		t.Fatal(err)
	}
	defer exe1.Close()
	want := make([]float64, steps)
	for s := range steps {
		out, err := exe1.Run(feeds(s, 0, global))
		if err != nil {
			t.Fatal(err)
		}
		want[s] = float64(out["loss"].F32[0])
	}

	ts2, err := train(global/world, world)
	if err != nil {
		t.Fatal(err)
	}
	// Without a collective, or with one of another size, the graph is refused.
	if _, err := New().Compile(ts2.Graph, backend.Options{Updates: ts2.Updates}); err == nil || !strings.Contains(err.Error(), "needs a collective") {
		t.Errorf("compiled a 2-rank graph without a collective: %v", err)
	}
	if _, err := New().Compile(ts2.Graph, backend.Options{Updates: ts2.Updates, Collective: hubRank{newHub(3), 0}}); err == nil || !strings.Contains(err.Error(), "the collective has 3") {
		t.Errorf("compiled a 2-rank graph with a 3-rank collective: %v", err)
	}
	h := newHub(world)
	exes := make([]backend.Executable, world)
	for r := range world {
		if exes[r], err = New().Compile(ts2.Graph, backend.Options{Updates: ts2.Updates, Collective: hubRank{h, r}}); err != nil {
			t.Fatal(err)
		}
		defer exes[r].Close()
	}
	losses := make([][]float64, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		losses[r] = make([]float64, steps)
		wg.Go(func() {
			per := global / world
			for s := range steps {
				out, err := exes[r].Run(feeds(s, r*per, (r+1)*per))
				if err != nil {
					errs[r] = err
					return
				}
				losses[r][s] = float64(out["loss"].F32[0])
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for s := range steps {
		got := (losses[0][s] + losses[1][s]) / 2
		if d := math.Abs(got - want[s]); d > 1e-5*math.Abs(want[s]) {
			t.Errorf("step %d: 2-rank loss %.9g, 1-rank %.9g (relative %.3g)", s, got, want[s], d/math.Abs(want[s]))
		}
	}
	if want[steps-1] >= want[0] {
		t.Errorf("the loss did not fall (%g → %g): the test would not see a wrong gradient", want[0], want[steps-1])
	}
	for _, p := range []string{"w1", "w2"} {
		a, err := exe1.Initializer(p)
		if err != nil {
			t.Fatal(err)
		}
		for r := range world {
			b, err := exes[r].Initializer(p)
			if err != nil {
				t.Fatal(err)
			}
			for i := range a.F32 {
				if d := math.Abs(float64(a.F32[i] - b.F32[i])); d > 1e-5*math.Max(math.Abs(float64(a.F32[i])), 1e-3) {
					t.Fatalf("%s[%d] after %d steps: rank %d has %g, one rank %g", p, i, steps, r, b.F32[i], a.F32[i])
				}
			}
		}
	}
}
