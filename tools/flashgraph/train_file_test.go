package main

import (
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
	"github.com/flashgraph/flashgraph/onnx"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
	"github.com/flashgraph/flashgraph/passes"
)

// logitsOnly is g without its loss: the targets input and the loss nodes
// gone, logits the only output (what an exporter gives for inference).
func logitsOnly(t *testing.T, g *graph.Graph) *graph.Graph {
	t.Helper()
	c := g.Clone()
	c.Outputs = []*graph.Value{c.Value("logits")}
	d, err := (passes.DCE{}).Run(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ins []*graph.Value
	for _, in := range d.Inputs {
		if in.Name != "targets" {
			ins = append(ins, in)
		}
	}
	d.Inputs = ins
	if err := graph.Verify(d); err != nil {
		t.Fatal(err)
	}
	return d
}

// tinyONNX writes the tiny model (seq 16, batch 2, seed 0), logits only, as
// an .onnx file.
func tinyONNX(t *testing.T) string {
	t.Helper()
	return tinyExport(t, true)
}

// tinyExport writes the tiny model as an .onnx file: logits only, or as
// built (inputs tokens and targets, outputs loss and logits).
func tinyExport(t *testing.T, logitsOnlyGraph bool) string {
	t.Helper()
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Seq, cfg.Batch = 16, 2
	g, err := model.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if logitsOnlyGraph {
		g = logitsOnly(t, g)
	}
	p := filepath.Join(t.TempDir(), "tiny.onnx")
	if err := onnx.ExportFile(g, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// ckptLosses reads the per-step losses a checkpoint records.
func ckptLosses(t *testing.T, path string) []float64 {
	t.Helper()
	ts, _, err := checkpoint.LoadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	var l []float64
	if err := json.Unmarshal([]byte(ts.Metadata[checkpoint.MetaLosses]), &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// Our tiny model exported to ONNX without its loss, then trained as a FILE
// with -loss next-token, trains exactly like -config tiny: the appended loss
// is the built-in one, the params are the same, so are the batches.
func TestTrainFileMatchesBuiltIn(t *testing.T) {
	data := trainData(t)
	file := tinyONNX(t)
	dir := t.TempDir()
	builtin, fromFile := filepath.Join(dir, "builtin"), filepath.Join(dir, "file")
	runCLI(t, tinyTrainArgs(data, builtin, "4", "-lr", "3e-3")...)
	_, stderr := runCLI(t, "train", "-steps", "4", "-data", data, "-out", fromFile, "-eval-every", "3", "-lr", "3e-3", "-loss", "next-token", file)
	for _, want := range []string{"loss loss appended", "FlashAttention", "tokens tokens"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	a := ckptLosses(t, filepath.Join(builtin, "ckpt", "step-00000004.safetensors"))
	b := ckptLosses(t, filepath.Join(fromFile, "ckpt", "step-00000004.safetensors"))
	if len(a) != 4 || len(b) != 4 {
		t.Fatalf("losses: built-in %v, file %v", a, b)
	}
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("step %d: built-in loss %v, file %v", i+1, a[i], b[i])
		}
	}
	// The model exported with its own loss trains the same with -loss loss
	// (its targets input found by name).
	ownLoss := filepath.Join(dir, "own")
	runCLI(t, "train", "-steps", "4", "-data", data, "-out", ownLoss, "-eval-every", "3", "-lr", "3e-3", "-loss", "loss", tinyExport(t, false))
	if c := ckptLosses(t, filepath.Join(ownLoss, "ckpt", "step-00000004.safetensors")); len(c) != 4 || c[0] != a[0] || c[3] != a[3] {
		t.Errorf("-loss loss: losses %v, built-in %v", c, a)
	}

	// The graph trained is fused and shows the appended loss.
	fwd, err := os.ReadFile(filepath.Join(fromFile, "graph.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"FlashAttention", "SoftmaxCrossEntropyLoss", "input targets"} {
		if !strings.Contains(string(fwd), want) {
			t.Errorf("graph.txt lacks %q", want)
		}
	}
	if about, err := os.ReadFile(filepath.Join(fromFile, "train_source.txt")); err != nil || !strings.Contains(string(about), "SoftmaxCrossEntropyLoss(") {
		t.Errorf("train_source.txt: %v\n%s", err, about)
	}

	// -resume needs no flags and no FILE: the checkpoint folder keeps the model.
	_, stderr = runCLI(t, "train", "-resume", "-steps", "6", "-data", data, "-out", fromFile, "-eval-every", "3", "-lr", "3e-3")
	if !strings.Contains(stderr, "resumed from") || !strings.Contains(stderr, "graph: ") {
		t.Errorf("resume without FILE:\n%s", stderr)
	}
	if l := ckptLosses(t, filepath.Join(fromFile, "ckpt", "step-00000006.safetensors")); len(l) != 6 || l[3] != b[3] {
		t.Errorf("resumed losses %v", l)
	}

	// A checkpoint of another model is refused, both ways.
	code, _, e := runCode("train", "-resume", "-steps", "8", "-data", data, "-out", builtin, "-lr", "3e-3", "-loss", "next-token", file)
	if code == 0 || !strings.Contains(e, "built-in model") {
		t.Errorf("a FILE resuming a built-in checkpoint: exit %d\n%s", code, e)
	}
	code, _, e = runCode("train", "-resume", "-steps", "8", "-data", data, "-out", fromFile, "-lr", "3e-3", "-loss", "next-token", "-freeze", "lm_head", file)
	if code == 0 || !strings.Contains(e, "another model") || !strings.Contains(e, "-freeze") {
		t.Errorf("resuming with other params: exit %d\n%s", code, e)
	}
}

// The GPT-2-like fixture registers its causal mask as a float tril buffer:
// it is not trained, and the attention fuses in training.
func TestTrainFileTrilBufferFuses(t *testing.T) {
	fixture := filepath.Join("..", "..", "onnx", "testdata", "byom", "gpt2_tril.onnx")
	stdout, _ := runCLI(t, "train", "-explain", "-loss", "next-token", fixture)
	for _, want := range []string{"input_ids", "appended", "7 trained", "fused"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("-explain lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "not fused") || strings.Contains(stdout, "attn.bias") {
		t.Errorf("-explain:\n%s", stdout)
	}
	out := filepath.Join(t.TempDir(), "out")
	_, stderr := runCLI(t, "train", "-steps", "2", "-data", trainData(t), "-out", out, "-eval-every", "0", "-loss", "next-token", "-fuse=require", fixture)
	if !strings.Contains(stderr, "1 FlashAttention, 0 Softmax") {
		t.Errorf("the attention did not fuse:\n%s", stderr)
	}
	// generate runs the FILE-trained model's whole forward for every byte
	// (no KV cache), and says so.
	code, o, e := runCode("generate", "-ckpt", filepath.Join(out, "ckpt"), "-prompt", "ab")
	if code != 0 || !strings.HasPrefix(o, "ab") || len(o) != len("ab")+7+1 || !strings.Contains(e, "no KV cache") {
		t.Errorf("generate of a FILE-trained checkpoint: exit %d, %q\n%s", code, o, e)
	}
}

// Bad input is refused with a clear error and leaves -out untouched.
func TestTrainFileBadInput(t *testing.T) {
	dir := t.TempDir()
	data := trainData(t)
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A graph text with no params.
	noParams := write("noparams.txt", graphText(t, func(b *graph.Builder) {
		x := b.Input("tokens", graph.Int64, 2, 4)
		tab := b.Const("table", graph.Float32, graph.Shape{256, 8}, graph.Ones())
		b.Output(b.Rename(b.Gather(tab, x, 0), "logits"))
	}))
	// Logits whose last axis is not the table's rows; a non-scalar "loss";
	// an extra input.
	model := func(vocab, logitsV int, extra bool) string {
		return graphText(t, func(b *graph.Builder) {
			x := b.Input("tokens", graph.Int64, 2, 4)
			tab := b.Param("emb", graph.Float32, graph.Shape{vocab, 8}, graph.Normal(0.1, 1))
			w := b.Param("head", graph.Float32, graph.Shape{8, logitsV}, graph.Normal(0.1, 2))
			h := b.Gather(tab, x, 0)
			if extra {
				h = b.Add(h, b.Input("bias", graph.Float32, 2, 4, 8))
			}
			l := b.Rename(b.MatMul(h, w), "logits")
			b.Output(l, b.Rename(b.ReduceMean(l, false, 2), "notscalar"))
		})
	}
	// A graph with its own loss whose targets input has another name.
	ownLoss := write("ownloss.txt", graphText(t, func(b *graph.Builder) {
		x := b.Input("tokens", graph.Int64, 2, 4)
		y := b.Input("next", graph.Int64, 2, 4)
		tab := b.Param("emb", graph.Float32, graph.Shape{256, 256}, graph.Normal(0.1, 1))
		l := b.Reshape(b.Gather(tab, x, 0), 8, 256)
		b.Output(b.Rename(b.Op("SoftmaxCrossEntropyLoss", nil, l, b.Reshape(y, 8)), "loss"))
	}))
	badVocab := write("badvocab.txt", model(256, 100, false))
	good := write("good.txt", model(256, 256, false))
	unbound := write("unbound.txt", model(256, 256, true))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-loss", "next-token", noParams}, "no float initializers"},
		{[]string{"-loss", "next-token", badVocab}, "is not the vocabulary"},
		{[]string{"-loss", "notscalar", good}, "must be a float scalar"},
		{[]string{"-loss", "nope", good}, "not a graph output"},
		{[]string{good}, "no loss"},
		{[]string{"-loss", "next-token", unbound}, "bias float32[2,4,8] are not bound"},
		{[]string{"-loss", "next-token", "-bind", "nope=x.safetensors", good}, "nope"},
		{[]string{"-loss", "next-token", "-freeze", "zz*", good}, "matches no float param"},
		{[]string{"-loss", "next-token", "-freeze", "*", good}, "no param left to train"},
		{[]string{"-loss", "next-token", "-config", "small", good}, "-config"},
		{[]string{"-loss", "loss", "-tokens", "tokens", ownLoss}, "-targets next"},
		{[]string{"-loss", "next-token", "-dtype", "float64", good}, "-dtype"},
		{[]string{"-loss", "next-token", "-bind", "bias=" + filepath.Join(dir, "none.safetensors"), unbound}, "-bind bias"},
		{[]string{"-loss", "next-token"}, "only with a graph FILE"},
	} {
		out := filepath.Join(dir, "out")
		args := append([]string{"train", "-steps", "2", "-data", data, "-out", out}, c.args...)
		code, _, stderr := runCode(args...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, want an error with %q:\n%s", c.args, code, c.want, stderr)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%v: -out was created", c.args)
		}
	}
}

// ... and with -targets it trains.
func TestTrainFileTargets(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "own.txt")
	if err := os.WriteFile(p, []byte(graphText(t, func(b *graph.Builder) {
		x := b.Input("tokens", graph.Int64, 2, 4)
		y := b.Input("next", graph.Int64, 2, 4)
		tab := b.Param("emb", graph.Float32, graph.Shape{256, 256}, graph.Normal(0.1, 1))
		l := b.Reshape(b.Gather(tab, x, 0), 8, 256)
		b.Output(b.Rename(b.Op("SoftmaxCrossEntropyLoss", nil, l, b.Reshape(y, 8)), "loss"))
	})), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	_, stderr := runCLI(t, "train", "-steps", "3", "-data", trainData(t), "-out", out, "-eval-every", "0", "-lr", "0.1", "-loss", "loss", "-targets", "next", p)
	l := ckptLosses(t, filepath.Join(out, "ckpt", "step-00000003.safetensors"))
	// A bigram table learns: at lr 0.1 the loss falls from about ln 256.
	if len(l) != 3 || !(l[0] > 5 && l[0] < 6) || !(l[2] < l[0]) {
		t.Errorf("losses %v\n%s", l, stderr)
	}
}

func graphText(t *testing.T, build func(b *graph.Builder)) string {
	t.Helper()
	b := graph.NewBuilder("m")
	build(b)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return graph.Format(g)
}

// -bind gives an input a fixed value from a safetensors file; the checkpoint
// folder keeps it, so -resume needs no flags, and export's reference feeds it.
func TestTrainFileBind(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.txt")
	text := graphText(t, func(b *graph.Builder) {
		x := b.Input("tokens", graph.Int64, 2, 4)
		tab := b.Param("emb", graph.Float32, graph.Shape{256, 8}, graph.Normal(0.1, 1))
		w := b.Param("head", graph.Float32, graph.Shape{8, 256}, graph.Normal(0.1, 2))
		h := b.Add(b.Gather(tab, x, 0), b.Input("bias", graph.Float32, 2, 4, 8))
		b.Output(b.Rename(b.MatMul(h, w), "logits"))
	})
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	bias := graph.NewTensor(graph.Float32, graph.Shape{2, 4, 8})
	for i := range bias.Len() {
		bias.Set(i, float64(i%7)/7)
	}
	bf := filepath.Join(dir, "bias.safetensors")
	if err := checkpoint.WriteFileAtomic(bf, func(w io.Writer) error {
		return checkpoint.WriteSafetensors(w, &checkpoint.Tensors{Tensors: map[string]*graph.Tensor{"x": bias}, Metadata: map[string]string{}})
	}); err != nil {
		t.Fatal(err)
	}
	data := trainData(t)
	out := filepath.Join(dir, "out")
	stdout, _ := runCLI(t, "train", "-explain", "-loss", "next-token", "-bind", "bias="+bf, p)
	if !strings.Contains(stdout, "bound:   input bias") {
		t.Errorf("-explain does not show the binding:\n%s", stdout)
	}
	runCLI(t, "train", "-steps", "2", "-data", data, "-out", out, "-eval-every", "0", "-loss", "next-token", "-bind", "bias="+bf, p)
	_, stderr := runCLI(t, "train", "-resume", "-steps", "3", "-data", data, "-out", out, "-eval-every", "0")
	if !strings.Contains(stderr, "resumed from") {
		t.Errorf("resume:\n%s", stderr)
	}
	// Another value for the input is another model.
	other := filepath.Join(dir, "other.safetensors")
	bias.Set(0, 5)
	if err := checkpoint.WriteFileAtomic(other, func(w io.Writer) error {
		return checkpoint.WriteSafetensors(w, &checkpoint.Tensors{Tensors: map[string]*graph.Tensor{"bias": bias}, Metadata: map[string]string{}})
	}); err != nil {
		t.Fatal(err)
	}
	code, _, e := runCode("train", "-resume", "-steps", "4", "-data", data, "-out", out, "-loss", "next-token", "-bind", "bias="+other, p)
	if code == 0 || !strings.Contains(e, "another model") || !strings.Contains(e, "-bind") {
		t.Errorf("resume with another bound value: exit %d\n%s", code, e)
	}
	ref := filepath.Join(dir, "ref.safetensors")
	runCLI(t, "export", "-ckpt", filepath.Join(out, "ckpt"), "-o", filepath.Join(dir, "m.onnx"), "-reference", ref)
	rs, err := checkpoint.ReadSafetensorsFile(ref)
	if err != nil {
		t.Fatal(err)
	}
	if got := rs.Tensors["input.bias"]; got == nil || got.At(0) != 0 || got.At(1) != float64(float32(1.0/7)) {
		t.Errorf("the reference does not feed the bound bias: %v", got)
	}
}

// A model PyTorch exported with its own loss (the fixtures of onnx/testdata,
// TorchScript opset 17 and dynamo opset 18) trains with -loss loss, its
// attention fused; -loss next-token on it says what to do instead.
func TestTrainFileTorchExports(t *testing.T) {
	data := trainData(t)
	for _, f := range []string{"flashgraph_tiny_ts17.onnx", "flashgraph_tiny_dynamo18.onnx"} {
		p := filepath.Join("..", "..", "onnx", "testdata", f)
		out := filepath.Join(t.TempDir(), "out")
		_, stderr := runCLI(t, "train", "-steps", "2", "-data", data, "-out", out, "-eval-every", "0", "-loss", "loss", "-fuse=require", p)
		if !strings.Contains(stderr, "1 FlashAttention, 0 Softmax") || !strings.Contains(stderr, "step 2/2") {
			t.Errorf("%s:\n%s", f, stderr)
		}
		code, _, e := runCode("train", "-steps", "2", "-data", data, "-out", out, "-loss", "next-token", p)
		if code == 0 || !strings.Contains(e, "-loss loss trains it") {
			t.Errorf("%s with -loss next-token: exit %d\n%s", f, code, e)
		}
	}
}

// An ONNX model with symbolic dimensions trains once -dims sizes them; the
// sizes are part of the model's identity in the checkpoint.
func TestTrainFileDims(t *testing.T) {
	m, err := onnxpb.Load(filepath.Join("..", "..", "onnx", "testdata", "byom", "gpt2_tril.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	in := m.Graph.Input[0].Type.Tensor.Shape
	in.Dim[0] = onnxpb.Dimension{Param: "batch"}
	in.Dim[1] = onnxpb.Dimension{Param: "seq"}
	dir := t.TempDir()
	p := filepath.Join(dir, "dyn.onnx")
	if err := os.WriteFile(p, onnxpb.Encode(m), 0o644); err != nil {
		t.Fatal(err)
	}
	data := trainData(t)
	out := filepath.Join(dir, "out")
	code, _, e := runCode("train", "-steps", "2", "-data", data, "-out", out, "-loss", "next-token", p)
	if code == 0 || !strings.Contains(e, `"batch"`) || !strings.Contains(e, "-dims") {
		t.Errorf("symbolic dims without -dims: exit %d\n%s", code, e)
	}
	runCLI(t, "train", "-steps", "2", "-data", data, "-out", out, "-eval-every", "0", "-loss", "next-token", "-dims", "batch=2,seq=8", p)
	runCLI(t, "train", "-resume", "-steps", "3", "-data", data, "-out", out, "-eval-every", "0")
	runCLI(t, "export", "-ckpt", filepath.Join(out, "ckpt"), "-o", filepath.Join(dir, "dyn_trained.onnx"))
}

// On CUDA (skipped without a GPU): the tiny model exported to ONNX trains
// with -loss next-token like -config tiny does, float32 and bf16, and the
// GPT-2-like fixture with a tril buffer trains fused in bf16.
func TestTrainFileCUDA(t *testing.T) {
	if why := cuda.Available(); why != nil {
		t.Skipf("no CUDA: %v", why)
	}
	data := trainData(t)
	file := tinyONNX(t)
	for _, dtype := range []string{"float32", "bf16"} {
		dir := t.TempDir()
		builtin, fromFile := filepath.Join(dir, "builtin"), filepath.Join(dir, "file")
		runCLI(t, tinyTrainArgs(data, builtin, "6", "-device", "cuda", "-dtype", dtype)...)
		runCLI(t, "train", "-steps", "6", "-data", data, "-out", fromFile, "-eval-every", "3", "-device", "cuda", "-dtype", dtype, "-lr", "3e-3", "-loss", "next-token", file)
		a := ckptLosses(t, filepath.Join(builtin, "ckpt", "step-00000006.safetensors"))
		b := ckptLosses(t, filepath.Join(fromFile, "ckpt", "step-00000006.safetensors"))
		if len(a) != 6 || len(b) != 6 {
			t.Fatalf("%s: losses %v and %v", dtype, a, b)
		}
		// The same graph on the same device: the first step (before any
		// update) is the same forward pass; later steps may differ only by
		// the order of atomic additions in the backward.
		if a[0] != b[0] {
			t.Errorf("%s: step 1 loss %v built-in, %v from the file", dtype, a[0], b[0])
		}
		for i := range a {
			if d := math.Abs(a[i] - b[i]); d > 1e-3*math.Abs(a[i]) {
				t.Errorf("%s: step %d loss %v built-in, %v from the file", dtype, i+1, a[i], b[i])
			}
		}
	}
	fixture := filepath.Join("..", "..", "onnx", "testdata", "byom", "gpt2_tril.onnx")
	_, stderr := runCLI(t, "train", "-steps", "4", "-data", data, "-out", filepath.Join(t.TempDir(), "o"), "-device", "cuda", "-dtype", "bf16", "-fuse=require", "-loss", "next-token", fixture)
	if !strings.Contains(stderr, "1 FlashAttention, 0 Softmax") || !strings.Contains(stderr, "step 4/4") {
		t.Errorf("tril fixture on CUDA:\n%s", stderr)
	}
}
