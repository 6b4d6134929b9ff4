package cpu

import (
	"context"
	"fmt"
	"math"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// collectives are the kernels of the data-parallel ops over a job of several
// ranks, made at Compile with the job's collective.
var collectives = map[string]func(*graph.Node, backend.Collective) (kernel, error){
	"AllReduce":     collectiveKernel,
	"ReduceScatter": reduceScatterCollective,
	"AllGather":     allGatherCollective,
}

// checkCollective refuses a node of a job of several ranks without a
// collective of its size, or of a dtype the collective cannot reduce.
func checkCollective(n *graph.Node, c backend.Collective) error {
	w := n.Attrs.Int("world", 1)
	if c == nil {
		return fmt.Errorf("%s over %d ranks needs a collective (backend.Options.Collective)", n.Op, w)
	}
	if int64(c.WorldSize()) != w {
		return fmt.Errorf("%s over %d ranks, but the collective has %d", n.Op, w, c.WorldSize())
	}
	for _, x := range n.Inputs {
		if dt := x.Type.DType; dt != graph.Float32 {
			return fmt.Errorf("%s of %v (%s): the collective reduces float32 only", n.Op, dt, x.Name)
		}
	}
	return nil
}

// reduceScatterKernel is ReduceScatter on one rank: the concatenation of the
// inputs (offsets [0, total]).
func reduceScatterKernel(n *graph.Node, in, out []*graph.Tensor) error {
	if w := n.Attrs.Int("world", 1); w > 1 {
		return fmt.Errorf("ReduceScatter over %d ranks: the CPU executor is not connected to a collective", w)
	}
	f32, f64 := 0, 0
	for _, x := range in {
		f32 += copy(out[0].F32[f32:], x.F32)
		f64 += copy(out[0].F64[f64:], x.F64)
	}
	return nil
}

// allGatherKernel is AllGather on one rank, the identity.
func allGatherKernel(n *graph.Node, in, out []*graph.Tensor) error {
	if w := n.Attrs.Int("world", 1); w > 1 {
		return fmt.Errorf("AllGather over %d ranks: the CPU executor is not connected to a collective", w)
	}
	return identityKernel(n, in, out)
}

// reduceScatterCollective is ReduceScatter over several ranks through a
// collective that only sums: the whole bucket is summed (one call, the same
// bits as AllReduce's), and the rank keeps its part. It moves world times the
// bytes NCCL's reduce-scatter does, which the CPU test transport can afford;
// what ZeRO-1 saves, the optimizer state outside the part, is saved all the
// same.
func reduceScatterCollective(n *graph.Node, c backend.Collective) (kernel, error) {
	if err := checkCollective(n, c); err != nil {
		return nil, err
	}
	total := 0
	for _, x := range n.Inputs {
		total += x.Type.Shape.Numel()
	}
	lo, hi, err := graph.ShardRange(n.Attrs, total)
	if err != nil {
		return nil, err
	}
	w := float64(n.Attrs.Int("world", 1))
	mean := n.Attrs.String("reduce", "mean") == "mean"
	bucket := make([]float32, total)
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		off := 0
		for _, x := range in {
			off += copy(bucket[off:], x.F32)
		}
		if err := c.AllReduceSum(context.Background(), bucket); err != nil {
			return fmt.Errorf("ReduceScatter: %w", err)
		}
		for i, v := range bucket[lo:hi] {
			if mean {
				v = float32(float64(v) / w)
			}
			out[0].F32[i] = v
		}
		return nil
	}, nil
}

// negZero is the float32 -0, the one value x with v + x == v for every v
// (+0 would turn a -0 into +0).
var negZero = math.Float32frombits(1 << 31)

// allGatherCollective is AllGather over several ranks through a collective
// that only sums: each rank contributes its part at its offsets and -0
// everywhere else, so that the float64 sum in rank order is every part's
// bits exactly.
func allGatherCollective(n *graph.Node, c backend.Collective) (kernel, error) {
	if err := checkCollective(n, c); err != nil {
		return nil, err
	}
	total := n.Outputs[0].Type.Shape.Numel()
	lo, hi, err := graph.ShardRange(n.Attrs, total)
	if err != nil {
		return nil, err
	}
	return func(n *graph.Node, in, out []*graph.Tensor) error {
		buf := out[0].F32
		for i := range buf {
			buf[i] = negZero
		}
		copy(buf[lo:hi], in[0].F32)
		if err := c.AllReduceSum(context.Background(), buf); err != nil {
			return fmt.Errorf("AllGather: %w", err)
		}
		return nil
	}, nil
}
