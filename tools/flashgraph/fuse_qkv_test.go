package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/checkpoint"
)

// train -fuse-qkv trains the step with each layer's q, k and v as one GEMM
// (train_graph.txt), records it in the checkpoint under the same tensor
// names as without it, and -explain says what it merged; compile -fuse-qkv
// -explain shows the pass in the pipeline and its firings.
func TestTrainFuseQKVFlag(t *testing.T) {
	data := trainData(t)
	names := map[bool][]string{}
	for _, q := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "out")
		args := tinyTrainArgs(data, out, "3")
		if q {
			args = append(args, "-fuse-qkv")
		}
		runCLI(t, args...)
		text, err := os.ReadFile(filepath.Join(out, "train_graph.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(text), "= Concat(layers.0.wq, layers.0.wk, layers.0.wv)"); got != q {
			t.Errorf("fuse-qkv=%v: train_graph.txt concatenates the q/k/v weights: %v", q, got)
		}
		ts, _, err := checkpoint.LoadCheckpoint(filepath.Join(out, "ckpt", "step-00000003.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(ts.Metadata[checkpoint.MetaOptions], `"fuse_qkv":true`); got != q {
			t.Errorf("fuse-qkv=%v: checkpoint settings %s", q, ts.Metadata[checkpoint.MetaOptions])
		}
		for n := range ts.Tensors {
			names[q] = append(names[q], n)
		}
		explain, _ := runCLI(t, append(args, "-explain")...)
		want := map[bool]string{false: "fuse_qkv: off", true: "fuse_qkv: 2 merged"}[q]
		if !strings.Contains(explain, want) {
			t.Errorf("train -explain does not say %q:\n%s", want, explain)
		}
	}
	if len(names[true]) != len(names[false]) || len(names[true]) == 0 {
		t.Errorf("checkpoint tensors: %d with -fuse-qkv, %d without", len(names[true]), len(names[false]))
	}

	stdout, _ := runCLI(t, "compile", "-fuse", "-fuse-qkv", "-explain")
	for _, want := range []string{"pipeline fuse+fuse_qkv: check_consts, canonicalize, fuse_attention, dce, fuse_qkv",
		"fuse_qkv: layers.1/attn/MatMul_0 (MatMul): fired shared-input-matmuls", "fused into layers.1/attn/FlashAttention_0"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("compile -fuse -fuse-qkv -explain lacks %q:\n%s", want, stdout)
		}
	}
}

// bench -train refuses a -fuse-qkv or -torch-modes value it does not know
// before timing anything (no GPU needed to say so).
func TestBenchTrainQKVAndModeFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "-train", "-fuse-qkv", "maybe"}, `-fuse-qkv "maybe": want off, on or both`},
		{[]string{"bench", "-train", "-torch-modes", "eager,autotune"}, `-torch-modes: unknown mode "autotune" (want eager, compile, max-autotune)`},
		{[]string{"compile", "-fuse-qkv", "-passes", "dce"}, "-fuse-qkv with -passes: name fuse_qkv in -passes instead"},
		{[]string{"bench", "-train", "-seq", "-8"}, "-batch, -seq and -warmup must be at least 0"},
	} {
		code, _, stderr := runCode(c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("flashgraph %s: exit %d, want an error saying %q\n%s", strings.Join(c.args, " "), code, c.want, stderr)
		}
	}
}
