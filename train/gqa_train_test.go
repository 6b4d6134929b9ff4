package train

import (
	"math"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// TestGQATrainsWithoutRepeatedKV: the built-in model with fewer key/value
// heads (-kv-heads 2 and 1 of 4) trains fused with FlashAttention and
// FlashAttentionGrad reading and writing the kv-headed K, V (dK, dV summed
// over each group inside the op): no repeat of K or V (Expand) and no
// [B,H,S,D] K/V is left in the training step. Its losses are the unfused
// step's (which repeats K and V and differentiates the repeat) within
// float64 rounding, and they fall.
func TestGQATrainsWithoutRepeatedKV(t *testing.T) {
	var text strings.Builder
	for i := range 400 {
		text.WriteString([]string{"grouped ", "query ", "attention ", "shares ", "keys "}[i%5])
	}
	corpus, err := NewCorpus("gqa", []byte(text.String()), 0.1)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []int{2, 1} {
		cfg, err := model.Lookup("tiny")
		if err != nil {
			t.Fatal(err)
		}
		cfg.KVHeads, cfg.DType = kv, graph.Float64
		kvShape := graph.Shape{cfg.Batch, kv, cfg.Seq, cfg.HeadDim}
		h := Hyper{LR: 3e-3, MinLR: 3e-3, Steps: 6, DataOrder: OrderSequential}
		var losses [2][]float64
		for i, fuse := range []bool{true, false} {
			tr, err := NewTrainer(cpu.New(), cfg, fuse, h, corpus)
			if err != nil {
				t.Fatal(err)
			}
			step := tr.Graphs.Step.Graph
			ops := step.CountOps()
			if fuse {
				if ops["FlashAttention"] != cfg.Layers || ops["FlashAttentionGrad"] != cfg.Layers || ops["Expand"] != 0 {
					t.Errorf("kv %d: fused step has %d FlashAttention, %d FlashAttentionGrad, %d Expand; want %d, %d, 0", kv, ops["FlashAttention"], ops["FlashAttentionGrad"], ops["Expand"], cfg.Layers, cfg.Layers)
				}
				for _, n := range step.Nodes {
					if n.Op == "FlashAttentionGrad" && (!n.Inputs[1].Type.Shape.Equal(kvShape) || !n.Outputs[1].Type.Shape.Equal(kvShape) || !n.Outputs[2].Type.Shape.Equal(kvShape)) {
						t.Errorf("kv %d: %s reads K %v and writes dK %v, dV %v; want %v", kv, n.Name, n.Inputs[1].Type.Shape, n.Outputs[1].Type.Shape, n.Outputs[2].Type.Shape, kvShape)
					}
				}
			} else if ops["Expand"] == 0 {
				t.Errorf("kv %d: the unfused step has no Expand: it should repeat K and V as built", kv)
			}
			for range h.Steps {
				l, err := tr.Step()
				if err != nil {
					t.Fatal(err)
				}
				losses[i] = append(losses[i], l)
			}
			tr.Close()
		}
		for s := range losses[0] {
			if d := math.Abs(losses[0][s]-losses[1][s]) / losses[1][s]; !(d <= 1e-10) {
				t.Errorf("kv %d step %d: fused loss %.12f, unfused %.12f (relative %.2g)", kv, s+1, losses[0][s], losses[1][s], d)
			}
		}
		if last := losses[0][len(losses[0])-1]; !(last < losses[0][0]) {
			t.Errorf("kv %d: loss did not fall: %v", kv, losses[0])
		}
		t.Logf("kv %d: fused losses %.6f", kv, losses[0])
	}
}
