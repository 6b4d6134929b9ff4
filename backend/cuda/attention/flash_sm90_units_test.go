package attention

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/kernels"
)

// flashSM90SourceFiles are the files the sm90 units are made of: the
// shared header, the forward's and backward's device code, and the units.
var flashSM90SourceFiles = []string{
	"flash_sm90_common.cuh", "flash_sm90_fwd.cuh", "flash_sm90_bwd.cuh",
	flashSM90FwdFile, flashSM90BwdFile, flashSM90DevFile,
}

// flashSM90LiveKernels are the sm90 kernels the dispatcher runs by default
// (FlashSM90Env and FlashSM90BwdEnv unset) for some shape: the forwards
// and backwards flashSM90Pick and flashSM90BwdPick can return.
func flashSM90LiveKernels() (fwd, bwd []string) {
	f, b := map[string]bool{}, map[string]bool{}
	for _, dt := range []GemmType{GemmBF16, GemmF16} {
		for _, dim := range []int{64, 128} {
			for _, sq := range []int{1, 128, 1024, 1025, 2048, 4096, 16384} {
				for _, causal := range []bool{false, true} {
					if name, err := flashSM90Pick(9, 0, dt, dim, sq, causal, 0.1, ""); err == nil && name != "" {
						f[name] = true
					}
				}
			}
			if name, err := flashSM90BwdPick(9, 0, dt, dim, 0.1, ""); err == nil && name != "" {
				b[name] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(f)), slices.Sorted(maps.Keys(b))
}

// flashSM90Launchable are every sm90 kernel name the Go launchers can
// form, a variant named or not.
func flashSM90Launchable() []string {
	var names []string
	for _, dt := range []GemmType{GemmBF16, GemmF16} {
		for _, dim := range []int{64, 128} {
			for _, v := range flashSM90FwdVariants {
				names = append(names, flashSM90Name(dt, dim, v))
			}
			for _, v := range flashSM90BwdVariants {
				if n := flashSM90BwdName(dt, dim, v); n != "" {
					names = append(names, n)
				}
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// flashSM90DeviceDef matches a top-level definition in the sm90 sources: a
// device function (its name, with the template arguments of an explicit
// specialisation), a namespace-level constant, a macro.
var flashSM90DeviceDef = regexp.MustCompile(`(?m)^(?:template <[^\n]*>\s*)?__device__ __forceinline__ [^(\n]*?\b(\w+(?:<[^>(]*>)?)\s*\(|^constexpr \w+ (\w+) =|^#define (\w+)`)

// TestFlashSM90Units checks, without NVRTC, that splitting the Hopper
// kernels into compile units is purely textual and that the production
// units hold only live kernels:
//   - every unit includes the shared header (kernels.Includes);
//   - every kernel a launcher can name is defined in exactly one unit, the
//     one flashSM90UnitOf says (so the launcher compiles the right one);
//   - flash_sm90_fwd.cu defines exactly the forwards the dispatcher picks by
//     default for some shape, flash_sm90_bwd.cu exactly the backwards: the
//     others are the dev unit's;
//   - each device function, constant and macro is defined once across the
//     files (the units share one text, not copies that could drift), and
//     every FA90_ macro a unit uses is defined in it before the use.
func TestFlashSM90Units(t *testing.T) {
	srcs := flashSM90Sources(t)
	definedIn := map[string][]string{}
	for _, f := range flashSM90Files {
		inc, err := kernels.Includes(f)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(inc, func(p string) bool { return strings.HasSuffix(p, "flash_sm90_common.cuh") }) {
			t.Errorf("%s does not include flash_sm90_common.cuh (it includes %v)", f, inc)
		}
		for _, m := range flashSM90Instance.FindAllStringSubmatch(srcs[f], -1) {
			definedIn[m[1]] = append(definedIn[m[1]], f)
		}
		if n := strings.Count(srcs[f], "namespace fa90 {"); n != strings.Count(srcs[f], "}  // namespace fa90") {
			t.Errorf("%s opens namespace fa90 %d times and closes it %d times", f, n, strings.Count(srcs[f], "}  // namespace fa90"))
		}
	}
	for _, name := range flashSM90Launchable() {
		if got := definedIn[name]; len(got) != 1 || got[0] != flashSM90UnitOf(name) {
			t.Errorf("%s is defined in %v; want exactly %s (flashSM90UnitOf)", name, got, flashSM90UnitOf(name))
		}
	}
	liveFwd, liveBwd := flashSM90LiveKernels()
	for file, live := range map[string][]string{flashSM90FwdFile: liveFwd, flashSM90BwdFile: liveBwd} {
		var got []string
		for _, m := range flashSM90Instance.FindAllStringSubmatch(srcs[file], -1) {
			got = append(got, m[1])
		}
		slices.Sort(got)
		if !slices.Equal(got, live) {
			t.Errorf("%s defines %v;\nthe dispatcher's defaults are %v: the production unit must hold exactly those", file, got, live)
		}
	}
	for _, k := range slices.Concat(liveFwd, liveBwd) {
		if flashSM90UnitOf(k) == flashSM90DevFile {
			t.Errorf("%s is a default, but flashSM90UnitOf puts it in the dev unit", k)
		}
	}

	defs := map[string][]string{}
	for _, f := range flashSM90SourceFiles {
		src, err := kernels.Source(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flashSM90DeviceDef.FindAllStringSubmatch(src, -1) {
			name := m[1] + m[2] + m[3]
			defs[name] = append(defs[name], f)
		}
	}
	if len(defs) < 50 {
		t.Errorf("found only %d definitions in the sm90 sources: is flashSM90DeviceDef out of date?", len(defs))
	}
	for _, name := range slices.Sorted(maps.Keys(defs)) {
		if len(defs[name]) > 1 && !strings.HasSuffix(name, "_CUH") {
			t.Errorf("%s is defined %d times (%v): the units must share one definition", name, len(defs[name]), defs[name])
		}
	}
	for _, f := range flashSM90Files {
		for _, p := range flashSM90MacroProblems(srcs[f]) {
			t.Errorf("%s (as compiled): %s", f, p)
		}
	}
}

// flashSM90MacroProblems lists the FA90_ macros src uses before it defines
// them or never defines, with the line of the first such use.
func flashSM90MacroProblems(src string) []string {
	var problems []string
	seen := map[string]bool{}
	for _, loc := range regexp.MustCompile(`\bFA90_\w+`).FindAllStringIndex(src, -1) {
		name := src[loc[0]:loc[1]]
		if seen[name] {
			continue
		}
		seen[name] = true
		def := strings.Index(src, "#define "+name+"(")
		if def < 0 {
			def = strings.Index(src, "#define "+name+" ")
		}
		line := strings.Count(src[:loc[0]], "\n") + 1
		switch {
		case def < 0:
			problems = append(problems, fmt.Sprintf("line %d uses %s, which it never defines", line, name))
		case def > loc[0]:
			problems = append(problems, fmt.Sprintf("line %d uses %s before its #define", line, name))
		}
	}
	return problems
}

// TestFlashSM90MacroProblems doctors a unit the way a careless split would
// (a macro's definition moved behind its uses, or left out) and checks that
// flashSM90MacroProblems notices.
func TestFlashSM90MacroProblems(t *testing.T) {
	src := flashSM90Sources(t)[flashSM90BwdFile]
	if p := flashSM90MacroProblems(src); len(p) != 0 {
		t.Fatalf("%s: %v", flashSM90BwdFile, p)
	}
	def := "#define FA90_BWD("
	i := strings.Index(src, def)
	if i < 0 {
		t.Fatalf("%s has no %q", flashSM90BwdFile, def)
	}
	j := i + strings.Index(src[i:], "\n\n")
	for name, doctored := range map[string]string{
		"moved":   src[:i] + src[j:] + "\n" + src[i:j] + "\n",
		"dropped": src[:i] + src[j:],
	} {
		if p := flashSM90MacroProblems(doctored); !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, "FA90_BWD,") || strings.Contains(s, "FA90_BWD ") }) {
			t.Errorf("%s: the definition of FA90_BWD %s, but flashSM90MacroProblems says %v", name, name, p)
		}
	}
}
