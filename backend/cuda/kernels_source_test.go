package cuda

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/kernels"
)

// These tests read the embedded kernel sources, so they run without a GPU:
// a code that Go passes to a kernel and the #define the kernel compares it
// with are written in two files, and a mismatch would otherwise show only as
// wrong numbers on a GPU.

// intDefinePattern matches a #define whose value is an integer literal.
var intDefinePattern = regexp.MustCompile(`(?m)^[ \t]*#define[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]+(-?[0-9]+)[ \t]*(?://.*)?$`)

// intDefines reads a source's integer #defines; a name defined twice is a problem.
func intDefines(src string) (map[string]int64, []string) {
	defs := map[string]int64{}
	var problems []string
	for _, m := range intDefinePattern.FindAllStringSubmatch(src, -1) {
		v, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil {
			problems = append(problems, fmt.Sprintf("#define %s %s: %v", m[1], m[2], err))
			continue
		}
		if _, dup := defs[m[1]]; dup {
			problems = append(problems, fmt.Sprintf("%s is defined twice", m[1]))
		}
		defs[m[1]] = v
	}
	return defs, problems
}

// opsGoValues are the Go values of ops.cu's integer #defines, by define name:
// the storage type codes and the sizes launches depend on.
func opsGoValues() (map[string]int64, []string) {
	want := map[string]int64{}
	var problems []string
	set := func(name string, v int64, what string) {
		if name == "" {
			problems = append(problems, what+" has no #define name")
			return
		}
		if _, dup := want[name]; dup {
			problems = append(problems, fmt.Sprintf("Go names %s twice", name))
		}
		want[name] = v
	}
	for i, k := range kernelDTypes {
		set(k.define, int64(i), "storage type "+k.dt.String())
	}
	set("MAXR", maxRank, "maxRank")
	set("GG_PER", ggPer, "ggPer")
	set("G64", gemmF64Tile, "gemmF64Tile")
	set("ADAMW_MULTI_BLOCK", adamwMultiBlock, "adamwMultiBlock")
	set("ADAMW_MULTI_GROUPS", adamwMultiGroups, "adamwMultiGroups")
	return want, problems
}

// opsCodeProblems compares the integer #defines of an ops.cu source with
// the Go values: every one must be on both sides, with the same value.
func opsCodeProblems(src string) []string {
	defs, problems := intDefines(src)
	want, goProblems := opsGoValues()
	problems = append(problems, goProblems...)
	for _, name := range slices.Sorted(maps.Keys(want)) {
		got, ok := defs[name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("ops.cu does not define %s (Go: %d)", name, want[name]))
		case got != want[name]:
			problems = append(problems, fmt.Sprintf("%s is %d in ops.cu but %d in Go", name, got, want[name]))
		}
	}
	for name, v := range defs {
		if _, ok := want[name]; !ok {
			problems = append(problems, fmt.Sprintf("ops.cu defines %s %d, which no Go value matches (add it to the Go table, or to opsGoValues)", name, v))
		}
	}
	slices.Sort(problems)
	return problems
}

func opsSource(t *testing.T) string {
	t.Helper()
	src, err := kernels.Source(opsKernelFile)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func TestOpsCodesMatchKernels(t *testing.T) {
	src := opsSource(t)
	for _, p := range opsCodeProblems(src) {
		t.Error(p)
	}
	// The check must see the codes at all (a pattern that matched nothing
	// would pass vacuously) and must fail on each kind of drift.
	if defs, _ := intDefines(src); defs["MAXR"] != maxRank || defs["DT_BOOL"] != int64(dtCode(graph.Bool)) {
		t.Fatalf("intDefines read MAXR=%d DT_BOOL=%d from ops.cu", defs["MAXR"], defs["DT_BOOL"])
	}
	for _, c := range []struct {
		name, from, to, want string
	}{
		{"value differs", "#define DT_F64 1\n", "#define DT_F64 7\n", "DT_F64 is 7 in ops.cu but 1 in Go"},
		{"define missing", "#define DT_F16 3\n", "", "ops.cu does not define DT_F16 (Go: 3)"},
		{"no Go constant", "#define DT_BOOL 5\n", "#define DT_BOOL 5\n#define DT_F8 6\n", "ops.cu defines DT_F8 6, which no Go value matches"},
		{"defined twice", "#define MAXR 6\n", "#define MAXR 6\n#define MAXR 6\n", "MAXR is defined twice"},
		{"size differs", "#define G64 16\n", "#define G64 32\n", "G64 is 32 in ops.cu but 16 in Go"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(src, c.from) {
				t.Fatalf("ops.cu has no line %q to doctor", c.from)
			}
			got := opsCodeProblems(strings.Replace(src, c.from, c.to, 1))
			if !slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, c.want) }) {
				t.Errorf("problems %q; want one starting %q", got, c.want)
			}
		})
	}
}

// Every graph dtype with a device form has a storage type code of its own
// (strings have none: CheckDTypes refuses them).
func TestEveryDTypeHasKernelCode(t *testing.T) {
	seen := map[int32]graph.DType{}
	for dt := graph.InvalidDType + 1; !strings.HasPrefix(dt.String(), "dtype("); dt++ {
		if dt == graph.String {
			continue
		}
		if _, ok := dtCodes[dt]; !ok {
			t.Errorf("%v has no ops.cu storage type code", dt)
			continue
		}
		if prev, dup := seen[dtCode(dt)]; dup {
			t.Errorf("%v and %v share code %d", prev, dt, dtCode(dt))
		}
		seen[dtCode(dt)] = dt
	}
	if len(seen) != len(kernelDTypes) {
		t.Errorf("kernelDTypes has %d entries, the graph %d dtypes", len(kernelDTypes), len(seen))
	}
}

var (
	// kernelEntryPattern matches an extern "C" __global__ entry point's name.
	kernelEntryPattern = regexp.MustCompile(`extern "C" __global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)[\s\\]+)?(?:void\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*\(`)
	// macroDefinition matches a #define with its continuation lines.
	macroDefinition = regexp.MustCompile(`(?m)^[ \t]*#define(?:.*\\\n)*.*$`)
)

// kernelEntries lists the extern "C" __global__ entry points a source
// declares outside macro definitions (a macro declares nothing until it is
// instantiated; flashSourceProblems reads flash_attention.cu's instances).
func kernelEntries(src string) []string {
	var names []string
	for _, m := range kernelEntryPattern.FindAllStringSubmatch(macroDefinition.ReplaceAllString(src, ""), -1) {
		names = append(names, m[1])
	}
	return names
}

// entryProblems compares the entry points the backend looks up with those a
// source declares: each side must have every name of the other.
func entryProblems(file string, src string, used []string) []string {
	declared := kernelEntries(src)
	var problems []string
	for _, k := range used {
		if !slices.Contains(declared, k) {
			problems = append(problems, fmt.Sprintf("%s declares no extern \"C\" __global__ %s", file, k))
		}
	}
	for _, k := range declared {
		if !slices.Contains(used, k) {
			problems = append(problems, fmt.Sprintf("%s declares %s, which the backend never launches", file, k))
		}
	}
	return problems
}

// TestOpsKernelNamesDeclared is TestOpsKernelsCompile's check for machines
// without NVRTC: every name in opsKernelNames is an entry point of ops.cu,
// and ops.cu has no other.
func TestOpsKernelNamesDeclared(t *testing.T) {
	src := opsSource(t)
	for _, p := range entryProblems(opsKernelFile, src, opsKernelNames) {
		t.Error(p)
	}
	renamed := strings.Replace(src, "void gather_grad_f32(", "void gather_grad_fp32(", 1)
	got := entryProblems(opsKernelFile, renamed, opsKernelNames)
	want := []string{
		`ops.cu declares no extern "C" __global__ gather_grad_f32`,
		"ops.cu declares gather_grad_fp32, which the backend never launches",
	}
	if !slices.Equal(got, want) {
		t.Errorf("renamed kernel: problems %q, want %q", got, want)
	}
}
