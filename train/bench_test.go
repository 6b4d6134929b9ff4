package train

import (
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/model"
)

// BenchmarkCPUTrainStepSmall times one training step of the small config
// (fused attention and elementwise chains, as `flashgraph train -config
// small -device cpu` runs it) on the CPU backend: forward, backward and
// AdamW of 8×256 tokens. The step is compiled once; each iteration is one
// Trainer.Step on the next batch. tok/s is the rate `train` reports.
//
//	go test ./train -run X -bench CPUTrainStepSmall -benchtime 5x -cpuprofile cpu.out
func BenchmarkCPUTrainStepSmall(b *testing.B) {
	cfg, err := model.Lookup("small")
	if err != nil {
		b.Fatal(err)
	}
	tr, err := NewTrainer(cpu.New(), cfg, true, Hyper{LR: 3e-3, MinLR: 3e-4, Warmup: 5, Steps: 1 << 20, WeightDecay: 0.1, DataSeed: 11}, benchCorpus(b))
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	// One step outside the timer: the first run touches every buffer.
	if _, err := tr.Step(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := tr.Step(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*cfg.Batch*cfg.Seq)/b.Elapsed().Seconds(), "tok/s")
}

// benchCorpus is enough varied bytes for windows of the small config's 256.
func benchCorpus(b *testing.B) *Corpus {
	b.Helper()
	text := make([]byte, 1<<16)
	x := uint32(1)
	for i := range text {
		x = x*1664525 + 1013904223
		text[i] = ' ' + byte(x>>24)%95
	}
	c, err := NewCorpus("bench", text, 0.1)
	if err != nil {
		b.Fatal(err)
	}
	return c
}
