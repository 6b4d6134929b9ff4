package main

import (
	"fmt"
	"io"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// printPlan prints the device memory plan of g and, when g has a scalar
// loss output, of its training step (forward, backward and AdamW), which is
// where the unfused attention keeps its S×S probabilities alive. With
// explain, each plan is followed by the planning facts it was made from
// (views, folded transposes, storage types, in-place updates, scratch,
// grouped launches) and where they come from. fuseQKV says g went through
// fuse_qkv: its step then gets disjoint_sums, as train's does.
//
// With world > 1 the training step is one rank's of a data-parallel job
// (train -ranks): its gradient all-reduce buckets are listed after the plan,
// each with where it is final, and with explain the gradients in it.
//
// With tbps > 0 the training step's plan (the forward's without one) is
// followed by its memory traffic per op type and its time at tbps TB/s.
func printPlan(w io.Writer, g *graph.Graph, compute graph.DType, explain, fuseQKV bool, world int, bucketBytes int64, tbps float64) error {
	p, err := cuda.PlanMemoryWith(g, cuda.PlanOptions{Compute: compute})
	if err != nil {
		return fmt.Errorf("memory plan: %w", err)
	}
	fmt.Fprintf(w, "memory plan of %s (forward):\n", g.Name)
	if err := p.Report(w, 5); err != nil {
		return err
	}
	if explain {
		if err := p.ReportFacts(w); err != nil {
			return err
		}
	}
	loss := g.Value("loss")
	if loss == nil || loss.Type.Shape.Rank() != 0 || len(g.Params) == 0 {
		if tbps > 0 {
			fmt.Fprintf(w, "memory traffic of %s (forward):\n", g.Name)
			return p.ReportTraffic(w, g, tbps)
		}
		return nil
	}
	ts, err := autodiff.TrainingGraph(g, autodiff.TrainOptions{Loss: "loss", World: world, BucketBytes: bucketBytes})
	if err != nil {
		return fmt.Errorf("training graph for the plan: %w", err)
	}
	if fuseQKV {
		if ts.Graph, err = passes.DisjointSums().Run(ts.Graph, nil); err != nil {
			return fmt.Errorf("training graph for the plan: %w", err)
		}
	}
	// The step as `train -device cuda` runs it: a fused graph's step has its
	// elementwise chains fused too (train.BuildGraphsFor).
	fusedEW := false
	for _, n := range g.Nodes {
		if n.Op == "FlashAttention" {
			fusedEW = true
			break
		}
	}
	stepGraph := ts.Graph
	if fusedEW {
		if stepGraph, err = (passes.FuseElementwise{}).Run(ts.Graph, nil); err != nil {
			return fmt.Errorf("training graph for the plan: %w", err)
		}
	}
	tp, err := cuda.PlanMemoryWith(stepGraph, cuda.PlanOptions{Compute: compute, Updates: ts.Updates})
	if err != nil {
		return fmt.Errorf("memory plan of the training step: %w", err)
	}
	fmt.Fprintf(w, "memory plan of %s (training step%s):\n", g.Name, map[bool]string{true: ", elementwise chains fused as on CUDA", false: ""}[fusedEW])
	if err := tp.Report(w, 5); err != nil {
		return err
	}
	if explain {
		if err := tp.ReportFacts(w); err != nil {
			return err
		}
	}
	if tbps > 0 {
		fmt.Fprintf(w, "memory traffic of %s (training step):\n", g.Name)
		if err := tp.ReportTraffic(w, stepGraph, tbps); err != nil {
			return err
		}
	}
	if world > 1 {
		reportBuckets(w, stepGraph, world, bucketBytes, explain)
	}
	// What train -recompute saves: the same step with each layer's forward
	// recomputed in the backward.
	rc, err := (passes.Recompute{}).Run(ts.Graph, nil)
	if err != nil {
		return fmt.Errorf("recomputing training step for the plan: %w", err)
	}
	if rc == ts.Graph {
		return nil
	}
	if fusedEW {
		if rc, err = (passes.FuseElementwise{}).Run(rc, nil); err != nil {
			return fmt.Errorf("recomputing training step for the plan: %w", err)
		}
	}
	rp, err := cuda.PlanMemoryWith(rc, cuda.PlanOptions{Compute: compute, Updates: ts.Updates})
	if err != nil {
		return fmt.Errorf("memory plan of the recomputing training step: %w", err)
	}
	fmt.Fprintf(w, "with train -recompute: activation arena %s (peak live %s at %s), %.0f%% of the above\n",
		cuda.FormatBytes(rp.PeakBytes), cuda.FormatBytes(rp.LiveBytes), rp.PeakNode, 100*float64(rp.PeakBytes)/float64(tp.PeakBytes))
	if explain {
		if err := rp.ReportFacts(w); err != nil {
			return err
		}
	}
	// The cheap mode (train -recompute=cheap, passes.RecomputeCheap): norms
	// and elementwise ops recomputed, GEMM and attention outputs saved.
	cc, err := (passes.Recompute{Mode: passes.RecomputeCheap}).Run(ts.Graph, nil)
	if err != nil {
		return fmt.Errorf("recomputing training step (cheap) for the plan: %w", err)
	}
	if fusedEW {
		if cc, err = (passes.FuseElementwise{}).Run(cc, nil); err != nil {
			return fmt.Errorf("recomputing training step (cheap) for the plan: %w", err)
		}
	}
	cp, err := cuda.PlanMemoryWith(cc, cuda.PlanOptions{Compute: compute, Updates: ts.Updates})
	if err != nil {
		return fmt.Errorf("memory plan of the cheaply recomputing training step: %w", err)
	}
	fmt.Fprintf(w, "with train -recompute=cheap (only norms and elementwise ops recomputed): activation arena %s (peak live %s at %s), %.0f%% of the training step\n",
		cuda.FormatBytes(cp.PeakBytes), cuda.FormatBytes(cp.LiveBytes), cp.PeakNode, 100*float64(cp.PeakBytes)/float64(tp.PeakBytes))
	return nil
}

// reportBuckets lists the gradient all-reduce buckets of a data-parallel
// training step: for each, its gradients' count and bytes and the node after
// which it is final (where its collective can start while the rest of the
// backward runs); with explain, the gradients.
func reportBuckets(w io.Writer, step *graph.Graph, world int, bucketBytes int64, explain bool) {
	if bucketBytes <= 0 {
		bucketBytes = autodiff.DefaultBucketBytes
	}
	var total int64
	type row struct {
		n     *graph.Node
		bytes int64
		after string
		at    int
	}
	var rows []row
	for i, n := range step.Nodes {
		if n.Op != "AllReduce" {
			continue
		}
		var b int64
		for _, x := range n.Inputs {
			b += int64(x.Type.Shape.Numel()) * int64(x.Type.DType.Size())
		}
		total += b
		after := "the step's start"
		if i > 0 {
			after = step.Nodes[i-1].Name
		}
		rows = append(rows, row{n, b, after, i})
	}
	fmt.Fprintf(w, "gradient all-reduce over %d ranks: %d bucket(s) of up to %s, %s in all (-bucket-mb):\n", world, len(rows), cuda.FormatBytes(bucketBytes), cuda.FormatBytes(total))
	for _, r := range rows {
		fmt.Fprintf(w, "  bucket %d: %d gradient(s), %s, final after node %d of %d (%s)\n",
			r.n.Attrs.Int("bucket", 0), len(r.n.Inputs), cuda.FormatBytes(r.bytes), r.at, len(step.Nodes), r.after)
		if explain {
			for _, x := range r.n.Inputs {
				fmt.Fprintf(w, "    %s %v\n", x.Name, x.Type)
			}
		}
	}
}
