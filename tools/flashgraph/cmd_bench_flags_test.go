package main

import (
	"errors"
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/bench"
)

func TestBenchFlags(t *testing.T) {
	if _, err := parseInts("seqs", "512, 1024"); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", "0", "x", "-5"} {
		if _, err := parseInts("seqs", bad); err == nil {
			t.Errorf("parseInts(%q) accepted", bad)
		}
	}
	if ms, err := parseMemShapes("4096:8,16384:16"); err != nil || len(ms) != 2 || ms[1] != (bench.MemShape{S: 16384, B: 16}) {
		t.Errorf("parseMemShapes: %v %v", ms, err)
	}
	if _, err := parseMemShapes("4096"); err == nil {
		t.Error("parseMemShapes accepted S without B")
	}
	if _, err := parseCausal("sometimes"); err == nil {
		t.Error("parseCausal accepted nonsense")
	}
	code, _, stderr := runCode("bench", "-seqs", "1000")
	if code == 0 || !strings.Contains(stderr, "multiples") {
		t.Errorf("S that does not divide the tokens: code %d, %s", code, stderr)
	}
	// -kv-heads is checked against every D's H before any GPU work.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-dims", "128", "-width", "4096", "-kv-heads", "3"}, "-kv-heads 3: must divide H = 32"},
		{[]string{"-dims", "64,128", "-width", "2048", "-kv-heads", "32"}, "-kv-heads 32: must divide H = 16"},
		{[]string{"-kv-heads", "8,x"}, `-kv-heads: "x" is not a positive integer`},
		{[]string{"-kv-heads", ""}, "-kv-heads: empty list"},
		{[]string{"-kv-heads", "1", "-decode", "1"}, "-decode times multi-head attention only"},
		{[]string{"-quick", "-kv-heads", "5"}, "-kv-heads 5: must divide H"},
	} {
		if code, _, stderr := runCode(append([]string{"bench"}, c.args...)...); code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("bench %v: code %d, %s; want %q", c.args, code, stderr, c.want)
		}
	}
	for _, bad := range [][]string{{"-rounds", "0"}, {"-settle", "-1s"}, {"-iters", "0"}} {
		if code, _, stderr := runCode(append([]string{"bench"}, bad...)...); code == 0 || !strings.Contains(stderr, "at least") {
			t.Errorf("bench %v: code %d, %s", bad, code, stderr)
		}
	}
}

// Without a GPU the bench says why and fails; with one this test is moot.
func TestBenchWithoutGPU(t *testing.T) {
	if cuda.Available() == nil {
		t.Skip("a GPU is present: bench would run")
	}
	code, stdout, stderr := runCode("bench", "-quick")
	if code == 0 || !strings.Contains(stderr, "bench needs -device cuda: ") || stdout != "" {
		t.Fatalf("code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, _, stderr := runCode("bench", "-device", "cpu"); code == 0 || !strings.Contains(stderr, "bench needs -device cuda") {
		t.Fatalf("-device cpu: code %d, %s", code, stderr)
	}
}

// bench -train -data reads the data before it looks for a GPU: a missing
// file is named on any machine.
func TestBenchTrainDataMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-corpus.txt")
	code, _, stderr := runCode("bench", "-train", "-torch", "", "-data", missing)
	if code == 0 || !strings.Contains(stderr, "no-such-corpus.txt") {
		t.Fatalf("code %d, stderr %q: want an error naming the missing file", code, stderr)
	}
}

func TestDecodeShapes(t *testing.T) {
	got, err := decodeShapes(bench.DecodeOptions{Sqs: "1,16", Seqs: "4096,16384", Dims: "128", Tokens: 32768, Width: 2048})
	if err != nil {
		t.Fatal(err)
	}
	want := []bench.DecodeShape{{B: 8, H: 16, Sq: 1, Sk: 4096, D: 128}, {B: 8, H: 16, Sq: 16, Sk: 4096, D: 128},
		{B: 2, H: 16, Sq: 1, Sk: 16384, D: 128}, {B: 2, H: 16, Sq: 16, Sk: 16384, D: 128}}
	if len(got) != len(want) {
		t.Fatalf("%v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("shape %d: %v, want %v", i, got[i], want[i])
		}
	}
	for _, o := range []bench.DecodeOptions{
		{Sqs: "1", Seqs: "1000", Dims: "128", Tokens: 32768, Width: 2048}, // 32768 % 1000
		{Sqs: "32", Seqs: "16", Dims: "64", Tokens: 32, Width: 64},        // more rows than keys
		{Sqs: "x", Seqs: "16", Dims: "64", Tokens: 32, Width: 64},
	} {
		if _, err := decodeShapes(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

func TestAccuracyCases(t *testing.T) {
	got, err := accuracyCases("1024,4096", "128,64", "both", "bf16,fp16", 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 16 {
		t.Fatalf("%d cases, want 2 dtypes × 2 D × 2 S × 2 causal", len(got))
	}
	want0 := bench.AccuracyCase{DType: "bfloat16", B: 1, H: 4, S: 1024, D: 128, Causal: false}
	want15 := bench.AccuracyCase{DType: "float16", B: 1, H: 4, S: 4096, D: 64, Causal: true}
	if got[0] != want0 || got[1].Causal != true || got[15] != want15 {
		t.Errorf("order: first %v, second %v, last %v", got[0], got[1], got[15])
	}
	for _, bad := range []struct{ seqs, dims, causal, dtypes string }{
		{"1024", "64", "both", "fp32"},
		{"1024", "64", "both", ""},
		{"0", "64", "both", "bf16"},
		{"1024", "64", "sometimes", "bf16"},
	} {
		if _, err := accuracyCases(bad.seqs, bad.dims, bad.causal, bad.dtypes, 4, nil); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if _, err := accuracyCases("1024", "64", "both", "bf16", 0, nil); err == nil {
		t.Error("0 heads accepted")
	}
}

// options replaces the timing default of -seqs, refuses the modes it cannot
// run with, and needs PyTorch and -device cuda.
func TestAccuracyOptions(t *testing.T) {
	parse := func(args ...string) (bench.AccuracyOptions, error) {
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		seqs := fs.String("seqs", "512,1024,2048,4096,8192,16384", "")
		dims := fs.String("dims", "64,128", "")
		causal := fs.String("causal", "both", "")
		torchPy := fs.String("torch", "python3", "")
		device := fs.String("device", "cuda", "")
		fs.String("decode", "", "")
		fs.Bool("memory", false, "")
		kvHeads := fs.String("kv-heads", "", "")
		a := addAccuracyFlags(fs)
		if err := fs.Parse(args); err != nil {
			return bench.AccuracyOptions{}, err
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !*a.on {
			return bench.AccuracyOptions{}, errors.New("-accuracy not set")
		}
		var kv []int
		if set["kv-heads"] {
			var err error
			if kv, err = parseInts("kv-heads", *kvHeads); err != nil {
				return bench.AccuracyOptions{}, err
			}
		}
		return a.options(args, set, *seqs, *dims, *causal, kv, 1, *torchPy, "", *device)
	}
	o, err := parse("-accuracy", "-dims", "128")
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Cases) != 8 || o.Cases[0].S != 1024 || o.Cases[7].S != 4096 || o.Cases[0].H != 4 {
		t.Errorf("default cases %v", o.Cases)
	}
	if o.Command != "flashgraph bench -accuracy -dims 128" || o.Script != "tools/reference/sdpa_error.py" || o.RefDev != "cuda" {
		t.Errorf("options %+v", o)
	}
	o, err = parse("-accuracy", "-seqs", "256", "-dims", "64", "-causal", "causal", "-accuracy-dtypes", "bf16", "-accuracy-heads", "2")
	if err != nil {
		t.Fatal(err)
	}
	if want := (bench.AccuracyCase{DType: "bfloat16", B: 1, H: 2, S: 256, D: 64, Causal: true}); len(o.Cases) != 1 || o.Cases[0] != want {
		t.Errorf("cases %v, want [%v]", o.Cases, want)
	}
	// -kv-heads: grouped cases after the multi-head ones of each D, each
	// H_kv dividing -accuracy-heads.
	o, err = parse("-accuracy", "-seqs", "2048", "-dims", "128", "-causal", "causal", "-accuracy-dtypes", "bf16",
		"-accuracy-heads", "32", "-kv-heads", "32,8,1")
	if err != nil {
		t.Fatal(err)
	}
	var kvs []int
	for _, c := range o.Cases {
		kvs = append(kvs, c.KVHeads)
		if c.H != 32 || c.S != 2048 || c.D != 128 || !c.Causal {
			t.Errorf("case %v", c)
		}
	}
	if len(kvs) != 3 || kvs[0] != 0 || kvs[1] != 8 || kvs[2] != 1 {
		t.Errorf("K/V heads of the cases %v, want [0 8 1] (32 = H is multi-head)", kvs)
	}
	for args, want := range map[string]string{
		"-accuracy -kv-heads 8":                     "-kv-heads 8: must divide -accuracy-heads 4",
		"-accuracy -accuracy-heads 6 -kv-heads 4,3": "-kv-heads 4: must divide -accuracy-heads 6",
		"-accuracy -decode 1":                       "-accuracy runs alone",
		"-accuracy -memory":                         "-accuracy runs alone",
		"-accuracy -torch=":                         "-torch is empty",
		"-accuracy -device cpu":                     "needs -device cuda",
	} {
		if _, err := parse(strings.Fields(args)...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", args, err, want)
		}
	}
}
