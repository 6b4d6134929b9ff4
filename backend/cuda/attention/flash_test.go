package attention

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
	"github.com/flashgraph/flashgraph/kernels"
)

func TestPlanFlash(t *testing.T) {
	for _, c := range []struct {
		dt    GemmType
		dim   int
		scale float32
		tc    bool
		fwd   string
	}{
		{GemmBF16, 64, 0.125, true, "flash_fwd_bf16_d64"},
		{GemmF16, 128, 0.1, true, "flash_fwd_fp16_d128"},
		{GemmBF16, 80, 0.1, false, "flash_fwd_generic_bf16"},
		{GemmBF16, 64, -1, false, "flash_fwd_generic_bf16"},
		{GemmF32, 128, 0.1, false, "flash_fwd_generic_fp32"},
	} {
		p, err := planFlash(c.dt, c.dim, c.scale)
		if err != nil {
			t.Fatal(err)
		}
		if p.tensorCore != c.tc || p.fwd != c.fwd {
			t.Errorf("planFlash(%v, %d, %g) = %+v, want tensorCore %v fwd %s", c.dt, c.dim, c.scale, p, c.tc, c.fwd)
		}
		if c.tc && (p.bwdPreVec != "flash_bwd_prevec_"+p.suffix || p.bwdConvertVec != "flash_bwd_convertvec_"+p.suffix) {
			t.Errorf("planFlash(%v, %d): vector pre/convert %q %q", c.dt, c.dim, p.bwdPreVec, p.bwdConvertVec)
		}
		if p.fwdSmem > 227*1024 || p.bwdSmem > 227*1024 || p.genDQSmem > 227*1024 || p.genKVSmem > 227*1024 {
			t.Errorf("planFlash(%v, %d): shared memory over 227 KB: %+v", c.dt, c.dim, p)
		}
	}
	if !flashVecAligned(0x1000, 0x2010) || flashVecAligned(0x1000, 0x2002) || flashVecAligned(0x1008) {
		t.Error("flashVecAligned: wrong answer on 16-byte alignment")
	}
	if _, err := planFlash(GemmF32, 257, 1); err == nil || !strings.Contains(err.Error(), "head dim 257") {
		t.Errorf("dim 257: got %v", err)
	}
	if err := checkFlashShape(0, 1, 1, 64); err == nil {
		t.Error("bh 0 accepted")
	}
}

// flashRef is a float64 reference of attention forward and backward, with the
// magnitudes of each output (the same products on absolute values), which bound
// the rounding error componentwise.
type flashRef struct {
	o, lse, dq, dk, dv        []float64
	oMag, dqMag, dkMag, dvMag []float64
}

func flashReference(q, k, v, do []float64, bh, sq, sk, dim int, scale float64, causal bool) flashRef {
	r := flashRef{
		o: make([]float64, bh*sq*dim), lse: make([]float64, bh*sq), dq: make([]float64, bh*sq*dim),
		dk: make([]float64, bh*sk*dim), dv: make([]float64, bh*sk*dim), oMag: make([]float64, bh*sq*dim),
		dqMag: make([]float64, bh*sq*dim), dkMag: make([]float64, bh*sk*dim), dvMag: make([]float64, bh*sk*dim),
	}
	p := make([]float64, sk)
	for b := range bh {
		Q, dO := q[b*sq*dim:], do[b*sq*dim:]
		K, V := k[b*sk*dim:], v[b*sk*dim:]
		for i := range sq {
			m := math.Inf(-1)
			n := sk
			if causal {
				n = min(sk, i+1)
			}
			for j := range n {
				s := 0.0
				for c := range dim {
					s += Q[i*dim+c] * K[j*dim+c]
				}
				p[j] = s * scale
				m = math.Max(m, p[j])
			}
			sum := 0.0
			for j := range n {
				p[j] = math.Exp(p[j] - m)
				sum += p[j]
			}
			r.lse[b*sq+i] = m + math.Log(sum)
			oi := r.o[(b*sq+i)*dim:]
			om := r.oMag[(b*sq+i)*dim:]
			for j := range n {
				p[j] /= sum
				for c := range dim {
					oi[c] += p[j] * V[j*dim+c]
					om[c] += p[j] * math.Abs(V[j*dim+c])
				}
			}
			dsum, dabs := 0.0, 0.0
			for c := range dim {
				dsum += dO[i*dim+c] * oi[c]
				dabs += math.Abs(dO[i*dim+c] * oi[c])
			}
			for j := range n {
				dp, dpa := 0.0, 0.0
				for c := range dim {
					dp += dO[i*dim+c] * V[j*dim+c]
					dpa += math.Abs(dO[i*dim+c] * V[j*dim+c])
				}
				ds := p[j] * (dp - dsum) * scale
				dsa := p[j] * (dpa + dabs) * scale
				for c := range dim {
					r.dq[(b*sq+i)*dim+c] += ds * K[j*dim+c]
					r.dqMag[(b*sq+i)*dim+c] += dsa * math.Abs(K[j*dim+c])
					r.dk[(b*sk+j)*dim+c] += ds * Q[i*dim+c]
					r.dkMag[(b*sk+j)*dim+c] += dsa * math.Abs(Q[i*dim+c])
					r.dv[(b*sk+j)*dim+c] += p[j] * dO[i*dim+c]
					r.dvMag[(b*sk+j)*dim+c] += p[j] * math.Abs(dO[i*dim+c])
				}
			}
		}
	}
	return r
}

// flashTensor holds one input or output on the device in element type dt.
func flashUpload(t *testing.T, d *Device, dt GemmType, x []float64) (DevicePtr, []float64) {
	t.Helper()
	rounded := make([]float64, len(x))
	var p DevicePtr
	var err error
	switch dt {
	case GemmF32:
		h := make([]float32, len(x))
		for i, v := range x {
			h[i] = float32(v)
			rounded[i] = float64(h[i])
		}
		p, err = Upload(d, h)
	default:
		h := make([]uint16, len(x))
		for i, v := range x {
			if dt == GemmBF16 {
				h[i] = BF16FromFloat32(float32(v))
				rounded[i] = float64(BF16ToFloat32(h[i]))
			} else {
				h[i] = F16FromFloat32(float32(v))
				rounded[i] = float64(F16ToFloat32(h[i]))
			}
		}
		p, err = Upload(d, h)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	return p, rounded
}

// flashAlloc allocates n elements of dt poisoned with NaN (all bits set).
func flashAlloc(t testing.TB, d *Device, n, elem int) DevicePtr {
	t.Helper()
	p, err := d.Alloc(n * elem)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Memset(p, 0xff, n*elem); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	return p
}

// flashNormals returns a generator of n standard normals drawn from rng, in
// order (the tests' random Q, K, V and dO).
func flashNormals(rng *rand.Rand) func(n int) []float64 {
	return func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = rng.NormFloat64()
		}
		return x
	}
}

func flashDownload(t *testing.T, d *Device, dt GemmType, p DevicePtr, n int) []float64 {
	t.Helper()
	out := make([]float64, n)
	if dt == GemmF32 {
		h := make([]float32, n)
		if err := Download(d, p, h); err != nil {
			t.Fatal(err)
		}
		for i, v := range h {
			out[i] = float64(v)
		}
		return out
	}
	h := make([]uint16, n)
	if err := Download(d, p, h); err != nil {
		t.Fatal(err)
	}
	for i, v := range h {
		if dt == GemmBF16 {
			out[i] = float64(BF16ToFloat32(v))
		} else {
			out[i] = float64(F16ToFloat32(v))
		}
	}
	return out
}

// flashCheck: |got-ref| <= frac*mag + atol + rtol*|ref| elementwise, and the
// relative L2 error at most l2 unless ref is a cancellation (||ref|| < 1e-3 ||mag||).
func flashCheck(name string, got, ref, mag []float64, frac, atol, rtol, l2 float64) error {
	var en, rn, mn float64
	bad := 0
	first := ""
	for i := range ref {
		e := math.Abs(got[i] - ref[i])
		lim := atol + rtol*math.Abs(ref[i])
		if mag != nil {
			lim += frac * mag[i]
			mn += mag[i] * mag[i]
		}
		if !(e <= lim) {
			if bad == 0 {
				first = fmt.Sprintf(" first at %d: got %g want %g", i, got[i], ref[i])
			}
			bad++
		}
		en += e * e
		rn += ref[i] * ref[i]
	}
	if bad > 0 {
		return fmt.Errorf("%s: %d of %d elements out of tolerance;%s", name, bad, len(ref), first)
	}
	cancel := mag != nil && math.Sqrt(rn) < 1e-3*math.Sqrt(mn)
	if !cancel && math.Sqrt(en) > l2*math.Sqrt(rn) {
		return fmt.Errorf("%s: relative L2 error %.3g > %.3g", name, math.Sqrt(en/rn), l2)
	}
	return nil
}

func TestFlashAttentionGPU(t *testing.T) {
	d := gpu(t)
	d.SetCubinCacheDir(t.TempDir())
	type tol struct{ frac, rtol, l2 float64 }
	tols := map[GemmType]tol{GemmBF16: {1.0 / 128, 0.02, 1e-2}, GemmF16: {1.0 / 1024, 0.004, 2e-3}, GemmF32: {1e-5, 2e-5, 1e-5}}
	rng := rand.New(rand.NewPCG(7, 11))
	for _, c := range []struct {
		dt              GemmType
		bh, sq, sk, dim int
		causal          bool
		dqOff           int  // bytes dQ sits past an allocation: 2 takes the pre/convert kernels' unaligned fallback
		outOff          int  // bytes O, dK and dV sit past their allocations: 8 takes FA2's kernels (the Hopper ones store them with TMA, which needs 16-byte alignment; FA2 4)
		fa2             bool // FA2's kernels on a Hopper GPU too (FlashSM90Env, FlashSM90BwdEnv = 0): dQaccum unpermuted
	}{
		{GemmBF16, 3, 200, 200, 64, true, 0, 0, false},
		{GemmBF16, 2, 77, 300, 128, false, 0, 0, false},
		{GemmF16, 2, 300, 77, 128, true, 0, 0, false},
		{GemmF16, 2, 130, 130, 64, false, 0, 0, false},
		{GemmBF16, 2, 130, 100, 128, true, 2, 0, false},
		{GemmBF16, 3, 200, 200, 64, true, 0, 0, true},
		{GemmF16, 2, 77, 300, 128, false, 0, 0, true},
		{GemmBF16, 2, 130, 100, 128, true, 2, 0, true},
		{GemmBF16, 2, 130, 100, 128, false, 0, 8, false},
		{GemmBF16, 11, 300, 300, 128, true, 0, 0, false}, // causal heads in groups of 8 (bwd_tile): 8 + 3
		{GemmBF16, 5, 8200, 130, 128, true, 0, 0, false}, // 8 MiB of Q, dO, dQaccum a head: groups of 3 (bwd_tile): 3 + 2
		{GemmF16, 11, 260, 200, 64, true, 0, 0, false},
		{GemmBF16, 2, 65, 90, 40, true, 0, 0, false},
		{GemmF32, 2, 150, 150, 128, true, 0, 0, false},
		{GemmF32, 1, 33, 70, 20, false, 0, 0, false},
	} {
		name := fmt.Sprintf("%v/bh%d/sq%d/sk%d/d%d/causal%v/dqoff%d/outoff%d/fa2%v", c.dt, c.bh, c.sq, c.sk, c.dim, c.causal, c.dqOff, c.outOff, c.fa2)
		t.Run(name, func(t *testing.T) {
			if c.fa2 {
				t.Setenv(FlashSM90Env, "0")
				t.Setenv(FlashSM90BwdEnv, "0")
			}
			nq, nk := c.bh*c.sq*c.dim, c.bh*c.sk*c.dim
			gen := flashNormals(rng)
			q, qh := flashUpload(t, d, c.dt, gen(nq))
			k, kh := flashUpload(t, d, c.dt, gen(nk))
			v, vh := flashUpload(t, d, c.dt, gen(nk))
			dO, doh := flashUpload(t, d, c.dt, gen(nq))
			es := c.dt.ElemSize()
			o := flashAlloc(t, d, nq+8, es).Offset(c.outOff)
			lse := flashAlloc(t, d, c.bh*c.sq, 4)
			dq := flashAlloc(t, d, nq+8, es).Offset(c.dqOff)
			dk, dv := flashAlloc(t, d, nk+8, es).Offset(c.outOff), flashAlloc(t, d, nk+8, es).Offset(c.outOff)
			scale := float32(1 / math.Sqrt(float64(c.dim)))
			if err := FlashForward(d, c.dt, q, k, v, o, lse, c.bh, c.sq, c.sk, c.dim, scale, c.causal); err != nil {
				t.Fatal(err)
			}
			if err := FlashBackward(d, c.dt, q, k, v, o, dO, lse, dq, dk, dv, 0, c.bh, c.sq, c.sk, c.dim, scale, c.causal); err != nil {
				t.Fatal(err)
			}
			ref := flashReference(qh, kh, vh, doh, c.bh, c.sq, c.sk, c.dim, float64(scale), c.causal)
			tl := tols[c.dt]
			lseGot := flashDownload(t, d, GemmF32, lse, c.bh*c.sq)
			for _, chk := range []error{
				flashCheck("O", flashDownload(t, d, c.dt, o, nq), ref.o, ref.oMag, tl.frac, 0, tl.rtol, tl.l2),
				flashCheck("LSE", lseGot, ref.lse, nil, 0, 1e-3, 2e-5, 1e-5),
				flashCheck("dQ", flashDownload(t, d, c.dt, dq, nq), ref.dq, ref.dqMag, tl.frac, 0, tl.rtol, tl.l2),
				flashCheck("dK", flashDownload(t, d, c.dt, dk, nk), ref.dk, ref.dkMag, tl.frac, 0, tl.rtol, tl.l2),
				flashCheck("dV", flashDownload(t, d, c.dt, dv, nk), ref.dv, ref.dvMag, tl.frac, 0, tl.rtol, tl.l2),
			} {
				if chk != nil {
					t.Error(chk)
				}
			}
		})
	}
}

// flashDecodeKernels are the decode entry points of flash_attention.cu.
var flashDecodeKernels = []string{
	"flash_decode_bf16_d64", "flash_decode_bf16_d128", "flash_decode_fp16_d64", "flash_decode_fp16_d128",
	"flash_decode_combine_bf16", "flash_decode_combine_fp16",
}

// TestFlashDecodeCompile compiles flash_attention.cu for sm_90a with NVRTC
// where it is installed (no GPU needed), checks that the decode kernels are
// in the cubin and that ptxas spilled none of their registers, and logs
// their resource report.
func TestFlashDecodeCompile(t *testing.T) {
	version, err := driver.NVRTCVersion()
	if err != nil {
		t.Skip(err)
	}
	if strings.HasPrefix(version, "11.") {
		t.Skipf("NVRTC %s cannot target sm_90a", version)
	}
	src, err := kernels.Source("flash_attention.cu")
	if err != nil {
		t.Fatal(err)
	}
	cubin, log, err := driver.NVRTCCompile("flash_attention.cu", src, driver.CompileOptions("sm_90a", []string{"--ptxas-options=-v"}))
	if err != nil {
		t.Fatal(err)
	}
	// ptxas -v reports each function as "Compiling entry function 'NAME'"
	// followed by its lines (registers, spills).
	reports := map[string]string{}
	for _, part := range strings.Split(log, "Compiling entry function '")[1:] {
		name, rest, _ := strings.Cut(part, "'")
		reports[name] = rest
	}
	for _, k := range flashDecodeKernels {
		if !bytes.Contains(cubin, []byte(k+"\x00")) {
			t.Errorf("cubin has no kernel %s", k)
		}
		rep, ok := reports[k]
		if !ok {
			t.Errorf("ptxas -v reported nothing for %s", k)
			continue
		}
		t.Logf("%s:%s", k, rep)
		if m := regexp.MustCompile(`[1-9][0-9]* bytes spill (stores|loads)`).FindString(rep); m != "" {
			t.Errorf("%s: ptxas spilled registers (%s)", k, m)
		}
		// The plans count on flashDecodeResident CTAs per SM for v1's and v2's
		// rings: the registers (allocated per thread in steps of 8, 64K per
		// SM) must allow that many.
		var dim int
		if _, err := fmt.Sscanf(k[strings.LastIndex(k, "_d")+2:], "%d", &dim); err != nil || strings.Contains(k, "combine") {
			continue
		}
		m := regexp.MustCompile(`Used (\d+) registers`).FindStringSubmatch(rep)
		if m == nil {
			t.Errorf("%s: no register count in the ptxas report", k)
			continue
		}
		regs := (atoi(m[1]) + 7) / 8 * 8
		want := max(flashDecodeResident(dim, flashDecodeStages[dim]), flashDecodeResident(dim, flashDecodeV1Stages[dim]))
		if fit := 65536 / (regs * 32 * flashDecodeWarps); fit < want {
			t.Errorf("%s: %d registers a thread: %d CTAs per SM, the split heuristics assume %d", k, atoi(m[1]), fit, want)
		}
		if m := regexp.MustCompile(`registers, (\d+) bytes smem`).FindStringSubmatch(rep); m != nil && atoi(m[1]) > flashDecodeSMemPerCTA0-1024 {
			t.Errorf("%s: %s bytes of static shared memory, flashDecodeSMemPerCTA0 counts %d", k, m[1], flashDecodeSMemPerCTA0-1024)
		}
	}
}

// TestFlashDecodeMatchesSource checks flash_decode.go's copy of the decode
// kernels' tiling against flash_attention.cu: the constants, each
// instantiation's ring depth, and the header's shared-memory byte counts.
func TestFlashDecodeMatchesSource(t *testing.T) {
	src, err := kernels.Source("flash_attention.cu")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"DEC_NW": flashDecodeWarps, "DEC_BC": flashDecodeKeys, "DEC_ROWS": flashDecodeRows, "DEC_MAX_SPLITS": flashDecodeMaxSplits,
		"DEC_MAX_TICKETS": flashDecodeMaxTickets, "DEC_FUSED": flashDecodeFused, "DEC_PF256": flashDecodePF256} {
		m := regexp.MustCompile(`constexpr int ` + name + ` = ([^;]+);`).FindStringSubmatch(src)
		if m == nil {
			t.Errorf("flash_attention.cu has no constexpr int %s", name)
			continue
		}
		got := m[1]
		if name == "DEC_BC" {
			if got != "16 * DEC_NW" {
				t.Errorf("DEC_BC = %s, flash_decode.go assumes 16 * DEC_NW", got)
			}
			continue
		}
		if got != fmt.Sprint(want) {
			t.Errorf("%s = %s in flash_attention.cu, %d in flash_decode.go", name, got, want)
		}
	}
	inst := regexp.MustCompile(`(?m)^FLASH_DECODE\((\w+),\s*(\w+),\s*(\d+),\s*(\d+)\)`).FindAllStringSubmatch(src, -1)
	if len(inst) != 4 {
		t.Errorf("%d FLASH_DECODE instantiations, want 4 (bf16, fp16 x d64, d128)", len(inst))
	}
	for _, m := range inst {
		dim, stages := atoi(m[3]), atoi(m[4])
		if want := fmt.Sprintf("flash_decode_%s_d%d", flashTypeSuffix[m[2]], dim); m[1] != want {
			t.Errorf("FLASH_DECODE(%s, %s, %d, ...) should be named %s", m[1], m[2], dim, want)
		}
		if flashDecodeMaxStages[dim] != stages {
			t.Errorf("%s: at most %d stages in flash_attention.cu, flashDecodeMaxStages[%d] = %d", m[1], stages, dim, flashDecodeMaxStages[dim])
		}
	}
	for dim, maxStages := range flashDecodeMaxStages {
		line := fmt.Sprintf("decode d%d : up to %d stages -> %d B", dim, maxStages, flashDecodeSmem(dim, maxStages))
		if dim == 128 {
			line = fmt.Sprintf("decode d%d: up to %d stages -> %d B", dim, maxStages, flashDecodeSmem(dim, maxStages))
		}
		if !strings.Contains(src, line) {
			t.Errorf("the header of flash_attention.cu does not say %q", line)
		}
		static := flashDecodeSMemPerCTA0 - 1024 // the ticket flag: the block's limit counts it too
		if flashDecodeSmem(dim, maxStages)+static > 227*1024 || flashDecodeSmem(dim, maxStages+1)+static <= 227*1024 {
			t.Errorf("decode d%d: %d stages take %d bytes of shared memory; the most that fit in 227 KiB should be the maximum", dim, maxStages, flashDecodeSmem(dim, maxStages))
		}
		// Residency, as the split heuristics count it, of each ring in use.
		for _, c := range []struct {
			what           string
			stages, wantSM int
		}{
			{"v1", flashDecodeV1Stages[dim], map[int]int{64: 3, 128: 2}[dim]},
			{"v2", flashDecodeStages[dim], 2},
			{"deepest", maxStages, 1},
		} {
			if got := flashDecodeResident(dim, c.stages); got != c.wantSM {
				t.Errorf("decode d%d, %s ring of %d: %d resident CTAs per SM, want %d", dim, c.what, c.stages, got, c.wantSM)
			}
		}
	}
}

// TestFlashDecodePlan checks the dispatch rule and the split of the keys.
func TestFlashDecodePlan(t *testing.T) {
	for _, c := range []struct {
		dt             GemmType
		sq, sk, dim    int
		scale          float32
		causal, always bool
	}{
		{GemmBF16, 1, 4096, 128, 0.1, false, true},
		{GemmF16, 16, 1024, 64, 0.1, false, true},
		{GemmBF16, 17, 4096, 128, 0.1, false, false}, // too many rows
		{GemmBF16, 16, 1023, 128, 0.1, false, false}, // too few keys
		{GemmBF16, 16, 16384, 128, 0.1, true, false}, // top-left causal: a row sees <= 16 keys
		{GemmF32, 1, 4096, 128, 0.1, false, false},
		{GemmBF16, 1, 4096, 80, 0.1, false, false},
		{GemmBF16, 1, 4096, 64, -1, false, false},
	} {
		if got := flashDecodeApplies(c.dt, c.sq, c.sk, c.dim, c.scale, c.causal); got != c.always {
			t.Errorf("flashDecodeApplies(%v, sq %d, sk %d, d%d, %g, causal %v) = %v", c.dt, c.sq, c.sk, c.dim, c.scale, c.causal, got)
		}
		ws := FlashForwardWorkspaceBytes(c.dt, 8, c.sq, c.sk, c.dim, c.scale, c.causal)
		if (ws > 0) != c.always {
			t.Errorf("FlashForwardWorkspaceBytes(%v, sq %d, sk %d, d%d) = %d", c.dt, c.sq, c.sk, c.dim, ws)
		}
	}
	for _, c := range []struct {
		v               flashDecodeVersion
		bh, sq, sk, dim int
		causal          bool
		splits, tiles   int
	}{
		// v1: splits aim at 528 CTAs.
		{flashDecodeV1, 32, 16, 16384, 128, false, 16, 16},  // 528/32 -> 17 splits of 16 tiles; 16 cover the 256 tiles
		{flashDecodeV1, 1, 1, 16384, 128, false, 128, 2},    // 256 tiles, chunks of >= 2 tiles
		{flashDecodeV1, 1, 1, 1 << 19, 128, false, 256, 32}, // at most 256 splits
		{flashDecodeV1, 1024, 1, 4096, 128, false, 1, 64},   // a big batch fills the GPU without splitting
		{flashDecodeV1, 4, 7, 1000, 128, false, 8, 2},       // 16 tiles
		{flashDecodeV1, 4, 7, 1000, 128, true, 1, 1},        // causal: 7 keys, one tile
		{flashDecodeV1, 2, 1, 100, 128, false, 1, 2},        // shorter than two tiles: one split
		// v2: one wave of 132 x 2 CTAs at D=64, 132 x 1 at D=128.
		{flashDecodeV2, 128, 1, 4096, 128, false, 1, 64},  // the bench's D128 S4096: one CTA per SM at D=128
		{flashDecodeV2, 32, 16, 16384, 128, false, 4, 64}, // the bench's D128 S16384
		{flashDecodeV2, 133, 1, 4096, 128, false, 1, 64},  // more than the slots: one chunk, written directly
		{flashDecodeV2, 256, 1, 4096, 64, false, 1, 64},   // the bench's D64 S4096
		{flashDecodeV2, 64, 16, 16384, 64, false, 4, 64},  // the bench's D64 S16384
		{flashDecodeV2, 100, 1, 4096, 64, false, 2, 32},
		{flashDecodeV2, 40, 1, 16384, 128, false, 3, 86},    // 132/40 = 3; the last chunk has 84 tiles
		{flashDecodeV2, 40, 1, 16384, 64, false, 6, 43},     // 264/40 = 6; the last chunk has 41 tiles
		{flashDecodeV2, 1, 1, 16384, 128, false, 128, 2},    // chunks of >= 2 tiles
		{flashDecodeV2, 1, 1, 1 << 19, 64, false, 256, 32},  // at most 256 splits
		{flashDecodeV2, 1, 1, 1 << 19, 128, false, 131, 63}, // 132 slots: 8192 tiles in chunks of 63
		{flashDecodeV2, 1024, 1, 4096, 128, false, 1, 64},
		{flashDecodeV2, 4, 7, 1000, 128, false, 8, 2},
		{flashDecodeV2, 4, 7, 1000, 128, true, 1, 1},
		{flashDecodeV2, 2, 1, 100, 128, false, 1, 2},
	} {
		p, err := planFlashDecodeAs(c.v, GemmBF16, c.bh, c.sq, c.sk, c.dim, c.causal)
		if err != nil {
			t.Fatal(err)
		}
		if p.splits != c.splits || p.tilesPerSplit != c.tiles {
			t.Errorf("%v bh %d sq %d sk %d d%d causal %v: %d splits of %d tiles, want %d of %d", c.v, c.bh, c.sq, c.sk, c.dim, c.causal, p.splits, p.tilesPerSplit, c.splits, c.tiles)
		}
		keys := flashDecodeKeyRange(c.sq, c.sk, c.causal)
		if covered := p.splits * p.tilesPerSplit * flashDecodeKeys; covered < keys || covered-keys >= p.tilesPerSplit*flashDecodeKeys {
			t.Errorf("bh %d sk %d: %d splits of %d tiles cover %d keys for %d (none may be empty)", c.bh, c.sk, p.splits, p.tilesPerSplit, covered, keys)
		}
		want := ((c.bh*p.splits*c.sq*c.dim*4+255)/256)*256 + c.bh*p.splits*c.sq*4
		if c.v == flashDecodeV2 && p.splits == 1 {
			want = 0 // written directly
		}
		if p.workspaceBytes() != want {
			t.Errorf("%v bh %d sk %d: workspace %d, want %d", c.v, c.bh, c.sk, p.workspaceBytes(), want)
		}
		if wantFlags := map[flashDecodeVersion]int{flashDecodeV1: 0, flashDecodeV2: flashDecodeFlagsV2}[c.v]; p.flags != wantFlags {
			t.Errorf("%v: flags %d, want %d", c.v, p.flags, wantFlags)
		}
		wantStages := map[flashDecodeVersion]map[int]int{flashDecodeV1: flashDecodeV1Stages, flashDecodeV2: flashDecodeStages}[c.v][c.dim]
		if p.stages != wantStages || p.smem != flashDecodeSmem(c.dim, wantStages) {
			t.Errorf("%v d%d: ring of %d (%d bytes), want %d (%d bytes)", c.v, c.dim, p.stages, p.smem, wantStages, flashDecodeSmem(c.dim, wantStages))
		}
		if !c.causal && c.sk >= flashDecodeMinKeys {
			p1, _ := planFlashDecodeAs(flashDecodeV1, GemmBF16, c.bh, c.sq, c.sk, c.dim, false)
			p2, _ := planFlashDecodeAs(flashDecodeV2, GemmBF16, c.bh, c.sq, c.sk, c.dim, false)
			if ws := FlashForwardWorkspaceBytes(GemmBF16, c.bh, c.sq, c.sk, c.dim, 0.1, false); ws != max(p1.workspaceBytes(), p2.workspaceBytes()) {
				t.Errorf("bh %d sk %d: FlashForwardWorkspaceBytes %d, want the larger of v1's %d and v2's %d", c.bh, c.sk, ws, p1.workspaceBytes(), p2.workspaceBytes())
			}
		}
	}
	if p, _ := planFlashDecodeAs(flashDecodeV2, GemmBF16, 64, 1, 4096, 128, false); p.String() != "v2 2x32 r3" {
		t.Errorf("plan String %q, want \"v2 2x32 r3\"", p.String())
	}
	if _, err := planFlashDecode(GemmBF16, 1, 17, 4096, 128, false); err == nil || !strings.Contains(err.Error(), "17 query rows") {
		t.Errorf("sq 17: %v", err)
	}
	if _, err := planFlashDecode(GemmF32, 1, 1, 4096, 128, false); err == nil {
		t.Error("float32 accepted")
	}
	for env, want := range map[string]bool{"": true, "1": true, "0": false} {
		t.Setenv(FlashDecodeEnv, env)
		if on, err := flashDecodeOn(); err != nil || on != want {
			t.Errorf("%s=%q: %v, %v", FlashDecodeEnv, env, on, err)
		}
	}
	t.Setenv(FlashDecodeEnv, "yes")
	if _, err := flashDecodeOn(); err == nil || !strings.Contains(err.Error(), FlashDecodeEnv) {
		t.Errorf("%s=yes: %v", FlashDecodeEnv, err)
	}
	for env, want := range map[string]flashDecodeVersion{"": flashDecodeV2, "v2": flashDecodeV2, "v1": flashDecodeV1} {
		t.Setenv(FlashDecodeKernelEnv, env)
		p, err := planFlashDecode(GemmBF16, 128, 1, 4096, 128, false)
		if err != nil || p.version != want {
			t.Errorf("%s=%q: planned %v, %v; want v%d", FlashDecodeKernelEnv, env, p, err, want)
		}
		t.Setenv(FlashDecodeEnv, "")
		if got, err := FlashDecodeChoice(GemmBF16, 128, 1, 4096, 128, 0.1, false); err != nil || got != p.String() {
			t.Errorf("%s=%q: FlashDecodeChoice %q, %v; want %q", FlashDecodeKernelEnv, env, got, err, p.String())
		}
		t.Setenv(FlashDecodeEnv, "0")
		if got, err := FlashDecodeChoice(GemmBF16, 128, 1, 4096, 128, 0.1, false); err != nil || got != "" {
			t.Errorf("%s=0: FlashDecodeChoice %q, %v; want \"\"", FlashDecodeEnv, got, err)
		}
	}
	t.Setenv(FlashDecodeEnv, "")
	if got, err := FlashDecodeChoice(GemmBF16, 128, 32, 4096, 128, 0.1, false); err != nil || got != "" {
		t.Errorf("sq 32: FlashDecodeChoice %q, %v; want \"\" (not a decode shape)", got, err)
	}
	t.Setenv(FlashDecodeKernelEnv, "v3")
	if _, err := planFlashDecode(GemmBF16, 128, 1, 4096, 128, false); err == nil || !strings.Contains(err.Error(), FlashDecodeKernelEnv) {
		t.Errorf("%s=v3: %v, want an error naming the variable", FlashDecodeKernelEnv, err)
	}
}

// TestFlashDecodeGPU checks the decode forward (kernel and combine, called
// directly, so causal and short shapes that FlashForward would not send to it
// are covered too) against the float64 reference: O and LSE, Sq in {1, 2, 7,
// 16}, Sk in {1000, 4096, 16384}, causal or not, D 64 and 128, bf16 and fp16.
// Each shape runs every launch variant (flashDecodeTestVariants): v1 (partials
// and the combine kernel), v2 as planned (the fused combine in the last CTA,
// up to 128 chunks here), v2 with one chunk (O and LSE written directly), with
// the most chunks its tiles allow, with the L2 prefetch hint, and with the
// shallowest and the deepest K/V ring. The
// workspace and the outputs are poisoned with NaN before every launch, so a
// partial result that is read but never written shows, and so does an output
// the last CTA never wrote (a ticket left over from an earlier launch would
// leave it NaN: the launches run back to back on the same module).
func TestFlashDecodeGPU(t *testing.T) {
	d := gpu(t)
	d.SetCubinCacheDir(t.TempDir())
	type tol struct{ frac, rtol, l2 float64 }
	tols := map[GemmType]tol{GemmBF16: {1.0 / 128, 0.02, 1e-2}, GemmF16: {1.0 / 1024, 0.004, 2e-3}}
	rng := rand.New(rand.NewPCG(3, 5))
	gen := flashNormals(rng)
	for _, dt := range []GemmType{GemmBF16, GemmF16} {
		for _, dim := range []int{64, 128} {
			for _, sk := range []int{1000, 4096, 16384} {
				for _, sq := range []int{1, 2, 7, 16} {
					for _, causal := range []bool{false, true} {
						bh := 3
						if sk == 1000 {
							bh = 40 // few splits per row
						}
						name := fmt.Sprintf("%v/d%d/sk%d/sq%d/causal%v", dt, dim, sk, sq, causal)
						t.Run(name, func(t *testing.T) {
							nq, nk := bh*sq*dim, bh*sk*dim
							q, qh := flashUpload(t, d, dt, gen(nq))
							k, kh := flashUpload(t, d, dt, gen(nk))
							v, vh := flashUpload(t, d, dt, gen(nk))
							scale := float32(1 / math.Sqrt(float64(dim)))
							ref := flashReference(qh, kh, vh, make([]float64, nq), bh, sq, sk, dim, float64(scale), causal)
							tl := tols[dt]
							variants, err := flashDecodeTestVariants(dt, bh, sq, sk, dim, causal)
							if err != nil {
								t.Fatal(err)
							}
							for _, tv := range variants {
								p := tv.plan
								o := flashAlloc(t, d, nq, dt.ElemSize())
								lse := flashAlloc(t, d, bh*sq, 4)
								ws := DevicePtr(0) // none: a direct launch must not touch it
								if p.workspaceBytes() > 0 {
									ws = flashAlloc(t, d, p.workspaceBytes(), 1)
								}
								if err := flashForwardDecode(d, p, q, k, v, o, lse, ws, bh, 1, sq, sk, dim, scale, causal); err != nil {
									t.Fatalf("%s (%v): %v", tv.name, p, err)
								}
								if err := flashCheck("O", flashDownload(t, d, dt, o, nq), ref.o, ref.oMag, tl.frac, 0, tl.rtol, tl.l2); err != nil {
									t.Errorf("%s (%v): %v", tv.name, p, err)
								}
								if err := flashCheck("LSE", flashDownload(t, d, GemmF32, lse, bh*sq), ref.lse, nil, 0, 1e-3, 2e-5, 1e-5); err != nil {
									t.Errorf("%s (%v): %v", tv.name, p, err)
								}
							}
						})
					}
				}
			}
		}
	}
}

// flashDecodeTestVariant is one decode launch of a shape under test.
type flashDecodeTestVariant struct {
	name string
	plan flashDecodePlan
}

// flashDecodeTestVariants are the launches TestFlashDecodeGPU checks for a
// shape: v1, v2 as planned, v2 with one chunk and with the most chunks (each
// of flashDecodeMinTiles tiles, up to flashDecodeMaxSplits), v2 with the L2
// prefetch hint, v2 with rings of 2 tiles and of the most.
func flashDecodeTestVariants(dt GemmType, bh, sq, sk, dim int, causal bool) ([]flashDecodeTestVariant, error) {
	v1, err := planFlashDecodeAs(flashDecodeV1, dt, bh, sq, sk, dim, causal)
	if err != nil {
		return nil, err
	}
	v2, err := planFlashDecodeAs(flashDecodeV2, dt, bh, sq, sk, dim, causal)
	if err != nil {
		return nil, err
	}
	one, most, pf, shallow, deep := v2, v2, v2, v2, v2
	one.split(bh, sq, dim, 1)
	most.split(bh, sq, dim, max(1, v2.tiles/flashDecodeMinTiles))
	pf.flags |= flashDecodePF256
	shallow.setStages(dim, 2)
	deep.setStages(dim, flashDecodeMaxStages[dim])
	return []flashDecodeTestVariant{{"v1", v1}, {"v2", v2}, {"v2-one-chunk", one}, {"v2-most-chunks", most}, {"v2-prefetch", pf},
		{"v2-ring-2", shallow}, {"v2-ring-max", deep}}, nil
}

// TestFlashDecodeDispatch checks that FlashForward runs the decode forward
// for a decode shape (its output is bit-identical to the direct call's),
// that FlashDecodeEnv=0 turns it off (another kernel, still correct), that
// FlashForwardWS with a workspace gives the same result, and that
// FlashDecodeKernelEnv=v1 runs v1 in that workspace.
func TestFlashDecodeDispatch(t *testing.T) {
	d := gpu(t)
	const bh, sq, sk, dim = 8, 4, 8192, 128
	dt := GemmBF16
	rng := rand.New(rand.NewPCG(9, 1))
	gen := flashNormals(rng)
	nq, nk := bh*sq*dim, bh*sk*dim
	q, qh := flashUpload(t, d, dt, gen(nq))
	k, kh := flashUpload(t, d, dt, gen(nk))
	v, vh := flashUpload(t, d, dt, gen(nk))
	scale := float32(0.088)
	if !flashDecodeApplies(dt, sq, sk, dim, scale, false) {
		t.Fatal("flashDecodeApplies says no to a decode shape")
	}
	p, err := planFlashDecode(dt, bh, sq, sk, dim, false)
	if err != nil {
		t.Fatal(err)
	}
	run := func(f func(o, lse DevicePtr) error) ([]float64, []float64) {
		o, lse := flashAlloc(t, d, nq, 2), flashAlloc(t, d, bh*sq, 4)
		if err := f(o, lse); err != nil {
			t.Fatal(err)
		}
		return flashDownload(t, d, dt, o, nq), flashDownload(t, d, GemmF32, lse, bh*sq)
	}
	ws := flashAlloc(t, d, FlashForwardWorkspaceBytes(dt, bh, sq, sk, dim, scale, false), 1)
	direct, directL := run(func(o, lse DevicePtr) error {
		return flashForwardDecode(d, p, q, k, v, o, lse, ws, bh, 1, sq, sk, dim, scale, false)
	})
	t.Setenv(FlashDecodeEnv, "")
	viaFF, viaFFL := run(func(o, lse DevicePtr) error {
		return FlashForward(d, dt, q, k, v, o, lse, bh, sq, sk, dim, scale, false)
	})
	viaWS, _ := run(func(o, lse DevicePtr) error {
		return FlashForwardWS(d, dt, q, k, v, o, lse, ws, bh, sq, sk, dim, scale, false)
	})
	if !slices.Equal(direct, viaFF) || !slices.Equal(directL, viaFFL) || !slices.Equal(direct, viaWS) {
		t.Error("FlashForward / FlashForwardWS did not run the decode forward for a decode shape")
	}
	// FlashDecodeKernelEnv=v1 runs v1 (bit-identical to a direct v1 launch)
	// in the workspace FlashForwardWorkspaceBytes sized.
	p1, err := planFlashDecodeAs(flashDecodeV1, dt, bh, sq, sk, dim, false)
	if err != nil {
		t.Fatal(err)
	}
	directV1, directV1L := run(func(o, lse DevicePtr) error {
		return flashForwardDecode(d, p1, q, k, v, o, lse, ws, bh, 1, sq, sk, dim, scale, false)
	})
	t.Setenv(FlashDecodeKernelEnv, "v1")
	viaV1, viaV1L := run(func(o, lse DevicePtr) error {
		return FlashForwardWS(d, dt, q, k, v, o, lse, ws, bh, sq, sk, dim, scale, false)
	})
	t.Setenv(FlashDecodeKernelEnv, "")
	if !slices.Equal(directV1, viaV1) || !slices.Equal(directV1L, viaV1L) {
		t.Errorf("%s=v1: FlashForwardWS did not run v1 (%v)", FlashDecodeKernelEnv, p1)
	}
	t.Setenv(FlashDecodeEnv, "0")
	off, offL := run(func(o, lse DevicePtr) error {
		return FlashForward(d, dt, q, k, v, o, lse, bh, sq, sk, dim, scale, false)
	})
	if slices.Equal(direct, off) {
		t.Errorf("%s=0: the output is bit-identical to the decode forward's; did it still run?", FlashDecodeEnv)
	}
	ref := flashReference(qh, kh, vh, make([]float64, nq), bh, sq, sk, dim, float64(scale), false)
	for name, got := range map[string][]float64{"decode": direct, "decode v1": viaV1, "off": off} {
		if err := flashCheck(name+" O", got, ref.o, ref.oMag, 1.0/128, 0, 0.02, 1e-2); err != nil {
			t.Error(err)
		}
	}
	for name, got := range map[string][]float64{"decode": directL, "decode v1": viaV1L, "off": offL} {
		if err := flashCheck(name+" LSE", got, ref.lse, nil, 0, 1e-3, 2e-5, 1e-5); err != nil {
			t.Error(err)
		}
	}
	t.Setenv(FlashDecodeEnv, "maybe")
	if err := FlashForward(d, dt, q, k, v, q, q, bh, sq, sk, dim, scale, false); err == nil || !strings.Contains(err.Error(), FlashDecodeEnv) {
		t.Errorf("%s=maybe: %v, want an error naming the variable", FlashDecodeEnv, err)
	}
}
