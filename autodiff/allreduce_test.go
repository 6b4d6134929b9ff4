package autodiff

import (
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// A world of one (or the default 0) inserts nothing: the training graph is
// byte-identical to the single-process one.
func TestAllReduceWorldOfOneInsertsNothing(t *testing.T) {
	cfg := tinyConfig(t, graph.Float32)
	base, err := TrainingGraph(buildModel(t, cfg), TrainOptions{ClipNorm: 1})
	if err != nil {
		t.Fatal(err)
	}
	one, err := TrainingGraph(buildModel(t, cfg), TrainOptions{ClipNorm: 1, World: 1})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := graph.Format(base.Graph), graph.Format(one.Graph); a != b {
		t.Errorf("world 1 changed the training graph")
	}
	for _, n := range one.Graph.Nodes {
		if n.Op == "AllReduce" {
			t.Fatalf("world 1 inserted %s", n.Name)
		}
	}
	if _, err := TrainingGraph(buildModel(t, cfg), TrainOptions{World: -1}); err == nil {
		t.Error("world -1 accepted")
	}
}

// With world 2 every AdamW (and the clip's norm) reads a gradient averaged
// over the ranks, the gradients are bucketed by size in backward order, one
// AllReduce per bucket placed right after the node that computes the
// bucket's last gradient, and the graph verifies and survives the text
// format.
func TestAllReduceInsertedPerBucket(t *testing.T) {
	cfg := tinyConfig(t, graph.Float32)
	g := buildModel(t, cfg)
	ts, err := TrainingGraph(g, TrainOptions{World: 2, ClipNorm: 1})
	if err != nil {
		t.Fatal(err)
	}
	producer := map[*graph.Value]*graph.Node{}
	var reduces []*graph.Node
	for i, n := range ts.Graph.Nodes {
		for _, o := range n.Outputs {
			producer[o] = n
		}
		if n.Op == "AllReduce" {
			reduces = append(reduces, n)
			if w := n.Attrs.Int("world", 0); w != 2 {
				t.Errorf("%s: world %d, want 2", n.Name, w)
			}
			if r := n.Attrs.String("reduce", ""); r != "mean" {
				t.Errorf("%s: reduce %q, want mean", n.Name, r)
			}
			if b := n.Attrs.Int("bucket", -1); b != 0 {
				t.Errorf("%s: bucket %d with the 25 MiB default on a tiny model, want 0", n.Name, b)
			}
			if i == 0 || !slices.ContainsFunc(n.Inputs, func(v *graph.Value) bool { return producer[v] == ts.Graph.Nodes[i-1] }) {
				t.Errorf("%s is not right after the node of its last gradient", n.Name)
			}
		}
	}
	if len(reduces) != 1 || len(reduces[0].Inputs) != len(ts.Params) {
		t.Fatalf("%d AllReduce nodes for %d params, want one bucket of every gradient", len(reduces), len(ts.Params))
	}
	for _, n := range ts.Graph.Nodes {
		if n.Op != "AdamW" {
			continue
		}
		// The grad input is the clip's output, which must depend on an
		// AllReduce; check the clip scales an all-reduced gradient.
		if !dependsOnOp(n.Inputs[1], producer, "AllReduce") {
			t.Errorf("%s's gradient does not come from an AllReduce", n.Name)
		}
	}
	text := graph.Format(ts.Graph)
	back, err := graph.Parse(text)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if graph.Format(back) != text {
		t.Error("the text format does not round-trip the AllReduce nodes")
	}

	// A bucket of one byte puts every gradient in its own bucket, numbered
	// in backward order: the last param's gradient is bucket 0.
	ts, err = TrainingGraph(buildModel(t, cfg), TrainOptions{World: 2, BucketBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	placedAt := map[*graph.Value]int{}
	for i, n := range ts.Graph.Nodes {
		for _, o := range n.Outputs {
			placedAt[o] = i
		}
		if n.Op == "AllReduce" {
			b := n.Attrs.Int("bucket", -1)
			if seen[b] {
				t.Errorf("bucket %d used twice with 1-byte buckets", b)
			}
			seen[b] = true
			if len(n.Inputs) != 1 {
				t.Errorf("%s reduces %d gradients with 1-byte buckets", n.Name, len(n.Inputs))
			}
			if want := "grad.reduced." + ts.Params[len(ts.Params)-1]; b == 0 && !strings.HasPrefix(n.Outputs[0].Name, want) {
				t.Errorf("bucket 0 reduces %s, want %s (backward order)", n.Outputs[0].Name, want)
			}
			if at, ok := placedAt[n.Inputs[0]]; ok && at != i-1 {
				t.Errorf("%s is at node %d, its gradient is made at node %d", n.Name, i, at)
			}
		}
	}
	if len(seen) != len(ts.Params) {
		t.Errorf("%d buckets for %d params with 1-byte buckets", len(seen), len(ts.Params))
	}
}

func dependsOnOp(v *graph.Value, producer map[*graph.Value]*graph.Node, op string) bool {
	seen := map[*graph.Node]bool{}
	stack := []*graph.Value{v}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := producer[v]
		if n == nil || seen[n] {
			continue
		}
		seen[n] = true
		if n.Op == op {
			return true
		}
		stack = append(stack, n.Inputs...)
	}
	return false
}
