package attention

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
)

// wgmmaDescriptors is what sassDescriptorMoves finds in one kernel: its
// wgmmas (HGMMA), and how many of them that are not the first of their
// group read a descriptor that came from an ordinary register since the
// wgmma before.
type wgmmaDescriptors struct {
	wgmmas, moved int
}

var (
	sassFunction    = regexp.MustCompile(`Function : (\S+)`)
	sassInstruction = regexp.MustCompile(`^\s+/\*[0-9a-f]{4,}\*/\s+([^;]*);`)
	sassUniformReg  = regexp.MustCompile(`\bUR(\d+)\b`)
	sassDescriptor  = regexp.MustCompile(`gdesc\[UR(\d+)\]`)
)

// sassDescriptorMoves reads a `cuobjdump -sass` listing. A wgmma takes its
// shared-memory descriptors from uniform registers; when ptxas keeps them on
// the uniform datapath, a group's k-steps add constants there and issue
// back to back, and only the first wgmma of a group (after WARPGROUP.ARRIVE)
// may need an R2UR to bring a base in. When it builds them in ordinary
// registers instead, every wgmma is preceded by R2URs (and the IMADs that
// made them): on the H200 that made the persistent forward slower
// (BENCHMARKS.md, "Measurements the Hopper kernels' comments cite") without
// any message from ptxas.
//
// A wgmma counts as moved when one of the four uniform registers from its
// gdesc[URn] on was written, since the wgmma before, by an R2UR or by a
// uniform instruction reading such a register (followed through straight
// code, branches ignored). An R2UR that feeds something else (a loop bound
// compared on the uniform datapath, say) leaves the wgmmas alone.
func sassDescriptorMoves(sass string) map[string]wgmmaDescriptors {
	out := map[string]wgmmaDescriptors{}
	kernel := ""
	first := true
	fromR := map[int]bool{} // uniform registers holding a value moved from an ordinary one
	for _, line := range strings.Split(sass, "\n") {
		if m := sassFunction.FindStringSubmatch(line); m != nil {
			kernel, first = m[1], true
			clear(fromR)
			continue
		}
		m := sassInstruction.FindStringSubmatch(line)
		if m == nil || kernel == "" {
			continue
		}
		f := strings.Fields(m[1])
		if len(f) == 0 {
			continue
		}
		if strings.HasPrefix(f[0], "@") && len(f) > 1 {
			f = f[1:] // predicated
		}
		op := f[0]
		switch {
		case strings.HasPrefix(op, "WARPGROUP.ARRIVE"):
			first = true
		case strings.HasPrefix(op, "HGMMA"):
			d := out[kernel]
			d.wgmmas++
			if mm := sassDescriptor.FindStringSubmatch(m[1]); mm != nil && !first {
				n := atoiDec(mm[1])
				if fromR[n] || fromR[n+1] || fromR[n+2] || fromR[n+3] {
					d.moved++
				}
			}
			out[kernel] = d
			first = false
			clear(fromR)
		default:
			// A uniform destination is the first operand when it is a
			// register URn (UISETP's are predicates); .64 writes two.
			operands := strings.Split(strings.Join(f[1:], " "), ",")
			if len(operands) == 0 {
				continue
			}
			dst := sassUniformReg.FindStringSubmatch(strings.TrimSpace(operands[0]))
			if dst == nil || strings.TrimSpace(operands[0]) != "UR"+dst[1] {
				continue
			}
			moved := strings.HasPrefix(op, "R2UR")
			for _, src := range operands[1:] {
				for _, r := range sassUniformReg.FindAllStringSubmatch(src, -1) {
					moved = moved || fromR[atoiDec(r[1])]
				}
			}
			n := atoiDec(dst[1])
			fromR[n] = moved
			if strings.Contains(op, ".64") {
				fromR[n+1] = moved
			}
		}
	}
	return out
}

// atoiDec is the value of a string of decimal digits (the regexps above
// match nothing else).
func atoiDec(s string) int {
	n := 0
	for _, c := range s {
		n = 10*n + int(c-'0')
	}
	return n
}

// cudaTool is the path of a CUDA toolkit program (cuobjdump, nvdisasm): from
// a toolkit root (driver.ToolkitDirs) or PATH, "" when there is none.
func cudaTool(name string) string {
	for _, d := range driver.ToolkitDirs() {
		p := filepath.Join(d, "bin", name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return ""
}

func TestSASSDescriptorMoves(t *testing.T) {
	// Shortened from the sm_90a listings of the persistent forward with its
	// descriptors in ordinary registers and of the kept build (the kernels'
	// former names); "derived": a descriptor computed from a moved register;
	// "bound": from the ping-pong backward (NVRTC 13), an R2UR that feeds a
	// loop bound, not the descriptors.
	const listing = `
	code for sm_90a
		Function : kept
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0500*/                   R2UR UR12, R4 ;                                          /* 0x00000000040c72ca */
        /*0510*/                   WARPGROUP.ARRIVE ;                                      /* 0x00000000000079c5 */
        /*0520*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR12], RZ, !UPT ;   /* 0x0 */
        /*0530*/                   UIADD3 UR12, UR12, 0x2, URZ ;                            /* 0x0 */
        /*0540*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR12], R88 ;        /* 0x0 */
        /*0550*/                   WARPGROUP.ARRIVE ;                                      /* 0x00000000000079c5 */
        /*0560*/                   R2UR UR16, R6 ;                                          /* 0x0 */
        /*0570*/                   HGMMA.64x128x16.F32.BF16 R24, R152, gdesc[UR16].tnspB, R24 ; /* 0x0 */
        /*0580*/                   HGMMA.64x128x16.F32.BF16 R24, R156, gdesc[UR16].tnspB, R24, gsb0 ; /* 0x0 */
		..........
		Function : moved
        /*0510*/                   WARPGROUP.ARRIVE ;                                      /* 0x00000000000079c5 */
        /*0520*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR20], RZ, !UPT ;   /* 0x0 */
        /*0530*/                   R2UR UR22, R188 ;                                        /* 0x0 */
        /*0540*/                   VIADD R188, R16, 0x4 ;                                   /* 0x0 */
        /*0550*/               @P0 R2UR UR23, R189 ;                                        /* 0x0 */
        /*0560*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR20], R88 ;        /* 0x0 */
        /*0570*/                   R2UR UR20, R186 ;                                        /* 0x0 */
        /*0580*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR20], R88, gsb0 ;  /* 0x0 */
		..........
		Function : derived
        /*0510*/                   WARPGROUP.ARRIVE ;                                      /* 0x00000000000079c5 */
        /*0520*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12].tnspA.tnspB, RZ, !UPT ; /* 0x0 */
        /*0530*/                   R2UR UR6, R0 ;                                           /* 0x0 */
        /*0540*/                   UIADD3 UR14, UR6, 0x180, URZ ;                           /* 0x0 */
        /*0550*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12].tnspA.tnspB, R24 ; /* 0x0 */
		..........
		Function : bound
        /*0510*/                   WARPGROUP.ARRIVE ;                                      /* 0x00000000000079c5 */
        /*0520*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12].tnspA.tnspB, RZ, !UPT ; /* 0x0 */
        /*0530*/                   UIADD3 UR14, UR10, 0x180, URZ ;                          /* 0x0 */
        /*0540*/                   R2UR UR10, R0 ;                                          /* 0x0 */
        /*0550*/                   UIADD3 UR12, UR9, 0x180, URZ ;                           /* 0x0 */
        /*0560*/                   UMOV UR15, 0x40000040 ;                                  /* 0x0 */
        /*0570*/                   UISETP.GE.AND UP0, UPT, UR8, UR10, UPT ;                 /* 0x0 */
        /*0580*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12].tnspA.tnspB, R24, gsb0 ; /* 0x0 */
`
	got := sassDescriptorMoves(listing)
	want := map[string]wgmmaDescriptors{"kept": {4, 0}, "moved": {3, 2}, "derived": {2, 1}, "bound": {2, 0}}
	if len(got) != len(want) {
		t.Fatalf("kernels %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %+v, want %+v", k, got[k], w)
		}
	}
}
