package main

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
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

// train FILE -recompute on a graph exported by PyTorch (no layer scopes in
// its node names) finds the layer by structure, says so, computes the same
// losses bit for bit and plans fewer bytes of activations; a graph with no
// layer to recompute is refused with the reason.
func TestTrainFileRecompute(t *testing.T) {
	data := trainData(t)
	fixture := filepath.Join("..", "..", "onnx", "testdata", "flashgraph_tiny_ts17.onnx")
	activations := regexp.MustCompile(`needs about [^(]+\(([0-9.]+) KiB activations`)
	var losses [2]string
	var acts [2]float64
	for i, rc := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "out")
		args := []string{"train", "-steps", "3", "-data", data, "-out", out, "-eval-every", "0", "-loss", "loss"}
		if rc {
			args = append(args, "-recompute")
		}
		_, stderr := runCLI(t, append(args, fixture)...)
		if got := strings.Contains(stderr, "found by structure): recomputes "); got != rc {
			t.Errorf("recompute=%v: stderr tells what was recomputed: %v\n%s", rc, got, stderr)
		}
		m := activations.FindStringSubmatch(stderr)
		if m == nil {
			t.Fatalf("recompute=%v: no memory line:\n%s", rc, stderr)
		}
		acts[i], _ = strconv.ParseFloat(m[1], 64)
		ts, _, err := checkpoint.LoadCheckpoint(filepath.Join(out, "ckpt", "step-00000003.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		losses[i] = ts.Metadata[checkpoint.MetaLosses]
	}
	if losses[0] != losses[1] {
		t.Errorf("losses %s, with -recompute %s", losses[0], losses[1])
	}
	if !(acts[1] < acts[0]) {
		t.Errorf("activations %.1f KiB, with -recompute %.1f KiB: no saving", acts[0], acts[1])
	}

	p := filepath.Join(t.TempDir(), "bigram.txt")
	if err := os.WriteFile(p, []byte(graphText(t, func(b *graph.Builder) {
		x := b.Input("tokens", graph.Int64, 2, 4)
		tab := b.Param("emb", graph.Float32, graph.Shape{256, 256}, graph.Normal(0.1, 1))
		b.Output(b.Rename(b.Gather(tab, x, 0), "logits"))
	})), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCode("train", "-steps", "2", "-data", data, "-out", filepath.Join(t.TempDir(), "o"), "-loss", "next-token", "-recompute", p)
	if code != 1 || !strings.Contains(stderr, "-recompute: no layer of m can be recomputed") || !strings.Contains(stderr, "train without -recompute") {
		t.Errorf("-recompute on a graph without layers: exit %d\n%s", code, stderr)
	}
}
