package autodiff

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// DefaultBucketBytes is the gradient bytes one all-reduce bucket collects
// before it is reduced (PyTorch DDP's default, 25 MiB).
const DefaultBucketBytes = 25 << 20

// allReduceGradients averages each param's final gradient over world ranks
// with one flashgraph.AllReduce per bucket (gradientBuckets: backward order,
// up to bucketBytes each). Each bucket's node is placed right after the node
// that computes the last of its gradients: the point where an executor can
// hand the bucket to its collective (on a GPU, on a second stream while the
// rest of the backward runs), in one call for the whole bucket. It returns
// the reduced gradient of each param.
func allReduceGradients(g *graph.Graph, nm *graph.Namer, gradOf func(string) *graph.Value, params []string, world int, bucketBytes int64) (map[string]*graph.Value, error) {
	out := map[string]*graph.Value{}
	var nodes []*graph.Node
	for k, b := range gradientBuckets(gradOf, params, bucketBytes) {
		attrs := graph.Attrs{"reduce": graph.Str("mean"), "world": graph.Int(int64(world)), "bucket": graph.Int(int64(k))}
		n, err := graph.NewNode(nm.Fresh(fmt.Sprintf("allreduce/bucket%d", k)), "AllReduce", attrs, b.grads...)
		if err != nil {
			return nil, fmt.Errorf("AllReduce of bucket %d (%s, ...): %w", k, b.params[0], err)
		}
		for j, p := range b.params {
			n.Outputs[j].Name = nm.Fresh("grad.reduced." + p)
			out[p] = n.Outputs[j]
		}
		nodes = append(nodes, n)
	}
	insertAfterProducers(g, nodes)
	return out, nil
}
