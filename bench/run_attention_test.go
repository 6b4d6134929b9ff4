package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
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
	if !strings.Contains(text, "(ours: peak of our own allocations; torch: max_memory_allocated)") || strings.Contains(text, "cuMemGetInfo") {
		t.Errorf("the legend should say that our peak GiB is the peak of our own allocations:\n%s", text)
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

// -kv-heads: each D's entries in order, H_kv = H folded into multi-head
// attention (once), and an entry that does not divide H named.
func TestAttentionShapes(t *testing.T) {
	got, err := AttentionShapes([]int{2048, 4096}, []int{128}, []int{8, 1}, []bool{true}, 16384, 4096)
	if err != nil {
		t.Fatal(err)
	}
	want := []TableShape{{S: 2048, D: 128, KVHeads: 8, Causal: true}, {S: 4096, D: 128, KVHeads: 8, Causal: true},
		{S: 2048, D: 128, KVHeads: 1, Causal: true}, {S: 4096, D: 128, KVHeads: 1, Causal: true}}
	if !slices.Equal(got, want) {
		t.Errorf("shapes %v, want %v", got, want)
	}
	// Without -kv-heads: the multi-head shapes as before (D, S, causal).
	mha, err := AttentionShapes([]int{512, 1024}, []int{64, 128}, nil, []bool{false, true}, 16384, 2048)
	if err != nil || len(mha) != 8 || mha[0] != (TableShape{S: 512, D: 64}) || mha[7] != (TableShape{S: 1024, D: 128, Causal: true}) {
		t.Errorf("MHA shapes %v, %v", mha, err)
	}
	// H = 32 at D=64, 16 at D=128 (width 2048): 16 is GQA at D=64 and MHA at D=128.
	mixed, err := AttentionShapes([]int{1024}, []int{64, 128}, []int{16, 16, 4}, []bool{true}, 16384, 2048)
	if err != nil {
		t.Fatal(err)
	}
	want = []TableShape{{S: 1024, D: 64, KVHeads: 16, Causal: true}, {S: 1024, D: 64, KVHeads: 4, Causal: true},
		{S: 1024, D: 128, Causal: true}, {S: 1024, D: 128, KVHeads: 4, Causal: true}}
	if !slices.Equal(mixed, want) {
		t.Errorf("mixed shapes %v, want %v", mixed, want)
	}
	for _, c := range []struct {
		kv            []int
		tokens, width int
		seqs          []int
		want          string
	}{
		{[]int{3}, 16384, 4096, []int{2048}, "-kv-heads 3: must divide H = 32"},
		{[]int{64}, 16384, 4096, []int{2048}, "-kv-heads 64: must divide H = 32"},
		{[]int{0}, 16384, 4096, []int{2048}, "-kv-heads 0"},
		{nil, 16384, 4096, []int{3000}, "must be multiples"},
		{nil, 16384, 4000, []int{2048}, "-width 4000 must be a multiple of D"},
		{nil, 0, 4096, []int{2048}, "must be positive"},
	} {
		_, err := AttentionShapes(c.seqs, []int{128}, c.kv, []bool{true}, c.tokens, c.width)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("kv %v tokens %d width %d seqs %v: error %v, want %q", c.kv, c.tokens, c.width, c.seqs, err, c.want)
		}
	}
}

// sdpa_bench.py gets --kv-heads as given, and only when it was given.
func TestTorchArgsKVHeads(t *testing.T) {
	shapes := []TableShape{{S: 2048, D: 128, KVHeads: 8, Causal: true}, {S: 4096, D: 128, KVHeads: 1, Causal: true}}
	args, out, err := torchArgs("sdpa_bench.py", "flash,cudnn", shapes, []int{8, 1}, 16384, 4096, 3, 20, 0)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	line := strings.Join(args, " ")
	for _, want := range []string{"sdpa_bench.py --backends flash,cudnn --seqs 2048,4096 --head-dims 128 --causal causal", "--kv-heads 8,1", "--out " + out} {
		if !strings.Contains(line, want) {
			t.Errorf("args %q lack %q", line, want)
		}
	}
	args, out, err = torchArgs("sdpa_bench.py", "flash", shapes[:1], nil, 16384, 4096, 3, 20, 0)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	if slices.Contains(args, "--kv-heads") {
		t.Errorf("multi-head args %v pass --kv-heads", args)
	}
}

// Grouped rows: sdpa_bench.py's H_kv (H_kv = H read as multi-head), our
// fused grouped row with the composed path skipped, the Hkv column and the
// notes; a table without grouped shapes keeps its multi-head layout
// (TestParseTorchRowsAndTable).
func TestGQATable(t *testing.T) {
	const lines = `{"backend": "flash", "B": 8, "H": 32, "H_kv": 8, "S": 2048, "D": 128, "causal": true, "dtype": "bfloat16", "fwd_ms": 1.0, "bwd_ms": 3.0, "peak_mem_bytes": 402653184, "iters": 20, "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "error": null}
{"backend": "cudnn", "B": 8, "H": 32, "H_kv": 8, "S": 2048, "D": 128, "causal": true, "dtype": "bfloat16", "fwd_ms": null, "bwd_ms": null, "peak_mem_bytes": null, "iters": 20, "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "error": "No available kernel. [cuDNN does not support GQA]"}
{"backend": "flash", "B": 8, "H": 32, "H_kv": 32, "S": 2048, "D": 128, "causal": true, "dtype": "bfloat16", "fwd_ms": 1.1, "bwd_ms": 3.3, "peak_mem_bytes": 402653184, "iters": 20, "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "error": null}
{"backend": "cudnn", "B": 8, "H": 32, "S": 2048, "D": 128, "causal": true, "dtype": "bfloat16", "fwd_ms": 1.2, "bwd_ms": 2.2, "peak_mem_bytes": 402653184, "iters": 20, "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "error": null}
`
	torch, err := parseTorchRows(strings.NewReader(lines))
	if err != nil {
		t.Fatal(err)
	}
	if torch[0].HKV != 8 || torch[1].HKV != 8 || torch[2].HKV != 0 || torch[3].HKV != 0 {
		t.Fatalf("H_kv read as %d %d %d %d, want 8 8 0 0 (H_kv = H, or none, is multi-head)", torch[0].HKV, torch[1].HKV, torch[2].HKV, torch[3].HKV)
	}
	if _, err := parseTorchRows(strings.NewReader(`{"backend": "flash", "B": 8, "H": 32, "H_kv": 5, "S": 2048, "D": 128}`)); err == nil || !strings.Contains(err.Error(), "H_kv 5") {
		t.Errorf("an H_kv that does not divide H: %v", err)
	}
	gqa := &AttnResult{Shape: AttnShape{B: 8, H: 32, KVHeads: 8, S: 2048, D: 128, Causal: true},
		Fused: AttnTiming{FwdMs: 0.8, BwdMs: 2.5, MeasuredBytes: 300 << 20}, Composed: AttnTiming{Err: composedSkipGQA}}
	mha := &AttnResult{Shape: AttnShape{B: 8, H: 32, S: 2048, D: 128, Causal: true},
		Fused: AttnTiming{FwdMs: 0.9, BwdMs: 2.75, MeasuredBytes: 400 << 20}, Composed: AttnTiming{Err: "skipped"}}
	ours := append(attnRows(gqa, 20, "NVIDIA H200"), attnRows(mha, 20, "NVIDIA H200")...)
	if ours[0].HKV != 8 || ours[1].HKV != 8 || ours[2].HKV != 0 {
		t.Fatalf("our rows' H_kv %d %d %d, want 8 8 0", ours[0].HKV, ours[1].HKV, ours[2].HKV)
	}
	b, _ := json.Marshal(ours[2])
	if strings.Contains(string(b), "H_kv") {
		t.Errorf("a multi-head row's JSON has H_kv: %s", b)
	}
	all := append(torch, ours...)
	shapes := []TableShape{{S: 2048, D: 128, Causal: true}, {S: 2048, D: 128, KVHeads: 8, Causal: true}}
	var out bytes.Buffer
	printAttnTable(&out, shapes, all)
	text := out.String()
	t.Log("\n" + text)
	var mhaRow, gqaRow string
	for _, l := range strings.Split(text, "\n") {
		fs := strings.Fields(l)
		if len(fs) > 4 && fs[0] == "128" && fs[1] == "2048" && fs[2] == "1" {
			switch fs[3] {
			case "32":
				mhaRow = l
			case "8":
				gqaRow = l
			}
		}
	}
	if mhaRow == "" || gqaRow == "" {
		t.Fatalf("the table lacks a row with Hkv 32 or 8:\n%s", text)
	}
	f, _ := attnFLOPs(8, 32, 2048, 128, true)
	// D S c Hkv | fused comp flash cudnn eff | ...: the grouped row's fused
	// and flash TFLOP/s come from its own rows, the composed path is skipped,
	// cuDNN failed.
	want := []string{"128", "2048", "1", "8", "|", fmtTF(tflops(f, 0.8)), "skip", fmtTF(tflops(f, 1.0)), "err", "-", "|"}
	if got := strings.Fields(gqaRow); !slices.Equal(got[:len(want)], want) {
		t.Errorf("grouped row %q, want it to start %q", gqaRow, want)
	}
	if !strings.Contains(gqaRow, " 1.25  1.20  1.21 |") {
		t.Errorf("grouped row %q lacks fused/flash 1.0/0.8, 3.0/2.5, 4.0/3.3", gqaRow)
	}
	if got := strings.Fields(mhaRow); got[5] != fmtTF(tflops(f, 0.9)) || got[7] != fmtTF(tflops(f, 1.1)) {
		t.Errorf("multi-head row %q: fused %s and flash %s expected", mhaRow, fmtTF(tflops(f, 0.9)), fmtTF(tflops(f, 1.1)))
	}
	for _, want := range []string{"Hkv", "enable_gqa=True", "torch-cudnn D=128 S=2048 H_kv=8 causal=true: No available kernel"} {
		if !strings.Contains(text, want) {
			t.Errorf("the table lacks %q", want)
		}
	}
	// Against the fastest SDPA backend per phase: grouped, cuDNN failed, so
	// FLASH; multi-head, FLASH's forward (1.1 ms), cuDNN's backward (2.2 ms)
	// and cuDNN's total (3.4 ms) against fused's 0.9, 2.75, 3.65.
	for _, want := range []string{"D=128 S=2048 Hkv=8 causal=true: fwd 1.25 (flash) bwd 1.20 (flash) f+b 1.21 (flash)",
		"D=128 S=2048 Hkv=32 causal=true: fwd 1.22 (flash) bwd 0.80 (cudnn) f+b 0.93 (cudnn)"} {
		if !strings.Contains(text, want) {
			t.Errorf("the table lacks %q", want)
		}
	}
	if strings.Contains(text, "composed D=128") {
		t.Errorf("a skipped composed path must not be a note:\n%s", text)
	}
	// Rounds keep grouped and multi-head rows apart; -json sorts MHA first.
	merged := medianRows([][]benchRow{all, all})
	if len(merged) != len(all) {
		t.Errorf("medianRows merged %d rows into %d: grouped and multi-head rows must stay apart", len(all), len(merged))
	}
	sortRows(merged)
	if merged[0].HKV != 0 || merged[len(merged)-1].HKV != 8 {
		t.Errorf("sortRows: first H_kv %d, last %d", merged[0].HKV, merged[len(merged)-1].HKV)
	}
}
