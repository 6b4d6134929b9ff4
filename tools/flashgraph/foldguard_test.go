package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// compile refuses, before allocating, work on constants that cannot fit: an
// ONNX model whose constant folding would make a [100000,100000] tensor or a
// range of 10^12 numbers, and an export to .onnx of a hand-written graph
// whose const holds 1.6·10^10 float64s (357 GiB to export). Each refusal names the node or the
// initializer and the size, is quick, and writes nothing.
func TestCompileRefusesHugeConstants(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	model := func(inits []*onnxpb.Tensor, n *onnxpb.Node) []byte {
		g := &onnxpb.Graph{Name: "huge", Initializer: inits, Node: []*onnxpb.Node{n}, Output: []*onnxpb.ValueInfo{{Name: n.Output[0]}}}
		return onnxpb.Encode(&onnxpb.Model{IRVersion: 8, OpsetImport: []onnxpb.OperatorSetID{{Version: 17}}, Graph: g})
	}
	scalar := func(name string, v int64) *onnxpb.Tensor { return onnxpb.NewInt64(name, nil, []int64{v}) }
	fill := write("fill.onnx", model([]*onnxpb.Tensor{onnxpb.NewInt64("s", []int64{2}, []int64{100000, 100000})},
		&onnxpb.Node{Name: "fill", OpType: "ConstantOfShape", Input: []string{"s"}, Output: []string{"y"}}))
	rng := write("range.onnx", model([]*onnxpb.Tensor{scalar("a", 0), scalar("b", 1e12), scalar("d", 1)},
		&onnxpb.Node{Name: "count", OpType: "Range", Input: []string{"a", "b", "d"}, Output: []string{"y"}}))
	text := write("huge.txt", []byte("flashgraph 1\ngraph huge\ninput x: float32[4]\nconst big: float64[100000,160000] = ones()\nnode m = Mul(big, big) -> y: float64[100000,160000]\noutput y\n"))
	out := filepath.Join(dir, "out.onnx")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"compile", fill}, []string{`node "fill"`, "ConstantOfShape", "[100000 100000] result of 1e+10 elements", "refused before allocating"}},
		{[]string{"compile", "-plan", rng}, []string{`node "count"`, "Range", "a range of 1e+12 elements", "refused before allocating"}},
		{[]string{"compile", "-o", out, text}, []string{"const big", "float64[100000,160000]", "357.63 GiB", "refused before allocating"}},
	} {
		t0 := time.Now()
		code, _, stderr := runCode(c.args...)
		if code != 1 {
			t.Errorf("%v: exit %d, stderr:\n%s", c.args, code, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr does not say %q:\n%s", c.args, w, stderr)
			}
		}
		if strings.Contains(stderr, "goroutine") {
			t.Errorf("%v crashed:\n%s", c.args, stderr)
		}
		if took := time.Since(t0); took > 10*time.Second {
			t.Errorf("%v: refused after %v (allocated first?)", c.args, took)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("the refused export left %s (%v)", out, err)
	}
}
