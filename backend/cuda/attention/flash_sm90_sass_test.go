package attention

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
)

// sassByKernel splits a `cuobjdump -sass` listing into each function's
// instructions (operands and encodings, one a line), by function name.
func sassByKernel(sass string) map[string]string {
	out := map[string]string{}
	kernel := ""
	var b strings.Builder
	flush := func() {
		if kernel != "" {
			out[kernel] = b.String()
		}
		b.Reset()
	}
	for _, line := range strings.Split(sass, "\n") {
		if m := sassFunction.FindStringSubmatch(line); m != nil {
			flush()
			kernel = m[1]
			continue
		}
		if kernel != "" && sassInstruction.MatchString(line) {
			b.WriteString(strings.Join(strings.Fields(line), " "))
			b.WriteString("\n")
		}
	}
	flush()
	return out
}

// flashSM90FormerName maps a kernel name of before the rename
// (flash_fwd_sm90_ppp_bf16_d64) to the name now.
func flashSM90FormerName(name string) string {
	for _, dir := range []struct {
		prefix  string
		renamed map[string]string
	}{{"flash_fwd_sm90_", flashSM90FwdRenamed}, {"flash_bwd_sm90_", flashSM90BwdRenamed}} {
		if rest, ok := strings.CutPrefix(name, dir.prefix); ok {
			v, tail, _ := strings.Cut(rest, "_")
			if now, ok := dir.renamed[v]; ok {
				return dir.prefix + now + "_" + tail
			}
		}
	}
	return name
}

func TestFlashSM90FormerName(t *testing.T) {
	for old, want := range map[string]string{
		"flash_fwd_sm90_ppp3_bf16_d64":  "flash_fwd_sm90_persistent3wg_bf16_d64",
		"flash_fwd_sm90_tma_fp16_d128":  "flash_fwd_sm90_warpspec_fp16_d128",
		"flash_bwd_sm90_pp_bf16_d64":    "flash_bwd_sm90_pingpong_bf16_d64",
		"flash_bwd_sm90_dqtma_fp16_d64": "flash_bwd_sm90_baseline_fp16_d64",
		"flash_bwd_sm90_alt_bf16_d128":  "flash_bwd_sm90_alternating_bf16_d128",
		"flash_fwd_bf16_d64":            "flash_fwd_bf16_d64",
	} {
		if got := flashSM90FormerName(old); got != want {
			t.Errorf("flashSM90FormerName(%s) = %s, want %s", old, got, want)
		}
	}
	listing := "\t\tFunction : k1\n        /*0000*/                   LDC R1, c[0x0][0x28] ;  /* 0x00000a00ff017b82 */\n" +
		"\t\tFunction : k2\n        /*0000*/                   EXIT ;  /* 0x000000000000794d */\n"
	got := sassByKernel(listing)
	if len(got) != 2 || !strings.HasPrefix(got["k1"], "/*0000*/ LDC R1") || !strings.Contains(got["k2"], "EXIT") {
		t.Errorf("sassByKernel: %q", got)
	}
}

// TestFlashSM90SplitSASS checks on a machine with NVRTC (12.0 or newer) and
// cuobjdump, no GPU needed, that splitting the Hopper kernels into units
// left their machine code as it was: each kernel's SASS from its unit
// (flash_sm90_fwd.cu, flash_sm90_bwd.cu, the dev unit) equals its SASS
// from every sm90 kernel compiled as one program, as before the split. With
// FLASHGRAPH_SM90_OLD_SOURCE naming the pre-split flash_attention_sm90.cu
// (git show 49505a5:kernels/flash_attention_sm90.cu), it also compares
// each kernel with its former self under its former name. Opt-in
// (FLASHGRAPH_SM90_SASS=1): it compiles everything twice.
func TestFlashSM90SplitSASS(t *testing.T) {
	if os.Getenv("FLASHGRAPH_SM90_SASS") != "1" {
		t.Skip("set FLASHGRAPH_SM90_SASS=1 (and FLASHGRAPH_SM90_OLD_SOURCE=path) to compare the units' SASS")
	}
	version, err := driver.NVRTCVersion()
	if err != nil {
		t.Skip(err)
	}
	if strings.HasPrefix(version, "11.") {
		t.Skipf("NVRTC %s cannot target sm_90a", version)
	}
	tool := cudaTool("cuobjdump")
	if tool == "" {
		t.Skip("no cuobjdump in the CUDA toolkit or PATH")
	}
	dir := t.TempDir()
	sass := func(name, src string) map[string]string {
		t.Helper()
		cubin, _, err := driver.NVRTCCompile(name, src, driver.CompileOptions("sm_90a", nil))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		path := filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(name)+".cubin")
		if err := os.WriteFile(path, cubin, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(tool, "-sass", path).CombinedOutput()
		if err != nil {
			t.Fatalf("%s -sass %s: %v\n%s", tool, name, err, out)
		}
		return sassByKernel(string(out))
	}
	srcs := flashSM90Sources(t)
	split := map[string]string{}
	for _, f := range flashSM90Files {
		for k, s := range sass(f, srcs[f]) {
			split[k] = s
		}
	}
	refs := map[string]map[string]string{
		"one unit": sass("one unit", srcs[flashSM90DevFile]+srcs[flashSM90FwdFile]+srcs[flashSM90BwdFile]),
	}
	if old := os.Getenv("FLASHGRAPH_SM90_OLD_SOURCE"); old != "" {
		b, err := os.ReadFile(old)
		if err != nil {
			t.Fatal(err)
		}
		renamed := map[string]string{}
		for k, s := range sass(filepath.Base(old), string(b)) {
			renamed[flashSM90FormerName(k)] = s
		}
		refs[old] = renamed
	}
	for _, k := range flashSM90AllKernels {
		got, ok := split[k]
		if !ok || got == "" {
			t.Errorf("%s: not in the units' cubins", k)
			continue
		}
		for label, ref := range refs {
			want, ok := ref[k]
			if !ok {
				t.Errorf("%s: not in %s's cubin", k, label)
				continue
			}
			if got != want {
				t.Errorf("%s: SASS differs from %s's: %s", k, label, firstDiff(got, want))
			}
		}
	}
	t.Logf("compared %d kernels against %s", len(flashSM90AllKernels), strings.Join(slices.Sorted(maps.Keys(refs)), ", "))
}

// firstDiff describes the first line where two listings differ.
func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return fmt.Sprintf("line %d: %q against %q (%d and %d lines)", i+1, la[i], lb[i], len(la), len(lb))
		}
	}
	return fmt.Sprintf("%d lines against %d", len(la), len(lb))
}
