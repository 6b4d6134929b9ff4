package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func init() {
	// Guarded: another test file of the package may define -update too.
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files under testdata/")
	}
}

// TestCompilePlanGolden: `compile -fuse -plan` of each model config, the
// forward, the training step and the step with -recompute, as golden files
// (testdata/plan_*.golden; refresh with `go test ./tools/flashgraph -run
// TestCompilePlanGolden -update` and review the diff like code). A change of
// the memory planner or of its planning facts shows here as bytes.
func TestCompilePlanGolden(t *testing.T) {
	for _, c := range []struct{ config, dtype string }{
		{"gpt2", "bf16"}, {"gpt2", "float32"}, {"small", "bf16"}, {"tiny", "bf16"}, {"tiny", "float32"},
	} {
		t.Run(c.config+"_"+c.dtype, func(t *testing.T) {
			stdout, _ := runCLI(t, "compile", "-fuse", "-plan", "-config", c.config, "-dtype", c.dtype)
			checkGolden(t, "plan_"+c.config+"_"+c.dtype+".golden", stdout)
		})
	}
}

// With -explain, -plan also says what facts each plan was made from.
func TestCompilePlanExplainsFacts(t *testing.T) {
	stdout, _ := runCLI(t, "compile", "-fuse", "-plan", "-explain", "-config", "tiny", "-dtype", "bf16")
	if strings.Count(stdout, "planning facts (compute bfloat16):") != 3 {
		t.Fatalf("want the planning facts of the forward, the step and the recomputing step:\n%s", stdout)
	}
	for _, want := range []string{"op table KeepDType", "op table View", "75 AdamW", "Transpose", "grouped launches (lowering): ", "25 AdamW nodes in 1 run(s)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("planning facts do not mention %q:\n%s", want, stdout)
		}
	}
	plain, _ := runCLI(t, "compile", "-fuse", "-plan", "-config", "tiny", "-dtype", "bf16")
	if strings.Contains(plain, "planning facts") {
		t.Errorf("the facts are printed without -explain:\n%s", plain)
	}
}

// checkGolden compares got with testdata/name, or rewrites it with -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if f := flag.Lookup("update"); f != nil && f.Value.String() == "true" {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (-update rewrites it after review):\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// compile -plan -traffic lists the training step's traffic per op type
// (fused elementwise chains and AdamW in it, the folded transposes not) and
// refuses -traffic without -plan or without a bandwidth.
func TestCompilePlanTraffic(t *testing.T) {
	stdout, _ := runCLI(t, "compile", "-fuse", "-plan", "-traffic", "4.8", "-config", "tiny", "-dtype", "bf16")
	_, report, ok := strings.Cut(stdout, "memory traffic of tiny (training step):\n")
	if !ok {
		t.Fatalf("no traffic report:\n%s", stdout)
	}
	for _, want := range []string{"ms at 4.8 TB/s", "FusedElementwise", "AdamW", "MatMul", "total"} {
		if !strings.Contains(report, want) {
			t.Errorf("traffic report lacks %q:\n%s", want, report)
		}
	}
	plain, _ := runCLI(t, "compile", "-fuse", "-plan", "-config", "tiny", "-dtype", "bf16")
	if strings.Contains(plain, "memory traffic") {
		t.Errorf("traffic printed without -traffic:\n%s", plain)
	}
	for _, args := range [][]string{{"-traffic", "4.8"}, {"-plan", "-traffic", "-1"}} {
		var so, se bytes.Buffer
		if code := realMain(append([]string{"compile", "-config", "tiny"}, args...), &so, &se); code == 0 || !strings.Contains(se.String(), "-traffic") {
			t.Errorf("compile %v: exit %d, stderr %q; want a refusal naming -traffic", args, code, se.String())
		}
	}
}
