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

// train -recompute (full; alone, as when it was a switch) and
// -recompute=cheap write a training step that recomputes in the backward,
// record the mode in the checkpoint, say it in -explain and the summary, and
// on the CPU end in the same weights, moments and losses, bit for bit, as
// the same run without recomputation.
func TestTrainCLIRecompute(t *testing.T) {
	data := trainData(t)
	type mode struct {
		flag, name string
		attention  bool // the FlashAttention is recomputed too
	}
	modes := []mode{{"", "none", false}, {"-recompute=cheap", "cheap", false}, {"-recompute", "full", true}}
	ckpts := map[string]*checkpoint.Tensors{}
	for _, m := range modes {
		out := filepath.Join(t.TempDir(), "out")
		args := tinyTrainArgs(data, out, "4")
		if m.flag != "" {
			args = append(args, m.flag)
		}
		stdout, stderr := runCLI(t, args...)
		if got := strings.Contains(stderr, "recompute: info: layers.1: recomputes "); got != (m.name != "none") {
			t.Errorf("%s: stderr tells what was recomputed: %v\n%s", m.name, got, stderr)
		}
		if got := strings.Contains(stdout, "with -recompute "+m.name); got != (m.name != "none") {
			t.Errorf("%s: the summary names the recompute mode: %v\n%s", m.name, got, stdout)
		}
		ts, step, err := checkpoint.LoadCheckpoint(filepath.Join(out, "ckpt", "step-00000004.safetensors"))
		if err != nil || step != 4 {
			t.Fatalf("%s: checkpoint step %d, %v", m.name, step, err)
		}
		ckpts[m.name] = ts
		opts := ts.Metadata[checkpoint.MetaOptions]
		if got := strings.Contains(opts, `"recompute":true`); got != (m.name != "none") {
			t.Errorf("%s: checkpoint settings %s", m.name, opts)
		}
		if got := strings.Contains(opts, `"recompute_cheap":true`); got != (m.name == "cheap") {
			t.Errorf("%s: checkpoint settings %s", m.name, opts)
		}
		text, err := os.ReadFile(filepath.Join(out, "train_graph.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(text), "recompute/layers.1/attn/FlashAttention_0"); got != m.attention {
			t.Errorf("%s: train_graph.txt has a recomputed FlashAttention: %v", m.name, got)
		}
		if got := strings.Contains(string(text), "recompute/layers.1/"); got != (m.name != "none") {
			t.Errorf("%s: train_graph.txt has recomputed nodes: %v", m.name, got)
		}
		explain, _ := runCLI(t, append(args, "-explain")...)
		if !strings.Contains(explain, "recompute: "+m.name+" (") {
			t.Errorf("%s: train -explain does not say the recompute mode:\n%s", m.name, explain)
		}
	}
	a := ckpts["none"]
	for _, m := range modes[1:] {
		b := ckpts[m.name]
		if a.Metadata[checkpoint.MetaLosses] != b.Metadata[checkpoint.MetaLosses] {
			t.Errorf("losses %s, with -recompute %s %s", a.Metadata[checkpoint.MetaLosses], m.name, b.Metadata[checkpoint.MetaLosses])
		}
		if len(a.Tensors) != len(b.Tensors) {
			t.Fatalf("%d and %d checkpoint tensors", len(a.Tensors), len(b.Tensors))
		}
		for n, x := range a.Tensors {
			y := b.Tensors[n]
			if y == nil || y.Len() != x.Len() {
				t.Fatalf("%s missing or resized with -recompute %s", n, m.name)
			}
			for i := range x.Len() {
				if math.Float64bits(x.At(i)) != math.Float64bits(y.At(i)) {
					t.Fatalf("%s[%d] = %v, with -recompute %s %v", n, i, x.At(i), m.name, y.At(i))
				}
			}
		}
	}
}

// A recompute mode after a space would be read as train's FILE; it is
// refused with the spelling that works, as is an unknown mode.
func TestTrainRecomputeFlagErrors(t *testing.T) {
	data := trainData(t)
	out := filepath.Join(t.TempDir(), "out")
	for _, c := range []struct {
		args []string
		want string
	}{
		{tinyTrainArgs(data, out, "2", "-recompute", "cheap"), "write -recompute=cheap"},
		{tinyTrainArgs(data, out, "2", "-recompute=some"), `recompute mode "some": want none, cheap or full`},
		{[]string{"bench", "-train", "-recompute", "full"}, "write -recompute=full"},
	} {
		code, _, stderr := runCode(c.args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("flashgraph %s: exit %d, want an error saying %q\n%s", strings.Join(c.args, " "), code, c.want, stderr)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a refused run created %s", out)
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
