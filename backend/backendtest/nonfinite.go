package backendtest

import (
	"math"

	"github.com/flashgraph/flashgraph/graph"
)

// NonFiniteGraph is the graph the backends' CheckFinite tests run: the first
// node to make a non-finite value from inputs without one is sqrt, the Sqrt
// of −w·x (NaN where w·x > 0), not the Mul and Add after it that only pass
// the NaN on, nor the Add that reads the infinity the feeds give input mask.
// With the feeds NonFiniteFeeds returns, element 2 is the NaN.
func NonFiniteGraph() (g *graph.Graph, sqrt *graph.Node, err error) {
	b := graph.NewBuilder("nan")
	x := b.Input("x", graph.Float32, 4)
	mask := b.Input("mask", graph.Float32, 4)
	w := b.Param("w", graph.Float32, graph.Shape{4}, graph.Literal(1, 2, 3, 4))
	masked := b.Add(x, mask)  // -inf from a graph input: not this node's doing
	neg := b.Neg(b.Mul(w, x)) // finite
	root := b.Sqrt(neg)       // NaN where w·x > 0: the first
	b.Output(b.Add(b.Mul(root, w), masked))
	g, err = b.Build()
	if err != nil {
		return nil, nil, err
	}
	return g, root.Producer, nil
}

// NonFiniteFeeds are NonFiniteGraph's inputs: x = (-1, -2, 3, -4), so that
// w·x > 0 at element 2 only, and a mask with -inf at element 1.
func NonFiniteFeeds() map[string]*graph.Tensor {
	x := graph.NewTensor(graph.Float32, graph.Shape{4})
	for i, v := range []float64{-1, -2, 3, -4} {
		x.Set(i, v)
	}
	mask := graph.NewTensor(graph.Float32, graph.Shape{4})
	mask.Set(1, math.Inf(-1))
	return map[string]*graph.Tensor{"x": x, "mask": mask}
}
