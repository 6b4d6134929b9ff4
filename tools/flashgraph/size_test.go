package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/model"
)

// TestSizeFlagsCompile: the size flags build the model they say, with
// grouped-query attention fused in every layer, and bad sizes are refused
// with the flag named.
func TestSizeFlagsCompile(t *testing.T) {
	_, stderr := runCLI(t, "compile", "-fuse=require", "-dim", "48", "-heads", "6", "-kv-heads", "2", "-layers", "3", "-o", "-")
	if !strings.Contains(stderr, "FlashAttention 3, Softmax 0") {
		t.Errorf("-dim 48 -heads 6 -kv-heads 2 -layers 3: %s", stderr)
	}
	// The big GQA shape of issue 29 builds and plans (on the CPU, without
	// running it).
	stdout, _ := runCLI(t, "compile", "-fuse", "-plan", "-dim", "1024", "-layers", "24", "-heads", "16", "-kv-heads", "4")
	for _, want := range []string{"memory plan of tiny (forward)", "memory plan of tiny (training step", "float32[4,32,2048]"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("-dim 1024 plan lacks %q:\n%s", want, stdout)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-dim", "50"}, "-dim 50 is not divisible by -heads 4"},
		{[]string{"-heads", "16", "-kv-heads", "3"}, "-kv-heads 3 must divide -heads 16"},
		{[]string{"-kv-heads", "8"}, "-kv-heads 8 must divide -heads 4"},
		{[]string{"-vocab", "1"}, "-vocab must be at least 2"},
		{[]string{"-dim", "-8"}, "-dim must be positive"},
		{[]string{"-ffn", "1000000000"}, "-ffn 1000000000 is too large"},
		{[]string{"-dim", "36", "-heads", "4"}, "odd head width 9"},
		{[]string{"-head-dim", "7"}, "head_dim must be even"},
	} {
		if code, _, stderr := runCode(append([]string{"compile"}, c.args...)...); code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, stderr, c.want)
		}
	}
	// A graph FILE keeps its own sizes.
	g := filepath.Join(t.TempDir(), "g.txt")
	runCLI(t, "compile", "-o", g)
	if code, _, stderr := runCode("compile", "-kv-heads", "2", g); code == 0 || !strings.Contains(stderr, "-kv-heads: only for the model built from -config") {
		t.Errorf("-kv-heads with a FILE: exit %d, %s", code, stderr)
	}
	// -head-dim sets the per-head width apart from -dim / -heads.
	_, stderr = runCLI(t, "compile", "-heads", "2", "-head-dim", "8", "-o", "-")
	if !strings.Contains(stderr, "graph tiny:") {
		t.Errorf("-head-dim: %s", stderr)
	}
}

// TestTrainTokenFileAndResume: train on a raw uint16 token file with a
// vocabulary above 256 and a sized GQA model, in sequential order, then
// resume with no model flags: the checkpoint carries the model.
func TestTrainTokenFileAndResume(t *testing.T) {
	dir := t.TempDir()
	toks := make([]byte, 2*3000)
	for i := range 3000 {
		binary.LittleEndian.PutUint16(toks[2*i:], uint16((i*7)%300))
	}
	data := filepath.Join(dir, "train.bin")
	if err := os.WriteFile(data, toks, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	size := []string{"-dim", "32", "-heads", "4", "-kv-heads", "2", "-vocab", "300", "-data-order", "sequential"}
	stdout, stderr := runCLI(t, tinyTrainArgs(data, out, "2", size...)...)
	for _, want := range []string{"data: " + data + ": uint16 tokens (3.0k)", "data order: sequential: step i reads windows i·2 … i·2+1 of 17 tokens", "2 FlashAttention"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("train on a token file: stderr lacks %q:\n%s", want, stderr)
		}
	}
	// The loss is per token, not per byte.
	if !regexp.MustCompile(`val loss +[0-9.]+ at step 2 \(nats/token; [0-9.]+ bits/token\)`).MatchString(stdout) || strings.Contains(stdout, "/byte") {
		t.Errorf("the summary of a token run:\n%s", stdout)
	}
	_, stderr = runCLI(t, tinyTrainArgs(data, out, "3", "-resume", "-data-order", "sequential")...)
	if !strings.Contains(stderr, "resume: the model of") || !strings.Contains(stderr, "vocab 300, dim 32, 2 layers, 4 heads (2 key/value heads) of 8") || strings.Contains(stderr, "settings differ") && strings.Contains(stderr, "DataOrder") {
		t.Errorf("-resume without model flags:\n%s", stderr)
	}
	// generate needs no flags either; tokens above 255 print as ids.
	stdout, stderr = runCLI(t, "generate", "-ckpt", filepath.Join(out, "ckpt"), "-prompt", "ab", "-max-new", "3")
	if !regexp.MustCompile(`^ab(<\d+>){3}\n$`).MatchString(stdout) || !strings.Contains(stderr, "vocabulary of 300 tokens") {
		t.Errorf("generate from the token model: stdout %q, stderr %s", stdout, stderr)
	}
	// A flag that contradicts the checkpoint is refused by the restore.
	if code, _, stderr := runCode(tinyTrainArgs(data, out, "4", "-resume", "-dim", "64")...); code == 0 || !strings.Contains(stderr, "the checkpoint is of another model") {
		t.Errorf("-resume -dim 64: exit %d, %s", code, stderr)
	}
	// Tokens the vocabulary cannot embed are an error naming the first one.
	if code, _, stderr := runCode(tinyTrainArgs(data, filepath.Join(dir, "o2"), "1")...); code == 0 || !strings.Contains(stderr, "token 259 at token offset 37 of "+data) {
		t.Errorf("vocab 256, tokens up to 299: exit %d, %s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "o2")); !os.IsNotExist(err) {
		t.Errorf("a refused run made its -out folder: %v", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-data-format", "utf16"}, "-data-format: data format \"utf16\""},
		{[]string{"-data-order", "shuffled"}, "-data-order: data order \"shuffled\""},
	} {
		if code, _, stderr := runCode(tinyTrainArgs(data, filepath.Join(dir, "o3"), "1", append(c.args, "-vocab", "300")...)...); code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, %s", c.args, code, stderr)
		}
	}
}

// A model resized by flags takes the learning rate of the built-in config
// nearest its size, not the rate of the config it was resized from (tiny's
// 3e-3 makes a 24-layer, 1024-wide model diverge); an unresized config keeps
// its own.
func TestDefaultLRFollowsTheSize(t *testing.T) {
	tiny, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if lr, like := defaultPeakLR(tiny); lr != 3e-3 || like != "" {
		t.Errorf("tiny: %g (like %q), want 3e-3 of its own", lr, like)
	}
	big := tiny
	big.Dim, big.Layers, big.Heads, big.HeadDim, big.FFN = 1024, 24, 16, 64, 4096
	if lr, like := defaultPeakLR(big); lr != 3e-4 || like != "gpt2-medium" {
		t.Errorf("tiny resized to 1024×24: %g (like %q), want gpt2-medium's 3e-4", lr, like)
	}
}
