package attention

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// gqaRepeat returns x [bh/group, s, dim] with each head repeated for its
// group ([bh, s, dim], head h a copy of head h/group): the repeated K/V the
// grouped kernels never materialise.
func gqaRepeat(x []float64, bh, group, s, dim int) []float64 {
	n := s * dim
	y := make([]float64, bh*n)
	for h := range bh {
		copy(y[h*n:(h+1)*n], x[h/group*n:(h/group+1)*n])
	}
	return y
}

// gqaSum folds a per-query-head [bh, s, dim] gradient onto the bh/group K/V
// heads.
func gqaSum(x []float64, bh, group, s, dim int) []float64 {
	n := s * dim
	y := make([]float64, bh/group*n)
	for h := range bh {
		for i := range n {
			y[h/group*n+i] += x[h*n+i]
		}
	}
	return y
}

// gqaReference is the float64 reference of attention with K and V of
// bh/group heads: multi-head attention on K and V repeated to every query
// head, each group's dK and dV (and their magnitudes) summed.
func gqaReference(q, k, v, do []float64, bh, group, sq, sk, dim int, scale float64, causal bool) flashRef {
	ref := flashReference(q, gqaRepeat(k, bh, group, sk, dim), gqaRepeat(v, bh, group, sk, dim), do, bh, sq, sk, dim, scale, causal)
	for _, x := range []*[]float64{&ref.dk, &ref.dv, &ref.dkMag, &ref.dvMag} {
		*x = gqaSum(*x, bh, group, sk, dim)
	}
	return ref
}

// TestFlashGQAGPU runs FlashForwardGroupedWS and FlashBackwardGrouped with K
// and V of H_kv heads against the float64 reference of attention over the
// repeated heads (dK, dV summed over each group), with TestFlashAttentionGPU's
// tolerances: H = 8 query heads on H_kv = 2 and 1 (multi-query), D = 64 and
// 128, S = 1024 causal, the backward on the grouped kernels
// (FlashGQABwdEnv=grouped), on FA2's kernels and on the Hopper ones (sm90,
// skipped off compute capability 9.0). The forward must also equal, bit for
// bit, FlashForward on the materialised repeat (each query head reads the
// same K/V values either way). The decode forward (4 query rows) and the
// generic float32 kernels are covered too.
func TestFlashGQAGPU(t *testing.T) {
	d := gpu(t)
	d.SetCubinCacheDir(t.TempDir())
	type tol struct{ frac, rtol, l2 float64 }
	tols := map[GemmType]tol{GemmBF16: {1.0 / 128, 0.02, 1e-2}, GemmF16: {1.0 / 1024, 0.004, 2e-3}, GemmF32: {1e-5, 2e-5, 1e-5}}
	type gqaCase struct {
		dt                     GemmType
		b, h, hkv, sq, sk, dim int
		causal                 bool
		kernels                string // "fa2", "sm90", or "" (what FlashForward picks: decode, generic)
	}
	var cases []gqaCase
	for _, dim := range []int{64, 128} {
		for _, hkv := range []int{2, 1} {
			for _, k := range []string{"fa2", "sm90"} {
				cases = append(cases, gqaCase{GemmBF16, 1, 8, hkv, 1024, 1024, dim, true, k})
			}
		}
	}
	cases = append(cases,
		gqaCase{GemmF16, 2, 4, 2, 300, 300, 64, true, "fa2"}, // ragged blocks, two batches
		gqaCase{GemmF16, 2, 4, 2, 300, 300, 64, true, "sm90"},
		gqaCase{GemmBF16, 2, 8, 2, 4, 2048, 128, false, ""}, // decode forward
		gqaCase{GemmF32, 2, 4, 1, 150, 150, 128, true, ""},  // generic kernels
	)
	refs := map[string]flashRef{}
	for _, c := range cases {
		bh, group := c.b*c.h, c.h/c.hkv
		name := fmt.Sprintf("%v/B%d/H%d/Hkv%d/sq%d/sk%d/d%d/causal%v/%s", c.dt, c.b, c.h, c.hkv, c.sq, c.sk, c.dim, c.causal, c.kernels)
		t.Run(name, func(t *testing.T) {
			switch c.kernels {
			case "fa2":
				t.Setenv(FlashSM90Env, "0")
				t.Setenv(FlashSM90BwdEnv, "0")
			case "sm90":
				sm90GPU(t)
			}
			nq, nkv := bh*c.sq*c.dim, bh/group*c.sk*c.dim
			gen := flashNormals(rand.New(rand.NewPCG(uint64(c.dim), uint64(c.hkv*1000+c.sq))))
			q, qh := flashUpload(t, d, c.dt, gen(nq))
			k, kh := flashUpload(t, d, c.dt, gen(nkv))
			v, vh := flashUpload(t, d, c.dt, gen(nkv))
			dO, doh := flashUpload(t, d, c.dt, gen(nq))
			kr, _ := flashUpload(t, d, c.dt, gqaRepeat(kh, bh, group, c.sk, c.dim))
			vr, _ := flashUpload(t, d, c.dt, gqaRepeat(vh, bh, group, c.sk, c.dim))
			es := c.dt.ElemSize()
			o, oRep := flashAlloc(t, d, nq, es), flashAlloc(t, d, nq, es)
			lse, lseRep := flashAlloc(t, d, bh*c.sq, 4), flashAlloc(t, d, bh*c.sq, 4)
			dq := flashAlloc(t, d, nq, es)
			dk, dv := flashAlloc(t, d, nkv, es), flashAlloc(t, d, nkv, es)
			scale := float32(1 / math.Sqrt(float64(c.dim)))
			if err := FlashForwardGroupedWS(d, c.dt, q, k, v, o, lse, 0, bh, group, c.sq, c.sk, c.dim, scale, c.causal); err != nil {
				t.Fatal(err)
			}
			if err := FlashForward(d, c.dt, q, kr, vr, oRep, lseRep, bh, c.sq, c.sk, c.dim, scale, c.causal); err != nil {
				t.Fatal(err)
			}
			oGot, lseGot := flashDownload(t, d, c.dt, o, nq), flashDownload(t, d, GemmF32, lse, bh*c.sq)
			oRepGot, lseRepGot := flashDownload(t, d, c.dt, oRep, nq), flashDownload(t, d, GemmF32, lseRep, bh*c.sq)
			for i := range oGot {
				if math.Float64bits(oGot[i]) != math.Float64bits(oRepGot[i]) {
					t.Fatalf("O[%d] = %g grouped, %g on the repeated K/V: the forward must read the same values", i, oGot[i], oRepGot[i])
				}
			}
			for i := range lseGot {
				if math.Float64bits(lseGot[i]) != math.Float64bits(lseRepGot[i]) {
					t.Fatalf("LSE[%d] = %g grouped, %g on the repeated K/V", i, lseGot[i], lseRepGot[i])
				}
			}
			// The grouped kernels: at these small shapes the rule would run
			// multi-head attention on repeated K/V instead
			// (TestFlashGQARepeatGPU checks both ways).
			t.Setenv(FlashGQABwdEnv, "grouped")
			if err := FlashBackwardGrouped(d, c.dt, q, k, v, o, dO, lse, dq, dk, dv, 0, bh, group, c.sq, c.sk, c.dim, scale, c.causal); err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("%v/%d/%d/%d/%d/%d/%d/%v", c.dt, bh, group, c.sq, c.sk, c.dim, c.hkv, c.causal)
			ref, ok := refs[key]
			if !ok {
				ref = gqaReference(qh, kh, vh, doh, bh, group, c.sq, c.sk, c.dim, float64(scale), c.causal)
				refs[key] = ref
			}
			tl := tols[c.dt]
			for _, chk := range []error{
				flashCheck("O", oGot, ref.o, ref.oMag, tl.frac, 0, tl.rtol, tl.l2),
				flashCheck("LSE", lseGot, ref.lse, nil, 0, 1e-3, 2e-5, 1e-5),
				flashCheck("dQ", flashDownload(t, d, c.dt, dq, nq), ref.dq, ref.dqMag, tl.frac, 0, tl.rtol, tl.l2),
				flashCheck("dK", flashDownload(t, d, c.dt, dk, nkv), ref.dk, ref.dkMag, tl.frac, 0, tl.rtol, tl.l2),
				flashCheck("dV", flashDownload(t, d, c.dt, dv, nkv), ref.dv, ref.dvMag, tl.frac, 0, tl.rtol, tl.l2),
			} {
				if chk != nil {
					t.Error(chk)
				}
			}
		})
	}
}

// TestFlashGroupRefused: a group that does not divide the heads is an
// error naming it, before any launch (no GPU needed to say so).
func TestFlashGroupRefused(t *testing.T) {
	for _, c := range []struct{ bh, group int }{{8, 3}, {8, 0}, {4, -2}} {
		if err := checkFlashGroup(c.bh, c.group); err == nil {
			t.Errorf("bh %d group %d: accepted", c.bh, c.group)
		}
	}
	if err := checkFlashGroup(8, 4); err != nil {
		t.Errorf("bh 8 group 4: %v", err)
	}
}

// TestFlashGQASpeed times grouped-query attention at the shape
// (bf16, H = 32 query heads on H_kv = 8 and 1, D = 128, causal, B·S = 16k
// tokens, S = 2048, 4096, 8192) against the same attention over K and V
// repeated to 32 heads beforehand (FlashForward, FlashBackward: what the
// graph ran before the fusion read K/V from before the repeat; those copies
// and the sums of the repeated dK, dV are not counted), on the default
// (sm90) kernels and on FA2's (subtests "default" and "fa2"), and logs
// TFLOP/s (causal halves the forward's 4·B·H·S²·D; the backward counts 2.5×
// that). The grouped backward is timed both ways FlashGQABwdEnv offers:
// "grouped", the kernels that loop a CTA over a K/V head's group (H/H_kv
// times fewer CTAs: where that grid is too small, this is where it shows),
// and "repeat", K and V repeated into the workspace, the multi-head kernels
// and each group's dK, dV summed (its copies and sums counted); the line
// gives the grouped grid's CTAs and which way the default (auto) runs.
// Subtest "threshold" times H_kv = 8 at B = 1 (grouped grids of 128 to 1024
// CTAs, around flashBwdRepeatMinCTAs) and "noncausal" the shapes
// without the mask (no CTA longer than another), both on the default
// kernels: where the rule's line should lie. It checks nothing but that the
// launches run.
func TestFlashGQASpeed(t *testing.T) {
	d := sm90GPU(t)
	const h, dim, iters = 32, 128, 5
	for _, c := range []struct {
		name   string
		tokens int // B·S; 0: B = 1
		seqs   []int
		hkvs   []int
		causal bool
	}{
		{"default", 16384, []int{2048, 4096, 8192}, []int{8, 1}, true},
		{"fa2", 16384, []int{2048, 4096, 8192}, []int{8, 1}, true},
		{"threshold", 0, []int{2048, 4096, 8192, 16384}, []int{8}, true},
		{"noncausal", 16384, []int{2048, 8192}, []int{8, 1}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "fa2" {
				t.Setenv(FlashSM90Env, "0")
				t.Setenv(FlashSM90BwdEnv, "0")
			}
			for _, s := range c.seqs {
				tokens := c.tokens
				if tokens == 0 {
					tokens = s
				}
				flashGQASpeedAt(t, d, tokens, h, dim, s, iters, c.hkvs, c.causal)
			}
		})
	}
}

// flashGQASpeedAt is TestFlashGQASpeed at one sequence length.
func flashGQASpeedAt(t *testing.T, d *Device, tokens, h, dim, s, iters int, hkvs []int, causal bool) {
	p := newFlashSpeedProblem(t, d, tokens, h*dim, s, dim, 4, uint32(s))
	bh, n, o, lse, scale := p.bh, p.n, p.o, p.lse, p.scale
	q, kr, vr, dO := p.in[0], p.in[1], p.in[2], p.in[3]
	grads := [3]DevicePtr{flashAlloc(t, d, n, 2), flashAlloc(t, d, n, 2), flashAlloc(t, d, n, 2)}
	// The repeat's workspace is the largest (its scratch does not depend
	// on the group); sized under the setting that asks for it.
	t.Setenv(FlashGQABwdEnv, "repeat")
	ws := flashAlloc(t, d, FlashBackwardWorkspaceBytes(GemmBF16, bh, h, s, s, dim, scale), 1)
	fwdFlops := 4 * float64(bh) * float64(s) * float64(s) * float64(dim)
	if causal {
		fwdFlops /= 2
	}
	for _, hkv := range hkvs {
		group := h / hkv
		// The grouped K and V are the first bh/group heads of the
		// repeated buffers: only the speed is compared here.
		times := map[string]float64{}
		for _, c := range []struct {
			name, env string
			g         int
			bwdOnly   bool
		}{{"grouped", "grouped", group, false}, {"repeat", "repeat", group, true}, {"mha", "", 1, false}} {
			t.Setenv(FlashGQABwdEnv, c.env)
			if !c.bwdOnly {
				fwd, err := timeFlash(d, func() error {
					return FlashForwardGroupedWS(d, GemmBF16, q, kr, vr, o, lse, 0, bh, c.g, s, s, dim, scale, causal)
				}, iters)
				if err != nil {
					t.Fatalf("%s forward S=%d H_kv=%d: %v", c.name, s, hkv, err)
				}
				times[c.name+"/fwd"] = fwd
			}
			bwd, err := timeFlash(d, func() error {
				return FlashBackwardGrouped(d, GemmBF16, q, kr, vr, o, dO, lse, grads[0], grads[1], grads[2], ws, bh, c.g, s, s, dim, scale, causal)
			}, iters)
			if err != nil {
				t.Fatalf("%s backward S=%d H_kv=%d: %v", c.name, s, hkv, err)
			}
			times[c.name+"/bwd"] = bwd
		}
		auto := "grouped"
		if r, _ := flashBwdRepeatPick("", true, bh, group, s); r {
			auto = "repeat"
		}
		ctas := (s + flashBwdKeyBlock - 1) / flashBwdKeyBlock * (bh / group)
		tf := func(flops, ms float64) float64 { return flops / (ms * 1e-3) / 1e12 }
		t.Logf("S=%d B·H=%d H_kv=%d causal=%v: forward grouped %.1f TFLOP/s, on pre-repeated K/V %.1f (%.2f×); backward: grouped kernels (%d CTAs) %.1f, repeat path %.1f (%.2f× the grouped speed), on pre-repeated K/V %.1f; auto runs %s",
			s, bh, hkv, causal,
			tf(fwdFlops, times["grouped/fwd"]), tf(fwdFlops, times["mha/fwd"]), times["mha/fwd"]/times["grouped/fwd"],
			ctas, tf(2.5*fwdFlops, times["grouped/bwd"]), tf(2.5*fwdFlops, times["repeat/bwd"]), times["grouped/bwd"]/times["repeat/bwd"],
			tf(2.5*fwdFlops, times["mha/bwd"]), auto)
	}
}
