package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/graph"
)

// spatialGraph has a node of every op ops_spatial.go and ops_misc.go lower,
// with the optional inputs and outputs given.
func spatialGraph(t *testing.T, dt graph.DType) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("spatial")
	in := func(name string, shape ...int) *graph.Value { return b.Input(name, dt, shape...) }
	outs := []*graph.Value{
		b.Op("Conv", graph.Attrs{"pads": graph.Ints(1, 1, 1, 1), "group": graph.Int(1)}, in("cx", 1, 2, 5, 5), in("cw", 3, 2, 3, 3), in("cb", 3)),
		b.Op("ConvTranspose", graph.Attrs{"strides": graph.Ints(2, 2)}, in("tx", 1, 2, 3, 4), in("tw", 2, 3, 3, 3), in("tb", 3)),
		b.Op("AveragePool", graph.Attrs{"kernel_shape": graph.Ints(3, 3), "count_include_pad": graph.Int(1)}, in("ax", 1, 2, 5, 5)),
		b.Op("Interpolate", graph.Attrs{"sizes": graph.Ints(1, 2, 7, 9), "scales": graph.Floats(1, 1, 7.0/3, 9.0/4)}, in("ix", 1, 2, 3, 4)),
		b.Op("LRN", graph.Attrs{"size": graph.Int(3)}, in("lx", 2, 5, 3, 2)),
		b.Op("Det", nil, in("dx", 3, 4, 4)),
		b.Op("GridSample", graph.Attrs{"mode": graph.Str("bicubic")}, in("gx", 2, 2, 4, 5), in("gg", 2, 3, 4, 2)),
		b.Op("RoiAlign", graph.Attrs{"output_height": graph.Int(2)}, in("rx", 2, 3, 6, 7), in("rr", 4, 4), b.Input("ri", graph.Int64, 4)),
		b.Op("Einsum", graph.Attrs{"equation": graph.Str("i,i,ij")}, in("e0", 4), in("e1", 4), in("e2", 4, 2)),
	}
	outs = append(outs, b.Op("TfIdfVectorizer", tfidfAttrs("TFIDF"), b.Input("fx", graph.Int64, 3, 9)))
	outs = append(outs, b.OpN("MaxPool", graph.Attrs{"kernel_shape": graph.Ints(2, 3), "storage_order": graph.Int(1)}, in("mx", 2, 2, 5, 4))...)
	outs = append(outs, b.OpN("TopK", graph.Attrs{"axis": graph.Int(1)}, in("kx", 3, 6), b.Ints(3))...)
	b.Output(outs...)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// tfidfAttrs are TfIdfVectorizer's attributes in backendtest's case, with
// a repeated 2-gram ({0, 1} again, the last one's column counting).
func tfidfAttrs(mode string) graph.Attrs {
	return graph.Attrs{
		"mode": graph.Str(mode), "min_gram_length": graph.Int(1), "max_gram_length": graph.Int(3), "max_skip_count": graph.Int(2),
		"ngram_counts": graph.Ints(0, 3, 9), "ngram_indexes": graph.Ints(0, 1, 2, 3, 5, 6, 4), "pool_int64s": graph.Ints(0, 1, 3, 0, 1, 2, 2, 0, 1, 1, 0, 3),
		"weights": graph.Floats(0.5, 1.5, 2, 0.25, 1, 3, 0.75),
	}
}

// kernelParamKinds reads the parameter kinds of ops.cu's entry points from
// the source as g++ -E expands it (the D6, WIN_PARAMS, ... macros written
// out): per entry point, "ptr" for a pointer, else the Go type a launch must
// pass (int64, int32, float64, ...).
func kernelParamKinds(t *testing.T) map[string][]string {
	t.Helper()
	gxx := cudatest.HostCXX86(t)
	path := filepath.Join(t.TempDir(), "ops.cpp")
	if err := os.WriteFile(path, []byte(opsSyntaxPrelude+"\n"+opsSource(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(gxx, "-std=c++17", "-E", "-P", path).Output()
	if err != nil {
		t.Fatalf("g++ -E: %v", err)
	}
	sig := regexp.MustCompile(`extern "C"\s+void\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(([^)]*)\)`)
	kinds := map[string][]string{}
	for _, m := range sig.FindAllStringSubmatch(string(out), -1) {
		var ks []string
		for _, p := range strings.Split(m[2], ",") {
			ks = append(ks, cParamKind(p))
		}
		kinds[m[1]] = ks
	}
	return kinds
}

// cParamKind is the Go argument type a C parameter declaration takes.
func cParamKind(decl string) string {
	if strings.Contains(decl, "*") {
		return "ptr"
	}
	f := strings.Fields(decl)
	if len(f) < 2 {
		return "?" + decl
	}
	typ := strings.Join(f[:len(f)-1], " ")
	typ = strings.TrimPrefix(typ, "const ")
	switch typ {
	case "i64", "long long":
		return "int64"
	case "u64", "unsigned long long":
		return "uint64"
	case "int":
		return "int32"
	case "unsigned", "unsigned int":
		return "uint32"
	case "double":
		return "float64"
	case "float":
		return "float32"
	}
	return "?" + typ
}

func goArgKind(a any) string {
	switch a.(type) {
	case DevicePtr:
		return "ptr"
	case int64, int32, uint32, uint64, float64, float32:
		return fmt.Sprintf("%T", a)
	}
	return fmt.Sprintf("?%T", a)
}

// launchProblems compares a launch's arguments with its kernel's parameters.
func launchProblems(kinds map[string][]string, entry string, args []any) []string {
	want, ok := kinds[entry]
	if !ok {
		return []string{fmt.Sprintf("%s: ops.cu has no such entry point", entry)}
	}
	if len(want) != len(args) {
		return []string{fmt.Sprintf("%s: %d arguments for %d parameters", entry, len(args), len(want))}
	}
	var problems []string
	for i, a := range args {
		if got := goArgKind(a); got != want[i] {
			problems = append(problems, fmt.Sprintf("%s: argument %d is %s, the parameter %s", entry, i, got, want[i]))
		}
	}
	return problems
}

// TestSpatialLaunchesMatchKernels lowers a node of every op of
// ops_spatial.go and ops_misc.go without a device and checks each launch
// against its kernel's parameters: the same count, and each argument of
// the parameter's type (the driver passes arguments by their Go size, so a
// mismatch would shift every later one on the GPU).
func TestSpatialLaunchesMatchKernels(t *testing.T) {
	kinds := kernelParamKinds(t)
	if len(kinds["conv"]) < 40 {
		t.Fatalf("read %d parameters of conv from the expanded ops.cu", len(kinds["conv"]))
	}
	for _, dt := range []graph.DType{graph.Float32, graph.Float64, graph.BFloat16} {
		g := spatialGraph(t, dt)
		launched := map[string]int{}
		args := map[string][]any{}
		tables := DevicePtr(1 << 40)
		upload := func(data []byte) DevicePtr {
			tables = tables.Offset((len(data) + 255) &^ 255)
			return tables
		}
		lines, _ := renderKernelsWith(t, g, PlanOptions{}, renderHooks{uploaded: upload, launched: func(entry string, a []any) {
			launched[entry]++
			args[entry] = a
			for _, p := range launchProblems(kinds, entry, a) {
				t.Errorf("%v: %s", dt, p)
			}
		}})
		for _, l := range lines {
			if strings.Contains(l, "needs a device") {
				t.Errorf("%v: %s", dt, l)
			}
		}
		for _, k := range []string{"conv", "conv_transpose", "max_pool", "avg_pool", "interpolate", "topk", "lrn", "det", "grid_sample", "roi_align", "einsum", "tfidf"} {
			if launched[k] != 1 {
				t.Errorf("%v: %s launched %d times, want once", dt, k, launched[k])
			}
		}
		// The comparison has teeth: one argument short, or one of another
		// type, is a problem.
		ein := args["einsum"]
		if len(ein) == 0 || len(launchProblems(kinds, "einsum", ein)) != 0 {
			t.Fatalf("%v: einsum launched with %d arguments", dt, len(ein))
		}
		if len(launchProblems(kinds, "einsum", ein[:len(ein)-1])) == 0 {
			t.Error("a launch one argument short passed")
		}
		doctored := append([]any{int32(0)}, ein[1:]...)
		if len(launchProblems(kinds, "einsum", doctored)) == 0 {
			t.Error("an int32 for an int64 parameter passed")
		}
	}
}

// Every op of the op table has a kernel but those listed in noKernelYet,
// each a table op whose lowering refuses with backend.ErrUnsupported.
func TestEveryOpHasKernel(t *testing.T) {
	for _, s := range graph.Ops() {
		if HasKernel(s.Name) == noKernelYet[s.Name] {
			t.Errorf("HasKernel(%s) is %v, and noKernelYet lists it: %v", s.Name, HasKernel(s.Name), noKernelYet[s.Name])
		}
	}
	for op := range noKernelYet {
		if _, ok := graph.LookupOp(op); !ok {
			t.Errorf("noKernelYet lists %s, which the op table does not have", op)
		}
		_, err := lowerings[op].lower(&lowerCtx{n: &graph.Node{Op: op}})
		if !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), op) {
			t.Errorf("%s's lowering: %v, want an error naming it that wraps backend.ErrUnsupported", op, err)
		}
	}
}
