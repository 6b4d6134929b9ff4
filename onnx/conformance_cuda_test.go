package onnx

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/graph"
)

// The ONNX backend test suite over the CUDA backend: every test whose CPU
// verdict in testdata/conformance.txt is "pass" is imported as the CPU run
// imports it (conformanceImport), compiled on CUDA, run, and compared with the
// same expected outputs and tolerances (confCase.run, compareOutput). Each
// such test must pass on CUDA or have its CUDA verdict expected:
//
//   - derived, not listed: a test whose imported graph has an op the CUDA
//     backend has no kernel for (cuda.HasKernel false) is expected to be
//     refused at Compile with "no CUDA kernel: OP", OP the first such node's op;
//   - listed in testdata/conformance_cuda.txt with a verdict that falls under
//     one of the rules of cudaRuleCheck.
//
// A wrong number, a run-time error or a panic on CUDA is always a failure and
// never an expectation. On a GPU machine, from this directory:
//
//	go test ./onnx -run TestONNXConformanceCUDA -conformance-device cuda -v
//
// (-update-conformance-cuda rewrites the file; -conformance-report FILE writes
// every observed CUDA verdict to FILE; docs/GPU.md has the compiled-binary
// form). A report brought back from a GPU machine is turned into the file here,
// without a GPU, by
//
//	go test ./onnx -run TestONNXConformanceCUDA -conformance-cuda-from REPORT -update-conformance-cuda
//
// Without -conformance-device cuda the test checks the file against
// testdata/conformance.txt (each listed test a CPU pass, no test twice, each
// verdict under a rule), and with the suite's data present, that no line
// repeats what is derived.

var (
	conformanceDevice     = flag.String("conformance-device", "cpu", "TestONNXConformanceCUDA: cuda runs the suite's CPU passes on the CUDA backend")
	updateConformanceCUDA = flag.Bool("update-conformance-cuda", false, "rewrite testdata/conformance_cuda.txt with the CUDA results")
	conformanceReport     = flag.String("conformance-report", "", "write the observed per-test CUDA verdicts to this file")
	conformanceCUDAFrom   = flag.String("conformance-cuda-from", "", "take the CUDA verdicts from a -conformance-report file instead of a GPU")
)

const cudaExpectFile = "testdata/conformance_cuda.txt"

var cudaNodeOp = regexp.MustCompile(`^cuda: node .* \(([A-Za-z0-9_]+)\): `)

// cudaDtypeErr are the CUDA backend's Compile errors that name an element
// type it has no kernel for.
// The last form is cuda.CheckDTypes' (a string value).
var cudaDtypeErr = regexp.MustCompile(`(?:no cuBLAS GEMM for|generated elementwise kernels do not handle) ([a-z0-9]+)|dtype ([a-z0-9]+) is not supported on CUDA`)

// cudaCompileVerdict names a CUDA Compile error:
//   - "no CUDA kernel: OP" for an error wrapping backend.ErrUnsupported from
//     the lowering of a node of op OP;
//   - "dtype not supported on CUDA: DTYPE" for an error naming an element type
//     the backend has no kernel for;
//   - "CUDA compile error: MESSAGE" otherwise, MESSAGE the backend's own
//     error (which says what it cannot do).
func cudaCompileVerdict(err error) string {
	msg := err.Error()
	if errors.Is(err, backend.ErrUnsupported) {
		if m := cudaNodeOp.FindStringSubmatch(msg); m != nil {
			return "no CUDA kernel: " + m[1]
		}
	}
	if m := cudaDtypeErr.FindStringSubmatch(msg); m != nil {
		dt := m[1] + m[2] // one of the two forms matched
		if _, perr := graph.ParseDType(dt); perr == nil {
			return "dtype not supported on CUDA: " + dt
		}
	}
	return "CUDA compile error: " + strings.ReplaceAll(msg, "\n", " ")
}

// cudaRuleCheck says whether a verdict may stand in conformance_cuda.txt.
func cudaRuleCheck(v string) error {
	if op, ok := strings.CutPrefix(v, "no CUDA kernel: "); ok {
		if _, inTable := graph.LookupOp(op); !inTable {
			return fmt.Errorf("%q: %s is not an op of the op table", v, op)
		}
		if cuda.HasKernel(op) {
			return fmt.Errorf("%q: the CUDA backend has a kernel for %s", v, op)
		}
		return nil
	}
	if dt, ok := strings.CutPrefix(v, "dtype not supported on CUDA: "); ok {
		if _, err := graph.ParseDType(dt); err != nil {
			return fmt.Errorf("%q: %w", v, err)
		}
		return nil
	}
	if msg, ok := strings.CutPrefix(v, "CUDA compile error: "); ok && strings.HasPrefix(msg, "cuda: ") && len(msg) > len("cuda: ") {
		return nil
	}
	return fmt.Errorf("verdict %q is under no rule (no CUDA kernel: OP; dtype not supported on CUDA: DTYPE; CUDA compile error: cuda: MESSAGE)", v)
}

// cudaReportCheck admits the verdicts of a report: the rules, pass and FAIL.
func cudaReportCheck(v string) error {
	if v == "pass" || strings.HasPrefix(v, "FAIL: ") {
		return nil
	}
	return cudaRuleCheck(v)
}

// cudaDerived is the CUDA verdict a case's graph implies without a GPU:
// "no CUDA kernel: OP" for the first node whose op the backend has no kernel
// for, "" when every node has one.
func cudaDerived(g *graph.Graph) string {
	// A value of a dtype with no device form (strings) is refused before
	// any lowering: the verdict of the very error Compile gives.
	if err := cuda.CheckDTypes(g); err != nil {
		return cudaCompileVerdict(err)
	}
	for _, n := range g.Nodes {
		if !cuda.HasKernel(n.Op) {
			return "no CUDA kernel: " + n.Op
		}
	}
	return ""
}

// cudaCheckExpectations checks conformance_cuda.txt against conformance.txt
// and returns the CPU passes (sorted) and the listed CUDA verdicts.
func cudaCheckExpectations(t *testing.T) ([]string, map[string]string) {
	cpuExp, err := readExpectations("testdata/conformance.txt")
	if err != nil {
		t.Fatal(err)
	}
	listed, err := readVerdictFile(cudaExpectFile, cudaRuleCheck)
	if err != nil {
		t.Fatal(err)
	}
	var passes []string
	for name, v := range cpuExp {
		if v == "pass" {
			passes = append(passes, name)
		}
	}
	slices.Sort(passes)
	for name := range listed {
		if v, ok := cpuExp[name]; !ok {
			t.Errorf("%s: %s lists it, testdata/conformance.txt does not", name, cudaExpectFile)
		} else if v != "pass" {
			t.Errorf("%s: %s lists it, but its CPU verdict is %q (only CPU passes are run on CUDA)", name, cudaExpectFile, v)
		}
	}
	return passes, listed
}

// TestONNXConformanceCUDA: the suite's CPU passes on the CUDA backend (see
// above).
func TestONNXConformanceCUDA(t *testing.T) {
	passes, listed := cudaCheckExpectations(t)
	t.Logf("%s: %d CPU passes, %d listed with a CUDA verdict", cudaExpectFile, len(passes), len(listed))
	if t.Failed() {
		return
	}
	onGPU := false
	switch *conformanceDevice {
	case "cpu", "":
	case "cuda":
		onGPU = *conformanceCUDAFrom == ""
	default:
		t.Fatalf("-conformance-device %q: want cpu or cuda", *conformanceDevice)
	}
	if *conformanceDevice != "cuda" && *conformanceCUDAFrom == "" {
		if *updateConformanceCUDA || *conformanceReport != "" {
			t.Fatal("-update-conformance-cuda and -conformance-report need -conformance-device cuda or -conformance-cuda-from")
		}
	}
	if _, err := os.Stat(*conformanceDir); err != nil {
		if onGPU || *conformanceCUDAFrom != "" {
			t.Fatalf("no ONNX backend test data at %s (-conformance-dir): %v", *conformanceDir, err)
		}
		t.Logf("no ONNX backend test data at %s: the derived CUDA verdicts are not checked", *conformanceDir)
		return
	}

	var b backend.Backend
	var reported map[string]string
	device := ""
	switch {
	case *conformanceCUDAFrom != "":
		var err error
		if reported, err = readVerdictFile(*conformanceCUDAFrom, cudaReportCheck); err != nil {
			t.Fatal(err)
		}
		device = reportDevice(*conformanceCUDAFrom)
	case onGPU:
		if err := cuda.Available(); err != nil {
			t.Skipf("-conformance-device cuda, but CUDA is not available: %v", err)
		}
		cb, err := cuda.NewBackend(cuda.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer cb.(*cuda.Backend).Close()
		b = cb
		device = cb.(*cuda.Backend).Device().Name()
	}

	start := time.Now()
	derived := map[string]string{}
	observed := map[string]string{}
	counts := map[string]int{}
	for _, name := range passes {
		dir := filepath.Join(*conformanceDir, filepath.FromSlash(name))
		d, obs := cudaCase(dir, b)
		if strings.HasPrefix(d, "FAIL") {
			t.Errorf("%s: CPU pass, but %s", name, d)
			continue
		}
		derived[name] = d
		want := d
		if v, ok := listed[name]; ok {
			if v == d {
				t.Errorf("%s: %s lists %q, which the graph implies: remove the line", name, cudaExpectFile, v)
			}
			want = v
		}
		if want == "" {
			want = "pass"
		}
		switch {
		case reported != nil:
			v, ok := reported[name]
			if !ok {
				t.Errorf("%s: CPU pass, not in %s", name, *conformanceCUDAFrom)
				continue
			}
			obs = v
		case b == nil:
			kind, _, _ := strings.Cut(want, ":")
			counts[kind]++
			continue
		}
		observed[name] = obs
		kind, _, _ := strings.Cut(obs, ":")
		counts[kind]++
		// What the file would make of obs: a line unless obs is what the
		// graph implies (derived, or pass with nothing derived).
		canList := obs != "pass" && obs != d
		switch {
		case strings.HasPrefix(obs, "FAIL"):
			t.Errorf("%s: on CUDA: %s", name, obs)
		case obs != want && !(*updateConformanceCUDA && canList):
			t.Errorf("%s: on CUDA: %s, expected %s", name, obs, want)
		}
	}
	if b == nil && reported == nil {
		// No GPU asked for: the expectations only.
		t.Logf("expected on CUDA without a GPU run: %d pass, %d no CUDA kernel (derived or listed), %d dtype not supported, %d CUDA compile error",
			counts["pass"], counts["no CUDA kernel"], counts["dtype not supported on CUDA"], counts["CUDA compile error"])
		t.Log("the CUDA run itself needs -conformance-device cuda on a GPU machine (docs/GPU.md)")
		return
	}
	for name := range reported {
		if _, ok := observed[name]; !ok {
			t.Errorf("%s is in %s but is not a CPU pass", name, *conformanceCUDAFrom)
		}
	}
	t.Logf("%d CPU passes on CUDA (%s) in %v: %d pass, %d no CUDA kernel, %d dtype not supported, %d CUDA compile error, %d FAIL",
		len(observed), device, time.Since(start).Round(time.Millisecond), counts["pass"], counts["no CUDA kernel"],
		counts["dtype not supported on CUDA"], counts["CUDA compile error"], counts["FAIL"])
	stamp := fmt.Sprintf("%s, %s", device, time.Now().UTC().Format("2006-01-02"))
	if *conformanceCUDAFrom != "" {
		stamp = reportStamp(*conformanceCUDAFrom)
	}
	// The run's counts go into the stamp, so that docs/ONNX.md can quote
	// what the recorded run observed, not only what it listed.
	machineDate, _, _ := strings.Cut(stamp, ";")
	lacking := ""
	if l := lackingKernels(observed); l != "" {
		lacking = " (" + l + ")"
	}
	stamp = fmt.Sprintf("%s; %d of %d CPU passes pass on CUDA, %d refused for want of a kernel%s, %d FAIL",
		machineDate, counts["pass"], len(observed), counts["no CUDA kernel"], lacking, counts["FAIL"])
	if *conformanceReport != "" {
		var sb strings.Builder
		sb.WriteString("# The observed CUDA verdicts of the ONNX backend test suite's CPU passes (TestONNXConformanceCUDA).\n")
		fmt.Fprintf(&sb, "# GPU run: %s\n", stamp)
		for _, name := range passes {
			if v, ok := observed[name]; ok {
				fmt.Fprintf(&sb, "%s\t%s\n", name, v)
			}
		}
		if err := os.WriteFile(*conformanceReport, []byte(sb.String()), 0o644); err != nil {
			t.Error(err)
		} else {
			t.Logf("wrote %s", *conformanceReport)
		}
	}
	if *updateConformanceCUDA {
		var sb strings.Builder
		sb.WriteString(cudaFileHeader)
		fmt.Fprintf(&sb, "# GPU run: %s\n", stamp)
		for _, name := range passes {
			v, ok := observed[name]
			if !ok || v == "pass" || v == derived[name] || strings.HasPrefix(v, "FAIL") {
				continue
			}
			fmt.Fprintf(&sb, "%s\t%s\n", name, v)
		}
		if err := os.WriteFile(cudaExpectFile, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// cudaFileHeader heads testdata/conformance_cuda.txt.
const cudaFileHeader = `# The ONNX backend test suite's CPU passes (testdata/conformance.txt) on the CUDA backend:
# one line per test that does not pass on CUDA, "no CUDA kernel: OP", "dtype not supported
# on CUDA: DTYPE" or "CUDA compile error: MESSAGE". A test whose graph has an op without a
# CUDA kernel (cuda.HasKernel) is expected to be refused with "no CUDA kernel: OP" without a
# line here; a wrong number or a run-time error is never listed. Refreshed from a GPU run,
# from the onnx directory, with
#   go test -run TestONNXConformanceCUDA -conformance-device cuda -update-conformance-cuda
# or here from a report a GPU run wrote (-conformance-report FILE; docs/GPU.md) with
#   go test -run TestONNXConformanceCUDA -conformance-cuda-from FILE -update-conformance-cuda
# and checked by TestONNXConformanceCUDA; review changes like code.
`

// cudaCase imports one CPU pass and, given a backend, runs it there. It
// returns the derived verdict ("" for none; "FAIL: ..." when the import does
// not succeed) and the observed one.
func cudaCase(dir string, b backend.Backend) (derived, observed string) {
	imported := false
	defer func() {
		if r := recover(); r != nil {
			if imported {
				observed = fmt.Sprintf("FAIL: panic: %v", r)
			} else {
				derived = fmt.Sprintf("FAIL: panic: %v", r)
			}
		}
	}()
	c, v := conformanceImport(dir)
	if v != "" {
		return "FAIL: the import gives " + v, ""
	}
	derived = cudaDerived(c.g)
	imported = true
	if b == nil {
		return derived, ""
	}
	return derived, c.run(b, cudaCompileVerdict)
}

// reportStamp is the "# GPU run: " line of a report ("unknown" without one).
func reportStamp(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	for line := range strings.Lines(string(b)) {
		if s, ok := strings.CutPrefix(strings.TrimSpace(line), "# GPU run: "); ok {
			return s
		}
	}
	return "unknown"
}

// lackingKernels counts the "no CUDA kernel: OP" verdicts by op, most first.
func lackingKernels(observed map[string]string) string {
	byOp := map[string]int{}
	for _, v := range observed {
		if op, ok := strings.CutPrefix(v, "no CUDA kernel: "); ok {
			byOp[op]++
		}
	}
	ops := slices.Collect(maps.Keys(byOp))
	slices.SortFunc(ops, func(a, b string) int {
		if byOp[a] != byOp[b] {
			return byOp[b] - byOp[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(ops))
	for i, op := range ops {
		parts[i] = fmt.Sprintf("%s %d", op, byOp[op])
	}
	return strings.Join(parts, ", ")
}

// reportDevice is the device part of a report's stamp.
func reportDevice(path string) string {
	d, _, _ := strings.Cut(reportStamp(path), ",")
	return d
}
