package cpu

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
)

// fusedKernel runs a FusedElementwise node by running its body step by step
// with the ops' own kernels (and the executor's rounding of narrow types
// after each), so a fused graph gives bit for bit what the unfused graph
// gave. The steps' results are held only while the node runs.
func fusedKernel(n *graph.Node, in, out []*graph.Tensor) error {
	steps, err := graph.FusedBody(n.Attrs.String("body", ""), len(in))
	if err != nil {
		return err
	}
	inTypes := make([]graph.TensorType, len(in))
	for i, t := range in {
		inTypes[i] = t.Type()
	}
	types, err := graph.FusedTypes(steps, inTypes)
	if err != nil {
		return err
	}
	outIdx := n.Attrs["outputs"].Ints
	if len(outIdx) != len(out) {
		return fmt.Errorf("%d outputs listed, %d given", len(outIdx), len(out))
	}
	// Steps that are outputs compute straight into them.
	res := make([]*graph.Tensor, len(steps))
	written := map[int64]int{}
	for k, o := range outIdx {
		if o < 0 || int(o) >= len(steps) {
			return fmt.Errorf("outputs[%d] = %d: the body has %d steps", k, o, len(steps))
		}
		if _, dup := written[o]; !dup {
			written[o] = k
			res[o] = out[k]
		}
	}
	for k, s := range steps {
		args := make([]*graph.Tensor, len(s.Args))
		for j, a := range s.Args {
			if a.Step {
				args[j] = res[a.Index]
			} else {
				args[j] = in[a.Index]
			}
		}
		t := res[k]
		if t == nil {
			if t, err = allocate(types[k]); err != nil {
				return fmt.Errorf("step %d (%s): %w", k, s.Op, err)
			}
		}
		if err := kernels[s.Op](n, args, []*graph.Tensor{t}); err != nil {
			return fmt.Errorf("step %d (%s): %w", k, s.Op, err)
		}
		roundNarrow(t)
		res[k] = t
	}
	for k, o := range outIdx {
		if written[o] != k {
			copyTensor(out[k], res[o])
		}
	}
	return nil
}

// copyTensor copies src's elements into dst of the same type.
func copyTensor(dst, src *graph.Tensor) {
	copy(dst.F32, src.F32)
	copy(dst.F64, src.F64)
	copy(dst.I64, src.I64)
	copy(dst.B, src.B)
}
