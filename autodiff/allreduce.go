package autodiff

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// DefaultBucketBytes is the gradient bytes one all-reduce bucket collects
// before it is reduced (PyTorch DDP's default, 25 MiB).
const DefaultBucketBytes = 25 << 20

// allReduceGradients inserts one flashgraph.AllReduce (mean over world ranks)
// after each param's final gradient, in the reverse of params order (the
// order backward finishes them: last layer first). Each node's bucket
// attribute groups consecutive gradients until bucketBytes are collected, so
// that an executor can hand one bucket to its collective in one call as soon
// as the last gradient of the bucket is computed. It returns the reduced
// gradient of each param.
func allReduceGradients(g *graph.Graph, nm *graph.Namer, gradOf func(string) *graph.Value, params []string, world int, bucketBytes int64) (map[string]*graph.Value, error) {
	if bucketBytes <= 0 {
		bucketBytes = DefaultBucketBytes
	}
	out := map[string]*graph.Value{}
	bucket, filled := int64(0), int64(0)
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		gv := gradOf(p)
		size := int64(gv.Type.Shape.Numel()) * int64(gv.Type.DType.Size())
		if filled > 0 && filled+size > bucketBytes {
			bucket++
			filled = 0
		}
		filled += size
		attrs := graph.Attrs{"reduce": graph.Str("mean"), "world": graph.Int(int64(world)), "bucket": graph.Int(bucket)}
		n, err := graph.NewNode(nm.Fresh("allreduce/"+p), "AllReduce", attrs, gv)
		if err != nil {
			return nil, fmt.Errorf("AllReduce for %s: %w", p, err)
		}
		n.Outputs[0].Name = nm.Fresh("grad.reduced." + p)
		g.Nodes = append(g.Nodes, n)
		out[p] = n.Outputs[0]
	}
	return out, nil
}
