package attention

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
)

// TestFlashBwdRepeatPick checks when the grouped backward runs as
// multi-head attention: by the grid rule (ceil(Sk/128) × BH/group CTAs under
// flashBwdRepeatMinCTAs), or as FlashGQABwdEnv forces it; never for group 1
// or off the tensor-core path; a bad value is an error naming the variable.
func TestFlashBwdRepeatPick(t *testing.T) {
	for dim, tile := range flashTiles {
		if 16*tile.bwdWarps != flashBwdKeyBlock {
			t.Errorf("FA2's backward at D=%d has %d keys a CTA, the rule counts %d", dim, 16*tile.bwdWarps, flashBwdKeyBlock)
		}
	}
	if flashBwdRepeatMinCTAs != 264 {
		t.Errorf("flashBwdRepeatMinCTAs = %d, want two waves of 132 SMs", flashBwdRepeatMinCTAs)
	}
	for _, c := range []struct {
		name           string
		env            string
		tensorCore     bool
		bh, group, sk  int
		repeat, hasErr bool
	}{
		// BENCHMARKS.md's shapes: H = 32, B·S = 16k tokens.
		{"MQA S=2048", "", true, 8 * 32, 32, 2048, true, false},  // 16 × 8 = 128 CTAs
		{"MQA S=8192", "", true, 2 * 32, 32, 8192, true, false},  // 64 × 2 = 128
		{"Hkv8 S=2048", "", true, 8 * 32, 4, 2048, false, false}, // 16 × 64 = 1024
		{"Hkv8 S=8192", "", true, 2 * 32, 4, 8192, false, false}, // 64 × 16 = 1024
		{"264 CTAs", "", true, 4, 2, 132 * 128, false, false},    // 132 × 2
		{"264 CTAs ragged", "", true, 4, 2, 131*128 + 1, false, false},
		{"262 CTAs", "", true, 4, 2, 131 * 128, true, false},
		{"group 1", "", true, 1, 1, 128, false, false},
		{"auto", "auto", true, 2 * 32, 32, 8192, true, false},
		{"forced repeat", "repeat", true, 8 * 32, 4, 2048, true, false},
		{"forced grouped", "grouped", true, 2 * 32, 32, 8192, false, false},
		{"repeat, group 1", "repeat", true, 32, 1, 2048, false, false},
		{"repeat, generic kernels", "repeat", false, 32, 8, 2048, false, false},
		{"generic kernels", "", false, 32, 32, 128, false, false},
		{"bad value", "on", true, 32, 32, 128, false, true},
	} {
		got, err := flashBwdRepeatPick(c.env, c.tensorCore, c.bh, c.group, c.sk)
		if c.hasErr {
			if err == nil || !strings.Contains(err.Error(), FlashGQABwdEnv) {
				t.Errorf("%s: %s=%q gave %v, want an error naming the variable", c.name, FlashGQABwdEnv, c.env, err)
			}
			continue
		}
		if err != nil || got != c.repeat {
			t.Errorf("%s: flashBwdRepeatPick(%q, %v, bh %d, group %d, sk %d) = %v, %v; want %v", c.name, c.env, c.tensorCore, c.bh, c.group, c.sk, got, err, c.repeat)
		}
	}
}

// TestFlashBackwardWorkspaceBytes checks the backward's workspace: Dsum and
// dQaccum as before for multi-head attention and the grouped kernels, four
// [BH, Sk, D] 16-bit tensors more where the backward runs as multi-head
// attention (the rule, or FlashGQABwdEnv=repeat), every part on 256 bytes
// and none overlapping the next.
func TestFlashBackwardWorkspaceBytes(t *testing.T) {
	up := func(n int) int { return (n + 255) / 256 * 256 }
	base := func(bh, sq, dim int) int { return up(bh*sq*4) + bh*sq*dim*4 }
	rep := func(bh, sk, dim int) int { return 4 * up(bh*sk*dim*2) }
	for _, c := range []struct {
		name                  string
		env                   string
		dt                    GemmType
		bh, group, sq, sk, dm int
		scale                 float32
		want                  int
	}{
		{"MHA", "", GemmBF16, 8, 1, 1000, 1000, 64, 0.125, base(8, 1000, 64)},
		{"MQA", "", GemmBF16, 8, 8, 300, 520, 128, 0.1, base(8, 300, 128) + rep(8, 520, 128)},
		{"MQA fp16 ragged", "", GemmF16, 6, 3, 77, 75, 64, 0.1, up(6*77*4) + 6*77*64*4 + rep(6, 75, 64)},
		{"MQA generic float32", "", GemmF32, 8, 8, 300, 520, 64, 0.1, base(8, 300, 64)},
		{"MQA generic head dim", "", GemmBF16, 8, 8, 300, 520, 80, 0.1, base(8, 300, 80)},
		{"MQA generic odd sizes", "", GemmBF16, 3, 3, 7, 5, 20, 0.1, up(3*7*4) + 3*7*20*4},
		{"MQA negative scale", "", GemmBF16, 8, 8, 300, 520, 64, -1, base(8, 300, 64)},
		{"big grid", "", GemmBF16, 256, 4, 2048, 2048, 128, 0.1, base(256, 2048, 128)},
		{"big grid, repeat", "repeat", GemmBF16, 256, 4, 2048, 2048, 128, 0.1, base(256, 2048, 128) + rep(256, 2048, 128)},
		{"MQA, grouped", "grouped", GemmBF16, 8, 8, 300, 520, 128, 0.1, base(8, 300, 128)},
		{"MQA, bad value", "yes", GemmBF16, 8, 8, 300, 520, 128, 0.1, base(8, 300, 128)},
	} {
		t.Setenv(FlashGQABwdEnv, c.env)
		if got := FlashBackwardWorkspaceBytes(c.dt, c.bh, c.group, c.sq, c.sk, c.dm, c.scale); got != c.want {
			t.Errorf("%s: FlashBackwardWorkspaceBytes(%v, bh %d, group %d, sq %d, sk %d, D %d) = %d, want %d",
				c.name, c.dt, c.bh, c.group, c.sq, c.sk, c.dm, got, c.want)
		}
	}
	for _, s := range []struct{ bh, sq, sk, dim int }{{8, 300, 520, 128}, {6, 77, 75, 64}, {3, 1, 1, 64}, {3, 7, 5, 20}} {
		l := flashBwdLayoutOf(s.bh, s.sq, s.sk, s.dim, true)
		kv := s.bh * s.sk * s.dim * 2
		parts := []struct {
			name      string
			off, size int
		}{{"Dsum", 0, s.bh * s.sq * 4}, {"dQaccum", l.dqacc, s.bh * s.sq * s.dim * 4}, {"K", l.kr, kv}, {"V", l.vr, kv}, {"dK", l.dkr, kv}, {"dV", l.dvr, kv}}
		for i, p := range parts {
			if p.off%256 != 0 {
				t.Errorf("%+v: %s at %d, not on 256 bytes", s, p.name, p.off)
			}
			end := l.totalBytes
			if i+1 < len(parts) {
				end = parts[i+1].off
			}
			if p.off+p.size > end {
				t.Errorf("%+v: %s [%d, %d) runs past %d", s, p.name, p.off, p.off+p.size, end)
			}
		}
		if nr := flashBwdLayoutOf(s.bh, s.sq, s.sk, s.dim, false); nr.dqacc != l.dqacc || nr.totalBytes > l.kr || nr.kr != 0 {
			t.Errorf("%+v: without the repeat dQaccum at %d and %d bytes (repeat at %d), want %d and at most %d", s, nr.dqacc, nr.totalBytes, nr.kr, l.dqacc, l.kr)
		}
	}
}

// TestFlashGQARepeatGPU checks the grouped backward run as multi-head
// attention (FlashGQABwdEnv=repeat: K and V repeated to every query head,
// the group-1 kernels, each group's dK and dV summed) against the grouped
// kernels (=grouped) and the float64 reference, with TestFlashGQAGPU's
// tolerances: bf16, H = 8 query heads on H_kv = 1 and 2, D = 64 and 128, S =
// 512, causal or not, plus fp16 with ragged blocks over two batches and a
// bf16 Sq != Sk, on the default kernels (sm90 on compute capability 9.0)
// and on FA2's. The workspace is sized by FlashBackwardWorkspaceBytes under
// each setting. For the repeat it also checks the parts bit for bit: the
// workspace holds K and V repeated, and dK, dV are the float32 sums, in
// group order, of the per-query-head gradients left there, rounded once; a
// second run gives the same dK, dV bits; and so does the backward captured
// into a CUDA graph and replayed (no allocation, no host sync inside).
func TestFlashGQARepeatGPU(t *testing.T) {
	d := gpu(t)
	d.SetCubinCacheDir(t.TempDir())
	type tol struct{ frac, rtol, l2 float64 }
	tols := map[GemmType]tol{GemmBF16: {1.0 / 128, 0.02, 1e-2}, GemmF16: {1.0 / 1024, 0.004, 2e-3}}
	outAtol := map[GemmType]float64{GemmF16: 0x1p-25} // see TestFlashSM90Backward
	type repCase struct {
		dt                     GemmType
		b, h, hkv, sq, sk, dim int
		causal                 bool
	}
	var cases []repCase
	for _, dim := range []int{64, 128} {
		for _, hkv := range []int{1, 2} {
			for _, causal := range []bool{false, true} {
				cases = append(cases, repCase{GemmBF16, 1, 8, hkv, 512, 512, dim, causal})
			}
		}
	}
	cases = append(cases,
		repCase{GemmF16, 2, 4, 2, 300, 300, 64, true},    // ragged blocks, two batches
		repCase{GemmBF16, 1, 8, 1, 200, 520, 128, false}, // Sq != Sk: the repeats are Sk long
	)
	refs := map[repCase]flashRef{}
	for _, kernels := range []string{"default", "fa2"} {
		for _, c := range cases {
			bh, group := c.b*c.h, c.h/c.hkv
			name := fmt.Sprintf("%s/%v/B%d/H%d/Hkv%d/sq%d/sk%d/d%d/causal%v", kernels, c.dt, c.b, c.h, c.hkv, c.sq, c.sk, c.dim, c.causal)
			t.Run(name, func(t *testing.T) {
				if kernels == "fa2" {
					t.Setenv(FlashSM90Env, "0")
					t.Setenv(FlashSM90BwdEnv, "0")
				}
				nq, nkv, nrep := bh*c.sq*c.dim, bh/group*c.sk*c.dim, bh*c.sk*c.dim
				gen := flashNormals(rand.New(rand.NewPCG(uint64(c.dim*10+c.hkv), uint64(c.sq*1000+c.sk))))
				q, qh := flashUpload(t, d, c.dt, gen(nq))
				k, kh := flashUpload(t, d, c.dt, gen(nkv))
				v, vh := flashUpload(t, d, c.dt, gen(nkv))
				dO, doh := flashUpload(t, d, c.dt, gen(nq))
				es := c.dt.ElemSize()
				o, lse := flashAlloc(t, d, nq, es), flashAlloc(t, d, bh*c.sq, 4)
				scale := float32(1 / math.Sqrt(float64(c.dim)))
				if err := FlashForwardGroupedWS(d, c.dt, q, k, v, o, lse, 0, bh, group, c.sq, c.sk, c.dim, scale, c.causal); err != nil {
					t.Fatal(err)
				}
				ref, ok := refs[c]
				if !ok {
					ref = gqaReference(qh, kh, vh, doh, bh, group, c.sq, c.sk, c.dim, float64(scale), c.causal)
					refs[c] = ref
				}
				tl := tols[c.dt]
				type grads struct{ dq, dk, dv []float64 }
				// backward runs FlashBackwardGrouped under FlashGQABwdEnv=env
				// on a workspace sized under it, into NaN-poisoned dQ, dK, dV.
				backward := func(env string) (grads, DevicePtr, DevicePtr, DevicePtr, DevicePtr) {
					t.Setenv(FlashGQABwdEnv, env)
					ws := flashAlloc(t, d, FlashBackwardWorkspaceBytes(c.dt, bh, group, c.sq, c.sk, c.dim, scale), 1)
					dq, dk, dv := flashAlloc(t, d, nq, es), flashAlloc(t, d, nkv, es), flashAlloc(t, d, nkv, es)
					if err := FlashBackwardGrouped(d, c.dt, q, k, v, o, dO, lse, dq, dk, dv, ws, bh, group, c.sq, c.sk, c.dim, scale, c.causal); err != nil {
						t.Fatalf("%s=%s: %v", FlashGQABwdEnv, env, err)
					}
					return grads{flashDownload(t, d, c.dt, dq, nq), flashDownload(t, d, c.dt, dk, nkv), flashDownload(t, d, c.dt, dv, nkv)}, ws, dq, dk, dv
				}
				got := map[string]grads{}
				for _, env := range []string{"grouped", "repeat"} {
					g, _, _, _, _ := backward(env)
					got[env] = g
					for _, chk := range []error{
						flashCheck("dQ", g.dq, ref.dq, ref.dqMag, tl.frac, outAtol[c.dt], tl.rtol, tl.l2),
						flashCheck("dK", g.dk, ref.dk, ref.dkMag, tl.frac, outAtol[c.dt], tl.rtol, tl.l2),
						flashCheck("dV", g.dv, ref.dv, ref.dvMag, tl.frac, outAtol[c.dt], tl.rtol, tl.l2),
					} {
						if chk != nil {
							t.Errorf("%s=%s: %v", FlashGQABwdEnv, env, chk)
						}
					}
				}
				gr, rp := got["grouped"], got["repeat"]
				for _, chk := range []error{
					flashCheck("dQ repeat vs grouped", rp.dq, gr.dq, ref.dqMag, tl.frac, outAtol[c.dt], tl.rtol, tl.l2),
					flashCheck("dK repeat vs grouped", rp.dk, gr.dk, ref.dkMag, tl.frac, outAtol[c.dt], tl.rtol, tl.l2),
					flashCheck("dV repeat vs grouped", rp.dv, gr.dv, ref.dvMag, tl.frac, outAtol[c.dt], tl.rtol, tl.l2),
				} {
					if chk != nil {
						t.Error(chk)
					}
				}
				// The repeat's parts, from its workspace: the copies (FA2's
				// kernels read them; the Hopper build reads each group's K and
				// V in place and makes none), and the sums bit for bit.
				again, ws, dq, dk, dv := backward("repeat")
				lay := flashBwdLayoutOf(bh, c.sq, c.sk, c.dim, true)
				sm90, err := flashSM90BwdChoice(d, c.dt, c.dim, scale)
				if err != nil {
					t.Fatal(err)
				}
				copies := []struct {
					name string
					off  int
					want []float64
				}{{"K", lay.kr, gqaRepeat(kh, bh, group, c.sk, c.dim)}, {"V", lay.vr, gqaRepeat(vh, bh, group, c.sk, c.dim)}}
				if sm90 != "" {
					copies = nil
				}
				for _, r := range copies {
					if i := flashFirstBitDiff(flashDownload(t, d, c.dt, ws.Offset(r.off), nrep), r.want); i >= 0 {
						t.Errorf("repeated %s in the workspace differs from %s of head %d at %d", r.name, r.name, i/(c.sk*c.dim)/group, i)
					}
				}
				for _, r := range []struct {
					name string
					off  int
					got  []float64
				}{{"dK", lay.dkr, again.dk}, {"dV", lay.dvr, again.dv}} {
					sum := flashGroupSum32(c.dt, flashDownload(t, d, c.dt, ws.Offset(r.off), nrep), bh, group, c.sk*c.dim)
					if i := flashFirstBitDiff(r.got, sum); i >= 0 {
						t.Errorf("%s[%d] = %g, the float32 sum of its group's per-head %s in order is %g", r.name, i, r.got[i], r.name, sum[i])
					}
				}
				if i := flashFirstBitDiff(again.dk, rp.dk); i >= 0 {
					t.Errorf("dK[%d] = %g, then %g on a second run: the repeat path must be deterministic", i, rp.dk[i], again.dk[i])
				}
				if i := flashFirstBitDiff(again.dv, rp.dv); i >= 0 {
					t.Errorf("dV[%d] = %g, then %g on a second run", i, rp.dv[i], again.dv[i])
				}
				// Captured into a CUDA graph and replayed (the executor's
				// way, driver.Replayer: two plain runs, then the capture).
				if !d.GraphsEnabled() {
					t.Log("CUDA graphs are off: the capture is not checked")
					return
				}
				var r driver.Replayer
				defer r.Release(d)
				run := func() error {
					return FlashBackwardGrouped(d, c.dt, q, k, v, o, dO, lse, dq, dk, dv, ws, bh, group, c.sq, c.sk, c.dim, scale, c.causal)
				}
				for range 3 {
					if err := r.Run(d, run); err != nil {
						t.Fatal(err)
					}
				}
				if !r.Replaying() {
					t.Fatalf("the repeat path was not captured: %v", r.Off())
				}
				for _, p := range []struct {
					ptr DevicePtr
					n   int
				}{{dq, nq}, {dk, nkv}, {dv, nkv}} {
					if err := d.Memset(p.ptr, 0xff, p.n*es); err != nil {
						t.Fatal(err)
					}
				}
				if err := r.Run(d, run); err != nil {
					t.Fatal(err)
				}
				if err := d.Synchronize(); err != nil {
					t.Fatal(err)
				}
				if i := flashFirstBitDiff(flashDownload(t, d, c.dt, dk, nkv), rp.dk); i >= 0 {
					t.Errorf("replayed graph: dK[%d] differs from the plain run's", i)
				}
				if i := flashFirstBitDiff(flashDownload(t, d, c.dt, dv, nkv), rp.dv); i >= 0 {
					t.Errorf("replayed graph: dV[%d] differs from the plain run's", i)
				}
				if err := flashCheck("replayed graph: dQ", flashDownload(t, d, c.dt, dq, nq), ref.dq, ref.dqMag, tl.frac, outAtol[c.dt], tl.rtol, tl.l2); err != nil {
					t.Error(err)
				}
			})
		}
	}
}

// flashFirstBitDiff is the first index where got and want differ in their
// float64 bits (-1 for none; a NaN differs from everything).
func flashFirstBitDiff(got, want []float64) int {
	if len(got) != len(want) {
		return 0
	}
	for i := range got {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) || math.IsNaN(got[i]) {
			return i
		}
	}
	return -1
}

// flashGroupSum32 is what flash_bwd_kv_sum_<T> computes from per-query-head
// x [bh, n]: for each K/V head the float32 sum of its group's heads, added
// in head order from +0, rounded once to dt (as float64 values).
func flashGroupSum32(dt GemmType, x []float64, bh, group, n int) []float64 {
	out := make([]float64, bh/group*n)
	for h := range bh / group {
		for i := range n {
			var acc float32
			for g := range group {
				acc = float32(acc + float32(x[(h*group+g)*n+i]))
			}
			if dt == GemmBF16 {
				out[h*n+i] = float64(BF16ToFloat32(BF16FromFloat32(acc)))
			} else {
				out[h*n+i] = float64(F16ToFloat32(F16FromFloat32(acc)))
			}
		}
	}
	return out
}

// TestFlashBwdKVLaunchArgs checks the arguments the launchers give
// flash_bwd_kv_repeat and flash_bwd_kv_sum_<T> against the parameters
// flash_attention.cu declares, as the host's g++ expands its macros: the
// same count, pointers for pointers and int32 for int (Launch passes each
// argument by its Go size, so a mismatch would shift every later one on the
// GPU). It has teeth: an argument short, or an int64 for an int, fails.
func TestFlashBwdKVLaunchArgs(t *testing.T) {
	gxx, src := hostFA2Source(t)
	path := filepath.Join(t.TempDir(), "flash_attention.cpp")
	if err := os.WriteFile(path, []byte(hostSyntaxPrelude+hostSyntaxFA2Prelude+"\n"+src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(gxx, "-std=c++17", "-E", "-P", path).Output()
	if err != nil {
		t.Fatalf("g++ -E: %v", err)
	}
	sig := regexp.MustCompile(`extern "C"\s+void\s+(flash_bwd_kv_\w+)\s*\(([^)]*)\)`)
	params := map[string][]string{}
	for _, m := range sig.FindAllStringSubmatch(string(out), -1) {
		var kinds []string
		for _, p := range strings.Split(m[2], ",") {
			switch p = strings.TrimSpace(p); {
			case strings.Contains(p, "*"):
				kinds = append(kinds, "pointer")
			case strings.HasPrefix(p, "int "):
				kinds = append(kinds, "int32")
			default:
				kinds = append(kinds, "unknown: "+p)
			}
		}
		params[m[1]] = kinds
	}
	argKinds := func(args []any) []string {
		var kinds []string
		for _, a := range args {
			switch a.(type) {
			case DevicePtr:
				kinds = append(kinds, "pointer")
			case int32:
				kinds = append(kinds, "int32")
			default:
				kinds = append(kinds, fmt.Sprintf("%T", a))
			}
		}
		return kinds
	}
	args := flashBwdKVArgs(0x1000, 0x2000, 0x3000, 0x4000, 8*520, 128, 520, 8)
	var names []string
	for _, dt := range []GemmType{GemmBF16, GemmF16} {
		p, err := planFlash(dt, 128, 0.1)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, p.bwdRepeat, p.bwdKVSum)
	}
	for _, name := range names {
		want, ok := params[name]
		if !ok {
			t.Errorf("the expanded flash_attention.cu has no entry point %s (found %v)", name, slices.Sorted(maps.Keys(params)))
			continue
		}
		if got := argKinds(args); !slices.Equal(got, want) {
			t.Errorf("%s: launched with %v, declares %v", name, got, want)
		}
		if slices.Equal(argKinds(args[:len(args)-1]), want) {
			t.Errorf("%s: an argument short passed", name)
		}
		doctored := append([]any{}, args...)
		doctored[4] = int64(8 * 520)
		if slices.Equal(argKinds(doctored), want) {
			t.Errorf("%s: an int64 for an int passed", name)
		}
	}
}
