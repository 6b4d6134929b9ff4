package bench

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda"
)

// A case's name in the manifest, the files and the rows.
func TestAccuracyCaseName(t *testing.T) {
	c := AccuracyCase{DType: "float16", B: 1, H: 4, S: 4096, D: 64, Causal: true}
	if n := accuracyCaseName(c); n != "fp16_b1_h4_s4096_d64_causal" {
		t.Errorf("name %q", n)
	}
	c.KVHeads = 4 // H_kv = H: multi-head, the same name
	if n := accuracyCaseName(c); n != "fp16_b1_h4_s4096_d64_causal" {
		t.Errorf("H_kv = H: name %q", n)
	}
	c.KVHeads = 1
	if n := accuracyCaseName(c); n != "fp16_b1_h4_kv1_s4096_d64_causal" {
		t.Errorf("grouped name %q", n)
	}
}

// testAccuracyData is a case's inputs (AccuracyInputs) with outputs
// that are a float64 attention (naiveAttention) rounded to the element type.
func testAccuracyData(t *testing.T, c AccuracyCase) *AccuracyData {
	t.Helper()
	q, k, v, dout, err := AccuracyInputs(c, 3)
	if err != nil {
		t.Fatal(err)
	}
	widen, round := cuda.BF16ToFloat32, cuda.BF16FromFloat32
	if c.DType == "float16" {
		widen, round = cuda.F16ToFloat32, cuda.F16FromFloat32
	}
	f64 := func(x []uint16) []float64 {
		out := make([]float64, len(x))
		for i, h := range x {
			out[i] = float64(widen(h))
		}
		return out
	}
	o, lse, dq, dk, dv := naiveAttention(f64(q), f64(k), f64(v), f64(dout), c.B*c.H, c.H/c.KV(), c.S, c.D, float64(c.Scale()), c.Causal)
	r16 := func(x []float64) []uint16 {
		out := make([]uint16, len(x))
		for i, f := range x {
			out[i] = round(float32(f))
		}
		return out
	}
	l32 := make([]float32, len(lse))
	for i, f := range lse {
		l32[i] = float32(f)
	}
	return &AccuracyData{Case: c, Q: q, K: k, V: v, DO: dout, O: r16(o), DQ: r16(dq), DK: r16(dk), DV: r16(dv), LSE: l32}
}

// naiveAttention is attention forward and backward in float64, row by row
// (causal: key j visible to query i iff j <= i; query head b reads K/V head
// b/group, whose dK and dV sum over its group), written independently of
// sdpa_error.py's blocked reference so the end-to-end test checks one with
// the other.
func naiveAttention(q, k, v, dout []float64, bh, group, s, d int, scale float64, causal bool) (o, lse, dq, dk, dv []float64) {
	o, lse, dq = make([]float64, len(q)), make([]float64, bh*s), make([]float64, len(q))
	dk, dv = make([]float64, len(k)), make([]float64, len(v))
	p := make([]float64, s)
	for b := range bh {
		base, kvBase := b*s*d, (b/group)*s*d
		for i := range s {
			n := s
			if causal {
				n = i + 1
			}
			m := math.Inf(-1)
			for j := range n {
				dot := 0.0
				for c := range d {
					dot += q[base+i*d+c] * k[kvBase+j*d+c]
				}
				p[j] = dot * scale
				m = max(m, p[j])
			}
			sum := 0.0
			for j := range n {
				p[j] = math.Exp(p[j] - m)
				sum += p[j]
			}
			lse[b*s+i] = m + math.Log(sum)
			for j := range n {
				p[j] /= sum
				for c := range d {
					o[base+i*d+c] += p[j] * v[kvBase+j*d+c]
				}
			}
			dsum := 0.0
			for c := range d {
				dsum += dout[base+i*d+c] * o[base+i*d+c]
			}
			for j := range n {
				dp := 0.0
				for c := range d {
					dp += dout[base+i*d+c] * v[kvBase+j*d+c]
				}
				ds := p[j] * (dp - dsum) * scale
				for c := range d {
					dq[base+i*d+c] += ds * k[kvBase+j*d+c]
					dk[kvBase+j*d+c] += ds * q[base+i*d+c]
					dv[kvBase+j*d+c] += p[j] * dout[base+i*d+c]
				}
			}
		}
	}
	return o, lse, dq, dk, dv
}

// The files are the device's bits, little-endian, where the manifest says,
// and readAccuracyManifest notices a file of the wrong size.
func TestAccuracyManifestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	c := AccuracyCase{DType: "bfloat16", B: 1, H: 2, S: 24, D: 8, Causal: true}
	data := testAccuracyData(t, c)
	ent, err := writeAccuracyCase(dir, data)
	if err != nil {
		t.Fatal(err)
	}
	man := accuracyManifest{Format: accuracyFormat, Layout: accuracyLayout, Device: "test", Seed: 3, Cases: []accuracyCaseEnt{ent}}
	if err := writeAccuracyManifest(dir, man); err != nil {
		t.Fatal(err)
	}
	got, err := readAccuracyManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	g := got.Cases[0]
	if len(got.Cases) != 1 || g.Name != "bf16_b1_h2_s24_d8_causal" || g.DType != "bfloat16" || g.B != 1 || g.H != 2 ||
		g.S != 24 || g.D != 8 || !g.Causal || g.Scale != float64(float32(1/math.Sqrt(8))) || got.Seed != 3 {
		t.Errorf("manifest case %+v", g)
	}
	raw, err := os.ReadFile(filepath.Join(dir, g.Files["dk"]))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range data.DK {
		if v := binary.LittleEndian.Uint16(raw[2*i:]); v != want {
			t.Fatalf("dk element %d: file %#04x, data %#04x", i, v, want)
		}
	}
	raw, err = os.ReadFile(filepath.Join(dir, g.Files["lse"]))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range data.LSE {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); v != want {
			t.Fatalf("lse element %d: file %v, data %v", i, v, want)
		}
	}
	if err := os.Truncate(filepath.Join(dir, g.Files["v"]), 10); err != nil {
		t.Fatal(err)
	}
	if _, err := readAccuracyManifest(dir); err == nil || !strings.Contains(err.Error(), "v.u16") {
		t.Errorf("truncated v: %v", err)
	}
	short := *data
	short.O = short.O[:5]
	if _, err := writeAccuracyCase(t.TempDir(), &short); err == nil {
		t.Error("a short O was written")
	}

	// A grouped case: K, V, dK, dV of H_kv heads, H_kv in the manifest.
	gdir := t.TempDir()
	gc := AccuracyCase{DType: "bfloat16", B: 1, H: 4, KVHeads: 2, S: 24, D: 8, Causal: true}
	gdata := testAccuracyData(t, gc)
	if len(gdata.K) != 2*24*8 || len(gdata.DK) != 2*24*8 || len(gdata.Q) != 4*24*8 {
		t.Fatalf("grouped data: K %d dK %d Q %d elements", len(gdata.K), len(gdata.DK), len(gdata.Q))
	}
	gent, err := writeAccuracyCase(gdir, gdata)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeAccuracyManifest(gdir, accuracyManifest{Format: accuracyFormat, Layout: accuracyLayout, Cases: []accuracyCaseEnt{gent}}); err != nil {
		t.Fatal(err)
	}
	gm, err := readAccuracyManifest(gdir)
	if err != nil {
		t.Fatal(err)
	}
	if g := gm.Cases[0]; g.H != 4 || g.HKV != 2 || g.Name != "bf16_b1_h4_kv2_s24_d8_causal" {
		t.Errorf("grouped manifest case %+v", g)
	}
	if ent.HKV != 2 {
		t.Errorf("a multi-head case's H_kv is %d, want H", ent.HKV)
	}
	bad := gent
	bad.HKV = 3
	if err := writeAccuracyManifest(gdir, accuracyManifest{Format: accuracyFormat, Cases: []accuracyCaseEnt{bad}}); err != nil {
		t.Fatal(err)
	}
	if _, err := readAccuracyManifest(gdir); err == nil || !strings.Contains(err.Error(), "H_kv 3") {
		t.Errorf("H_kv 3 of H 4: %v", err)
	}
}

// The float64 test reference's grouped form is its multi-head form on K
// and V repeated per query head, with dK and dV summed over each group.
func TestNaiveAttentionGrouped(t *testing.T) {
	const h, group, s, d = 4, 2, 6, 3
	r := rand.New(rand.NewPCG(1, 2))
	draw := func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = r.NormFloat64()
		}
		return x
	}
	q, k, v, dout := draw(h*s*d), draw(h/group*s*d), draw(h/group*s*d), draw(h*s*d)
	repeat := func(x []float64) []float64 {
		var out []float64
		for b := range h {
			kv := b / group
			out = append(out, x[kv*s*d:(kv+1)*s*d]...)
		}
		return out
	}
	for _, causal := range []bool{false, true} {
		o, lse, dq, dk, dv := naiveAttention(q, k, v, dout, h, group, s, d, 0.4, causal)
		ro, rlse, rdq, rdk, rdv := naiveAttention(q, repeat(k), repeat(v), dout, h, 1, s, d, 0.4, causal)
		sum := func(x []float64) []float64 {
			out := make([]float64, h/group*s*d)
			for b := range h {
				for i := range s * d {
					out[(b/group)*s*d+i] += x[b*s*d+i]
				}
			}
			return out
		}
		for _, c := range []struct {
			name      string
			got, want []float64
		}{{"o", o, ro}, {"lse", lse, rlse}, {"dq", dq, rdq}, {"dk", dk, sum(rdk)}, {"dv", dv, sum(rdv)}} {
			if len(c.got) != len(c.want) {
				t.Fatalf("causal=%v %s: %d elements, want %d", causal, c.name, len(c.got), len(c.want))
			}
			for i := range c.got {
				if math.Abs(c.got[i]-c.want[i]) > 1e-12 {
					t.Fatalf("causal=%v %s[%d] = %v, want %v", causal, c.name, i, c.got[i], c.want[i])
				}
			}
		}
	}
}

// accuracyLines are sdpa_error.py lines for one case: ours, cuDNN and
// FLASH (ours above cuDNN on dQ), and a second case where cuDNN refused.
const accuracyLines = `{"case": "bf16_b1_h4_s1024_d128_full", "impl": "ours", "dtype": "bfloat16", "B": 1, "H": 4, "S": 1024, "D": 128, "causal": false, "scale": 0.08838834764831845, "metrics": {"o": {"rel_l2": 0.0020, "max_abs": 0.004, "ref_max_abs": 1.1, "nonfinite": 0}, "lse": {"rel_l2": 1e-8, "max_abs": 1e-6, "ref_max_abs": 9.0, "nonfinite": 0}, "dq": {"rel_l2": 0.0033, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 0}, "dk": {"rel_l2": 0.0030, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 0}, "dv": {"rel_l2": 0.0025, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 0}}, "error": null, "gpu": "H200", "torch": "2.11.0", "ref_device": "cuda"}
{"case": "bf16_b1_h4_s1024_d128_full", "impl": "cudnn", "dtype": "bfloat16", "B": 1, "H": 4, "S": 1024, "D": 128, "causal": false, "scale": 0.08838834764831845, "metrics": {"o": {"rel_l2": 0.0025, "max_abs": 0.005, "ref_max_abs": 1.1, "nonfinite": 0}, "dq": {"rel_l2": 0.0030, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 0}, "dk": {"rel_l2": 0.0030, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 0}, "dv": {"rel_l2": 0.0050, "max_abs": 0.02, "ref_max_abs": 2.0, "nonfinite": 0}}, "error": null, "gpu": "H200", "torch": "2.11.0", "ref_device": "cuda"}

{"case": "bf16_b1_h4_s1024_d128_full", "impl": "flash", "dtype": "bfloat16", "B": 1, "H": 4, "S": 1024, "D": 128, "causal": false, "scale": 0.08838834764831845, "metrics": {"o": {"rel_l2": 0.0026, "max_abs": 0.005, "ref_max_abs": 1.1, "nonfinite": 0}, "dq": {"rel_l2": 0.0040, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 0}, "dk": {"rel_l2": 0.0041, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 3}, "dv": {"rel_l2": 0.0042, "max_abs": 0.02, "ref_max_abs": 2.0, "nonfinite": 0}}, "error": null, "gpu": "H200", "torch": "2.11.0", "ref_device": "cuda"}
{"case": "bf16_b1_h4_s1024_d128_causal", "impl": "ours", "dtype": "bfloat16", "B": 1, "H": 4, "S": 1024, "D": 128, "causal": true, "scale": 0.08838834764831845, "metrics": {"o": {"rel_l2": 0.0020, "max_abs": 0.004, "ref_max_abs": 1.1, "nonfinite": 0}, "lse": {"rel_l2": 1e-8, "max_abs": 1e-6, "ref_max_abs": 9.0, "nonfinite": 0}, "dq": {"rel_l2": 0.0030, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 0}, "dk": {"rel_l2": 0.0030, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 0}, "dv": {"rel_l2": 0.0025, "max_abs": 0.01, "ref_max_abs": 2.0, "nonfinite": 0}}, "error": null, "gpu": "H200", "torch": "2.11.0", "ref_device": "cuda"}
{"case": "bf16_b1_h4_s1024_d128_causal", "impl": "cudnn", "dtype": "bfloat16", "B": 1, "H": 4, "S": 1024, "D": 128, "causal": true, "scale": 0.08838834764831845, "metrics": {}, "error": "No available kernel. Aborting execution. [cuDNN refused]", "gpu": "H200", "torch": "2.11.0", "ref_device": "cuda"}
`

func TestAccuracyTable(t *testing.T) {
	rows, err := parseAccuracyRows(strings.NewReader(accuracyLines))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 5 || rows[0].Impl != "fused" || rows[1].Impl != "torch-cudnn" || rows[2].Impl != "torch-flash" ||
		rows[0].Kind != "attention_accuracy" || rows[4].Error == nil {
		t.Fatalf("rows %+v", rows)
	}
	if m := rows[0].Metrics["dq"]; m.RelL2 == nil || *m.RelL2 != 0.0033 || m.RefMaxAbs != 2 {
		t.Errorf("ours dq %+v", m)
	}
	cases := []AccuracyCase{
		{DType: "bfloat16", B: 1, H: 4, S: 1024, D: 128, Causal: false},
		{DType: "bfloat16", B: 1, H: 4, S: 1024, D: 128, Causal: true},
	}
	var buf bytes.Buffer
	printAccuracyTable(&buf, cases, rows, "rel")
	printAccuracyVerdict(&buf, cases, rows)
	out := buf.String()
	t.Logf("\n%s", out)
	lines := strings.Split(out, "\n")
	// Case 1: O 0.0020/0.0025 = 0.80; dQ 0.0033/0.0030 = 1.10 (marked);
	// dK 1.00; dV 0.50; FLASH's dK has NaNs.
	want1 := "bf16   128   1024  0 | 2.00e-03 2.50e-03    0.80 2.60e-03 | 3.30e-03 3.00e-03   1.10* 4.00e-03 |" +
		" 3.00e-03 3.00e-03    1.00      nan | 2.50e-03 5.00e-03    0.50 4.20e-03 | 1.00e-08"
	want2 := "bf16   128   1024  1 | 2.00e-03      err       - " // cuDNN refused the causal case; FLASH has no row
	if len(lines) < 5 || lines[3] != want1 || !strings.HasPrefix(lines[4], want2) {
		t.Errorf("table lines:\n%q\n%q\nwant\n%q\n%q...", lines[3], lines[4], want1, want2)
	}
	for _, s := range []string{
		"torch-cudnn bf16_b1_h4_s1024_d128_causal: No available kernel",
		"verdict: ours/cuDNN > 1 for 1 of the 4 relative L2 errors compared (8 in all):",
		"  bf16 D=128 S=1024 causal=false dQ: 1.10 (3.30e-03 vs 3.00e-03)\n",
		"not compared (ours or cuDNN has no finite number): bf16 D=128 S=1024 causal=true O,dQ,dK,dV\n",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q", s)
		}
	}
	// The header lines up with the rows.
	if h := lines[2]; len([]rune(h)) != len([]rune(lines[3])) {
		t.Errorf("header is %d runes wide, rows %d:\n%s\n%s", len([]rune(h)), len([]rune(lines[3])), h, lines[3])
	}

	// Every ratio <= 1: one plain verdict line.
	good := strings.ReplaceAll(strings.Split(accuracyLines, "\n")[0], `"dq": {"rel_l2": 0.0033`, `"dq": {"rel_l2": 0.0029`) + "\n" +
		strings.Split(accuracyLines, "\n")[1] + "\n"
	rows, err = parseAccuracyRows(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	printAccuracyVerdict(&buf, cases[:1], rows)
	if got := buf.String(); got != "verdict: ours/cuDNN <= 1 for all 4 relative L2 errors (O, dQ, dK, dV of 1 case)\n" {
		t.Errorf("verdict %q", got)
	}
	buf.Reset()
	printAccuracyTable(&buf, cases[:1], rows, "max")
	if !strings.Contains(buf.String(), "max |x − ref|") || !strings.Contains(buf.String(), " 4.00e-03 5.00e-03    0.80 ") {
		t.Errorf("max table:\n%s", buf.String())
	}

	for _, bad := range []string{
		`{"case": "x", "impl": "ours", "B": 1, "H": 1, "S": 0, "D": 8, "metrics": {}}`,
		`{"case": "x", "impl": "ours", "B": 1, "H": 1, "S": 8, "D": 8, "error": null}`,
		`{"case": "x", `,
	} {
		if _, err := parseAccuracyRows(strings.NewReader(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// fakePython writes an executable shell script standing in for python3:
// "-c" (the import check) exits with importRC; a script run copies lines
// to its --out file and exits with runRC.
func fakePython(t *testing.T, importRC, runRC int, lines string) string {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "lines.jsonl")
	if err := os.WriteFile(data, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\n" +
		"if [ \"$1\" = -c ]; then echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit " + strconv.Itoa(importRC) + "; fi\n" +
		"while [ $# -gt 0 ]; do if [ \"$1\" = --out ]; then out=\"$2\"; fi; shift; done\n" +
		"cp '" + data + "' \"$out\"\nexit " + strconv.Itoa(runRC) + "\n"
	py := filepath.Join(dir, "python3")
	if err := os.WriteFile(py, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return py
}

func TestAccuracyPythonErrors(t *testing.T) {
	script := filepath.Join(t.TempDir(), "sdpa_error.py")
	if err := os.WriteFile(script, []byte("# stand-in\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A missing script is named with the flag that sets it.
	err := checkAccuracyPython("python3", filepath.Join(t.TempDir(), "nope.py"))
	if err == nil || !strings.Contains(err.Error(), "-accuracy-script") || !strings.Contains(err.Error(), "nope.py") {
		t.Errorf("missing script: %v", err)
	}
	err = checkAccuracyPython(filepath.Join(t.TempDir(), "no-such-python"), script)
	if err == nil || !strings.Contains(err.Error(), "-torch") || !strings.Contains(err.Error(), "torch and numpy") {
		t.Errorf("missing python: %v", err)
	}
	err = checkAccuracyPython(fakePython(t, 1, 0, ""), script)
	if err == nil || !strings.Contains(err.Error(), "cannot import torch and numpy") || !strings.Contains(err.Error(), "No module named 'torch'") {
		t.Errorf("python without torch: %v", err)
	}
	if err := checkAccuracyPython(fakePython(t, 0, 0, ""), script); err != nil {
		t.Errorf("python with torch: %v", err)
	}

	// The script's lines come back as rows; its failure comes back with
	// the rows it wrote.
	dir := t.TempDir()
	var log bytes.Buffer
	rows, err := runAccuracyPython(&log, fakePython(t, 0, 0, accuracyLines), script, dir, "cudnn,flash", "cuda")
	if err != nil || len(rows) != 5 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	if !strings.Contains(log.String(), "--dir "+dir) || !strings.Contains(log.String(), "--backends cudnn,flash --device cuda") {
		t.Errorf("command echo: %s", log.String())
	}
	rows, err = runAccuracyPython(io.Discard, fakePython(t, 0, 2, strings.Split(accuracyLines, "\n")[0]+"\n"), script, dir, "cudnn", "cuda")
	if err == nil || len(rows) != 1 || !strings.Contains(err.Error(), "exit status 2") {
		t.Errorf("failing script: %d rows, %v", len(rows), err)
	}
}

// accuracyTestPython is a python3 with torch and numpy on this machine
// ("" when there is none).
func accuracyTestPython(script string) string {
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if checkAccuracyPython(py, script) == nil {
			return py
		}
	}
	return ""
}

// End to end on the CPU where PyTorch is installed: the files this command
// writes, read by the real script, with "ours" a float64 attention rounded
// to bf16, so the script's blocked reference meets an independent one; the
// SDPA backends report that they need CUDA instead of failing.
func TestAccuracyScriptOnCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("runs python3 with torch")
	}
	script, err := filepath.Abs("../tools/reference/sdpa_error.py")
	if err != nil {
		t.Fatal(err)
	}
	py := accuracyTestPython(script)
	if py == "" {
		t.Skip("no python3 with torch and numpy")
	}
	dir := t.TempDir()
	cases := []AccuracyCase{
		{DType: "bfloat16", B: 1, H: 2, S: 40, D: 16, Causal: true},
		{DType: "float16", B: 1, H: 2, S: 40, D: 16, Causal: false},
		{DType: "bfloat16", B: 1, H: 4, KVHeads: 2, S: 40, D: 16, Causal: true},
		{DType: "bfloat16", B: 1, H: 4, KVHeads: 1, S: 40, D: 16, Causal: false},
	}
	man := accuracyManifest{Format: accuracyFormat, Layout: accuracyLayout, Seed: 3}
	for _, c := range cases {
		data := testAccuracyData(t, c)
		if c.Causal && c.KV() == c.H {
			data.DV[5] = 0x7fc0 // a NaN, as an element the kernels never wrote
		}
		ent, err := writeAccuracyCase(dir, data)
		if err != nil {
			t.Fatal(err)
		}
		man.Cases = append(man.Cases, ent)
	}
	if err := writeAccuracyManifest(dir, man); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	rows, err := runAccuracyPython(&log, py, script, dir, "cudnn,flash", "cpu")
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(rows) != 3*len(cases) {
		t.Fatalf("%d rows, want 3 per case:\n%s", len(rows), log.String())
	}
	for _, r := range rows {
		if r.Impl != "fused" {
			if r.Error == nil || !strings.Contains(*r.Error, "needs CUDA") {
				t.Errorf("%s %s: error %v, want needs CUDA", r.Case, r.Impl, r.Error)
			}
			continue
		}
		// Rounding the exact outputs to bf16 (fp16) leaves a relative error
		// of about 2⁻⁹/√3 (2⁻¹²/√3); far more means the two references disagree.
		tol := 4e-3
		if r.DType == "float16" {
			tol = 5e-4
		}
		for _, out := range []string{"o", "dq", "dk", "dv"} {
			m := r.Metrics[out]
			if r.Causal && out == "dv" && r.HKV == 0 {
				if m.Nonfinite != 1 || m.RelL2 != nil {
					t.Errorf("%s dv: %+v, want the NaN counted", r.Case, m)
				}
				continue
			}
			if m.RelL2 == nil || !(*m.RelL2 > 0 && *m.RelL2 < tol) || m.MaxAbs == nil || m.Nonfinite != 0 {
				t.Errorf("%s %s: %+v (rel L2 %v), want in (0, %g)", r.Case, out, m, deref(m.RelL2), tol)
			}
		}
		// LSE went through float32 only.
		if m := r.Metrics["lse"]; m.RelL2 == nil || *m.RelL2 > 1e-7 {
			t.Errorf("%s lse: %+v", r.Case, m)
		}
	}
	var buf bytes.Buffer
	printAccuracyTable(&buf, cases, rows, "rel")
	printAccuracyVerdict(&buf, cases, rows)
	t.Logf("\n%s", buf.String())
	if !strings.Contains(buf.String(), "verdict: nothing compared") {
		t.Errorf("no cuDNN numbers, yet the verdict compares:\n%s", buf.String())
	}
}

func deref(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}
