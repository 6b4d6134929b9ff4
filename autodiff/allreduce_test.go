package autodiff

import (
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
// over the ranks, the nodes are bucketed by size in backward order, and the
// graph verifies and survives the text format.
func TestAllReduceInsertedPerGradient(t *testing.T) {
	cfg := tinyConfig(t, graph.Float32)
	g := buildModel(t, cfg)
	ts, err := TrainingGraph(g, TrainOptions{World: 2, ClipNorm: 1})
	if err != nil {
		t.Fatal(err)
	}
	producer := map[*graph.Value]*graph.Node{}
	var reduces []*graph.Node
	for _, n := range ts.Graph.Nodes {
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
		}
	}
	if len(reduces) != len(ts.Params) {
		t.Fatalf("%d AllReduce nodes for %d params", len(reduces), len(ts.Params))
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
	for _, n := range ts.Graph.Nodes {
		if n.Op == "AllReduce" {
			b := n.Attrs.Int("bucket", -1)
			if seen[b] {
				t.Errorf("bucket %d used twice with 1-byte buckets", b)
			}
			seen[b] = true
			if want := "allreduce/" + ts.Params[len(ts.Params)-1]; b == 0 && !strings.HasPrefix(n.Name, want) {
				t.Errorf("bucket 0 is %s, want %s (backward order)", n.Name, want)
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
