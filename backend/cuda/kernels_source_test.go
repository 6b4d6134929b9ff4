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

// Every graph dtype has a storage type code of its own.
func TestEveryDTypeHasKernelCode(t *testing.T) {
	seen := map[int32]graph.DType{}
	for dt := graph.InvalidDType + 1; !strings.HasPrefix(dt.String(), "dtype("); dt++ {
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

var (
	flashFwdTCPattern  = regexp.MustCompile(`(?m)^FLASH_FWD_TC\((\w+),\s*(\w+),\s*(\d+),\s*(\d+),\s*(\d+)\)`)
	flashBwdTCPattern  = regexp.MustCompile(`(?m)^FLASH_BWD_TC\((\w+),\s*(\w+),\s*(\d+),\s*(\d+),\s*(\d+)\)`)
	flashTypedEntry    = regexp.MustCompile(`\b(\w+)##SUF\b`)
	flashFwdHeaderLine = regexp.MustCompile(`d(\d+)\s*:\s*FWD_BR=(\d+),\s*FWD_BC=(\d+),\s*FWD_NW=(\d+)\s*->\s*(\d+) B`)
	flashBwdHeaderLine = regexp.MustCompile(`d(\d+)\s*:\s*BWD_BR=(\d+),\s*BWD_NW=(\d+)\s*->\s*(\d+) B`)
)

// flashDecodeInstance matches a decode kernel's or its combine's instantiation.
var flashDecodeInstance = regexp.MustCompile(`(?m)^FLASH_DECODE(?:_COMBINE)?\((\w+),`)

// flashTypeSuffix is the kernel-name suffix of a flash element type.
var flashTypeSuffix = map[string]string{"__nv_bfloat16": "bf16", "__half": "fp16", "float": "fp32"}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// flashTypedMacros are flash_attention.cu's macros that declare one entry
// point per ##SUF of their body for each type they are instantiated with.
var flashTypedMacros = []string{"FLASH_TYPED", "FLASH_CONVERT", "FLASH_VEC"}

// flashTypedPatterns are, for a macro of flashTypedMacros, its definition
// and its instantiations.
func flashTypedPatterns(macro string) (body, inst *regexp.Regexp) {
	return regexp.MustCompile(`(?m)^#define ` + macro + `\(SUF, T\)(?:.*\\\n)*.*$`),
		regexp.MustCompile(`(?m)^` + macro + `\((\w+),[^)]*\)`)
}

// flashSourceProblems compares flash_attention.cu with flash.go: the
// tensor-core instantiations with flashTiles, the header's shared-memory
// byte counts with flashTile's, and the entry points with the names
// planFlash asks for (both ways).
func flashSourceProblems(src string) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	declared := map[string]bool{}
	type inst struct {
		suf string
		dim int
	}
	fwdSeen, bwdSeen := map[inst]bool{}, map[inst]bool{}
	for _, m := range flashFwdTCPattern.FindAllStringSubmatch(src, -1) {
		name, suf, dim, warps, keys := m[1], flashTypeSuffix[m[2]], atoi(m[3]), atoi(m[4]), atoi(m[5])
		declared[name] = true
		fwdSeen[inst{suf, dim}] = true
		if want := fmt.Sprintf("flash_fwd_%s_d%d", suf, dim); name != want {
			add("FLASH_FWD_TC(%s, %s, %d, ...) is named %s, planFlash asks for %s", name, m[2], dim, name, want)
		}
		if t, ok := flashTiles[dim]; !ok || t.fwdWarps != warps || t.fwdKeys != keys {
			add("%s: flash_attention.cu has %d warps and %d keys per tile, flashTiles[%d] %+v", name, warps, keys, dim, t)
		}
	}
	for _, m := range flashBwdTCPattern.FindAllStringSubmatch(src, -1) {
		name, suf, dim, rows, warps := m[1], flashTypeSuffix[m[2]], atoi(m[3]), atoi(m[4]), atoi(m[5])
		declared[name] = true
		bwdSeen[inst{suf, dim}] = true
		if want := fmt.Sprintf("flash_bwd_%s_d%d", suf, dim); name != want {
			add("FLASH_BWD_TC(%s, %s, %d, ...) is named %s, planFlash asks for %s", name, m[2], dim, name, want)
		}
		if t, ok := flashTiles[dim]; !ok || t.bwdRows != rows || t.bwdWarps != warps {
			add("%s: flash_attention.cu has %d rows per tile and %d warps, flashTiles[%d] %+v", name, rows, warps, dim, t)
		}
	}
	for dim := range flashTiles {
		for _, suf := range []string{"bf16", "fp16"} {
			if !fwdSeen[inst{suf, dim}] || !bwdSeen[inst{suf, dim}] {
				add("flash_attention.cu lacks a tensor-core forward or backward for %s, head dim %d", suf, dim)
			}
		}
	}
	fwdHeader, bwdHeader := map[int]bool{}, map[int]bool{}
	for _, m := range flashFwdHeaderLine.FindAllStringSubmatch(src, -1) {
		dim, rows, keys, warps, bytes := atoi(m[1]), atoi(m[2]), atoi(m[3]), atoi(m[4]), atoi(m[5])
		t := flashTiles[dim]
		fwdHeader[dim] = true
		if rows != 16*t.fwdWarps || keys != t.fwdKeys || warps != t.fwdWarps || bytes != t.fwdSmem(dim) {
			add("header, forward d%d: BR=%d BC=%d NW=%d -> %d B; flash.go: %+v -> %d B", dim, rows, keys, warps, bytes, t, t.fwdSmem(dim))
		}
	}
	for _, m := range flashBwdHeaderLine.FindAllStringSubmatch(src, -1) {
		dim, rows, warps, bytes := atoi(m[1]), atoi(m[2]), atoi(m[3]), atoi(m[4])
		t := flashTiles[dim]
		bwdHeader[dim] = true
		if rows != t.bwdRows || warps != t.bwdWarps || bytes != t.bwdSmem(dim) {
			add("header, backward d%d: BR=%d NW=%d -> %d B; flash.go: %+v -> %d B", dim, rows, warps, bytes, t, t.bwdSmem(dim))
		}
	}
	for dim := range flashTiles {
		if !fwdHeader[dim] || !bwdHeader[dim] {
			add("the header of flash_attention.cu gives no forward or backward shared memory for head dim %d", dim)
		}
	}
	for _, macro := range flashTypedMacros {
		body, inst := flashTypedPatterns(macro)
		var typed []string
		for _, m := range flashTypedEntry.FindAllStringSubmatch(body.FindString(src), -1) {
			typed = append(typed, m[1])
		}
		if len(typed) == 0 {
			add("found no entry points in the %s macro", macro)
		}
		for _, m := range inst.FindAllStringSubmatch(src, -1) {
			for _, prefix := range typed {
				declared[prefix+m[1]] = true
			}
		}
	}
	for _, m := range flashDecodeInstance.FindAllStringSubmatch(src, -1) {
		declared[m[1]] = true
	}
	for _, k := range kernelEntries(src) {
		declared[k] = true
	}
	used := map[string]bool{}
	for _, dt := range []GemmType{GemmF32, GemmBF16, GemmF16} {
		for dim := 1; dim <= 256; dim++ {
			for _, scale := range []float32{1, -1} {
				p, err := planFlash(dt, dim, scale)
				if err != nil {
					add("planFlash(%v, %d, %g): %v", dt, dim, scale, err)
					continue
				}
				for _, k := range []string{p.fwd, p.bwdPre, p.bwd, p.bwdConvert, p.bwdPreVec, p.bwdConvertVec, p.genBwdDQ, p.genBwdDKDV} {
					if k != "" {
						used[k] = true
					}
				}
			}
		}
	}
	for _, dt := range []GemmType{GemmBF16, GemmF16} {
		for dim := range flashDecodeStages {
			p, err := planFlashDecode(dt, 1, 1, 1, dim, false)
			if err != nil {
				add("planFlashDecode(%v, d%d): %v", dt, dim, err)
				continue
			}
			used[p.kernel], used[p.combine] = true, true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(used)) {
		if !declared[k] {
			add("flash_attention.cu declares no entry point %s", k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(declared)) {
		if !used[k] {
			add("flash_attention.cu declares %s, which planFlash never asks for", k)
		}
	}
	slices.Sort(problems)
	return problems
}

func TestFlashKernelsMatchSource(t *testing.T) {
	src, err := kernels.Source("flash_attention.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range flashSourceProblems(src) {
		t.Error(p)
	}
	for _, c := range []struct {
		name, from, to, want string
	}{
		{"tile differs",
			"FLASH_FWD_TC(flash_fwd_bf16_d64, __nv_bfloat16, 64, 8, 128)", "FLASH_FWD_TC(flash_fwd_bf16_d64, __nv_bfloat16, 64, 8, 64)",
			"flash_fwd_bf16_d64: flash_attention.cu has 8 warps and 64 keys per tile"},
		{"instantiation missing",
			"FLASH_BWD_TC(flash_bwd_fp16_d128, __half, 128, 64, 8)\n", "",
			"flash_attention.cu declares no entry point flash_bwd_fp16_d128"},
		{"header bytes differ", "-> 133120 B", "-> 131072 B", "header, backward d64: BR=128 NW=8 -> 131072 B"},
		{"typed entry renamed", "flash_bwd_convert_##SUF", "flash_bwd_cvt_##SUF", "flash_attention.cu declares flash_bwd_cvt_bf16"},
		{"unused type", "FLASH_TYPED(fp16, __half)", "FLASH_TYPED(fp16, __half)\nFLASH_TYPED(fp64, double)", "flash_attention.cu declares flash_bwd_pre_fp64, which planFlash never asks for"},
		{"float32 dQ conversion", "FLASH_CONVERT(fp16, __half)", "FLASH_CONVERT(fp16, __half)\nFLASH_CONVERT(fp32, float)", "flash_attention.cu declares flash_bwd_convert_fp32, which planFlash never asks for"},
		{"vector entry renamed", "flash_bwd_convertvec_##SUF", "flash_bwd_cvtvec_##SUF", "flash_attention.cu declares flash_bwd_cvtvec_bf16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(src, c.from) {
				t.Fatalf("flash_attention.cu has no %q to doctor", c.from)
			}
			got := flashSourceProblems(strings.Replace(src, c.from, c.to, 1))
			if !slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, c.want) }) {
				t.Errorf("problems %q; want one starting %q", got, c.want)
			}
		})
	}
}
