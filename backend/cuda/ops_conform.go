package cuda

import (
	"fmt"

	"github.com/flashgraph/flashgraph/backend"
)

// Ops of the op table with no CUDA kernel yet (graph/ops_conform.go): their
// lowering refuses the graph at Compile, naming the op, with an error that
// wraps backend.ErrUnsupported. They run on the CPU backend.
func init() {
	for _, op := range []string{"GatherElements", "ArgMax", "ReduceProd", "Conv", "ConvTranspose", "MaxPool", "AveragePool"} {
		lowerings[op] = lowering{lower: lowerUnsupported}
	}
}

func lowerUnsupported(c *lowerCtx) (func() error, error) {
	return nil, fmt.Errorf("op %s has no CUDA kernel yet: %w", c.n.Op, backend.ErrUnsupported)
}
