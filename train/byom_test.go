package train

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx"
)

// byomDir holds models written and trained in PyTorch by
// tools/reference/byom_models.py: the ONNX export of each model with its
// initial weights, the losses PyTorch's AdamW gave on the first steps, and
// the text both sides read their batches from. Regenerate with
//
//	cd tools/reference && python3 byom_models.py --attn explicit --out-dir ../../onnx/testdata/byom
const byomDir = "../onnx/testdata/byom"

// byomLosses is what byom_models.py records of a PyTorch run.
type byomLosses struct {
	Model       string    `json:"model"`
	ONNX        string    `json:"onnx"`
	Losses      []float64 `json:"losses"`
	LR          float64   `json:"lr"`
	Betas       []float64 `json:"betas"`
	Eps         float64   `json:"eps"`
	WeightDecay float64   `json:"weight_decay"`
	Batch       int       `json:"batch"`
	Seq         int       `json:"seq"`
	Data        string    `json:"data"`
	DataOrder   string    `json:"data_order"`
	DType       string    `json:"dtype"`
	Device      string    `json:"device"`
}

// sequentialBatch is batch k of the sequential data order: B consecutive,
// non-overlapping windows of S+1 tokens from token k·B·(S+1); the tokens are
// each window's first S, the targets its last S. byom_models.py reads the
// same windows.
func sequentialBatch(t *testing.T, data []byte, k, B, S int) (tokens, targets *graph.Tensor) {
	t.Helper()
	start := k * B * (S + 1)
	if start+B*(S+1) > len(data) {
		t.Fatalf("batch %d needs tokens up to %d; the data has %d", k, start+B*(S+1), len(data))
	}
	tokens = graph.NewTensor(graph.Int64, graph.Shape{B, S})
	targets = graph.NewTensor(graph.Int64, graph.Shape{B, S})
	for r := range B {
		w := data[start+r*(S+1) : start+(r+1)*(S+1)]
		for j := range S {
			tokens.I64[r*S+j] = int64(w[j])
			targets.I64[r*S+j] = int64(w[j+1])
		}
	}
	return tokens, targets
}

// A GPT-2-style model (learned positions, LayerNorm, GELU, a registered tril
// buffer as the mask) and a LLaMA-style one (RMSNorm, RoPE, SwiGLU,
// grouped-query attention through repeat_kv) written in PyTorch and
// exported by torch.onnx train here, with -loss next-token, on the same
// batches as in PyTorch and with the same AdamW at a constant rate, to the
// losses PyTorch recorded within 1e-4 relative over 20 steps; fused (every
// layer's attention a FlashAttention) and unfused alike.
//
// Every NAME.losses.json there (float32 CPU runs) is checked: the two
// TorchScript opset-17 exports and the two dynamo opset-18 exports (torch
// 2.11) are committed and must be among them; the dynamo ones train with
// -untie -retie (their exporter merged equal initializers and folded the tied
// lm_head's Transpose) and, for the LLaMA, its RoPE tables frozen.
func TestBYOMTrainsLikePyTorch(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(byomDir, "*.losses.json"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".losses.json"))
	}
	for _, want := range []string{"gpt2_small_ts17", "llama_gqa_ts17", "gpt2_small_dynamo18", "llama_gqa_dynamo18"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s/%s.losses.json is missing (have %v)", byomDir, want, names)
		}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(byomDir, name+".losses.json"))
			if err != nil {
				t.Fatal(err)
			}
			var ref byomLosses
			if err := json.Unmarshal(raw, &ref); err != nil {
				t.Fatal(err)
			}
			if ref.DType != "float32" || ref.Device != "cpu" || ref.DataOrder != "sequential" || len(ref.Losses) < 20 {
				t.Fatalf("%s.losses.json: %s on %s, order %q, %d losses; want float32 on cpu, sequential, 20 steps", name, ref.DType, ref.Device, ref.DataOrder, len(ref.Losses))
			}
			if ref.Betas[0] != 0.9 || ref.Betas[1] != 0.95 || ref.Eps != 1e-8 {
				t.Fatalf("PyTorch ran AdamW with betas %v eps %g; the training step's are (0.9, 0.95) and 1e-8", ref.Betas, ref.Eps)
			}
			data, err := os.ReadFile(filepath.Join(byomDir, ref.Data))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(byomDir, ref.ONNX)
			file, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			src, err := onnx.Import(path)
			if err != nil {
				t.Fatal(err)
			}
			softmaxes := src.CountOps()["Softmax"]
			if softmaxes < 2 {
				t.Fatalf("the import has %d Softmax nodes; each of the 2 layers has one", softmaxes)
			}
			spec := GraphSpec{File: path, SHA256: FileSHA256(file), Format: "onnx", Loss: LossNextToken}
			if strings.Contains(name, "dynamo") {
				// The dynamo exporter's optimizer merges equal initializers
				// (every norm gain into one) and folds the tied lm_head's
				// Transpose into a second table: as exported, the file
				// trains another model, and says so.
				m, err := PrepareGraph(src, spec, nil)
				if err != nil {
					t.Fatal(err)
				}
				if name == "gpt2_small_dynamo18" && len(m.Notes) == 0 {
					t.Error("as exported: no note of the merged norm gains")
				}
				spec.Untie, spec.Retie = true, true
				if ref.Model == "llama_gqa" {
					// The RoPE cos/sin tables, buffers PyTorch does not
					// train, are initializers in this export.
					spec.Freeze = []string{"slice_*"}
				}
			}
			m, err := PrepareGraph(src, spec, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range m.Notes {
				if !strings.HasPrefix(n, "untied ") && !strings.HasPrefix(n, "retied ") {
					t.Errorf("the export looks merged (PyTorch trains these apart): %q", n)
				}
			}
			var values int
			for _, p := range m.Params {
				values += m.Forward.Value(p).Type.Shape.Numel()
			}
			// PyTorch's sum(p.numel() for p in model.parameters()).
			pytorchValues := map[string]int{"gpt2_small": 34176, "llama_gqa": 34976}[ref.Model]
			if values != pytorchValues {
				t.Errorf("%d values trained in %d params; PyTorch trains %d", values, len(m.Params), pytorchValues)
			}
			gs := GraphSource(m)
			if gs.Config.Batch != ref.Batch || gs.Config.Seq != ref.Seq {
				t.Fatalf("the graph takes [%d, %d] tokens; PyTorch trained on [%d, %d]", gs.Config.Batch, gs.Config.Seq, ref.Batch, ref.Seq)
			}
			steps := 20
			h := Hyper{LR: ref.LR, MinLR: ref.LR, Steps: int64(steps), WeightDecay: ref.WeightDecay}
			corpus, err := NewCorpus(ref.Data, data, 0.1)
			if err != nil {
				t.Fatal(err)
			}
			for _, fuse := range []bool{true, false} {
				tr, err := NewSourceTrainer(cpu.New(), gs, fuse, h, corpus)
				if err != nil {
					t.Fatal(err)
				}
				ops := tr.Graphs.Forward.CountOps()
				if fuse && (ops["FlashAttention"] != softmaxes || ops["Softmax"] != 0) {
					t.Errorf("fused: %d FlashAttention and %d Softmax left; want all %d layers fused", ops["FlashAttention"], ops["Softmax"], softmaxes)
				}
				if !fuse && ops["FlashAttention"] != 0 {
					t.Errorf("unfused graph has %d FlashAttention", ops["FlashAttention"])
				}
				worst := 0.0
				for k := range steps {
					if lr := tr.LR(); lr != ref.LR {
						t.Fatalf("step %d: learning rate %g, want the constant %g", k+1, lr, ref.LR)
					}
					feeds := tr.StepFeeds()
					feeds[tr.tokensName], feeds[tr.targetsName] = sequentialBatch(t, data, k, ref.Batch, ref.Seq)
					out, err := tr.exec.Run(feeds)
					if err != nil {
						t.Fatal(err)
					}
					tr.step++
					got, want := out[tr.Graphs.Step.Loss].At(0), ref.Losses[k]
					rel := math.Abs(got-want) / math.Abs(want)
					worst = max(worst, rel)
					if !(rel <= 1e-4) {
						t.Errorf("fuse %v step %d: loss %.7f, PyTorch %.7f (relative difference %.2e)", fuse, k+1, got, want, rel)
					}
					t.Logf("fuse %v step %2d: loss %.7f  PyTorch %.7f  rel %.2e", fuse, k+1, got, want, rel)
				}
				t.Logf("fuse %v: max relative difference over %d steps %.2e", fuse, steps, worst)
				tr.Close()
			}
		})
	}
}
