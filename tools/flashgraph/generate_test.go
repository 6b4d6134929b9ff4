package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/generate"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
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

// generate from a grouped-query checkpoint (train -kv-heads 2): the KV cache
// holds the 2 key/value heads, half the multi-head model's cache, and the
// greedy text is the one the training model's full forward gives without a
// cache (float64 on both sides, so no rounding tie decides a byte).
func TestGenerateGQACheckpoint(t *testing.T) {
	data := trainData(t)
	gqa, mha := filepath.Join(t.TempDir(), "gqa"), filepath.Join(t.TempDir(), "mha")
	runCLI(t, tinyTrainArgs(data, gqa, "4", "-kv-heads", "2", "-lr", "3e-3")...)
	runCLI(t, tinyTrainArgs(data, mha, "1")...)
	const prompt, n = "for ", 10
	stdout, stderr := runCLI(t, "generate", "-ckpt", filepath.Join(gqa, "ckpt"), "-prompt", prompt, "-max-new", fmt.Sprint(n), "-dtype", "float64")
	// tiny at -seq 16: 2 layers · K and V · 2 heads · 16 positions · 16 · 8 bytes.
	if want := "KV cache 16.0 KiB: keys and values of 2 layers at 2 key/value heads (of 4 query heads), 16 positions"; !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr)
	}
	if _, e := runCLI(t, "generate", "-ckpt", filepath.Join(mha, "ckpt"), "-prompt", prompt, "-max-new", "2"); !strings.Contains(e, "KV cache 16.0 KiB: keys and values of 2 layers at 4 key/value heads (of 4 query heads)") {
		t.Errorf("multi-head float32 cache:\n%s", e)
	}

	path, _, err := checkpoint.LatestCheckpoint(filepath.Join(gqa, "ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, weights, err := generate.FromCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KV() != 2 {
		t.Fatalf("checkpoint config has %d kv heads, want 2", cfg.KV())
	}
	cfg.DType = graph.Float64
	seq := []int64(nil)
	for i := range len(prompt) {
		seq = append(seq, int64(prompt[i]))
	}
	for range n {
		c := cfg
		c.Batch, c.Seq = 1, len(seq)
		g, err := model.Build(c)
		if err != nil {
			t.Fatal(err)
		}
		exe, err := cpu.New().Compile(g, backend.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for name, w := range weights {
			w64 := graph.NewTensor(graph.Float64, w.Shape)
			for i := range w.Len() {
				w64.Set(i, w.At(i))
			}
			if err := exe.SetInitializer(name, w64); err != nil {
				t.Fatal(err)
			}
		}
		tokens := graph.NewTensor(graph.Int64, graph.Shape{1, len(seq)})
		copy(tokens.I64, seq)
		res, err := exe.Run(map[string]*graph.Tensor{"tokens": tokens, "targets": tokens})
		exe.Close()
		if err != nil {
			t.Fatal(err)
		}
		V, last := cfg.Vocab, len(seq)-1
		best := 0
		for v := 1; v < V; v++ {
			if res["logits"].At(last*V+v) > res["logits"].At(last*V+best) {
				best = v
			}
		}
		seq = append(seq, int64(best))
	}
	want := make([]byte, len(seq))
	for i, b := range seq {
		want[i] = byte(b)
	}
	if stdout != string(want)+"\n" {
		t.Errorf("generate: %q\nfull forward: %q", stdout, string(want))
	}
}
