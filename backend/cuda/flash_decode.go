package cuda

// Launcher for flash_attention.cu's decode forward (flash_decode_*): a few
// query rows (generation: Sq <= 16) against a long K/V. One CTA per (bh,
// query tile), as FA2 and the sm90 kernel launch, would give BH CTAs that
// each scan the whole K/V alone; the decode forward cuts the visible keys
// into chunks, one CTA per (bh, chunk), each writing its chunk's normalised
// output and logsumexp (float32, to a workspace), and a combine kernel
// rescales and sums them into O and the LSE (the same contract as
// FlashForward: natural log, +inf for a row that sees no key).

import (
	"fmt"
	"os"
)

// FlashDecodeEnv turns the decode forward off for comparisons: "0" runs the
// FA2 or sm90 forward for every shape; unset or "1": FlashForward runs the
// decode forward where flashDecodeApplies says so.
const FlashDecodeEnv = "FLASHGRAPH_FLASH_DECODE"

// The decode kernels' tiling, as flash_attention.cu fixes it (DEC_NW,
// DEC_BC, DEC_ROWS, DEC_MAX_SPLITS and the FLASH_DECODE instantiations; a
// test compares them).
const (
	flashDecodeWarps          = 4
	flashDecodeKeys           = 16 * flashDecodeWarps // keys per K/V tile
	flashDecodeRows           = 16                    // query rows: at most this Sq
	flashDecodeMaxSplits      = 256
	flashDecodeCombineThreads = 128
)

// flashDecodeStages is the depth of the K/V cp.async ring, by head dim.
var flashDecodeStages = map[int]int{64: 4, 128: 3}

// flashDecodeSmem is the decode kernel's dynamic shared memory: the query
// tile and the K/V ring (16-bit elements).
func flashDecodeSmem(dim int) int {
	return (flashDecodeRows + 2*flashDecodeStages[dim]*flashDecodeKeys) * dim * 2
}

// The dispatch rule and the split heuristic.
const (
	// flashDecodeMinKeys: with fewer visible keys per row, FA2/sm90 runs.
	flashDecodeMinKeys = 1024
	// flashDecodeCTAs is the grid the splits aim at: two waves of two
	// resident CTAs on each of the H200's 132 SMs (a fixed number, so that
	// the workspace, and the executor's memory plan, depend on the shape
	// only; another GPU gets more or fewer waves).
	flashDecodeCTAs = 4 * 132
	// flashDecodeMinTiles: a chunk has at least 128 keys.
	flashDecodeMinTiles = 2
)

// flashDecodePlan is one decode launch: kernel names, the split of the keys
// and the workspace layout.
type flashDecodePlan struct {
	kernel, combine       string
	smem                  int
	splits, tilesPerSplit int
	oBytes, lseBytes      int // partial outputs [bh, splits, sq, dim] and logsumexps [bh, splits, sq], float32
}

// flashDecodeKeyRange is how many keys a query row may see: all of them, or
// with the top-left causal mask at most min(sk, sq).
func flashDecodeKeyRange(sq, sk int, causal bool) int {
	if causal {
		return min(sk, sq)
	}
	return sk
}

// flashDecodeApplies is FlashForward's rule: bf16/fp16 with head dim 64 or
// 128 (and scale > 0, as for the tensor-core kernels), at most 16 query rows,
// and enough visible keys that splitting them pays. With the top-left
// causal mask a row of Sq <= 16 sees at most 16 keys, so causal attention
// never takes it.
func flashDecodeApplies(dt GemmType, sq, sk, dim int, scale float32, causal bool) bool {
	_, ok := flashDecodeStages[dim]
	return ok && (dt == GemmBF16 || dt == GemmF16) && scale > 0 && sq <= flashDecodeRows &&
		flashDecodeKeyRange(sq, sk, causal) >= flashDecodeMinKeys
}

// planFlashDecode lays out a decode launch for any shape the kernels take
// (flashDecodeApplies decides when FlashForward uses it): splits aim at
// flashDecodeCTAs CTAs in all, chunks of at least flashDecodeMinTiles tiles,
// no chunk empty, at most flashDecodeMaxSplits.
func planFlashDecode(dt GemmType, bh, sq, sk, dim int, causal bool) (flashDecodePlan, error) {
	var p flashDecodePlan
	var suffix string
	switch dt {
	case GemmBF16:
		suffix = "bf16"
	case GemmF16:
		suffix = "fp16"
	default:
		return p, fmt.Errorf("cuda: flash decode: element type %v not supported (bf16, fp16)", dt)
	}
	if _, ok := flashDecodeStages[dim]; !ok {
		return p, fmt.Errorf("cuda: flash decode: head dim %d not supported (64, 128)", dim)
	}
	if sq > flashDecodeRows {
		return p, fmt.Errorf("cuda: flash decode: %d query rows, at most %d", sq, flashDecodeRows)
	}
	if err := checkFlashShape(bh, sq, sk, dim); err != nil {
		return p, err
	}
	p.kernel = fmt.Sprintf("flash_decode_%s_d%d", suffix, dim)
	p.combine = "flash_decode_combine_" + suffix
	p.smem = flashDecodeSmem(dim)
	tiles := (flashDecodeKeyRange(sq, sk, causal) + flashDecodeKeys - 1) / flashDecodeKeys
	splits := (flashDecodeCTAs + bh - 1) / bh
	splits = max(1, min(splits, tiles/flashDecodeMinTiles, flashDecodeMaxSplits))
	p.tilesPerSplit = (tiles + splits - 1) / splits
	p.splits = max(1, (tiles+p.tilesPerSplit-1)/p.tilesPerSplit)
	p.oBytes = ((bh*p.splits*sq*dim*4 + 255) / 256) * 256
	p.lseBytes = bh * p.splits * sq * 4
	return p, nil
}

func (p flashDecodePlan) workspaceBytes() int { return p.oBytes + p.lseBytes }

// flashDecodeOn reads FlashDecodeEnv.
func flashDecodeOn() (bool, error) {
	switch env := os.Getenv(FlashDecodeEnv); env {
	case "", "1":
		return true, nil
	case "0":
		return false, nil
	default:
		return false, fmt.Errorf("cuda: %s=%q: want 1 or unset (the decode forward for Sq <= %d) or 0 (off)", FlashDecodeEnv, env, flashDecodeRows)
	}
}

// FlashForwardWorkspaceBytes is the device scratch FlashForwardWS needs for
// these arguments: the decode forward's partial results where
// flashDecodeApplies, else 0. It does not read FlashDecodeEnv, so a plan
// sized by it holds whichever forward runs.
func FlashForwardWorkspaceBytes(dt GemmType, bh, sq, sk, dim int, scale float32, causal bool) int {
	if !flashDecodeApplies(dt, sq, sk, dim, scale, causal) {
		return 0
	}
	p, err := planFlashDecode(dt, bh, sq, sk, dim, causal)
	if err != nil {
		return 0 // FlashForwardWS reports it
	}
	return p.workspaceBytes()
}

// flashForwardDecode launches the decode kernel and the combine; workspace
// holds p.workspaceBytes() bytes.
func flashForwardDecode(d *Device, p flashDecodePlan, q, k, v, o, lse, workspace DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	ks, err := d.flashKernels()
	if err != nil {
		return err
	}
	f, err := ks.fn(p.kernel, p.smem)
	if err != nil {
		return err
	}
	comb, err := ks.fn(p.combine, 0)
	if err != nil {
		return err
	}
	opart, lpart := workspace, workspace.Offset(p.oBytes)
	if err := d.Launch(f, [3]uint32{uint32(bh), uint32(p.splits), 1}, [3]uint32{32 * flashDecodeWarps, 1, 1}, uint32(p.smem),
		q, k, v, opart, lpart, int32(bh), int32(sq), int32(sk), int32(p.splits), int32(p.tilesPerSplit), scale, b2i(causal)); err != nil {
		return err
	}
	return d.Launch(comb, [3]uint32{uint32(bh * sq), 1, 1}, [3]uint32{flashDecodeCombineThreads, 1, 1}, 0,
		opart, lpart, o, lse, int32(bh), int32(sq), int32(dim), int32(p.splits))
}

// withWorkspace runs f on workspace, or when it is 0 on n fresh bytes that
// it frees after waiting for the device.
func withWorkspace(d *Device, workspace DevicePtr, n int, f func(DevicePtr) error) error {
	if workspace != 0 {
		return f(workspace)
	}
	ws, err := d.Alloc(n)
	if err != nil {
		return err
	}
	err = f(ws)
	if serr := d.Synchronize(); err == nil {
		err = serr
	}
	if ferr := d.Free(ws); err == nil {
		err = ferr
	}
	return err
}
