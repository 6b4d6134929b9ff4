package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// writeUnfusable writes, in our text format, a graph with two causal
// attention blocks; the second's probabilities are also summed, so it cannot
// be fused.
func writeUnfusable(t *testing.T) string {
	t.Helper()
	dt := graph.Float32
	b := graph.NewBuilder("unfusable")
	q := b.Input("q", dt, 1, 2, 8, 4)
	k := b.Input("k", dt, 1, 2, 8, 4)
	v := b.Input("v", dt, 1, 2, 8, 4)
	mask := b.Const("mask", dt, graph.Shape{8, 8}, graph.CausalMask())
	attn := func(x *graph.Value) (*graph.Value, *graph.Value) {
		p := b.Softmax(b.Add(b.Mul(b.MatMul(x, b.Transpose(k, 0, 1, 3, 2)), b.Scalar(dt, 0.5)), mask), -1)
		return b.MatMul(p, v), p
	}
	o1, _ := attn(q)
	o2, p2 := attn(o1)
	b.Output(o2, b.ReduceSum(p2, false, -1))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "unfusable.txt")
	if err := os.WriteFile(p, []byte(graph.Format(g)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFuseRequire(t *testing.T) {
	file := writeUnfusable(t)
	for _, cmd := range []string{"compile", "run"} {
		code, stdout, stderr := runCode(cmd, "-fuse=require", file)
		if code != 1 || !strings.Contains(stderr, "-fuse=require: attention fusion required, but 1 of 2 attention Softmax nodes were left unfused:\n  Softmax_1: probs also used by node ReduceSum_0") {
			t.Errorf("%s -fuse=require FILE: exit %d, stderr:\n%s", cmd, code, stderr)
		}
		if stdout != "" {
			t.Errorf("%s -fuse=require failed but printed %q", cmd, stdout)
		}
	}
	// The boolean forms still work; -fuse alone fuses what it can.
	for _, f := range []string{"-fuse", "-fuse=true", "-fuse=false"} {
		if code, _, stderr := runCode("compile", f, file); code != 0 {
			t.Errorf("compile %s FILE: exit %d: %s", f, code, stderr)
		}
	}
	if code, _, stderr := runCode("compile", "-fuse=maybe"); code != 2 || !strings.Contains(stderr, "want true, false or require") {
		t.Errorf("-fuse=maybe: exit %d: %s", code, stderr)
	}
	// The model configs fuse completely.
	for _, cfg := range []string{"tiny", "small", "gpt2"} {
		if code, _, stderr := runCode("compile", "-fuse=require", "-config", cfg, "-o", filepath.Join(t.TempDir(), "g.txt")); code != 0 {
			t.Errorf("compile -fuse=require -config %s: exit %d: %s", cfg, code, stderr)
		}
	}
	runCLI(t, "run", "-fuse=require")
	stdout, _ := runCLI(t, tinyTrainArgs(trainData(t), filepath.Join(t.TempDir(), "o"), "1", "-fuse=require")...)
	if !strings.Contains(stdout, "fused attention") {
		t.Errorf("train -fuse=require:\n%s", stdout)
	}
}
