package onnx

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/passes"
)

// ioFile is a fixture's inputs and ONNX Runtime's outputs on them.
type ioFile struct {
	Inputs  map[string]ioTensor `json:"inputs"`
	Outputs map[string]ioTensor `json:"outputs"`
}

type ioTensor struct {
	DType string    `json:"dtype"`
	Shape []int     `json:"shape"`
	Data  []float64 `json:"data"`
}

func (t ioTensor) tensor() (*graph.Tensor, error) {
	dt, err := graph.ParseDType(t.DType)
	if err != nil {
		return nil, err
	}
	out := graph.NewTensor(dt, graph.Shape(t.Shape))
	if len(t.Data) != out.Len() {
		return nil, fmt.Errorf("%d values for shape %v", len(t.Data), t.Shape)
	}
	for i, v := range t.Data {
		out.Set(i, v)
	}
	return out, nil
}

// Outputs must match ONNX Runtime to 1e-4 relative (float32), with an absolute
// floor of 1e-6 for values near zero.
const (
	rtol = 1e-4
	atol = 1e-6
)

func runGraph(t *testing.T, g *graph.Graph, feeds map[string]*graph.Tensor) map[string]*graph.Tensor {
	t.Helper()
	exe, err := cpu.New().Compile(g, backend.Options{PoisonOutputs: true})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	defer exe.Close()
	out, err := exe.Run(feeds)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return out
}

func fixtures(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join("testdata", "*.onnx"))
	if len(files) == 0 {
		t.Skip("no fixtures in onnx/testdata")
	}
	sort.Strings(files)
	return files
}

// fixtureExpects reads what fixtures.json says the importer should do with each
// file's attention: "fuse", or "unfused: <reason>" (file name -> expect).
func fixtureExpects(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "fixtures.json"))
	if err != nil {
		t.Fatal(err)
	}
	var index struct {
		Fixtures []struct {
			File   string `json:"file"`
			Expect string `json:"expect"`
		} `json:"fixtures"`
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		t.Fatalf("testdata/fixtures.json: %v", err)
	}
	out := map[string]string{}
	for _, f := range index.Fixtures {
		out[f.File] = f.Expect
	}
	return out
}

// TestFixturesMatchORT imports every exported model, runs it on the CPU backend
// and compares with ONNX Runtime's outputs, before and after the fusion
// pipeline. What the pipeline must do with the attention is fixtures.json's
// expect: "fuse" (every attention Softmax becomes FlashAttention) or
// "unfused: REASON" (no Softmax is fused and each explanation names REASON:
// a sliding window or a padding mask, which FlashAttention's causal flag
// cannot express, so fusing would compute something else).
func TestFixturesMatchORT(t *testing.T) {
	files := fixtures(t)
	expects := fixtureExpects(t)
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".onnx")
		t.Run(name, func(t *testing.T) {
			expect := expects[filepath.Base(path)]
			reason, unfused := strings.CutPrefix(expect, "unfused: ")
			if expect != "fuse" && (!unfused || reason == "") {
				t.Fatalf("fixtures.json: expect %q, want \"fuse\" or \"unfused: REASON\"", expect)
			}
			raw, err := os.ReadFile(strings.TrimSuffix(path, ".onnx") + ".io.json")
			if err != nil {
				t.Fatal(err)
			}
			var io ioFile
			if err := json.Unmarshal(raw, &io); err != nil {
				t.Fatal(err)
			}
			g, err := Import(path)
			if err != nil {
				t.Fatal(err)
			}
			feeds := map[string]*graph.Tensor{}
			for k, v := range io.Inputs {
				if feeds[k], err = v.tensor(); err != nil {
					t.Fatalf("input %s: %v", k, err)
				}
			}
			fused, err := passes.Default(true).Run(g, &passes.Log{})
			if err != nil {
				t.Fatal(err)
			}
			xs, err := passes.Explain(g)
			if err != nil {
				t.Fatal(err)
			}
			if unfused && len(xs) == 0 {
				t.Fatalf("no Softmax in the imported graph to refuse (%s)", reason)
			}
			c := fused.CountOps()
			for _, x := range xs {
				switch {
				case !unfused && !x.Fused:
					t.Errorf("attention not fused: %s", x)
				case unfused && x.Fused:
					t.Errorf("attention fused, want it refused (%s): %s", reason, x)
				case unfused && !strings.Contains(x.Reason, reason):
					t.Errorf("explanation does not name %q: %s", reason, x)
				}
				t.Logf("%s", x)
			}
			if !unfused && (c["FlashAttention"] == 0 || c["Softmax"] != 0) {
				t.Errorf("fused graph has %d FlashAttention and %d Softmax", c["FlashAttention"], c["Softmax"])
			}
			if unfused && (c["FlashAttention"] != 0 || c["Softmax"] != len(xs)) {
				t.Errorf("pipeline graph has %d FlashAttention and %d Softmax, want 0 and %d", c["FlashAttention"], c["Softmax"], len(xs))
			}
			for _, variant := range []string{"imported", "fused"} {
				vg := map[string]*graph.Graph{"imported": g, "fused": fused}[variant]
				got := runGraph(t, vg, feeds)
				compareORT(t, variant, io, got)
			}
		})
	}
}

// compareORT checks every output against ONNX Runtime's, element by element.
func compareORT(t *testing.T, variant string, io ioFile, got map[string]*graph.Tensor) {
	t.Helper()
	for k, want := range io.Outputs {
		out, ok := got[k]
		if !ok {
			t.Fatalf("%s: no output %s (have %v)", variant, k, keys(got))
		}
		if !out.Shape.Equal(graph.Shape(want.Shape)) {
			t.Fatalf("%s: output %s: shape %v, want %v", variant, k, out.Shape, want.Shape)
		}
		worst, at, maxAbs := 0.0, 0, 0.0
		for i, w := range want.Data {
			d := math.Abs(out.At(i) - w)
			maxAbs = max(maxAbs, d)
			if r := d / (atol + rtol*math.Abs(w)); r > worst || math.IsNaN(d) {
				worst, at = r, i
			}
		}
		if worst > 1 || math.IsNaN(worst) {
			t.Errorf("%s: output %s[%d] = %v, ORT %v (error %.3g of the tolerance)", variant, k, at, out.At(at), want.Data[at], worst)
		}
		t.Logf("%s: output %s %v: max abs error %.3g, worst error %.3g of tolerance (rtol %g, atol %g)", variant, k, out.Shape, maxAbs, worst, rtol, atol)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
