package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Train, then generate from the checkpoint with one command.
func TestGenerateFromTrainedCheckpoint(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	runCLI(t, tinyTrainArgs(trainData(t), out, "6")...)
	ckpt := filepath.Join(out, "ckpt")
	stdout, stderr := runCLI(t, "generate", "-ckpt", ckpt, "-prompt", "for ", "-max-new", "10")
	if !strings.HasPrefix(stdout, "for ") || len(stdout) != len("for ")+10+1 {
		t.Errorf("stdout %q: want the prompt, 10 bytes and a newline", stdout)
	}
	if !strings.Contains(stderr, "tokens/s decoding") {
		t.Errorf("no rate:\n%s", stderr)
	}
	// Greedy decoding is deterministic; a seeded sample is too.
	again, _ := runCLI(t, "generate", "-ckpt", ckpt, "-prompt", "for ", "-max-new", "10")
	s1, _ := runCLI(t, "generate", "-ckpt", ckpt, "-prompt", "for ", "-max-new", "10", "-temperature", "1", "-top-k", "20", "-seed", "3")
	s2, _ := runCLI(t, "generate", "-ckpt", ckpt, "-prompt", "for ", "-max-new", "10", "-temperature", "1", "-top-k", "20", "-seed", "3")
	if again != stdout || s1 != s2 {
		t.Errorf("not reproducible: %q %q, %q %q", stdout, again, s1, s2)
	}
	// float64 compute from a float32 checkpoint (the PyTorch comparison's mode).
	if f64, _ := runCLI(t, "generate", "-ckpt", ckpt, "-prompt", "for ", "-max-new", "10", "-dtype", "float64"); len(f64) != len(stdout) {
		t.Errorf("-dtype float64: %q", f64)
	}
	// -seq 16 in tinyTrainArgs: 16 positions in all.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-ckpt", ckpt, "-prompt", "for ", "-max-new", "14"}, "trained with a context of 16"},
		{[]string{"-ckpt", filepath.Join(out, "missing")}, "no such file"},
		{[]string{"-ckpt", t.TempDir()}, "no checkpoint in the folder"},
		{[]string{"-ckpt", filepath.Join(out, "graph.txt")}, "checkpoint"},
	} {
		code, _, stderr := runCode(append([]string{"generate"}, c.args...)...)
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("generate %v: exit %d, stderr %q lacks %q", c.args, code, stderr, c.want)
		}
	}
}

// generate -ckpt of a model trained from a graph FILE: the built-in tiny
// model exported to ONNX and trained as a FILE (the same weights, bit for
// bit, as -config tiny trained alike) writes the text the built-in model's
// KV-cached decoding writes, greedy and sampled; its own-loss export (a
// targets input, a loss output) generates too; a model whose logits read
// later tokens is refused, as is -dtype.
func TestGenerateFileTrained(t *testing.T) {
	data := trainData(t)
	dir := t.TempDir()
	builtin, fromFile, own := filepath.Join(dir, "builtin"), filepath.Join(dir, "file"), filepath.Join(dir, "own")
	runCLI(t, tinyTrainArgs(data, builtin, "4", "-lr", "3e-3")...)
	runCLI(t, "train", "-steps", "4", "-data", data, "-out", fromFile, "-eval-every", "3", "-lr", "3e-3", "-loss", "next-token", tinyONNX(t))
	runCLI(t, "train", "-steps", "4", "-data", data, "-out", own, "-eval-every", "3", "-lr", "3e-3", "-loss", "loss", tinyExport(t, false))
	for _, args := range [][]string{{"-prompt", "for i"}, {"-prompt", "su", "-temperature", "0.8", "-seed", "5", "-max-new", "9"}} {
		want, e0 := runCLI(t, append([]string{"generate", "-ckpt", filepath.Join(builtin, "ckpt")}, args...)...)
		for _, ck := range []string{fromFile, own} {
			got, e := runCLI(t, append([]string{"generate", "-ckpt", filepath.Join(ck, "ckpt")}, args...)...)
			if got != want {
				t.Errorf("%v from %s: %q, the built-in model's KV-cached decoding %q\n%s\n%s", args, ck, got, want, e, e0)
			}
			if !strings.Contains(e, "no KV cache, each new token runs the whole forward over its 16 positions") {
				t.Errorf("%v: no note of the uncached forward:\n%s", args, e)
			}
		}
	}
	if code, _, e := runCode("generate", "-ckpt", filepath.Join(fromFile, "ckpt"), "-dtype", "float64"); code != 1 || !strings.Contains(e, "-dtype is for the built-in models") {
		t.Errorf("-dtype on a FILE-trained model: exit %d\n%s", code, e)
	}

	// Logits that read every position (a mean over the sequence) are not
	// a causal model: refused before any text.
	p := filepath.Join(dir, "mean.txt")
	if err := os.WriteFile(p, []byte(graphText(t, func(b *graph.Builder) {
		x := b.Input("tokens", graph.Int64, 2, 4)
		tab := b.Param("emb", graph.Float32, graph.Shape{256, 8}, graph.Normal(0.1, 1))
		head := b.Param("head", graph.Float32, graph.Shape{8, 256}, graph.Normal(0.1, 2))
		h := b.Gather(tab, x, 0)
		b.Output(b.Rename(b.MatMul(b.Add(h, b.ReduceMean(h, true, 1)), head), "logits"))
	})), 0o644); err != nil {
		t.Fatal(err)
	}
	mean := filepath.Join(dir, "mean")
	runCLI(t, "train", "-steps", "1", "-data", data, "-out", mean, "-eval-every", "0", "-loss", "next-token", p)
	code, o, e := runCode("generate", "-ckpt", filepath.Join(mean, "ckpt"), "-prompt", "a")
	if code != 1 || o != "" || !strings.Contains(e, "is not causal: its logits at position 1 change with the tokens after it") {
		t.Errorf("a non-causal model: exit %d, %q\n%s", code, o, e)
	}
}
