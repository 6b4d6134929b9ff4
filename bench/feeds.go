package bench

import (
	"fmt"
	"math/rand/v2"

	"github.com/flashgraph/flashgraph/graph"
)

// RandomFeeds makes inputs for every graph input: token ids below the
// vocabulary (read off the embedding table the input indexes) for int64
// inputs, standard normals for floats.
func RandomFeeds(g *graph.Graph, seed uint64) (map[string]*graph.Tensor, error) {
	r := rand.New(rand.NewPCG(seed, 7))
	limit := indexLimits(g)
	feeds := map[string]*graph.Tensor{}
	for _, in := range g.Inputs {
		t := graph.NewTensor(in.Type.DType, in.Type.Shape)
		switch {
		case in.Type.DType == graph.Int64:
			hi, ok := limit[in]
			if !ok {
				return nil, fmt.Errorf("input %s is int64 but no Gather or loss says its range; give a graph whose int inputs index something", in.Name)
			}
			for i := range t.I64 {
				t.I64[i] = int64(r.IntN(hi))
			}
		case in.Type.DType == graph.Bool:
			for i := range t.B {
				t.B[i] = r.IntN(2) == 1
			}
		default:
			for i := range t.Len() {
				t.Set(i, r.NormFloat64())
			}
		}
		feeds[in.Name] = t
	}
	return feeds, nil
}

// indexLimits finds, for int64 inputs, the size of the axis they index
// (Gather data axis, or the class count of a cross-entropy, through Reshapes).
func indexLimits(g *graph.Graph) map[*graph.Value]int {
	root := map[*graph.Value]*graph.Value{}
	for _, in := range g.Inputs {
		root[in] = in
	}
	out := map[*graph.Value]int{}
	for _, n := range g.Nodes {
		switch n.Op {
		case "Reshape", "Identity", "Squeeze", "Unsqueeze":
			if r, ok := root[n.Inputs[0]]; ok {
				root[n.Outputs[0]] = r
			}
		case "Gather":
			if r, ok := root[n.Inputs[1]]; ok {
				ax, err := graph.NormAxis(int(n.Attrs.Int("axis", 0)), n.Inputs[0].Type.Shape.Rank())
				if err == nil {
					out[r] = n.Inputs[0].Type.Shape[ax]
				}
			}
		case "SoftmaxCrossEntropyLoss":
			if r, ok := root[n.Inputs[1]]; ok {
				out[r] = n.Inputs[0].Type.Shape[1]
			}
		}
	}
	return out
}
