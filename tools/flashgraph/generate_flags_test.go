package main

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/checkpoint"
)

// generate checks its flags and the prompt before printing anything; -stop
// ends the text before the stop string; a checkpoint whose logits are not
// finite is an error, not bytes.
func TestGenerateFlagsStopAndNaN(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	runCLI(t, tinyTrainArgs(trainData(t), out, "4")...)
	ckpt := filepath.Join(out, "ckpt")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-top-k", "5"}, "give a -temperature above 0"},
		{[]string{"-top-p", "0.9"}, "give a -temperature above 0"},
		{[]string{"-temperature", "-1"}, "-temperature must be"},
		{[]string{"-temperature", "1", "-top-p", "2"}, "-top-p must be in [0, 1]"},
		{[]string{"-max-new", "-3"}, "-max-new must be at least 0"},
		{[]string{"-prompt", strings.Repeat("x", 40)}, "give a prompt of at most 16 bytes"},
	} {
		args := append([]string{"generate", "-ckpt", ckpt}, c.args...)
		code, stdout, stderr := runCode(args...)
		if code != 1 || stdout != "" || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want %q)", c.args, code, stdout, stderr, c.want)
		}
		if strings.Contains(stderr, "-max-new -") && !strings.Contains(strings.Join(c.args, " "), "-max-new -") {
			t.Errorf("%v: the error names a -max-new the user did not give: %s", c.args, stderr)
		}
	}

	// -stop: the greedy text up to (not including) the stop string.
	full, _ := runCLI(t, "generate", "-ckpt", ckpt, "-prompt", "for ")
	gen := strings.TrimSuffix(strings.TrimPrefix(full, "for "), "\n")
	if len(gen) < 6 {
		t.Fatalf("greedy text %q too short to cut", gen)
	}
	stop := gen[3:5]
	cut := gen[:strings.Index(gen, stop)]
	got, _ := runCLI(t, "generate", "-ckpt", ckpt, "-prompt", "for ", "-stop", stop)
	if got != "for "+cut+"\n" {
		t.Errorf("-stop %q: %q, want %q (from %q)", stop, got, "for "+cut+"\n", full)
	}

	// A damaged checkpoint: NaN in a weight every position reads.
	p, _, err := checkpoint.LatestCheckpoint(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	ts, step, err := checkpoint.LoadCheckpoint(p)
	if err != nil {
		t.Fatal(err)
	}
	ts.Tensors["layers.0.wo"].F32[0] = float32(math.NaN())
	bad := filepath.Join(t.TempDir(), "bad")
	if _, err := checkpoint.SaveCheckpoint(bad, step, ts, 0); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCode("generate", "-ckpt", bad, "-prompt", "for ")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "not finite") {
		t.Errorf("NaN weights: exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}
}
