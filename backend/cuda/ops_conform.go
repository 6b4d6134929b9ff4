package cuda

import (
	"fmt"

	"github.com/flashgraph/flashgraph/backend"
)

// noKernelYet lists the ops of the op table with no CUDA kernel yet (an op
// added to the table goes here until it has one): their lowering refuses
// the graph at Compile, naming the op, with an error that wraps
// backend.ErrUnsupported. They run on the CPU backend. ONNX's training
// optimizers (graph/ops_training.go) are here: our training step updates
// with AdamW, which has its kernel.
var noKernelYet = map[string]bool{"Adagrad": true, "Adam": true, "Momentum": true}

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
