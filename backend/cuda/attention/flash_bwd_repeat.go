package attention

// The grouped backward run as multi-head attention. The grouped kernels
// (FA2's flash_bwd_<T>_d<D>, the sm90 "_gqa" ones) give a CTA one 128-key
// block of one K/V head and loop it over the group's query heads: a grid of
// Sk/128 × BH/group CTAs, each group query heads long. With few K/V heads
// (multi-query attention) that grid does not fill the GPU: on an H200, H = 32
// on H_kv = 1, D = 128, causal, 128 CTAs on 132 SMs, the longest (the first
// key block's, which sees every query) set the time, and the backward ran at
// 0.56-0.64× cuDNN's where H_kv = 8 beat it (BENCHMARKS.md, "Grouped-query
// attention vs PyTorch SDPA"). So for such shapes FlashBackwardGrouped
// runs the multi-head kernels (BH times more CTAs, a CTA per key block of a
// query head) into per-query-head dK and dV, and sums each group's into dK
// and dV, all in the workspace, in stream order. The Hopper multi-head
// kernels read each query head's K/V head where it is (bwd_kv_load_head in
// kernels/flash_sm90_bwd.cuh: head / group); FA2's read K and V repeated to
// the BH query heads in the workspace first (the repeat kernel), whose room
// the workspace keeps either way, as its size may not depend on the device.

import (
	"fmt"
	"os"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
)

// FlashGQABwdEnv chooses how FlashBackwardGrouped runs grouped K/V heads
// (group > 1) on the tensor-core kernels (bf16/fp16, head dim 64 or 128):
// unset or "auto", as flashBwdRepeatRule says for the shape; "grouped", the
// grouped kernels (a CTA loops over the group's query heads); "repeat", K
// and V repeated to every query head, the multi-head kernels, then each
// group's dK and dV summed. Both ways for timing them against each other.
// FlashBackwardWorkspaceBytes reads it too ("repeat" needs more workspace):
// set it before sizing a workspace, not between sizing and running.
const FlashGQABwdEnv = "FLASHGRAPH_FLASH_GQA_BWD"

const (
	// flashBwdKeyBlock is the keys of a backward CTA: flashSM90BwdKeys, and
	// FA2's 16·bwdWarps at every head dim of flashTiles (a test checks).
	flashBwdKeyBlock = flashSM90BwdKeys
	// flashBwdRepeatMinCTAs: a grouped backward grid of fewer CTAs runs as
	// multi-head attention instead. A backward CTA takes a whole SM (its
	// shared memory), so below one CTA per SM some SMs idle, and below two
	// the wave is too short to even out CTAs of unequal length (causal: the
	// first key block sees every query, the last only the last 128 when
	// Sq = Sk), while the repeat's copies and sums cost only a few percent
	// of the backward's time. Two waves of flashDecodeSMs, the H200's 132
	// SMs: a fixed count, as the decode forward plans with, so that the
	// workspace (and the executor's memory plan) depends on the shape (and
	// FlashGQABwdEnv), not on the device.
	flashBwdRepeatMinCTAs = 2 * flashDecodeSMs
)

// flashBwdRepeatRule says whether the grouped backward's grid of
// ceil(sk/flashBwdKeyBlock) × bh/group CTAs is too small (see
// flashBwdRepeatMinCTAs) for a group > 1.
func flashBwdRepeatRule(bh, group, sk int) bool {
	if group <= 1 {
		return false
	}
	ctas := int64((sk+flashBwdKeyBlock-1)/flashBwdKeyBlock) * int64(bh/group)
	return ctas < flashBwdRepeatMinCTAs
}

// flashBwdRepeatPick says whether a backward with group query heads per K/V
// head runs as multi-head attention (see the file comment), given env, the
// value of FlashGQABwdEnv: only on the tensor-core path (tensorCore) and
// for group > 1; "repeat" and "grouped" force either way.
func flashBwdRepeatPick(env string, tensorCore bool, bh, group, sk int) (bool, error) {
	var repeat bool
	switch env {
	case "", "auto":
		repeat = flashBwdRepeatRule(bh, group, sk)
	case "repeat":
		repeat = true
	case "grouped":
		repeat = false
	default:
		return false, fmt.Errorf("cuda: %s=%q: want auto or unset (repeat K/V where the grouped grid is under %d CTAs), repeat or grouped", FlashGQABwdEnv, env, flashBwdRepeatMinCTAs)
	}
	return repeat && tensorCore && group > 1, nil
}

// flashBwdLayout is the layout of FlashBackwardGrouped's workspace: float32
// Dsum [bh, sq], float32 dQaccum [bh, sq, dim] and, when the backward runs
// as multi-head attention, the repeated K and V and the per-query-head dK
// and dV ([bh, sk, dim] of 16-bit elements each), every part starting on
// 256 bytes (the Hopper kernels need 16 for TMA and bulk copies); without
// the repeat, FlashBackward's workspace as it always was.
type flashBwdLayout struct {
	dqacc      int // offset of dQaccum
	kr, vr     int // offsets of the repeated K and V (0: no repeat)
	dkr, dvr   int // offsets of the per-query-head dK and dV
	totalBytes int
}

func flashBwdLayoutOf(bh, sq, sk, dim int, repeat bool) flashBwdLayout {
	up := func(n int) int { return (n + 255) / 256 * 256 }
	rows := bh * sq
	var l flashBwdLayout
	l.dqacc = up(rows * 4)
	l.totalBytes = l.dqacc + rows*dim*4
	if repeat {
		kv := up(bh * sk * dim * 2)
		l.kr = up(l.totalBytes)
		l.vr, l.dkr, l.dvr = l.kr+kv, l.kr+2*kv, l.kr+3*kv
		l.totalBytes = l.kr + 4*kv
	}
	return l
}

// FlashBackwardWorkspaceBytes is the device scratch FlashBackwardGrouped
// (and FlashBackward, group 1) needs for these arguments: float32 Dsum [bh,
// sq] and dQaccum [bh, sq, dim] and, where the backward runs as multi-head
// attention (flashBwdRepeatPick, which reads FlashGQABwdEnv), four [bh, sk,
// dim] 16-bit tensors. K/V tensors that are not 16-byte aligned run the
// grouped kernels whatever the size says.
func FlashBackwardWorkspaceBytes(dt GemmType, bh, group, sq, sk, dim int, scale float32) int {
	repeat := false
	if p, err := planFlash(dt, dim, scale); err == nil {
		// A bad FlashGQABwdEnv sizes for the grouped kernels: the backward
		// itself reports it.
		repeat, _ = flashBwdRepeatPick(os.Getenv(FlashGQABwdEnv), p.tensorCore, bh, group, sk)
	}
	return flashBwdLayoutOf(bh, sq, sk, dim, repeat).totalBytes
}

// flashBwdRepeats says whether this backward runs as multi-head attention:
// flashBwdRepeatPick for the environment, on K, V, dK and dV 16-byte aligned
// (the copies move 16 bytes a thread; for others the grouped kernels run,
// unless "repeat" was asked for, which then fails naming the tensor).
func flashBwdRepeats(p flashPlan, bh, group, sk int, k, v, dk, dv DevicePtr) (bool, error) {
	env := os.Getenv(FlashGQABwdEnv)
	repeat, err := flashBwdRepeatPick(env, p.tensorCore, bh, group, sk)
	if err != nil || !repeat {
		return false, err
	}
	for _, t := range []struct {
		name string
		ptr  DevicePtr
	}{{"K", k}, {"V", v}, {"dK", dk}, {"dV", dv}} {
		if !flashVecAligned(t.ptr) {
			if env == "repeat" {
				return false, fmt.Errorf("cuda: %s=repeat: %s at %#x is not 16-byte aligned (the K/V copies need it)", FlashGQABwdEnv, t.name, uint64(t.ptr))
			}
			return false, nil
		}
	}
	return true, nil
}

// flashBwdKVGrid is the grid of the repeat and sum kernels for rows rows of
// dim columns (16 bytes a thread, grid-stride): x over the chunks, at most
// 2^20 blocks; y 0 for K (dK), 1 for V (dV).
func flashBwdKVGrid(rows, dim int) [3]uint32 {
	n := int64(rows) * int64(dim/8)
	return [3]uint32{uint32(min((n+255)/256, 1<<20)), 2, 1}
}

// flashBwdKVArgs are the arguments of flash_bwd_kv_repeat (K, V in; their
// repeats out) and flash_bwd_kv_sum_<T> (per-query-head dK, dV in; dK, dV
// out), for rows output rows of dim columns.
func flashBwdKVArgs(inK, inV, outK, outV DevicePtr, rows, dim, sk, group int) []any {
	return []any{inK, inV, outK, outV, int32(rows), int32(dim / 8), int32(sk), int32(group)}
}

// flashBwdRepeatKV writes K and V repeated to the bh query heads into kr
// and vr ([bh, sk, dim]).
func flashBwdRepeatKV(d *Device, ks *driver.KernelSet, p flashPlan, k, v, kr, vr DevicePtr, bh, group, sk, dim int) error {
	f, err := ks.Fn(p.bwdRepeat, 0)
	if err != nil {
		return err
	}
	rows := bh * sk
	return d.Launch(f, flashBwdKVGrid(rows, dim), [3]uint32{256, 1, 1}, 0, flashBwdKVArgs(k, v, kr, vr, rows, dim, sk, group)...)
}

// flashBwdSumKV writes dK and dV ([bh/group, sk, dim]) as the sums of each
// group's per-query-head dkr and dvr ([bh, sk, dim]), in a fixed order.
// The group-1 kernels already scaled them as the grouped ones scale theirs.
func flashBwdSumKV(d *Device, ks *driver.KernelSet, p flashPlan, dkr, dvr, dk, dv DevicePtr, bh, group, sk, dim int) error {
	f, err := ks.Fn(p.bwdKVSum, 0)
	if err != nil {
		return err
	}
	rows := bh / group * sk
	return d.Launch(f, flashBwdKVGrid(rows, dim), [3]uint32{256, 1, 1}, 0, flashBwdKVArgs(dkr, dvr, dk, dv, rows, dim, sk, group)...)
}
