package attention

// Launchers for kernels/flash_attention.cu: FlashAttention forward and backward.
// Layout: Q, O, dO, dQ are [bh, sq, dim]; K, V, dK, dV are [bh, sk, dim], all
// contiguous, of element type dt; LSE is float32 [bh, sq] (natural log). Causal
// masking is top-left aligned (key j visible to query i iff j <= i).

import (
	"fmt"
	"os"
	"sync"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
)

// flashPlan says which kernels of flash_attention.cu serve a dtype and head dim,
// and how to launch them.
type flashPlan struct {
	tensorCore bool
	suffix     string // "bf16", "fp16", "fp32"
	// Kernel names: the forward; the backward's preprocessing (Dsum) and
	// then its tensor-core main kernel and dQ conversion, or its generic
	// dQ and dK/dV kernels (the others are empty).
	fwd, bwdPre     string
	bwd, bwdConvert string
	// The tensor-core path's pre and convert kernels that move 16 bytes a
	// thread, for 16-byte aligned tensors (see flashVecAligned).
	bwdPreVec, bwdConvertVec string
	// The tensor-core path's K/V repeat and dK/dV group sum, which run a
	// grouped backward as multi-head attention (see flashBwdRepeats).
	bwdRepeat, bwdKVSum  string
	genBwdDQ, genBwdDKDV string
	fwdRows              int // query rows per CTA (forward)
	fwdThreads           int
	fwdSmem              int
	bwdKeys              int // keys per CTA (tensor-core backward)
	bwdThreads           int
	bwdSmem              int
	genDQSmem            int
	genKVSmem            int
}

// flashTile is a tensor-core kernel pair's tiling, exactly as
// flash_attention.cu instantiates it: FLASH_FWD_TC(name, T, D, fwdWarps,
// fwdKeys) and FLASH_BWD_TC(name, T, D, bwdRows, bwdWarps). Every launch
// parameter and shared-memory size below follows from it; a test checks it
// against the instantiations (and the byte counts of the file's header).
type flashTile struct {
	fwdWarps, fwdKeys int // forward: 16 query rows per warp; keys per K/V tile
	bwdRows, bwdWarps int // backward: query rows per tile; 16 keys per warp
}

// flashTiles are the shipped tensor-core tiles, by head dim.
var flashTiles = map[int]flashTile{
	64:  {fwdWarps: 8, fwdKeys: 128, bwdRows: 128, bwdWarps: 8},
	128: {fwdWarps: 4, fwdKeys: 64, bwdRows: 64, bwdWarps: 8},
}

// fwdSmem is the forward's dynamic shared memory: the Q tile and double-
// buffered K and V tiles, 16-bit elements.
func (t flashTile) fwdSmem(dim int) int { return (16*t.fwdWarps + 2*t.fwdKeys) * dim * 2 }

// bwdSmem is the backward's: K and V tiles (bc keys), double-buffered Q and
// dO tiles (16-bit), the dS tile, and double-buffered L and Dsum rows
// (float32).
func (t flashTile) bwdSmem(dim int) int {
	bc, br := 16*t.bwdWarps, t.bwdRows
	return 2*bc*dim*2 + 4*br*dim*2 + bc*br*2 + 4*br*4
}

// The generic (CUDA-core) kernels: 16 query or key rows per CTA of 128
// threads; float32 K/V (or Q/dO) tiles of 64 rows with stride dim|1, plus
// the CTA's own rows (and, for dK/dV, 64 floats of row sums).
const (
	flashGenericRows    = 16
	flashGenericThreads = 128
)

func flashGenericFwdSmem(dim int) int  { return (64*(dim|1) + 16*dim) * 4 }
func flashGenericDQSmem(dim int) int   { return (64*(dim|1) + 32*dim) * 4 }
func flashGenericDKDVSmem(dim int) int { return (64*(dim|1) + 32*dim + 64) * 4 }

// planFlash picks the kernels for dt and dim: bf16/fp16 with a head dim of
// flashTiles run on tensor cores (which need scale > 0); every other dim <=
// 256, float32 included, runs on the generic CUDA-core path.
func planFlash(dt GemmType, dim int, scale float32) (flashPlan, error) {
	var p flashPlan
	switch dt {
	case GemmF32:
		p.suffix = "fp32"
	case GemmBF16:
		p.suffix = "bf16"
	case GemmF16:
		p.suffix = "fp16"
	default:
		return p, fmt.Errorf("cuda: flash attention: unsupported element type %v", dt)
	}
	if dim < 1 || dim > 256 {
		return p, fmt.Errorf("cuda: flash attention: head dim %d not supported (1..256)", dim)
	}
	p.bwdPre = "flash_bwd_pre_" + p.suffix
	if t, ok := flashTiles[dim]; ok && dt != GemmF32 && scale > 0 {
		p.tensorCore = true
		p.fwd = fmt.Sprintf("flash_fwd_%s_d%d", p.suffix, dim)
		p.bwd = fmt.Sprintf("flash_bwd_%s_d%d", p.suffix, dim)
		p.bwdConvert = "flash_bwd_convert_" + p.suffix
		p.bwdPreVec = "flash_bwd_prevec_" + p.suffix
		p.bwdConvertVec = "flash_bwd_convertvec_" + p.suffix
		p.bwdRepeat, p.bwdKVSum = "flash_bwd_kv_repeat", "flash_bwd_kv_sum_"+p.suffix
		p.fwdRows, p.fwdThreads, p.fwdSmem = 16*t.fwdWarps, 32*t.fwdWarps, t.fwdSmem(dim)
		p.bwdKeys, p.bwdThreads, p.bwdSmem = 16*t.bwdWarps, 32*t.bwdWarps, t.bwdSmem(dim)
		return p, nil
	}
	p.fwd = "flash_fwd_generic_" + p.suffix
	p.genBwdDQ, p.genBwdDKDV = "flash_bwd_generic_dq_"+p.suffix, "flash_bwd_generic_dkdv_"+p.suffix
	p.fwdRows, p.fwdThreads = flashGenericRows, flashGenericThreads
	p.fwdSmem = flashGenericFwdSmem(dim)
	p.genDQSmem = flashGenericDQSmem(dim)
	p.genKVSmem = flashGenericDKDVSmem(dim)
	return p, nil
}

// flashKernels caches the compiled flash_attention.cu per device: FlashForward
// and FlashBackward are Device API, with no Backend to hold it.
var flashKernels struct {
	mu sync.Mutex
	m  map[*Device]*driver.KernelSet
}

func flashKernelSet(d *Device) (*driver.KernelSet, error) {
	flashKernels.mu.Lock()
	defer flashKernels.mu.Unlock()
	if ks, ok := flashKernels.m[d]; ok {
		return ks, nil
	}
	ks, err := driver.CompileKernelSet(d, "flash_attention.cu")
	if err != nil {
		return nil, err
	}
	if flashKernels.m == nil {
		flashKernels.m = map[*Device]*driver.KernelSet{}
	}
	flashKernels.m[d] = ks
	return ks, nil
}

func checkFlashShape(bh, sq, sk, dim int) error {
	if bh < 1 || sq < 1 || sk < 1 || dim < 1 {
		return fmt.Errorf("cuda: flash attention: bh %d, sq %d, sk %d, dim %d must be positive", bh, sq, sk, dim)
	}
	if bh > 1<<31-1 || (sq+15)/16 > 65535 || (sk+15)/16 > 65535 {
		return fmt.Errorf("cuda: flash attention: bh %d, sq %d, sk %d exceed the grid limits", bh, sq, sk)
	}
	if int64(bh)*int64(max(sq, sk)) > 1<<31-1 {
		return fmt.Errorf("cuda: flash attention: %d rows exceed the kernels' 32-bit row index", int64(bh)*int64(max(sq, sk)))
	}
	return nil
}

// checkFlashGroup: group query heads share each K/V head (grouped-query
// attention), so group must divide bh.
func checkFlashGroup(bh, group int) error {
	if group < 1 || bh%group != 0 {
		return fmt.Errorf("cuda: flash attention: group %d (query heads per K/V head) must be at least 1 and divide bh %d", group, bh)
	}
	return nil
}

func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// FlashForward computes O = softmax(scale·Q·Kᵀ [causal mask])·V and LSE (natural
// log, float32 [bh, sq]) on the device's stream. A query that sees no key gets
// O = 0 and LSE = +inf. On an sm_90 device the Hopper kernel may run instead of
// FA2 (see FlashSM90Env) when Q, K, V and O are 16-byte aligned (FA2 needs
// 4); for a few query rows against many keys the decode
// forward (see flash_decode.go, FlashDecodeEnv) runs instead of both, on a
// workspace FlashForward allocates and frees (FlashForwardWS takes one).
func FlashForward(d *Device, dt GemmType, q, k, v, o, lse DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	return FlashForwardWS(d, dt, q, k, v, o, lse, 0, bh, sq, sk, dim, scale, causal)
}

// FlashForwardWS is FlashForward with its workspace: at least
// FlashForwardWorkspaceBytes(dt, bh, sq, sk, dim, scale, causal) bytes, or 0
// to have it allocated (then the call waits for the kernels).
func FlashForwardWS(d *Device, dt GemmType, q, k, v, o, lse, workspace DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	return FlashForwardGroupedWS(d, dt, q, k, v, o, lse, workspace, bh, 1, sq, sk, dim, scale, causal)
}

// FlashForwardGroupedWS is FlashForwardWS with K and V of bh/group heads
// ([bh/group, sk, dim]; grouped-query attention): query head h reads K/V
// head h/group. group 1 is FlashForwardWS, the same kernels.
func FlashForwardGroupedWS(d *Device, dt GemmType, q, k, v, o, lse, workspace DevicePtr, bh, group, sq, sk, dim int, scale float32, causal bool) error {
	if err := checkFlashShape(bh, sq, sk, dim); err != nil {
		return err
	}
	if err := checkFlashGroup(bh, group); err != nil {
		return err
	}
	if flashDecodeApplies(dt, sq, sk, dim, scale, causal) {
		on, err := flashDecodeOn()
		if err != nil {
			return err
		}
		if on {
			p, err := planFlashDecode(dt, bh, sq, sk, dim, causal)
			if err != nil {
				return err
			}
			return withWorkspace(d, workspace, p.workspaceBytes(), func(ws DevicePtr) error {
				return flashForwardDecode(d, p, q, k, v, o, lse, ws, bh, group, sq, sk, dim, scale, causal)
			})
		}
	}
	if name, err := flashSM90Choice(d, dt, dim, sq, causal, scale); err != nil {
		return err
	} else if name != "" && (flashVecAligned(q, k, v, o) || os.Getenv(FlashSM90Env) != "") {
		// The Hopper kernels move Q, K, V and O with TMA, which needs
		// 16-byte aligned tensors: FA2 takes the others, unless a kernel was
		// asked for by name (then the launch says which tensor is not).
		return flashForwardSM90(d, name, q, k, v, o, lse, bh, group, sq, sk, dim, scale, causal)
	}
	p, err := planFlash(dt, dim, scale)
	if err != nil {
		return err
	}
	ks, err := flashKernelSet(d)
	if err != nil {
		return err
	}
	f, err := ks.Fn(p.fwd, p.fwdSmem)
	if err != nil {
		return err
	}
	block := [3]uint32{uint32(p.fwdThreads), 1, 1}
	if p.tensorCore {
		// Heads on grid y (see flashHeadChunks), query blocks on x.
		return flashHeadChunks(bh, group, func(h0, n int) error {
			qo, ko, lo := flashHeadOffset(h0, sq, dim, 2), flashHeadOffset(h0/group, sk, dim, 2), flashHeadOffset(h0, sq, 1, 4)
			grid := [3]uint32{uint32((sq + p.fwdRows - 1) / p.fwdRows), uint32(n), 1}
			return d.Launch(f, grid, block, uint32(p.fwdSmem), q+qo, k+ko, v+ko, o+qo, lse+lo, int32(n), int32(sq), int32(sk), scale, b2i(causal), int32(group))
		})
	}
	grid := [3]uint32{uint32(bh), uint32((sq + p.fwdRows - 1) / p.fwdRows), 1}
	return d.Launch(f, grid, block, uint32(p.fwdSmem), q, k, v, o, lse, int32(bh), int32(sq), int32(sk), int32(dim), scale, b2i(causal), int32(group))
}

// FlashBackward computes dQ, dK, dV from Q, K, V, O, dO and the forward's LSE.
// On an sm_90 device its main kernel may be the Hopper one (see
// FlashSM90BwdEnv) when Q, K, V, dO, dK and dV are 16-byte aligned (FA2's
// needs 4).
// workspace must hold FlashBackwardWorkspaceBytes(dt, bh, 1, sq, sk, dim, scale)
// bytes; when it is 0, FlashBackward allocates it, waits for the kernels and
// frees it.
func FlashBackward(d *Device, dt GemmType, q, k, v, o, dO, lse, dq, dk, dv, workspace DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	return FlashBackwardGrouped(d, dt, q, k, v, o, dO, lse, dq, dk, dv, workspace, bh, 1, sq, sk, dim, scale, causal)
}

// FlashBackwardGrouped is FlashBackward with K, V, dK and dV of bh/group
// heads (grouped-query attention): dK and dV of a K/V head sum over the group
// query heads that read it, inside the kernels (a CTA owns a K/V block and
// loops over the group's heads), or, where that grid is too small to fill
// the GPU (see flashBwdRepeatRule and FlashGQABwdEnv), by running the
// multi-head kernels on K and V repeated to every query head and summing
// each group's dK and dV after (flash_bwd_repeat.go), in the workspace:
// FlashBackwardWorkspaceBytes(dt, bh, group, sq, sk, dim, scale) bytes.
// group 1 is FlashBackward, the same kernels.
func FlashBackwardGrouped(d *Device, dt GemmType, q, k, v, o, dO, lse, dq, dk, dv, workspace DevicePtr, bh, group, sq, sk, dim int, scale float32, causal bool) error {
	if err := checkFlashShape(bh, sq, sk, dim); err != nil {
		return err
	}
	if err := checkFlashGroup(bh, group); err != nil {
		return err
	}
	p, err := planFlash(dt, dim, scale)
	if err != nil {
		return err
	}
	ks, err := flashKernelSet(d)
	if err != nil {
		return err
	}
	if workspace == 0 {
		ws, err := d.Alloc(FlashBackwardWorkspaceBytes(dt, bh, group, sq, sk, dim, scale))
		if err != nil {
			return err
		}
		err = FlashBackwardGrouped(d, dt, q, k, v, o, dO, lse, dq, dk, dv, ws, bh, group, sq, sk, dim, scale, causal)
		if serr := d.Synchronize(); err == nil {
			err = serr
		}
		if ferr := d.Free(ws); err == nil {
			err = ferr
		}
		return err
	}
	rows := bh * sq
	dsum := workspace
	dqacc := workspace.Offset(flashBwdLayoutOf(bh, sq, sk, dim, false).dqacc)
	pre, err := ks.Fn(p.bwdPre, 0)
	if err != nil {
		return err
	}
	preGrid := [3]uint32{driver.Grid1D(rows, 8), 1, 1}
	blk256 := [3]uint32{256, 1, 1}
	if !p.tensorCore {
		if err := d.Launch(pre, preGrid, blk256, 0, o, dO, dsum, DevicePtr(0), int32(rows), int32(dim)); err != nil {
			return err
		}
		fdq, err := ks.Fn(p.genBwdDQ, p.genDQSmem)
		if err != nil {
			return err
		}
		fkv, err := ks.Fn(p.genBwdDKDV, p.genKVSmem)
		if err != nil {
			return err
		}
		blk := [3]uint32{128, 1, 1}
		if err := d.Launch(fdq, [3]uint32{uint32(bh), uint32((sq + 15) / 16), 1}, blk, uint32(p.genDQSmem),
			q, k, v, dO, lse, dsum, dq, int32(bh), int32(sq), int32(sk), int32(dim), scale, b2i(causal), int32(group)); err != nil {
			return err
		}
		// A CTA per key block of a K/V head, looping over its group.
		return d.Launch(fkv, [3]uint32{uint32(bh / group), uint32((sk + 15) / 16), 1}, blk, uint32(p.genKVSmem),
			q, k, v, dO, lse, dsum, dk, dv, int32(bh), int32(sq), int32(sk), int32(dim), scale, b2i(causal), int32(group))
	}
	repeat, err := flashBwdRepeats(p, bh, group, sk, k, v, dk, dv)
	if err != nil {
		return err
	}
	// What the main kernel reads and writes: K, V, dK, dV of bh/group
	// heads, or their repeats of bh heads in the workspace (group 1).
	mk, mv, mdk, mdv, mgroup := k, v, dk, dv, group
	if repeat {
		lay := flashBwdLayoutOf(bh, sq, sk, dim, true)
		mk, mv, mdk, mdv = workspace.Offset(lay.kr), workspace.Offset(lay.vr), workspace.Offset(lay.dkr), workspace.Offset(lay.dvr)
		mgroup = 1
	}
	sm90, err := flashSM90BwdChoice(d, dt, dim, scale)
	if err != nil {
		return err
	}
	if sm90 != "" && !flashVecAligned(q, mk, mv, dO, mdk, mdv) && os.Getenv(FlashSM90BwdEnv) == "" {
		// The Hopper backwards move Q, K, V, dO, dK and dV with TMA (16-byte
		// aligned tensors only); FA2's takes the others unless a kernel was
		// asked for by name (then the launch says which tensor is not).
		sm90 = ""
	}
	vec := flashVecAligned(o, dO, dq, dqacc)
	if vec {
		if pre, err = ks.Fn(p.bwdPreVec, 0); err != nil {
			return err
		}
		preGrid = [3]uint32{driver.Grid1D(rows*dim/8, 256), 1, 1}
	}
	if err := d.Launch(pre, preGrid, blk256, 0, o, dO, dsum, dqacc, int32(rows), int32(dim)); err != nil {
		return err
	}
	if sm90 != "" && repeat {
		// The Hopper multi-head build reads each group's K and V where they
		// are (bwd_kv_load_head): no repeated copy, only the per-query-head
		// dK and dV in the workspace.
		if err := flashBackwardSM90(d, sm90, q, k, v, dO, lse, dsum, dqacc, mdk, mdv, bh, group, sq, sk, dim, scale, causal, true); err != nil {
			return err
		}
	} else if sm90 != "" {
		if err := flashBackwardSM90(d, sm90, q, mk, mv, dO, lse, dsum, dqacc, mdk, mdv, bh, mgroup, sq, sk, dim, scale, causal, false); err != nil {
			return err
		}
	} else {
		if repeat {
			if err := flashBwdRepeatKV(d, ks, p, k, v, mk, mv, bh, group, sk, dim); err != nil {
				return err
			}
		}
		if err := flashBackwardFA2(d, ks, p, q, mk, mv, dO, lse, dsum, dqacc, mdk, mdv, bh, mgroup, sq, sk, dim, scale, causal); err != nil {
			return err
		}
	}
	if repeat {
		if err := flashBwdSumKV(d, ks, p, mdk, mdv, dk, dv, bh, group, sk, dim); err != nil {
			return err
		}
	}
	n := int64(rows) * int64(dim)
	name := p.bwdConvert
	if vec {
		name, n = p.bwdConvertVec, n/8
	}
	conv, err := ks.Fn(name, 0)
	if err != nil {
		return err
	}
	// The Hopper kernels leave dQaccum's column blocks permuted (see
	// flash_bwd_convert in flash_attention.cu).
	blocks := min((n+255)/256, 65535*16)
	return d.Launch(conv, [3]uint32{uint32(blocks), 1, 1}, blk256, 0, dqacc, dq, n, int32(dim), int32(sq), scale, b2i(sm90 != ""))
}

// flashVecAligned reports whether every tensor given starts 16-byte aligned
// (the head dims of the tensor-core path keep every row so): what the
// backward's pre and convert kernels need to move 16 bytes a thread, and the
// Hopper kernels' TMA copies need at all.
func flashVecAligned(ptrs ...DevicePtr) bool {
	for _, p := range ptrs {
		if p%16 != 0 {
			return false
		}
	}
	return true
}

// flashBackwardFA2 launches FA2's tensor-core backward main kernel: a CTA
// per key block of a K/V head (grid y over the bh/group K/V heads), looping
// over the group's query heads.
func flashBackwardFA2(d *Device, ks *driver.KernelSet, p flashPlan, q, k, v, dO, lse, dsum, dqacc, dk, dv DevicePtr, bh, group, sq, sk, dim int, scale float32, causal bool) error {
	fb, err := ks.Fn(p.bwd, p.bwdSmem)
	if err != nil {
		return err
	}
	// Heads on grid y (see flashHeadChunks), key blocks on x.
	return flashHeadChunks(bh, group, func(h0, n int) error {
		qo, ko := flashHeadOffset(h0, sq, dim, 2), flashHeadOffset(h0/group, sk, dim, 2)
		lo, ao := flashHeadOffset(h0, sq, 1, 4), flashHeadOffset(h0, sq, dim, 4)
		return d.Launch(fb, [3]uint32{uint32((sk + p.bwdKeys - 1) / p.bwdKeys), uint32(n / group), 1}, [3]uint32{uint32(p.bwdThreads), 1, 1},
			uint32(p.bwdSmem), q+qo, k+ko, v+ko, dO+qo, lse+lo, dsum+lo, dqacc+ao, dk+ko, dv+ko, int32(n), int32(sq), int32(sk), scale, b2i(causal), int32(group))
	})
}
