package cuda

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// After its first run an executable replays its steps as a CUDA graph, and
// a replay computes from the new feeds, not the captured ones.
func TestRunsReplayAsGraphs(t *testing.T) {
	d := gpu(t)
	if !d.GraphsEnabled() {
		t.Skip("CUDA graphs are off (FLASHGRAPH_CUDA_GRAPHS or the driver)")
	}
	be, err := newBackend(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	b := graph.NewBuilder("replay")
	x := b.Input("x", graph.Float32, 4, 256)
	w := b.Input("w", graph.Float32, 256, 64)
	y := b.Sigmoid(b.MatMul(b.Mul(x, x), w))
	b.Output(b.ReduceSum(y, false, 1))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := be.Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	ref, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for run := range 4 {
		feeds := map[string]*graph.Tensor{"x": graph.NewTensor(graph.Float32, graph.Shape{4, 256}), "w": graph.NewTensor(graph.Float32, graph.Shape{256, 64})}
		for name, tt := range feeds {
			for i := range tt.Len() {
				tt.Set(i, float64((i*7+run*13+len(name))%17)/17-0.5)
			}
		}
		got, err := exe.Run(feeds)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ref.Run(feeds)
		if err != nil {
			t.Fatal(err)
		}
		name := g.Outputs[0].Name
		for i := range want[name].Len() {
			if a, b := got[name].At(i), want[name].At(i); a-b > 1e-4*(1+abs(b)) || b-a > 1e-4*(1+abs(b)) {
				t.Fatalf("run %d: element %d = %v, want %v", run, i, a, b)
			}
		}
	}
	x2 := exe.(*executable)
	if x2.stepsGraph.Off() != nil || !x2.stepsGraph.Replaying() {
		t.Fatalf("steps are not replayed as a graph after 4 runs: %v", x2.stepsGraph.Off())
	}
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// Zero constants of one type share one buffer; setting one to anything but
// zeros is refused, naming it, since the others read the same memory.
func TestZeroConstsShareABuffer(t *testing.T) {
	gpu(t)
	be, err := newBackend(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	b := graph.NewBuilder("zeros")
	x := b.Input("x", graph.Float32, 64)
	z1 := b.Const("z1", graph.Float32, graph.Shape{64}, graph.Zeros())
	z2 := b.Const("z2", graph.Float32, graph.Shape{64}, graph.Zeros())
	b.Output(b.Add(b.Add(x, z1), z2))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := be.Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	xe := exe.(*executable)
	if xe.bufs[g.Value("z1")].ptr != xe.bufs[g.Value("z2")].ptr {
		t.Error("two zeros constants of one type have separate buffers")
	}
	if st := exe.Stats(); st.InitializerBytes != 64*4 {
		t.Errorf("initializer bytes %d, want %d (one shared buffer)", st.InitializerBytes, 64*4)
	}
	feed := graph.NewTensor(graph.Float32, graph.Shape{64})
	for i := range 64 {
		feed.Set(i, float64(i))
	}
	out, err := exe.Run(map[string]*graph.Tensor{"x": feed})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 64 {
		if got := out[g.Outputs[0].Name].At(i); got != float64(i) {
			t.Fatalf("element %d = %v, want %d", i, got, i)
		}
	}
	if err := exe.SetInitializer("z2", graph.NewTensor(graph.Float32, graph.Shape{64})); err != nil {
		t.Errorf("setting zeros to zeros: %v", err)
	}
	ones := graph.NewTensor(graph.Float32, graph.Shape{64})
	ones.Set(3, 1)
	if err := exe.SetInitializer("z1", ones); err == nil || !strings.Contains(err.Error(), "z1") || !strings.Contains(err.Error(), "sharing") {
		t.Errorf("setting a shared zeros constant: %v", err)
	}
}
