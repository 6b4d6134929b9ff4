package autodiff

import (
	"fmt"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
)

// DefaultBucketBytes is the gradient bytes one all-reduce bucket collects
// before it is reduced (PyTorch DDP's default, 25 MiB).
const DefaultBucketBytes = 25 << 20

// allReduceGradients averages each param's final gradient over world ranks
// with one flashgraph.AllReduce per bucket. Gradients are bucketed in the
// reverse of params order (the order backward finishes them: last layer
// first) until bucketBytes are collected, and each bucket's node is placed
// right after the node that computes the last of its gradients: the point
// where an executor can hand the bucket to its collective (on a GPU, on a
// second stream while the rest of the backward runs), in one call for the
// whole bucket. It returns the reduced gradient of each param.
func allReduceGradients(g *graph.Graph, nm *graph.Namer, gradOf func(string) *graph.Value, params []string, world int, bucketBytes int64) (map[string]*graph.Value, error) {
	if bucketBytes <= 0 {
		bucketBytes = DefaultBucketBytes
	}
	type bucket struct {
		params []string
		grads  []*graph.Value
	}
	var buckets []*bucket
	filled := int64(0)
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		gv := gradOf(p)
		size := int64(gv.Type.Shape.Numel()) * int64(gv.Type.DType.Size())
		if len(buckets) == 0 || (filled > 0 && filled+size > bucketBytes) {
			buckets = append(buckets, &bucket{})
			filled = 0
		}
		filled += size
		b := buckets[len(buckets)-1]
		b.params = append(b.params, p)
		b.grads = append(b.grads, gv)
	}
	pos := map[*graph.Value]int{} // output value → index of its node
	for i, n := range g.Nodes {
		for _, o := range n.Outputs {
			pos[o] = i
		}
	}
	out := map[string]*graph.Value{}
	type placed struct {
		after int // index of the node computing the bucket's last gradient (-1: none)
		node  *graph.Node
	}
	var nodes []placed
	for k, b := range buckets {
		attrs := graph.Attrs{"reduce": graph.Str("mean"), "world": graph.Int(int64(world)), "bucket": graph.Int(int64(k))}
		n, err := graph.NewNode(nm.Fresh(fmt.Sprintf("allreduce/bucket%d", k)), "AllReduce", attrs, b.grads...)
		if err != nil {
			return nil, fmt.Errorf("AllReduce of bucket %d (%s, ...): %w", k, b.params[0], err)
		}
		after := -1
		for j, p := range b.params {
			n.Outputs[j].Name = nm.Fresh("grad.reduced." + p)
			out[p] = n.Outputs[j]
			if i, ok := pos[b.grads[j]]; ok {
				after = max(after, i)
			}
		}
		nodes = append(nodes, placed{after, n})
	}
	// Insert from the back of the graph so that the indices still to use
	// stay valid; buckets final at the same node keep their order.
	order := make([]int, len(nodes))
	for k := range order {
		order[k] = k
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if nodes[a].after != nodes[b].after {
			return nodes[b].after - nodes[a].after
		}
		return b - a
	})
	for _, k := range order {
		g.Nodes = slices.Insert(g.Nodes, nodes[k].after+1, nodes[k].node)
	}
	return out, nil
}
