package main

import (
	"path/filepath"
	"strings"
	"testing"
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
