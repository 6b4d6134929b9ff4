package cuda

import (
	"fmt"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// noKernelYet lists the ops of the op table with no CUDA kernel yet (an op
// added to the table goes here until it has one): their lowering refuses
// the graph at Compile, naming the op, with an error that wraps
// backend.ErrUnsupported. They run on the CPU backend. ONNX's training
// optimizers (graph/ops_training.go) are here: our training step updates
// with AdamW, which has its kernel.
var noKernelYet = map[string]bool{"Adagrad": true, "Adam": true, "Momentum": true,
	// A string op never reaches its lowering: CheckDTypes refuses the
	// graph first. It is listed so that every op has a lowering.
	"StringNormalizer": true}

func init() {
	for op := range noKernelYet {
		lowerings[op] = lowering{lower: lowerUnsupported}
	}
}

func lowerUnsupported(c *lowerCtx) (func() error, error) {
	return nil, fmt.Errorf("op %s has no CUDA kernel yet: %w", c.n.Op, backend.ErrUnsupported)
}

// HasKernel reports whether the CUDA backend runs op (an op table name).
func HasKernel(op string) bool {
	_, ok := lowerings[op]
	return ok && !noKernelYet[op]
}

// CheckDTypes refuses a graph with a value of an element type that has no
// device form: strings (graph.String), which only the CPU backend runs.
// Compile and the memory plan call it before anything else, so that such a
// graph is refused with an error that wraps backend.ErrUnsupported and
// names the dtype, whichever of its ops come first.
func CheckDTypes(g *graph.Graph) error {
	check := func(v *graph.Value) error {
		if v != nil && v.Type.DType == graph.String {
			return fmt.Errorf("value %q is a string tensor: dtype %v is not supported on CUDA (strings run on the CPU backend): %w", v.Name, v.Type.DType, backend.ErrUnsupported)
		}
		return nil
	}
	for _, v := range g.Inputs {
		if err := check(v); err != nil {
			return err
		}
	}
	for _, v := range g.Initializers() {
		if err := check(v); err != nil {
			return err
		}
	}
	for _, n := range g.Nodes {
		for _, v := range n.Outputs {
			if err := check(v); err != nil {
				return err
			}
		}
	}
	return nil
}
