package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/checkpoint"
)

// train -recompute writes a training step that recomputes each layer's
// forward, records the setting in the checkpoint, and on the CPU ends in the
// same weights, moments and losses, bit for bit, as the same run without it.
func TestTrainCLIRecompute(t *testing.T) {
	data := trainData(t)
	ckpts := map[bool]*checkpoint.Tensors{}
	for _, rc := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "out")
		args := tinyTrainArgs(data, out, "4")
		if rc {
			args = append(args, "-recompute")
		}
		_, stderr := runCLI(t, args...)
		if got := strings.Contains(stderr, "recompute: info: layers.1: recomputes "); got != rc {
			t.Errorf("recompute=%v: stderr tells what was recomputed: %v\n%s", rc, got, stderr)
		}
		ts, step, err := checkpoint.LoadCheckpoint(filepath.Join(out, "ckpt", "step-00000004.safetensors"))
		if err != nil || step != 4 {
			t.Fatalf("recompute=%v: checkpoint step %d, %v", rc, step, err)
		}
		ckpts[rc] = ts
		if got := strings.Contains(ts.Metadata[checkpoint.MetaOptions], `"recompute":true`); got != rc {
			t.Errorf("recompute=%v: checkpoint settings %s", rc, ts.Metadata[checkpoint.MetaOptions])
		}
		text, err := os.ReadFile(filepath.Join(out, "train_graph.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(text), "recompute/layers.1/attn/FlashAttention_0"); got != rc {
			t.Errorf("recompute=%v: train_graph.txt has a recomputed FlashAttention: %v", rc, got)
		}
	}
	a, b := ckpts[false], ckpts[true]
	if a.Metadata[checkpoint.MetaLosses] != b.Metadata[checkpoint.MetaLosses] {
		t.Errorf("losses %s, with -recompute %s", a.Metadata[checkpoint.MetaLosses], b.Metadata[checkpoint.MetaLosses])
	}
	if len(a.Tensors) != len(b.Tensors) {
		t.Fatalf("%d and %d checkpoint tensors", len(a.Tensors), len(b.Tensors))
	}
	for n, x := range a.Tensors {
		y := b.Tensors[n]
		if y == nil || y.Len() != x.Len() {
			t.Fatalf("%s missing or resized with -recompute", n)
		}
		for i := range x.Len() {
			if math.Float64bits(x.At(i)) != math.Float64bits(y.At(i)) {
				t.Fatalf("%s[%d] = %v, with -recompute %v", n, i, x.At(i), y.At(i))
			}
		}
	}
}

// compile -plan shows what -recompute saves on the training step.
func TestCompilePlanShowsRecompute(t *testing.T) {
	stdout, _ := runCLI(t, "compile", "-fuse", "-plan")
	if !strings.Contains(stdout, "with train -recompute: activation arena") {
		t.Errorf("compile -fuse -plan does not show the recomputing step:\n%s", stdout)
	}
}
