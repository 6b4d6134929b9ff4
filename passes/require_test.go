package passes

import (
	"errors"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// unfusableAttention is two attention blocks, the second of which cannot be
// fused (its probabilities are also summed), and a classifier Softmax that is
// not attention.
func unfusableAttention(t *testing.T) *graph.Graph {
	t.Helper()
	dt := graph.Float32
	b := graph.NewBuilder("unfusable")
	q := b.Input("q", dt, fzB, fzH, fzS, fzD)
	k := b.Input("k", dt, fzB, fzH, fzS, fzD)
	v := b.Input("v", dt, fzB, fzH, fzS, fzD)
	mask := b.Const("mask", dt, graph.Shape{fzS, fzS}, graph.CausalMask())
	attn := func(x *graph.Value) (*graph.Value, *graph.Value) {
		p := b.Softmax(b.Add(b.Mul(b.MatMul(x, b.Transpose(k, 0, 1, 3, 2)), b.Scalar(dt, 0.25)), mask), -1)
		return b.MatMul(p, v), p
	}
	o1, _ := attn(q)
	o2, p2 := attn(o1)
	cls := b.Softmax(b.ReduceMean(o2, false, 1), -1)
	b.Output(o2, b.ReduceSum(p2, false, -1), cls)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestRequireFusedNamesEveryUnfusedAttention(t *testing.T) {
	err := RequireFused(unfusableAttention(t))
	var ue *UnfusedError
	if !errors.As(err, &ue) {
		t.Fatalf("want an *UnfusedError, got %v", err)
	}
	// Softmax_0 fused, Softmax_1 refused, Softmax_2 is a classifier.
	if ue.Attention != 2 || len(ue.Unfused) != 1 || ue.Unfused[0].Softmax != "Softmax_1" {
		t.Fatalf("attention %d, unfused %+v", ue.Attention, ue.Unfused)
	}
	want := "attention fusion required, but 1 of 2 attention Softmax nodes were left unfused:\n  Softmax_1: probs also used by node ReduceSum_0"
	if err.Error() != want {
		t.Errorf("error:\n%s\nwant:\n%s", err, want)
	}
}

// A pipeline without fuse_attention fuses nothing: every attention Softmax
// is named.
func TestRequireFusedWithoutTheFusionPass(t *testing.T) {
	g := unfusableAttention(t)
	log := &Log{}
	pl, err := Select([]string{"dce"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pl.Run(g, log); err != nil {
		t.Fatal(err)
	}
	err = RequireFusedLog(g, log)
	if err == nil || strings.Count(err.Error(), "fuse_attention did not run") != 2 {
		t.Fatalf("err %v", err)
	}
}

// Every model config fuses completely.
func TestRequireFusedModelConfigs(t *testing.T) {
	for _, cfg := range model.Configs() {
		g, err := model.Build(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := RequireFused(g); err != nil {
			t.Errorf("%s: %v", cfg.Name, err)
		}
		if n := len(attentionSoftmaxes(g)); n != cfg.Layers {
			t.Errorf("%s: %d attention Softmax nodes, want one per layer (%d)", cfg.Name, n, cfg.Layers)
		}
	}
}
