package main

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
	"github.com/flashgraph/flashgraph/passes"
	"github.com/flashgraph/flashgraph/train"
)

func cpuRun(t *testing.T, g *graph.Graph, feeds map[string]*graph.Tensor) map[string]*graph.Tensor {
	t.Helper()
	exe, err := cpu.New().Compile(g, backend.Options{PoisonOutputs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	out, err := exe.Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// randomTokens feeds every int64 input with token ids in [0, vocab).
func randomTokens(g *graph.Graph, vocab int, seed uint64) map[string]*graph.Tensor {
	rng := rand.New(rand.NewPCG(seed, 3))
	feeds := map[string]*graph.Tensor{}
	for _, in := range g.Inputs {
		x := graph.NewTensor(in.Type.DType, in.Type.Shape)
		for i := range x.Len() {
			x.Set(i, float64(rng.IntN(vocab)))
		}
		feeds[in.Name] = x
	}
	return feeds
}

// The export rtol: 1e-5 relative in float32, measured against the largest
// logit so that logits near zero are held to the same absolute error.
const exportRTol = 1e-5

func sameLogits(t *testing.T, what string, got, want *graph.Tensor) {
	t.Helper()
	if got == nil || !got.Type().Equal(want.Type()) {
		t.Fatalf("%s: logits %v, want %v", what, got, want.Type())
	}
	var scale, worst float64
	for i := range want.Len() {
		scale = max(scale, math.Abs(want.At(i)))
	}
	for i := range want.Len() {
		d := math.Abs(got.At(i) - want.At(i))
		worst = max(worst, d)
		if !(d <= exportRTol*max(math.Abs(want.At(i)), scale)) {
			t.Fatalf("%s: logit %d is %v, the checkpoint's model gives %v", what, i, got.At(i), want.At(i))
		}
	}
	t.Logf("%s: worst |Δ| %.3g (largest logit %.3g)", what, worst, scale)
}

func opsetOf(t *testing.T, path string) (int64, map[string]int) {
	t.Helper()
	m, err := onnxpb.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := m.Opset("")
	ops := map[string]int{}
	for _, n := range m.Graph.Node {
		ops[n.OpType]++
	}
	return v, ops
}

// Export -> our importer -> the same logits as the checkpoint's model, for
// the built-in model and for one trained from a FILE, at opset 23 (fused
// attention as the Attention op) and 17 (decomposed).
func TestExportRoundTrip(t *testing.T) {
	data := trainData(t)
	dir := t.TempDir()
	builtin := filepath.Join(dir, "builtin")
	runCLI(t, tinyTrainArgs(data, builtin, "2")...)
	fromFile := filepath.Join(dir, "file")
	fixture := filepath.Join("..", "..", "onnx", "testdata", "byom", "gpt2_tril.onnx")
	runCLI(t, "train", "-steps", "2", "-data", data, "-out", fromFile, "-eval-every", "0", "-loss", "next-token", fixture)
	// A dynamo export trained with -untie -retie: the export writes the
	// untied copies as initializers and the retied table as a Transpose.
	untied := filepath.Join(dir, "untied")
	dynamo := filepath.Join("..", "..", "onnx", "testdata", "byom", "gpt2_small_dynamo18.onnx")
	runCLI(t, "train", "-steps", "2", "-data", data, "-out", untied, "-eval-every", "0", "-loss", "next-token", "-untie", "-retie", dynamo)

	for _, c := range []struct {
		name, ckpt string
		attention  int
	}{{"builtin", filepath.Join(builtin, "ckpt"), 2}, {"file", filepath.Join(fromFile, "ckpt"), 1}, {"untied", filepath.Join(untied, "ckpt"), 2}} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := train.LoadTrained(c.ckpt)
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := trainedForward(tr, "")
			if err != nil {
				t.Fatal(err)
			}
			feeds := randomTokens(want, 256, 7)
			wantOut := cpuRun(t, want, feeds)["logits"]

			o23, o17 := filepath.Join(dir, c.name+"23.onnx"), filepath.Join(dir, c.name+"17.onnx")
			ref, wst := filepath.Join(dir, c.name+"_ref.safetensors"), filepath.Join(dir, c.name+"_w.safetensors")
			runCLI(t, "export", "-ckpt", c.ckpt, "-o", o23, "-reference", ref)
			runCLI(t, "export", "-ckpt", c.ckpt, "-o", o17, "-opset", "17")
			runCLI(t, "export", "-ckpt", c.ckpt, "-o", wst)

			if v, ops := opsetOf(t, o23); v != 23 || ops["Attention"] != c.attention || ops["Softmax"] != 0 {
				t.Errorf("opset 23 export: opset %d, ops %v", v, ops)
			}
			if v, ops := opsetOf(t, o17); v != 17 || ops["Attention"] != 0 || ops["Softmax"] != c.attention {
				t.Errorf("opset 17 export: opset %d, ops %v", v, ops)
			}
			for _, p := range []string{o23, o17} {
				g, err := onnx.Import(p)
				if err != nil {
					t.Fatal(err)
				}
				sameLogits(t, filepath.Base(p), cpuRun(t, g, feeds)["logits"], wantOut)
				// The initializers are the trained weights.
				for _, pv := range g.Params {
					w := tr.Weights[pv.Name]
					if w == nil {
						t.Fatalf("%s: param %s is not in the checkpoint", p, pv.Name)
					}
					got, err := pv.Init.Materialize(pv.Type)
					if err != nil {
						t.Fatal(err)
					}
					for i := range w.Len() {
						if got.At(i) != w.At(i) {
							t.Fatalf("%s: %s[%d] is %v, trained %v", p, pv.Name, i, got.At(i), w.At(i))
						}
					}
				}
			}

			// The reference file holds its inputs and our logits on them.
			rs, err := checkpoint.ReadSafetensorsFile(ref)
			if err != nil {
				t.Fatal(err)
			}
			rin := map[string]*graph.Tensor{}
			for _, in := range want.Inputs {
				if rin[in.Name] = rs.Tensors["input."+in.Name]; rin[in.Name] == nil {
					t.Fatalf("reference lacks input %s", in.Name)
				}
			}
			sameLogits(t, "reference", rs.Tensors["output.logits"], cpuRun(t, want, rin)["logits"])

			ws, err := checkpoint.ReadSafetensorsFile(wst)
			if err != nil {
				t.Fatal(err)
			}
			if len(ws.Tensors) != len(tr.Weights) || ws.Metadata["format"] != WeightsFormat {
				t.Errorf("weights file: %d tensors (want %d), metadata %v", len(ws.Tensors), len(tr.Weights), ws.Metadata)
			}
		})
	}

	// The FILE-trained weights did train: they differ from the file's.
	orig, err := onnx.Import(fixture)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := train.LoadTrained(filepath.Join(fromFile, "ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	w0, _ := orig.Value("lm_head").Init.Materialize(orig.Value("lm_head").Type)
	if w := tr.Weights["lm_head"]; w == nil || w.At(0) == w0.At(0) {
		t.Errorf("lm_head was not trained")
	}

	// Bad input: clear errors, nothing written.
	bad := filepath.Join(dir, "bad.onnx")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-ckpt", filepath.Join(fromFile, "ckpt"), "-o", bad, tinyONNX(t)}, "another model"},
		{[]string{"-ckpt", filepath.Join(builtin, "ckpt"), "-o", bad, fixture}, "built-in model"},
		{[]string{"-ckpt", filepath.Join(builtin, "ckpt")}, "-o is required"},
		{[]string{"-ckpt", filepath.Join(builtin, "ckpt"), "-o", filepath.Join(dir, "x.txt")}, ".onnx or .safetensors"},
		{[]string{"-ckpt", filepath.Join(builtin, "ckpt"), "-o", bad, "-opset", "16"}, "-opset 16"},
		{[]string{"-ckpt", dir, "-o", bad}, "holds no checkpoint"},
	} {
		code, _, stderr := runCode(append([]string{"export"}, c.args...)...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("export %v: exit %d, want an error with %q:\n%s", c.args, code, c.want, stderr)
		}
		if _, err := os.Stat(bad); !os.IsNotExist(err) {
			t.Errorf("export %v wrote %s", c.args, bad)
		}
	}
}

// A fused attention has no opset-17 form: the library refuses it.
func TestExportOpset17RefusesFusedAttention(t *testing.T) {
	tr := filepath.Join("..", "..", "onnx", "testdata", "byom", "gpt2_tril.onnx")
	g, err := onnx.Import(tr)
	if err != nil {
		t.Fatal(err)
	}
	fused, err := passes.Default(true).Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := onnx.ExportWith(fused, onnx.ExportOptions{Opset: 17}); err == nil || !strings.Contains(err.Error(), "no Attention op") {
		t.Fatalf("opset 17 export of a fused graph: %v", err)
	}
}
