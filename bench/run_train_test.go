package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/model"
)

// The noise sample of bench -train -curve moves every parameter element by
// exactly ±rel relative, with both signs, and leaves constants alone.
func TestPerturbParams(t *testing.T) {
	b := graph.NewBuilder("p")
	x := b.Input("x", graph.Float32, 4)
	w := b.Param("w", graph.Float32, graph.Shape{4}, graph.Normal(1, 3))
	c := b.Const("c", graph.Float32, graph.Shape{4}, graph.Ones())
	b.Output(b.Mul(b.Mul(x, w), c))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	before, _ := exe.Initializer("w")
	const rel = 0x1p-9
	if err := perturbParams(exe, g, rel); err != nil {
		t.Fatal(err)
	}
	after, _ := exe.Initializer("w")
	signs := map[bool]int{}
	for i := range 4 {
		r := after.At(i)/before.At(i) - 1
		if math.Abs(math.Abs(r)-rel) > 1e-6 {
			t.Errorf("w[%d]: moved by %g relative, want ±%g", i, r, rel)
		}
		signs[r > 0]++
	}
	if signs[true] == 0 || signs[false] == 0 {
		t.Errorf("all four elements moved the same way: %v", signs)
	}
	if cv, _ := exe.Initializer("c"); cv.At(0) != 1 {
		t.Errorf("the constant moved: %v", cv.At(0))
	}
}

// bench -train -grads: the first step's gradients of every parameter, with
// and without elementwise fusion, from the same weights and batch. On the CPU
// the two are bit-identical, and the table lists each gradient with a zero
// difference.
func TestStepGradients(t *testing.T) {
	cfg, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	fused, err := stepGradients(cpu.New(), cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	unfused, err := stepGradients(cpu.New(), cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(fused) != 3+cfg.Layers*11 || len(unfused) != len(fused) {
		t.Fatalf("%d and %d gradients, want %d (one per parameter)", len(fused), len(unfused), 3+cfg.Layers*11)
	}
	nonzero := 0
	for name, f := range fused {
		u := unfused[name]
		for i := range f.Len() {
			if math.Float64bits(f.At(i)) != math.Float64bits(u.At(i)) {
				t.Fatalf("%s[%d]: fused %v, unfused %v", name, i, f.At(i), u.At(i))
			}
			if f.At(i) != 0 {
				nonzero++
			}
		}
	}
	if nonzero == 0 {
		t.Fatal("every gradient is zero")
	}
	var buf bytes.Buffer
	printGradientTable(&buf, cfg, unfused, fused, unfused)
	out := buf.String()
	if !strings.Contains(out, "grad.layers.1.wq") || !strings.Contains(out, "mean") || strings.Count(out, "\n") != len(fused)+4 {
		t.Errorf("table:\n%s", out)
	}
}

// The training table: MFU per row, and "vs compile" against the fastest
// torch.compile mode, named under the table (max-autotune here).
func TestPrintTrainTableBestCompile(t *testing.T) {
	f, i := func(v float64) *float64 { return &v }, func(v int64) *int64 { return &v }
	rows := []trainBenchRow{
		{Impl: "flashgraph", Config: "gpt2", B: 8, S: 1024, DType: "bfloat16", TokS: f(480e3), StepMs: f(17.1), MFU: f(0.36), PeakMemBytes: i(5 << 30)},
		{Impl: "flashgraph+qkv", Config: "gpt2", B: 8, S: 1024, DType: "bfloat16", TokS: f(500e3), StepMs: f(16.4), MFU: f(0.375), PeakMemBytes: i(5 << 30)},
		{Impl: "torch-eager", Config: "gpt2", B: 8, S: 1024, DType: "bfloat16", TokS: f(120e3), StepMs: f(68), MFU: f(0.09)},
		{Impl: "torch-compile", Config: "gpt2", B: 8, S: 1024, DType: "bfloat16", TokS: f(400e3), StepMs: f(20.5), MFU: f(0.3)},
		{Impl: "torch-compile-max-autotune", Config: "gpt2", B: 8, S: 1024, DType: "bfloat16", TokS: f(460e3), StepMs: f(17.8), MFU: f(0.345)},
	}
	var b bytes.Buffer
	printTrainTable(&b, rows)
	out := b.String()
	lines := strings.Split(out, "\n")
	find := func(impl string) string {
		for _, l := range lines {
			if fs := strings.Fields(l); len(fs) > 0 && fs[0] == impl {
				return l
			}
		}
		t.Fatalf("no row %s:\n%s", impl, out)
		return ""
	}
	for impl, want := range map[string][]string{
		"flashgraph":                 {"36.0%", "4.00×", "1.04×"},
		"flashgraph+qkv":             {"37.5%", "4.17×", "1.09×"},
		"torch-compile":              {"30.0%", "0.87×"},
		"torch-compile-max-autotune": {"34.5%", "1.00×"},
	} {
		l := find(impl)
		for _, w := range want {
			if !strings.Contains(l, w) {
				t.Errorf("%s row lacks %s: %q", impl, w, l)
			}
		}
	}
	if !strings.Contains(out, "vs compile: against the fastest torch.compile mode timed (torch-compile-max-autotune)") {
		t.Errorf("the table does not say which compile mode it divides by:\n%s", out)
	}
	if !strings.Contains(out, "peak mem: flashgraph = peak of our own device allocations") || strings.Contains(out, "cuMemGetInfo") {
		t.Errorf("the legend does not say that our peak mem is the peak of our own allocations:\n%s", out)
	}
	if l := find("flashgraph"); !strings.Contains(l, "5.00 GiB") {
		t.Errorf("flashgraph row lacks its peak mem (5.00 GiB): %q", l)
	}
}

// Our row's memory: the allocation peak less what was allocated before
// compiling, with cuMemGetInfo's difference beside it under its own name
// (here negative, as when another process released memory during the run);
// a PyTorch row, which has no such figure, leaves the key out.
func TestTrainRowStepMemory(t *testing.T) {
	var r trainBenchRow
	r.setStepMemory(40<<20, 7<<30, 100<<30, 101<<30)
	if r.PeakMemBytes == nil || *r.PeakMemBytes != 7<<30-40<<20 {
		t.Fatalf("peak_mem_bytes = %v, want %d", r.PeakMemBytes, 7<<30-40<<20)
	}
	if r.MemInfoDeltaBytes == nil || *r.MemInfoDeltaBytes != -(1<<30) {
		t.Fatalf("meminfo_delta_bytes = %v, want %d", r.MemInfoDeltaBytes, -(1 << 30))
	}
	line, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"peak_mem_bytes":7474249728`, `"meminfo_delta_bytes":-1073741824`} {
		if !strings.Contains(string(line), want) {
			t.Errorf("JSON row lacks %s: %s", want, line)
		}
	}
	var torch trainBenchRow
	if err := json.Unmarshal([]byte(`{"impl": "torch-eager", "peak_mem_bytes": 6400000000, "tok_s": 1e5}`), &torch); err != nil {
		t.Fatal(err)
	}
	line, err = json.Marshal(torch)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(line), "meminfo_delta_bytes") || !strings.Contains(string(line), `"peak_mem_bytes":6400000000`) {
		t.Errorf("PyTorch row: %s", line)
	}
}
