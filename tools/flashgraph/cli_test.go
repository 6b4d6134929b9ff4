package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// runCode runs the CLI in-process and returns the exit code and output.
func runCode(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := realMain(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestCompileWithoutFuseIsTheBuiltGraph(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")
	runCLI(t, "compile", "-config", "small", "-o", a)
	runCLI(t, "compile", "-config", "small", "-o", b)
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	if len(da) == 0 || !bytes.Equal(da, db) {
		t.Fatal("two compiles of the small config differ")
	}
	// The golden hash of the graph as the model builder makes it.
	want, err := os.ReadFile("../../model/testdata/small.sha256")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(da)
	if got := hex.EncodeToString(sum[:]); got != strings.TrimSpace(string(want)) {
		t.Fatalf("compile without -fuse: sha256 %s, the built graph's golden is %s", got, want)
	}
	g, err := graph.Parse(string(da))
	if err != nil {
		t.Fatal(err)
	}
	if graph.Format(g) != string(da) {
		t.Fatal("Parse then Format of the compiled file changes bytes")
	}
}

// Two separate processes must write the same bytes (no map-order or
// address-dependent output).
func TestCompileIsByteIdenticalAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "flashgraph")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var texts, dots [2][]byte
	for i := range 2 {
		txt, dot := filepath.Join(dir, "g.txt"), filepath.Join(dir, "g.dot")
		cmd := exec.Command(bin, "compile", "-fuse", "-config", "small", "-o", txt, "-dot", dot)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("compile: %v\n%s", err, out)
		}
		texts[i], _ = os.ReadFile(txt)
		dots[i], _ = os.ReadFile(dot)
	}
	if !bytes.Equal(texts[0], texts[1]) || !bytes.Equal(dots[0], dots[1]) || len(dots[0]) == 0 {
		t.Fatal("two processes wrote different text or DOT")
	}
}

func TestCompileFuseExplains(t *testing.T) {
	out := filepath.Join(t.TempDir(), "f.txt")
	stdout, _ := runCLI(t, "compile", "-fuse", "-explain", "-config", "small", "-o", out)
	if n := strings.Count(stdout, ": fused into "); n != 4 {
		t.Fatalf("want 4 fused Softmax lines, got %d:\n%s", n, stdout)
	}
	data, _ := os.ReadFile(out)
	g, err := graph.Parse(string(data))
	if err != nil {
		t.Fatal(err)
	}
	if c := g.CountOps(); c["FlashAttention"] != 4 || c["Softmax"] != 0 {
		t.Fatalf("fused small graph has %d FlashAttention and %d Softmax", c["FlashAttention"], c["Softmax"])
	}
}

func TestDotFuseShowsBeforeAndAfter(t *testing.T) {
	stdout, _ := runCLI(t, "dot", "-fuse")
	if !strings.Contains(stdout, "cluster_before") || !strings.Contains(stdout, "cluster_after") || !strings.Contains(stdout, "FlashAttention") {
		t.Fatal("dot -fuse does not show both graphs with the fused node")
	}
}

// An untrained model predicts nearly uniformly over the 256 bytes: its loss
// is close to ln 256. The weights are initialised with std 0.02, so logits
// stay within a few tenths and the loss within a few hundredths of it.
func TestRunPrintsLossNearLnVocab(t *testing.T) {
	stdout, _ := runCLI(t, "run", "-device", "cpu", "-fuse")
	var loss float64
	for _, line := range strings.Split(stdout, "\n") {
		if v, ok := strings.CutPrefix(line, "loss: float32[] = "); ok {
			if _, err := fmt.Sscan(v, &loss); err != nil {
				t.Fatalf("loss line %q: %v", line, err)
			}
		}
	}
	if want := math.Log(256); math.Abs(loss-want) > 0.05 {
		t.Fatalf("untrained tiny loss %v, want within 0.05 of ln 256 = %.4f:\n%s", loss, want, stdout)
	}
	if !strings.Contains(stdout, fmt.Sprintf("ln(vocab) = %.6g", math.Log(256))) {
		t.Errorf("run does not print ln(vocab):\n%s", stdout)
	}
}

func TestBadInputGivesClearErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.graph")
	os.WriteFile(bad, []byte("flashgraph 1\ngraph x\ninput a: float32[2]\nnode n = Neg(b) -> n: float32[2]\n"), 0o644)
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"compile", filepath.Join(dir, "missing.txt")}, 1, "no such file"},
		{[]string{"compile", bad}, 1, bad + ":4: node n: input b is not defined"},
		{[]string{"compile", "-config", "huge"}, 1, `unknown config "huge"`},
		{[]string{"compile", "-bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"compile", "a.txt", "-fuse"}, 2, "flags must come first"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"run", "-device", "tpu"}, 1, `-device "tpu"`},
		{[]string{"compile", "-batch", "-3"}, 1, "-batch must be positive"},
		{[]string{"run", "-dtype", "float16"}, 1, `-dtype "float16": want float32, float64 or bf16`},
		{[]string{"run", "-dtype", "bf16", "-device", "cpu"}, 1, "-dtype bf16 is mixed precision on CUDA"},
		{[]string{"train", "-dtype", "bf16", "-device", "cpu", "-steps", "1"}, 1, "-dtype bf16 is mixed precision on CUDA"},
		// Output into a missing folder names the flag and the folder.
		{[]string{"compile", "-config", "tiny", "-o", filepath.Join(dir, "no", "g.txt")}, 1, "-o " + filepath.Join(dir, "no", "g.txt") + ": folder " + filepath.Join(dir, "no") + ": no such file"},
		{[]string{"compile", "-config", "tiny", "-o", filepath.Join(dir, "no", "g.onnx")}, 1, "-o " + filepath.Join(dir, "no", "g.onnx") + ": folder"},
		{[]string{"dot", "-o", filepath.Join(dir, "no", "g.dot")}, 1, "-o " + filepath.Join(dir, "no", "g.dot") + ": folder"},
		// Model flags would be ignored for a graph FILE: refused.
		{[]string{"run", "-seq", "8", "-layers", "1", bad}, 1, bad + ": -layers, -seq: only for the model built from -config"},
		{[]string{"compile", "-dtype", "float64", bad}, 1, bad + ": -dtype: only for the model built from -config"},
	}
	for _, c := range cases {
		code, _, stderr := runCode(c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("flashgraph %s: exit %d (want %d), stderr %q lacks %q", strings.Join(c.args, " "), code, c.code, stderr, c.want)
		}
	}
	if code, stdout, _ := runCode("-h"); code != 0 || !strings.Contains(stdout, "compile") {
		t.Errorf("-h: exit %d, %q", code, stdout)
	}
}
