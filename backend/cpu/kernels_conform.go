package cpu

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// Kernels of the ops the ONNX backend test suite added (graph/ops_conform.go,
// and ONNX's training optimizers, graph/ops_training.go): small index,
// reduction and update ops whose op table Eval, run on the node's own
// tensors, is already the kernel we want (it computes in float64 and rounds
// once to the output's type, as the CPU kernels do).
func init() {
	for _, op := range evalKernelOps {
		kernels[op] = evalKernel(op)
	}
}

// evalKernelOps are the ops whose kernel is evalKernel.
var evalKernelOps = []string{"GatherElements", "ArgMax", "ReduceProd", "Conv", "ConvTranspose", "MaxPool", "AveragePool", "Einsum",
	"ScatterElements", "Pad", "TopK", "OneHot", "Interpolate",
	"CumSum", "GatherND", "ScatterND", "ReverseSequence", "MaxUnpool", "LRN", "Det", "GridSample", "RoiAlign", "TfIdfVectorizer",
	"Adagrad", "Adam", "Momentum",
	// String ops: text has no faster form than the definition.
	"StringNormalizer"}

// evalKernel runs the op table's Eval of op on the node's tensors.
func evalKernel(op string) kernel {
	spec, ok := graph.LookupOp(op)
	if !ok {
		panic("cpu: kernel for an op the table does not have: " + op) // programming error at init
	}
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		if err := spec.Eval(in, n.Attrs, out); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		return nil
	}
}
