package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// wgmmaDescriptors is what sassDescriptorMoves finds in one kernel: its
// wgmmas (HGMMA), and how many of them that are not the first of their
// group have an R2UR between them and the wgmma before.
type wgmmaDescriptors struct {
	wgmmas, moved int
}

var (
	sassFunction    = regexp.MustCompile(`Function : (\S+)`)
	sassInstruction = regexp.MustCompile(`^\s+/\*[0-9a-f]{4,}\*/\s+([^;]*);`)
)

// sassDescriptorMoves reads a `cuobjdump -sass` listing. A wgmma takes its
// shared-memory descriptors from uniform registers; when ptxas keeps them on
// the uniform datapath, a group's k-steps add constants there and issue
// back to back, and only the first wgmma of a group (after WARPGROUP.ARRIVE)
// may need an R2UR to bring a base in. When it builds them in ordinary
// registers instead, every wgmma is preceded by R2URs (and the IMADs that
// made them): on the H200 that cost the persistent forward 3–4% (run 50 in
// BENCHMARKS.md) without any message from ptxas.
func sassDescriptorMoves(sass string) map[string]wgmmaDescriptors {
	out := map[string]wgmmaDescriptors{}
	kernel := ""
	first, r2ur := true, 0
	for _, line := range strings.Split(sass, "\n") {
		if m := sassFunction.FindStringSubmatch(line); m != nil {
			kernel, first, r2ur = m[1], true, 0
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
		op := f[0]
		if strings.HasPrefix(op, "@") && len(f) > 1 {
			op = f[1] // predicated
		}
		switch {
		case strings.HasPrefix(op, "WARPGROUP.ARRIVE"):
			first, r2ur = true, 0
		case strings.HasPrefix(op, "R2UR"):
			r2ur++
		case strings.HasPrefix(op, "HGMMA"):
			d := out[kernel]
			d.wgmmas++
			if !first && r2ur > 0 {
				d.moved++
			}
			out[kernel] = d
			first, r2ur = false, 0
		}
	}
	return out
}

// cudaTool is the path of a CUDA toolkit program (cuobjdump, nvdisasm): from
// a toolkit root (toolkitDirs) or PATH, "" when there is none.
func cudaTool(name string) string {
	for _, d := range toolkitDirs() {
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
	// Shortened from the sm_90a listings of run 50 (ppp with its
	// descriptors in ordinary registers) and of the kept build.
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
`
	got := sassDescriptorMoves(listing)
	want := map[string]wgmmaDescriptors{"kept": {4, 0}, "moved": {3, 2}}
	if len(got) != len(want) {
		t.Fatalf("kernels %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %+v, want %+v", k, got[k], w)
		}
	}
}
