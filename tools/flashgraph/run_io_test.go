package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx"
)

// attentionModel is a small ONNX model made here: causal attention over
// float inputs q, k, v [1, 2, 8, 4] with the mask an input too ([8, 8],
// added to the scores), as some exporters leave it.
func attentionModel(t *testing.T, dir string) (path string, g *graph.Graph) {
	t.Helper()
	b := graph.NewBuilder("attn")
	q := b.Input("q", graph.Float32, 1, 2, 8, 4)
	k := b.Input("k", graph.Float32, 1, 2, 8, 4)
	v := b.Input("v", graph.Float32, 1, 2, 8, 4)
	mask := b.Input("mask", graph.Float32, 8, 8)
	b.Output(b.Rename(b.Attention(q, k, v, 0.5, mask).Out, "out"))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	data, err := onnx.ExportBytes(g)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "attn.onnx")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, g
}

func causalMaskTensor() *graph.Tensor {
	m := graph.NewTensor(graph.Float32, graph.Shape{8, 8})
	for i := range 8 {
		for j := i + 1; j < 8; j++ {
			m.F32[i*8+j] = float32(math.Inf(-1))
		}
	}
	return m
}

func writePB(t *testing.T, path, name string, x *graph.Tensor) {
	t.Helper()
	b, err := onnx.EncodeTensorProto(name, x)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// testDataSet writes test_data_set_0 for the attention model: random q, k,
// v, the causal mask, and the output the CPU reference computes. named
// false leaves the TensorProtos unnamed (matched by position).
func testDataSet(t *testing.T, dir string, g *graph.Graph, named bool) (string, map[string]*graph.Tensor) {
	t.Helper()
	set := filepath.Join(dir, "test_data_set_0")
	if err := os.MkdirAll(set, 0o755); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	feeds := map[string]*graph.Tensor{"mask": causalMaskTensor()}
	for _, n := range []string{"q", "k", "v"} {
		x := graph.NewTensor(graph.Float32, graph.Shape{1, 2, 8, 4})
		for i := range x.F32 {
			x.F32[i] = float32(rng.NormFloat64())
		}
		feeds[n] = x
	}
	for i, in := range g.Inputs {
		name := ""
		if named {
			name = in.Name
		}
		writePB(t, filepath.Join(set, fmt.Sprintf("input_%d.pb", i)), name, feeds[in.Name])
	}
	exe, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	outs, err := exe.Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	name := ""
	if named {
		name = "out"
	}
	writePB(t, filepath.Join(set, "output_0.pb"), name, outs["out"])
	return set, outs
}

func TestRunExpectTestDataSet(t *testing.T) {
	dir := t.TempDir()
	model, g := attentionModel(t, dir)
	for _, named := range []bool{true, false} {
		sub := filepath.Join(dir, fmt.Sprint(named))
		set, want := testDataSet(t, sub, g, named)
		outFile := filepath.Join(sub, "outs.safetensors")
		// The test data set's inputs, fused (the mask is an input, so the
		// attention stays unfused: the result is the composed one).
		stdout, _ := runCLI(t, "run", "-fuse", "-expect", set, "-outputs", outFile, model)
		if !strings.Contains(stdout, "expect out: ok; worst element [") || !strings.Contains(stdout, "expect: 1 outputs match") {
			t.Errorf("named %v: stdout\n%s", named, stdout)
		}
		got, err := readSafetensors(outFile)
		if err != nil {
			t.Fatal(err)
		}
		if r := compareTensors(got["out"], want["out"], 1e-6, 1e-7); !r.ok || len(got) != 1 {
			t.Errorf("named %v: -outputs holds %d tensors; out: %s", named, len(got), r)
		}
		// -inputs from the safetensors of the outputs' folder works too: a
		// safetensors file of the inputs.
		ins := map[string]*graph.Tensor{}
		for i, in := range g.Inputs {
			_, x, err := readTensorProtoFile(filepath.Join(set, fmt.Sprintf("input_%d.pb", i)))
			if err != nil {
				t.Fatal(err)
			}
			ins[in.Name] = x
		}
		inFile := filepath.Join(sub, "ins.safetensors")
		if err := writeSafetensors(inFile, ins, nil); err != nil {
			t.Fatal(err)
		}
		stdout, _ = runCLI(t, "run", "-inputs", inFile, "-expect", set, model)
		if !strings.Contains(stdout, "expect out: ok") {
			t.Errorf("named %v, -inputs safetensors: stdout\n%s", named, stdout)
		}
	}

	// A wrong expected output: non-zero exit, the worst element named.
	set := filepath.Join(dir, "true", "test_data_set_0")
	_, bad := testDataSet(t, filepath.Join(dir, "bad"), g, true)
	x := bad["out"]
	x.F32[1*8*4+5*4+2] += 0.01 // element [0, 1, 5, 2]
	badSet := filepath.Join(dir, "bad", "test_data_set_0")
	writePB(t, filepath.Join(badSet, "output_0.pb"), "out", x)
	code, stdout, stderr := runCode("run", "-expect", badSet, model)
	if code == 0 || !strings.Contains(stdout, "expect out: MISMATCH: 1 of 64 elements out of tolerance; worst element [0 1 5 2]") || !strings.Contains(stderr, "out differs beyond -atol 1e-07 + -rtol 0.001") {
		t.Errorf("perturbed output: exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	// A looser tolerance accepts it: -rtol and -atol are used.
	if code, stdout, _ := runCode("run", "-expect", badSet, "-atol", "0.02", model); code != 0 || !strings.Contains(stdout, "expect out: ok") {
		t.Errorf("-atol 0.02: exit %d, %s", code, stdout)
	}

	// Errors name the problem.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-inputs", filepath.Join(dir, "missing")}, "no such file"},
		{[]string{"-inputs", dir}, "no input_0.pb"},
		{[]string{"-inputs", filepath.Join(dir, "true", "outs.safetensors")}, "no tensor for input"},
		{[]string{"-expect", set, "-rtol", "-1"}, "-rtol and -atol must be at least 0"},
		{[]string{"-bind", "nope=" + filepath.Join(set, "input_0.pb")}, "no input of that name"},
		{[]string{"-bind", "mask=" + filepath.Join(set, "input_0.pb")}, "the tensor is float32[1,2,8,4], the input is float32[8,8]"},
		{[]string{"-bind", "mask"}, "want NAME=FILE"},
	} {
		args := append(append([]string{"run"}, c.args...), model)
		if code, _, stderr := runCode(args...); code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, stderr, c.want)
		}
	}
}

// TestBindFoldsTheMask: with the mask bound as a constant the attention
// fuses (it is a causal mask the passes can see), and run still matches the
// test data set, whose mask input is then skipped.
func TestBindFoldsTheMask(t *testing.T) {
	dir := t.TempDir()
	model, g := attentionModel(t, dir)
	set, _ := testDataSet(t, dir, g, true)
	maskFile := filepath.Join(dir, "mask.pb")
	writePB(t, maskFile, "mask", causalMaskTensor())
	if code, _, _ := runCode("compile", "-fuse=require", model); code == 0 {
		t.Fatal("attention with an input mask fused")
	}
	stdout, stderr := runCLI(t, "compile", "-fuse=require", "-bind", "mask="+maskFile, "-o", "-", model)
	if !strings.Contains(stderr, "FlashAttention 1") || strings.Contains(stdout, "input mask") {
		t.Errorf("bound mask: stderr %s", stderr)
	}
	stdout, _ = runCLI(t, "run", "-fuse", "-bind", "mask="+maskFile, "-expect", set, model)
	if !strings.Contains(stdout, "expect out: ok") {
		t.Errorf("fused run with the bound mask: %s", stdout)
	}
	// A safetensors file with the one tensor binds too.
	st := filepath.Join(dir, "mask.safetensors")
	if err := writeSafetensors(st, map[string]*graph.Tensor{"m": causalMaskTensor()}, nil); err != nil {
		t.Fatal(err)
	}
	if _, stderr := runCLI(t, "compile", "-fuse=require", "-bind", "mask="+st, "-o", "-", model); !strings.Contains(stderr, "FlashAttention 1") {
		t.Errorf("bound from safetensors: %s", stderr)
	}
}

// TestReadSafetensorsTensor: -bind's safetensors reader (run, compile and
// train) takes the tensor called NAME, else the file's only tensor, and
// names the tensors a file has when neither is there.
func TestReadSafetensorsTensor(t *testing.T) {
	dir := t.TempDir()
	mask := causalMaskTensor()
	one := filepath.Join(dir, "one.safetensors")
	two := filepath.Join(dir, "two.safetensors")
	if err := writeSafetensors(one, map[string]*graph.Tensor{"m": mask}, nil); err != nil {
		t.Fatal(err)
	}
	if err := writeSafetensors(two, map[string]*graph.Tensor{"mask": mask, "x": graph.NewTensor(graph.Float32, graph.Shape{2})}, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, name string }{{one, "mask"}, {two, "mask"}} {
		if got, err := readSafetensorsTensor(c.path, c.name); err != nil || !got.Type().Equal(mask.Type()) {
			t.Errorf("%s %s: %v, %v", c.path, c.name, got, err)
		}
	}
	if _, err := readSafetensorsTensor(two, "y"); err == nil || !strings.Contains(err.Error(), "no tensor called y (it has mask, x)") {
		t.Errorf("missing name: %v", err)
	}
	model, _ := attentionModel(t, dir)
	code, _, stderr := runCode("train", "-bind", "y="+two, "-steps", "1", "-out", filepath.Join(dir, "run"), model)
	if code == 0 || !strings.Contains(stderr, "-bind y: "+two+" has no tensor called y") {
		t.Errorf("train -bind, missing name: exit %d: %s", code, stderr)
	}
}

func TestGraphBindErrors(t *testing.T) {
	_, g := attentionModel(t, t.TempDir())
	if _, err := graph.Bind(g, "q", graph.NewTensor(graph.Int64, graph.Shape{1, 2, 8, 4})); err == nil || !strings.Contains(err.Error(), "only float to float") {
		t.Errorf("int64 into a float input: %v", err)
	}
	big := graph.NewTensor(graph.Int64, graph.Shape{1})
	big.I64[0] = 1<<53 + 1
	b := graph.NewBuilder("ints")
	in := b.Input("i", graph.Int64, 1)
	b.Output(b.Op("Identity", nil, in))
	gi, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := graph.Bind(gi, "i", big); err == nil || !strings.Contains(err.Error(), "beyond") {
		t.Errorf("int64 beyond 2^53: %v", err)
	}
	// The original graph is untouched by a bind.
	before := graph.Format(g)
	if _, err := graph.Bind(g, "mask", causalMaskTensor()); err != nil {
		t.Fatal(err)
	}
	if graph.Format(g) != before {
		t.Error("Bind modified its graph")
	}
}

// TestRunMemoryGuard: a forward pass whose plan cannot fit is refused before
// anything is allocated (2 TiB of activations: more than any machine has).
func TestRunMemoryGuard(t *testing.T) {
	if _, _, ok := availableMemory(cpu.New()); !ok {
		t.Skip("the available memory cannot be read here: the guard lets everything through")
	}
	code, _, stderr := runCode("run", "-seq", "65536", "-batch", "16")
	if code == 0 || !strings.Contains(stderr, "memory: the forward pass of tiny needs about") || !strings.Contains(stderr, "not enough memory") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// One -bind for run, compile and train FILE: NAME=FILE pairs, an input bound
// twice refused, applied in the order of the names.
func TestBindFlag(t *testing.T) {
	b := bindFlag{}
	for _, s := range []string{"b=y.pb", "a=x.safetensors"} {
		if err := b.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Set("a=z.pb"); err == nil || !strings.Contains(err.Error(), "input a bound twice") {
		t.Errorf("second -bind a: %v, want it refused", err)
	}
	for _, bad := range []string{"a", "=x.pb", "a="} {
		if err := b.Set(bad); err == nil {
			t.Errorf("-bind %q accepted", bad)
		}
	}
	if got := b.String(); got != "a=x.safetensors,b=y.pb" {
		t.Errorf("String() = %q", got)
	}
	if n := b.names(); len(n) != 2 || !n["a"] || !n["b"] {
		t.Errorf("names() = %v", n)
	}
}
