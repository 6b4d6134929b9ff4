package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestAttnFLOPs(t *testing.T) {
	// B=4, H=16, S=4096, D=128: 4·4·16·4096²·128 = 549755813888.
	fwd, bwd := attnFLOPs(4, 16, 4096, 128, false)
	if fwd != 549755813888 || bwd != 2.5*549755813888 {
		t.Fatalf("non-causal: fwd %v bwd %v", fwd, bwd)
	}
	cf, cb := attnFLOPs(4, 16, 4096, 128, true)
	if cf != fwd/2 || cb != bwd/2 {
		t.Fatalf("causal: fwd %v bwd %v, want half of %v %v", cf, cb, fwd, bwd)
	}
	// With B·S and H·D fixed, the count grows linearly in S and D.
	a, _ := attnFLOPs(16384/512, 2048/64, 512, 64, false)
	b, _ := attnFLOPs(16384/1024, 2048/64, 1024, 64, false)
	if b != 2*a {
		t.Fatalf("S doubles: %v -> %v", a, b)
	}
	// 1e12 FLOPs in 1 ms is 1000 TFLOP/s.
	if got := tflops(1e12, 1); got != 1000 {
		t.Fatalf("tflops = %v", got)
	}
	if !math.IsNaN(tflops(1, 0)) {
		t.Fatal("tflops of a zero time must be NaN")
	}
}

// Lines as tools/reference/sdpa_bench.py writes them (its header's schema).
const torchFixture = `{"backend": "flash", "B": 4, "H": 16, "S": 4096, "D": 128, "causal": false, "dtype": "bfloat16", "fwd_ms": 1.6, "bwd_ms": 4.4, "fwd_tflops": 343.6, "bwd_tflops": 312.4, "peak_mem_bytes": 402653184, "iters": 20, "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "error": null}
{"backend": "cudnn", "B": 4, "H": 16, "S": 4096, "D": 128, "causal": false, "dtype": "bfloat16", "fwd_ms": 0.9, "bwd_ms": 2.6, "fwd_tflops": 610.8, "bwd_tflops": 528.6, "peak_mem_bytes": 419430400, "iters": 20, "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "error": null}

{"backend": "efficient", "B": 16, "H": 32, "S": 1024, "D": 64, "causal": true, "dtype": "bfloat16", "fwd_ms": null, "bwd_ms": null, "fwd_tflops": null, "bwd_tflops": null, "peak_mem_bytes": null, "iters": 20, "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "error": "out of memory: CUDA out of memory"}
`

func TestParseTorchRowsAndTable(t *testing.T) {
	rows, err := parseTorchRows(strings.NewReader(torchFixture))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].Impl != "torch-flash" || rows[1].Impl != "torch-cudnn" || rows[2].Impl != "torch-efficient" {
		t.Fatalf("rows: %+v", rows)
	}
	if rows[2].Error == nil || rows[2].FwdMs != nil || rows[2].FwdTFLOPs != nil {
		t.Fatalf("an error line must keep its error and no numbers: %+v", rows[2])
	}
	f, _ := attnFLOPs(4, 16, 4096, 128, false)
	if got := *rows[0].FwdTFLOPs; math.Abs(got-tflops(f, 1.6)) > 1e-9 {
		t.Fatalf("torch fwd TFLOP/s recomputed as %v", got)
	}

	// Our two rows for the same shape, as attnRows makes them.
	res := &AttnResult{
		Shape:    AttnShape{B: 4, H: 16, S: 4096, D: 128},
		Fused:    AttnTiming{FwdMs: 1.8, BwdMs: 5.5, PlannedBytes: 700 << 20, MeasuredBytes: 704 << 20},
		Composed: AttnTiming{FwdMs: 6, BwdMs: 16.5, PlannedBytes: 5 << 30, MeasuredBytes: 5 << 30},
		Checked:  true, MaxAbsErr: [4]float64{0.0078125, 0.03, 0.05, 0.02}, MaxAbsRef: [4]float64{1, 2, 3, 4},
	}
	ours := attnRows(res, 20, "NVIDIA H200")
	if len(ours) != 2 || ours[0].Impl != "fused" || ours[1].Impl != "composed" || ours[0].MaxAbsErr["dk"] != 0.05 {
		t.Fatalf("attnRows: %+v", ours)
	}
	// A composed path that ran out of memory.
	oom := &AttnResult{
		Shape:    AttnShape{B: 16, H: 32, S: 1024, D: 64, Causal: true},
		Fused:    AttnTiming{FwdMs: 1, BwdMs: 3},
		Composed: AttnTiming{Err: "out of memory: needs 9 GiB by plan, 1 GiB free"},
	}
	all := append(append(rows, ours...), attnRows(oom, 20, "NVIDIA H200")...)
	var out bytes.Buffer
	printAttnTable(&out, []TableShape{{S: 4096, D: 128}, {S: 1024, D: 64, Causal: true}}, all)
	text := out.String()
	t.Log("\n" + text)
	lines := strings.Split(strings.TrimSpace(text), "\n")
	var row4096, row1024 string
	for _, l := range lines {
		fs := strings.Fields(l)
		if len(fs) > 2 && fs[0] == "128" && fs[1] == "4096" {
			row4096 = l
		}
		if len(fs) > 2 && fs[0] == "64" && fs[1] == "1024" {
			row1024 = l
		}
	}
	if row4096 == "" || row1024 == "" {
		t.Fatalf("table lacks a shape row:\n%s", text)
	}
	f4096 := strings.Fields(row4096)
	// D S c | 5 fwd | 5 bwd | ...: fused fwd TFLOP/s is field 4.
	want := []string{"128", "4096", "0", "|", fmtTF(tflops(f, 1.8)), fmtTF(tflops(f, 6)), fmtTF(tflops(f, 1.6)), fmtTF(tflops(f, 0.9)), "-", "|"}
	for i, w := range want {
		if f4096[i] != w {
			t.Fatalf("field %d of %q is %q, want %q", i, row4096, f4096[i], w)
		}
	}
	// Ratios: fused/flash fwd = 1.6/1.8, bwd 4.4/5.5, f+b 6.0/7.3;
	// fused/cudnn fwd 0.9/1.8; fused/composed fwd 6/1.8.
	for _, r := range []string{" 0.89  0.80  0.82 |", " 0.50  0.47  0.48 |", " 3.33  3.00  3.08 |", "0.69  5.00  0.39 |", "7.8e-03 5.0e-02"} {
		if !strings.Contains(row4096, r) {
			t.Errorf("row %q lacks %q", row4096, r)
		}
	}
	if strings.Count(row1024, "OOM") != 4 {
		t.Errorf("row %q should show OOM for composed and torch-efficient, forward and backward", row1024)
	}
	if !strings.Contains(text, "composed D=64 S=1024 causal=true: out of memory") {
		t.Errorf("the notes should give the composed failure:\n%s", text)
	}

	// -json rows round-trip through encoding/json (no NaN or Inf).
	sortRows(all)
	for _, r := range all {
		if _, err := json.Marshal(r); err != nil {
			t.Fatalf("row %+v: %v", r, err)
		}
	}
	if all[0].D != 64 || all[len(all)-1].Impl != "torch-cudnn" {
		t.Errorf("sortRows order: first %+v last %+v", all[0], all[len(all)-1])
	}
}

func fmtTF(v float64) string { return fmt.Sprintf("%.1f", v) }

func TestParseTorchRowsRejectsGarbage(t *testing.T) {
	if _, err := parseTorchRows(strings.NewReader("{\"backend\": \"flash\"}\n")); err == nil {
		t.Error("a line without a shape was accepted")
	}
	if _, err := parseTorchRows(strings.NewReader("not json\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("garbage: %v", err)
	}
}

func TestSM90Table(t *testing.T) {
	sh := AttnShape{B: 4, H: 16, S: 4096, D: 128, Causal: true}
	fa2 := attnRows(&AttnResult{Shape: sh, Fused: AttnTiming{FwdMs: 2, BwdMs: 5}, Composed: AttnTiming{Err: "skipped"}}, 20, "H200")[0]
	h := attnRows(&AttnResult{Shape: sh, Fused: AttnTiming{FwdMs: 1, BwdMs: 5}, Composed: AttnTiming{Err: "skipped"}}, 20, "H200")[0]
	h.Impl = "fused-sm90"
	f, _ := attnFLOPs(4, 16, 4096, 128, true)
	cd := benchRow{Kind: "attention", Impl: "torch-cudnn", S: 4096, D: 128, Causal: true, FwdMs: fptr(0.8), FwdTFLOPs: fptr(tflops(f, 0.8))}
	cp := attnRows(&AttnResult{Shape: sh, Fused: AttnTiming{FwdMs: 1.25, BwdMs: 5}, Composed: AttnTiming{Err: "skipped"}}, 20, "H200")[0]
	cp.Impl = "fused-sm90ppp3"
	failed := benchRow{Kind: "attention", Impl: "fused-sm90", S: 1024, D: 64, Error: sptr("cuda: flash_attention_sm90.cu needs compute capability 9.0")}
	var out bytes.Buffer
	printSM90Table(&out, []TableShape{{S: 4096, D: 128, Causal: true}, {S: 1024, D: 64}}, []benchRow{fa2, h, cp, cd, failed})
	text := out.String()
	t.Log("\n" + text)
	// tma 1 ms, pp .. ppp not run, ppp3 1.25 ms: the best is tma.
	want := fmt.Sprintf(" 128   4096  1 | %6s %7s %7s %7s %7s %7s %6s |     2.00     0.80", fmtTF(tflops(f, 2)), fmtTF(tflops(f, 1)), "-", "-", "-", fmtTF(tflops(f, 1.25)), fmtTF(tflops(f, 0.8)))
	if !strings.Contains(text, want) {
		t.Errorf("table lacks the row %q", want)
	}
	if !strings.Contains(text, "  64   1024  0 |      -       -       -       -       -       -      - |        -        -") || !strings.Contains(text, "needs compute capability 9.0") {
		t.Errorf("a failed sm90 run should print dashes and its reason")
	}
}

// TestMedianRows merges three rounds: times are the medians, TFLOP/s follow
// from them, each round's time is kept, a path that did not run stays as it
// was, and one round alone is left untouched.
func TestMedianRows(t *testing.T) {
	row := func(impl string, fwd, bwd float64) benchRow {
		f, b := attnFLOPs(2, 16, 8192, 128, true)
		return benchRow{Kind: "attention", Impl: impl, B: 2, H: 16, S: 8192, D: 128, Causal: true,
			FwdMs: fptr(fwd), BwdMs: fptr(bwd), FwdTFLOPs: fptr(tflops(f, fwd)), BwdTFLOPs: fptr(tflops(b, bwd))}
	}
	skipped := benchRow{Kind: "attention", Impl: "composed", B: 2, H: 16, S: 8192, D: 128, Causal: true, Error: sptr("skipped")}
	rounds := [][]benchRow{
		{row("fused", 1.0, 3.0), skipped, row("torch-cudnn", 1.2, 2.5)},
		{row("torch-cudnn", 1.1, 2.9), row("fused", 0.8, 2.6), skipped},
		{row("fused", 0.9, 2.7), skipped, row("torch-cudnn", 1.3, 2.4)},
	}
	got := medianRows(rounds)
	if len(got) != 3 || got[0].Impl != "fused" || got[1].Impl != "composed" || got[2].Impl != "torch-cudnn" {
		t.Fatalf("rows %v", got)
	}
	f, b := attnFLOPs(2, 16, 8192, 128, true)
	for _, c := range []struct {
		r        benchRow
		fwd, bwd float64
	}{{got[0], 0.9, 2.7}, {got[2], 1.2, 2.5}} {
		if *c.r.FwdMs != c.fwd || *c.r.BwdMs != c.bwd {
			t.Errorf("%s: fwd %v bwd %v ms, want medians %v %v", c.r.Impl, *c.r.FwdMs, *c.r.BwdMs, c.fwd, c.bwd)
		}
		if *c.r.FwdTFLOPs != tflops(f, c.fwd) || *c.r.BwdTFLOPs != tflops(b, c.bwd) {
			t.Errorf("%s: TFLOP/s %v %v not from the medians", c.r.Impl, *c.r.FwdTFLOPs, *c.r.BwdTFLOPs)
		}
		if len(c.r.FwdMsRounds) != 3 || len(c.r.BwdMsRounds) != 3 {
			t.Errorf("%s: rounds %v %v", c.r.Impl, c.r.FwdMsRounds, c.r.BwdMsRounds)
		}
	}
	if got[0].FwdMsRounds[1] != 0.8 {
		t.Errorf("fused rounds %v, want them in round order", got[0].FwdMsRounds)
	}
	if c := got[1]; c.Error == nil || c.FwdMs != nil || c.BwdMs != nil {
		t.Errorf("the skipped path: %+v", c)
	}
	one := medianRows(rounds[:1])
	if len(one) != 3 || *one[0].FwdMs != 1.0 || one[0].FwdMsRounds != nil {
		t.Errorf("one round: %+v", one[0])
	}
	if m := medianPtr([]float64{4, 1, 3, 2}); *m != 2.5 {
		t.Errorf("median of an even count: %v", *m)
	}
}
