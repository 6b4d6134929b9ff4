package cuda

import (
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// After its first run an executable replays its steps as a CUDA graph, and
// a replay computes from the new feeds, not the captured ones.
func TestRunsReplayAsGraphs(t *testing.T) {
	d := gpu(t)
	if !d.graphsEnabled() {
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
	if x2.stepsGraph.off != nil || x2.stepsGraph.exec == 0 {
		t.Fatalf("steps are not replayed as a graph after 4 runs: %v", x2.stepsGraph.off)
	}
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}
