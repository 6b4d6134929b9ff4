package autodiff

import (
	"fmt"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
)

// gradBucket is one all-reduce bucket: params in backward order and their
// gradients.
type gradBucket struct {
	params []string
	grads  []*graph.Value
}

// gradientBuckets groups the params' gradients in the reverse of params
// order (the order backward finishes them) until bucketBytes are collected.
func gradientBuckets(gradOf func(string) *graph.Value, params []string, bucketBytes int64) []*gradBucket {
	if bucketBytes <= 0 {
		bucketBytes = DefaultBucketBytes
	}
	var buckets []*gradBucket
	filled := int64(0)
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		gv := gradOf(p)
		size := int64(gv.Type.Shape.Numel()) * int64(gv.Type.DType.Size())
		if len(buckets) == 0 || (filled > 0 && filled+size > bucketBytes) {
			buckets = append(buckets, &gradBucket{})
			filled = 0
		}
		filled += size
		b := buckets[len(buckets)-1]
		b.params = append(b.params, p)
		b.grads = append(b.grads, gv)
	}
	return buckets
}

// insertAfterProducers inserts each node right after the last node of g that
// computes one of its inputs (at the start when none does): where a bucket's
// gradients are final. Nodes placed at the same point keep their order.
func insertAfterProducers(g *graph.Graph, nodes []*graph.Node) {
	pos := map[*graph.Value]int{}
	for i, n := range g.Nodes {
		for _, o := range n.Outputs {
			pos[o] = i
		}
	}
	after := make([]int, len(nodes))
	for k, n := range nodes {
		after[k] = -1
		for _, x := range n.Inputs {
			if i, ok := pos[x]; ok {
				after[k] = max(after[k], i)
			}
		}
	}
	// Insert from the back of the graph so that the indices still to use
	// stay valid.
	order := make([]int, len(nodes))
	for k := range order {
		order[k] = k
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if after[a] != after[b] {
			return after[b] - after[a]
		}
		return b - a
	})
	for _, k := range order {
		g.Nodes = slices.Insert(g.Nodes, after[k]+1, nodes[k])
	}
}

// ShardOffsets splits a flat bucket of total elements over world ranks:
// world+1 offsets, rank r holding [off[r], off[r+1]), parts that differ by at
// most one element.
func ShardOffsets(total, world int) []int64 {
	off := make([]int64, world+1)
	for r := range off {
		off[r] = int64(r * total / world)
	}
	return off
}

// shardedUpdate is the update of a ZeRO-1 step on rank: per bucket, a
// ReduceScatter gives the rank its part of the averaged flat bucket (placed
// where the bucket's gradients are final), AdamW updates the part, param by
// param (each keeps its weight decay), with moments only for the part, and
// an AllGather of the updated parts gives every rank the whole new weights.
// It returns the step's outputs after the loss: each param's new value,
// then the new moments of the rank's parts.
func shardedUpdate(g *graph.Graph, nm *graph.Namer, claim func(string) error, ts *TrainStep, vals map[string]*graph.Value,
	gradOf func(string) *graph.Value, params []string, opt TrainOptions, lr, step *graph.Value, b1, b2, eps float64) ([]*graph.Value, error) {
	world, rank := opt.World, opt.Rank
	if rank < 0 || rank >= world {
		return nil, fmt.Errorf("sharded optimizer: rank %d is outside [0, %d)", rank, world)
	}
	ints := func(v ...int) *graph.Value {
		d := make([]float64, len(v))
		for i, x := range v {
			d[i] = float64(x)
		}
		c := &graph.Value{Name: nm.Fresh("zero/c"), Type: graph.TensorType{DType: graph.Int64, Shape: graph.Shape{len(v)}}, Kind: graph.Const, Init: &graph.Init{Fn: "literal", Data: d}}
		g.Consts = append(g.Consts, c)
		return c
	}
	var tail []*graph.Node // nodes after the backward, in order
	op := func(name, opName string, attrs graph.Attrs, in ...*graph.Value) ([]*graph.Value, error) {
		n, err := graph.NewNode(nm.Fresh(name), opName, attrs, in...)
		if err != nil {
			return nil, err
		}
		tail = append(tail, n)
		return n.Outputs, nil
	}
	newValue := map[string]*graph.Value{}
	var momentOuts []*graph.Value
	var scatters []*graph.Node
	ts.Shards = map[string][2]int{}
	for k, b := range gradientBuckets(gradOf, params, opt.BucketBytes) {
		total := 0
		for _, gv := range b.grads {
			total += gv.Type.Shape.Numel()
		}
		off := ShardOffsets(total, world)
		lo, hi := int(off[rank]), int(off[rank+1])
		attrs := graph.Attrs{"world": graph.Int(int64(world)), "rank": graph.Int(int64(rank)), "bucket": graph.Int(int64(k)), "offsets": graph.Ints(off...)}
		rsAttrs := attrs.Clone()
		rsAttrs["reduce"] = graph.Str("mean")
		rs, err := graph.NewNode(nm.Fresh(fmt.Sprintf("zero/reduce_scatter/bucket%d", k)), "ReduceScatter", rsAttrs, b.grads...)
		if err != nil {
			return nil, fmt.Errorf("ReduceScatter of bucket %d: %w", k, err)
		}
		rs.Outputs[0].Name = nm.Fresh(fmt.Sprintf("grad.part.bucket%d", k))
		scatters = append(scatters, rs)
		part := rs.Outputs[0]
		// The rank's part of each param: the params of the bucket, flat and
		// one after another, cut at [lo, hi).
		var newParts []*graph.Value
		start := 0
		for j, p := range b.params {
			pv := vals[p]
			n := pv.Type.Shape.Numel()
			a, e := max(start, lo), min(start+n, hi)
			if a < e {
				flat, err := op("zero/flat/"+p, "Reshape", nil, pv, ints(n))
				if err != nil {
					return nil, err
				}
				pSeg, err := op("zero/part/"+p, "Slice", nil, flat[0], ints(a-start), ints(e-start), ints(0))
				if err != nil {
					return nil, err
				}
				gSeg, err := op("zero/grad_part/"+p, "Slice", nil, part, ints(a-lo), ints(e-lo), ints(0))
				if err != nil {
					return nil, err
				}
				mom := [2]*graph.Value{}
				for i, prefix := range []string{"opt.m.", "opt.v."} {
					name := prefix + p
					if err := claim(name); err != nil {
						return nil, err
					}
					init := graph.Zeros()
					mom[i] = &graph.Value{Name: name, Type: graph.TensorType{DType: pv.Type.DType, Shape: graph.Shape{e - a}}, Kind: graph.Const, Init: &init}
					g.Consts = append(g.Consts, mom[i])
				}
				wd := opt.WeightDecay
				if pv.Type.Shape.Rank() < 2 && !opt.DecayNorms {
					wd = 0
				}
				up, err := op("opt/"+p, "AdamW", graph.Attrs{"beta1": graph.Float(b1), "beta2": graph.Float(b2), "eps": graph.Float(eps), "weight_decay": graph.Float(wd)},
					pSeg[0], gSeg[0], mom[0], mom[1], lr, step)
				if err != nil {
					return nil, fmt.Errorf("AdamW for %s: %w", p, err)
				}
				up[0].Name = nm.Fresh("zero/new_part/" + p)
				for i, target := range []string{mom[0].Name, mom[1].Name} {
					name := target + ".next"
					if err := claim(name); err != nil {
						return nil, err
					}
					up[i+1].Name = name
					ts.Updates[name] = target
				}
				momentOuts = append(momentOuts, up[1], up[2])
				ts.Moments[p] = [2]string{mom[0].Name, mom[1].Name}
				ts.Shards[p] = [2]int{a - start, e - start}
				newParts = append(newParts, up[0])
			}
			start += n
			_ = j
		}
		mine := part // an empty part when the rank holds none of the bucket
		if len(newParts) == 1 {
			mine = newParts[0]
		} else if len(newParts) > 1 {
			c, err := op(fmt.Sprintf("zero/concat/bucket%d", k), "Concat", graph.Attrs{"axis": graph.Int(0)}, newParts...)
			if err != nil {
				return nil, err
			}
			mine = c[0]
		}
		full, err := op(fmt.Sprintf("zero/all_gather/bucket%d", k), "AllGather", attrs, mine)
		if err != nil {
			return nil, fmt.Errorf("AllGather of bucket %d: %w", k, err)
		}
		start = 0
		for _, p := range b.params {
			pv := vals[p]
			n := pv.Type.Shape.Numel()
			s, err := op("zero/param/"+p, "Slice", nil, full[0], ints(start), ints(start+n), ints(0))
			if err != nil {
				return nil, err
			}
			r, err := op("zero/reshape/"+p, "Reshape", nil, s[0], ints(pv.Type.Shape...))
			if err != nil {
				return nil, err
			}
			name := p + ".next"
			if err := claim(name); err != nil {
				return nil, err
			}
			r[0].Name = name
			ts.Updates[name] = p
			newValue[p] = r[0]
			start += n
		}
	}
	insertAfterProducers(g, scatters)
	g.Nodes = append(g.Nodes, tail...)
	var outs []*graph.Value
	for _, p := range params {
		outs = append(outs, newValue[p])
	}
	return append(outs, momentOuts...), nil
}
