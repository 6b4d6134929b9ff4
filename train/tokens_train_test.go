package train

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// TestTrainLLMCGPT2Vocab trains a few steps of a narrow model with GPT-2's
// vocabulary (50257) and grouped-query attention on an llm.c token file, in
// sequential order, and checks the checkpoint round trip of the data order.
func TestTrainLLMCGPT2Vocab(t *testing.T) {
	const V = 50257
	rng := rand.New(rand.NewPCG(1, 2))
	toks := make([]uint16, 2000)
	for i := range toks {
		toks[i] = uint16(rng.IntN(V))
	}
	toks[7] = V - 1 // <|endoftext|>
	dir := t.TempDir()
	p := writeFile(t, dir, "gpt2_train.bin", llmcTokens(toks, int32(len(toks))))
	corpus, err := LoadData(p, 0.1, FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if corpus.Format != FormatLLMC {
		t.Fatalf("read as %s", corpus.Format)
	}
	cfg := model.Config{Name: "gpt2vocab", Vocab: V, Dim: 16, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 8, FFN: 32, Seq: 8, Batch: 2, DType: graph.Float32}
	h := Hyper{LR: 1e-2, MinLR: 1e-2, Steps: 4, DataOrder: OrderSequential}
	tr, err := NewTrainer(cpu.New(), cfg, true, h, corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if n := tr.Graphs.Forward.CountOps()["FlashAttention"]; n != 1 {
		t.Errorf("%d FlashAttention nodes in the forward graph, want 1", n)
	}
	// Step 1's batch is the file's tokens 18..35 (windows 2 and 3 of 9).
	tok, _ := tr.train.Batch(1)
	if tok.I64[0] != int64(toks[18]) || tok.I64[8] != int64(toks[27]) {
		t.Errorf("sequential batch 1 starts with %d, %d; want tokens 18 and 27 of the file (%d, %d)", tok.I64[0], tok.I64[8], toks[18], toks[27])
	}
	var losses []float64
	for range 4 {
		l, err := tr.Step()
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, l)
	}
	// Untrained, the model predicts about uniformly over 50257 tokens.
	if want := math.Log(V); math.Abs(losses[0]-want) > 0.5 {
		t.Errorf("first loss %v, want about ln %d = %.3f", losses[0], V, want)
	}
	vl, err := tr.Eval()
	if err != nil || math.IsNaN(vl) {
		t.Errorf("validation loss %v, %v", vl, err)
	}
	// The order is part of the checkpoint: restoring into a random-order
	// trainer notes the difference.
	st, err := tr.State()
	if err != nil {
		t.Fatal(err)
	}
	h2 := h
	h2.DataOrder = ""
	tr2, err := NewTrainer(cpu.New(), cfg, true, h2, corpus)
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	notes, err := tr2.Restore(st, 4)
	if err != nil || len(notes) != 1 {
		t.Errorf("restore into another order: notes %q, err %v", notes, err)
	}
	// A model whose vocabulary is smaller than a token is refused, naming it.
	small := cfg
	small.Vocab = 50000
	if _, err := NewTrainer(cpu.New(), small, true, h, corpus); err == nil || !strings.Contains(err.Error(), "not below the model's vocabulary size 50000") {
		t.Errorf("vocab 50000 with tokens up to 50256: %v", err)
	}
}
