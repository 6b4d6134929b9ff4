package cpu

import (
	"fmt"
	"sync"

	"github.com/flashgraph/flashgraph/graph"
)

// fusedKernel runs a FusedElementwise node by running its body step by step
// with the ops' own kernels (and the executor's rounding of narrow types
// after each), so a fused graph gives bit for bit what the unfused graph
// gave. When every step has the outputs' shape (as fuse_elementwise makes
// them) it goes through the output in chunks of a few thousand elements,
// so that no intermediate is ever materialised at full size; otherwise the
// steps' full results are held while the node runs.
func fusedKernel(n *graph.Node, in, out []*graph.Tensor) error {
	steps, err := graph.FusedBody(n.Attrs.String("body", ""), len(in))
	if err != nil {
		return err
	}
	inTypes := make([]graph.TensorType, len(in))
	for i, t := range in {
		inTypes[i] = t.Type()
	}
	types, err := graph.FusedTypes(steps, inTypes, n.Attrs)
	if err != nil {
		return err
	}
	outIdx := n.Attrs["outputs"].Ints
	if len(outIdx) != len(out) {
		return fmt.Errorf("%d outputs listed, %d given", len(outIdx), len(out))
	}
	// A body with a reduction holds each step whole (the reduction needs
	// its entire operand); the reduction runs on ReduceSum/Mean's kernel.
	if !wholeSteps(steps) && oneShape(types, out) {
		return fusedChunked(n, steps, types, outIdx, in, out)
	}
	if wholeSteps(steps) {
		if ok, err := fusedRows(n, steps, types, outIdx, in, out); ok || err != nil {
			return err
		}
	}
	// Steps that are outputs compute straight into them.
	res := make([]*graph.Tensor, len(steps))
	written, err := outputSlots(outIdx, len(steps))
	if err != nil {
		return err
	}
	for o, k := range written {
		res[o] = out[k]
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
		// A reduction or index step takes constant operands and attributes
		// of its own (the reduction's axes and keepdims come from n).
		extra, stepAttrs, err := graph.FusedStepOperands(s, n.Attrs)
		if err != nil {
			return fmt.Errorf("step %d (%s): %w", k, s.Op, err)
		}
		stepNode := n
		if len(stepAttrs) > 0 && !graph.FusibleReduce[s.Op] {
			stepNode = &graph.Node{Name: n.Name, Op: s.Op, Attrs: stepAttrs}
		}
		if err := kernels[s.Op](stepNode, append(args, extra...), []*graph.Tensor{t}); err != nil {
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

// oneShape reports whether every step and output has out[0]'s shape.
// wholeSteps: a body with a reduction or an index step (whose operands
// have other shapes than the outputs) runs over chunks of rows (fusedRows)
// where it can, otherwise step by step, each step whole.
func wholeSteps(steps []graph.FusedStep) bool {
	for _, s := range steps {
		if _, index := graph.FusibleIndex[s.Op]; index || graph.FusibleReduce[s.Op] {
			return true
		}
	}
	return false
}

func oneShape(types []graph.TensorType, out []*graph.Tensor) bool {
	if len(out) == 0 {
		return false
	}
	for _, t := range types {
		if !t.Shape.Equal(out[0].Shape) {
			return false
		}
	}
	return true
}

// fusedChunk is how many output elements one pass of the body covers: small
// enough that a chunk's intermediates stay in cache, large enough that the
// per-chunk overhead vanishes.
const fusedChunk = 4096

// fusedChunked evaluates the body over consecutive ranges of output
// elements, in parallel over ranges. Every step is elementwise, so element
// i of a step depends only on element i of its operands (inputs read
// through their broadcast), and the result is the same as whole tensors
// give, bit for bit.
func fusedChunked(n *graph.Node, steps []graph.FusedStep, types []graph.TensorType, outIdx []int64, in, out []*graph.Tensor) error {
	shape := out[0].Shape
	total := shape.Numel()
	// Each input's flat index for an output index: broadcast strides.
	strides := make([][]int, len(in))
	for i, t := range in {
		strides[i] = broadcastStrides(t.Shape, shape)
	}
	outOf, err := outputSlots(outIdx, len(steps))
	if err != nil {
		return err
	}
	nChunks := (total + fusedChunk - 1) / fusedChunk
	var firstErr error
	var mu sync.Mutex
	parallelFor(nChunks, 1, func(c0, c1 int) {
		args := make([]*graph.Tensor, 3)
		scratch := make([]*graph.Tensor, len(steps))
		gathered := make([]*graph.Tensor, len(in))
		for c := c0; c < c1; c++ {
			lo := c * fusedChunk
			m := min(fusedChunk, total-lo)
			view := func(t *graph.Tensor) *graph.Tensor { return sliceView(t, lo, m) }
			ins := make([]*graph.Tensor, len(in))
			for i, t := range in {
				switch {
				case t.Len() == 1:
					ins[i] = &graph.Tensor{DType: t.DType, Shape: graph.Shape{}, F32: t.F32, F64: t.F64, I64: t.I64, B: t.B}
				case t.Shape.Equal(shape):
					ins[i] = view(t)
				default:
					if gathered[i] == nil || gathered[i].Len() != m {
						gathered[i] = graph.NewTensor(t.DType, graph.Shape{m})
					}
					gatherBroadcast(gathered[i], t, strides[i], shape, lo)
					ins[i] = gathered[i]
				}
			}
			res := make([]*graph.Tensor, len(steps))
			for k, s := range steps {
				a := args[:len(s.Args)]
				for j, op := range s.Args {
					if op.Step {
						a[j] = res[op.Index]
					} else {
						a[j] = ins[op.Index]
					}
				}
				var t *graph.Tensor
				if o, ok := outOf[int64(k)]; ok {
					t = view(out[o])
				} else {
					if scratch[k] == nil || scratch[k].Len() != m {
						scratch[k] = graph.NewTensor(types[k].DType, graph.Shape{m})
					}
					t = scratch[k]
				}
				stepNode := n
				if s.Attrs != nil { // an elementwise step with attributes of its own
					stepNode = &graph.Node{Name: n.Name, Op: s.Op, Attrs: s.Attrs}
				}
				if err := kernels[s.Op](stepNode, a, []*graph.Tensor{t}); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("step %d (%s): %w", k, s.Op, err)
					}
					mu.Unlock()
					return
				}
				roundNarrow(t)
				res[k] = t
			}
			for k, o := range outIdx {
				if outOf[o] != k {
					copyTensor(view(out[k]), res[o])
				}
			}
		}
	})
	return firstErr
}

// outputSlots maps each step that is an output to the first output slot
// listing it, checking every listed step exists.
func outputSlots(outIdx []int64, steps int) (map[int64]int, error) {
	outOf := map[int64]int{}
	for k, o := range outIdx {
		if o < 0 || int(o) >= steps {
			return nil, fmt.Errorf("outputs[%d] = %d: the body has %d steps", k, o, steps)
		}
		if _, dup := outOf[o]; !dup {
			outOf[o] = k
		}
	}
	return outOf, nil
}

// broadcastStrides are the strides of a tensor of shape in read broadcast
// to shape out (0 along broadcast axes).
func broadcastStrides(in, out graph.Shape) []int {
	st := make([]int, out.Rank())
	acc := 1
	for i := in.Rank() - 1; i >= 0; i-- {
		if in[i] != 1 {
			st[out.Rank()-in.Rank()+i] = acc
		}
		acc *= in[i]
	}
	return st
}

// gatherBroadcast copies src's elements for output indexes [lo, lo+dst.Len()) of
// shape into dst.
func gatherBroadcast(dst, src *graph.Tensor, strides []int, shape graph.Shape, lo int) {
	idx := make([]int, shape.Rank())
	rem := lo
	for d := shape.Rank() - 1; d >= 0; d-- {
		idx[d] = rem % shape[d]
		rem /= shape[d]
	}
	off := 0
	for d, i := range idx {
		off += i * strides[d]
	}
	for e := range dst.Len() {
		switch {
		case dst.F32 != nil:
			dst.F32[e] = src.F32[off]
		case dst.F64 != nil:
			dst.F64[e] = src.F64[off]
		case dst.I64 != nil:
			dst.I64[e] = src.I64[off]
		case dst.B != nil:
			dst.B[e] = src.B[off]
		}
		// Next output index: an odometer over shape.
		for d := shape.Rank() - 1; d >= 0; d-- {
			idx[d]++
			off += strides[d]
			if idx[d] < shape[d] {
				break
			}
			off -= idx[d] * strides[d]
			idx[d] = 0
		}
	}
}

// sliceView is elements [lo, lo+m) of t as a rank-1 tensor sharing t's storage.
func sliceView(t *graph.Tensor, lo, m int) *graph.Tensor {
	v := &graph.Tensor{DType: t.DType, Shape: graph.Shape{m}}
	switch {
	case t.F32 != nil:
		v.F32 = t.F32[lo : lo+m]
	case t.F64 != nil:
		v.F64 = t.F64[lo : lo+m]
	case t.I64 != nil:
		v.I64 = t.I64[lo : lo+m]
	case t.B != nil:
		v.B = t.B[lo : lo+m]
	}
	return v
}
