package attention

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/kernels"
)

// These tests read the embedded flash_attention.cu, so they run without a
// GPU: the launchers' tile tables and the kernels' instances are written in
// two files (moved from package cuda's kernels_source_test.go, which keeps
// the same entry-point reader for ops.cu).

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
var flashTypedMacros = []string{"FLASH_TYPED", "FLASH_CONVERT", "FLASH_VEC", "FLASH_KV_SUM"}

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
				for _, k := range []string{p.fwd, p.bwdPre, p.bwd, p.bwdConvert, p.bwdPreVec, p.bwdConvertVec, p.bwdRepeat, p.bwdKVSum, p.genBwdDQ, p.genBwdDKDV} {
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
		{"repeat entry renamed", "flash_bwd_kv_repeat(const uint4* k", "flash_bwd_kv_copy(const uint4* k", "flash_attention.cu declares no entry point flash_bwd_kv_repeat"},
		{"sum instance missing", "FLASH_KV_SUM(fp16, __half)\n", "", "flash_attention.cu declares no entry point flash_bwd_kv_sum_fp16"},
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
