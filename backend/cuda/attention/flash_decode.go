package attention

// Launcher for flash_attention.cu's decode forward (flash_decode_*): a few
// query rows (generation: Sq <= 16) against a long K/V. One CTA per (bh,
// query tile), as FA2 and the sm90 kernel launch, would give BH CTAs that
// each scan the whole K/V alone; the decode forward cuts the visible keys
// into chunks, one CTA per (bh, chunk), and merges the chunks' normalised
// outputs and logsumexps into O and the LSE (the same contract as
// FlashForward: natural log, +inf for a row that sees no key).
//
// Two versions, one kernel (its flags and ring-depth arguments tell them
// apart):
//
//   - v2, the default: the chunk count fills the GPU's resident CTA slots
//     once (one wave, every CTA the same number of key tiles, so that all
//     finish together), and the kernel finishes the job itself: a single
//     chunk writes O and LSE directly, and with more chunks the last CTA of
//     each bh to finish (a per-bh ticket) combines the chunks' partials,
//     which it reads back from L2. One launch, no combine kernel. Its K/V
//     ring is as deep as two CTAs per SM allow (d64: 6 tiles, 5 in flight;
//     d128: 3), since with one wave of equal CTAs what keeps DRAM busy is
//     the bytes each CTA has in flight.
//   - v1, the first version: about four CTAs per SM in several waves (its
//     ring: d64 4 tiles, 3 CTAs per SM; d128 3, 2 per SM), every chunk's
//     partials written to the workspace, and a second kernel
//     (flash_decode_combine_*) combining them.
//
// The decode work is bound by the K/V reads (two bytes per element, read
// once); what the versions differ in is the fixed cost around them: the
// second launch and its tail, and the partial round trip.

import (
	"fmt"
	"os"
)

// FlashDecodeEnv turns the decode forward off for comparisons: "0" runs the
// FA2 or sm90 forward for every shape; unset or "1": FlashForward runs the
// decode forward where flashDecodeApplies says so, in the version
// FlashDecodeKernelEnv picks.
const FlashDecodeEnv = "FLASHGRAPH_FLASH_DECODE"

// FlashDecodeKernelEnv picks the decode forward's version: unset or "v2"
// (one wave of CTAs, the combine fused into the kernel), or "v1" (the first
// version: more, shorter chunks and a separate combine kernel), so that both
// can be timed in one GPU session. It is a variable of its own because
// `flashgraph bench -decode` sets FlashDecodeEnv itself (to 1 and to 0, for
// its two columns). FlashForwardWorkspaceBytes covers both versions.
const FlashDecodeKernelEnv = "FLASHGRAPH_FLASH_DECODE_KERNEL"

// flashDecodeVersion is a decode forward version (FlashDecodeKernelEnv).
type flashDecodeVersion int

const (
	flashDecodeV1 flashDecodeVersion = 1
	flashDecodeV2 flashDecodeVersion = 2
)

func (v flashDecodeVersion) String() string { return fmt.Sprintf("v%d", int(v)) }

// The decode kernels' tiling and flags, as flash_attention.cu fixes them
// (DEC_NW, DEC_BC, DEC_ROWS, DEC_MAX_SPLITS, DEC_MAX_TICKETS, DEC_FUSED,
// DEC_PF256 and the FLASH_DECODE instantiations; a test compares them).
const (
	flashDecodeWarps          = 4
	flashDecodeKeys           = 16 * flashDecodeWarps // keys per K/V tile
	flashDecodeRows           = 16                    // query rows: at most this Sq
	flashDecodeMaxSplits      = 256
	flashDecodeMaxTickets     = 1024 // the fused combine's per-bh tickets: bh above this runs one chunk
	flashDecodeCombineThreads = 128

	flashDecodeFused = 1 // flags: v2's direct write / in-kernel combine
	flashDecodePF256 = 2 // flags: K/V loads with the L2 256-byte prefetch hint
)

// The depth of the K/V cp.async ring (tiles of flashDecodeKeys keys), by
// head dim: flashDecodeStages is v2's, flashDecodeV1Stages v1's, and
// flashDecodeMaxStages the most the kernels take (their instantiation's
// MAXST: what fits in 227 KiB, one CTA per SM).
var (
	flashDecodeStages    = map[int]int{64: 6, 128: 3}
	flashDecodeV1Stages  = map[int]int{64: 4, 128: 3}
	flashDecodeMaxStages = map[int]int{64: 14, 128: 6}
	// flashDecodeWave is how many CTAs per SM v2's one wave plans for, by
	// head dim (at most what their shared memory lets reside). Measured on
	// the H200 (TestFlashDecodeTiming, run 4): at D=128 one per SM beat two
	// (bh 128, S 4096: one chunk 65.1 us against two 67.4; bh 32, S 16384,
	// Sq 16: four chunks 73.3 against eight 77.5; Sq 1: equal), at D=64 two
	// per SM beat one (bh 64, S 16384: four chunks 68.0 against two 78.7).
	flashDecodeWave = map[int]int{64: 2, 128: 1}
)

// flashDecodeSmem is the decode kernel's dynamic shared memory for a ring of
// stages tiles: the query tile and the K/V ring (16-bit elements).
func flashDecodeSmem(dim, stages int) int {
	return (flashDecodeRows + 2*stages*flashDecodeKeys) * dim * 2
}

// Hopper's shared memory per SM as CTAs see it: 228 KiB, less 1 KiB the
// runtime reserves per resident CTA (sm_90) and the decode kernel's static
// shared memory (its ticket flag; ptxas reports 128 bytes).
const (
	flashDecodeSMemPerSM   = 228 * 1024
	flashDecodeSMemPerCTA0 = 1024 + 128
)

// flashDecodeResident is how many decode CTAs of head dim dim with a ring of
// stages tiles one SM holds at once, as their shared memory allows (d64: 4
// stages 3, 6 stages 2, 14 stages 1; d128: 3 stages 2, 6 stages 1; the
// registers allow as many, which TestFlashDecodeCompile checks).
func flashDecodeResident(dim, stages int) int {
	return flashDecodeSMemPerSM / (flashDecodeSmem(dim, stages) + flashDecodeSMemPerCTA0)
}

// The dispatch rule and the split heuristics.
const (
	// flashDecodeMinKeys: with fewer visible keys per row, FA2/sm90 runs.
	flashDecodeMinKeys = 1024
	// flashDecodeSMs is the GPU the chunk counts are planned for: the
	// H200's (and H100 SXM's) 132 SMs. A fixed number, so that the
	// workspace, and the executor's memory plan, depend on the shape only;
	// on a GPU with fewer SMs v2's one wave becomes two, the second short.
	flashDecodeSMs = 132
	// flashDecodeV1CTAs is v1's grid target: two waves of two resident CTAs
	// on each of 132 SMs.
	flashDecodeV1CTAs = 4 * flashDecodeSMs
	// flashDecodeMinTiles: a chunk has at least 128 keys.
	flashDecodeMinTiles = 2
	// flashDecodeFlagsV2 are v2's kernel flags. The prefetch hint is off
	// until the GPU says it pays (TestFlashDecodeTiming times both).
	flashDecodeFlagsV2 = flashDecodeFused
)

// flashDecodePlan is one decode launch: kernel names, the split of the keys
// and the workspace layout.
type flashDecodePlan struct {
	version               flashDecodeVersion
	kernel, combine       string // combine: v1 only (always named, so tests see both entry points)
	stages, smem          int    // K/V ring depth and the dynamic shared memory it takes
	flags                 int
	tiles                 int // key tiles of flashDecodeKeys a row sees
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
	_, ok := flashDecodeMaxStages[dim]
	return ok && (dt == GemmBF16 || dt == GemmF16) && scale > 0 && sq <= flashDecodeRows &&
		flashDecodeKeyRange(sq, sk, causal) >= flashDecodeMinKeys
}

// planFlashDecode lays out the decode launch FlashForward runs: the version
// FlashDecodeKernelEnv picks (v2 by default), for any shape the kernels take
// (flashDecodeApplies decides when FlashForward uses it).
func planFlashDecode(dt GemmType, bh, sq, sk, dim int, causal bool) (flashDecodePlan, error) {
	v, err := flashDecodeVersionEnv()
	if err != nil {
		return flashDecodePlan{}, err
	}
	return planFlashDecodeAs(v, dt, bh, sq, sk, dim, causal)
}

// planFlashDecodeAs lays out a decode launch of version v.
//
// v1: chunks aim at flashDecodeV1CTAs CTAs in all.
//
// v2: the chunk count is the largest that keeps the grid within one wave of
// resident CTAs (flashDecodeSMs × flashDecodeWave, at most what its ring
// lets reside), so that every
// CTA starts at once, scans the same number of tiles and the K/V stream
// keeps all of them busy to the end (the reads are bound by DRAM, not by
// any one SM, so CTAs with equal work finish together however they are
// spread over the SMs). A bh count that fills the slots alone runs one
// chunk per row, with no partials at all.
//
// Both: chunks of at least flashDecodeMinTiles tiles, no chunk empty, at
// most flashDecodeMaxSplits.
func planFlashDecodeAs(v flashDecodeVersion, dt GemmType, bh, sq, sk, dim int, causal bool) (flashDecodePlan, error) {
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
	if _, ok := flashDecodeMaxStages[dim]; !ok {
		return p, fmt.Errorf("cuda: flash decode: head dim %d not supported (64, 128)", dim)
	}
	if sq > flashDecodeRows {
		return p, fmt.Errorf("cuda: flash decode: %d query rows, at most %d", sq, flashDecodeRows)
	}
	if err := checkFlashShape(bh, sq, sk, dim); err != nil {
		return p, err
	}
	p.version = v
	p.kernel = fmt.Sprintf("flash_decode_%s_d%d", suffix, dim)
	p.combine = "flash_decode_combine_" + suffix
	p.tiles = (flashDecodeKeyRange(sq, sk, causal) + flashDecodeKeys - 1) / flashDecodeKeys
	var splits int
	switch v {
	case flashDecodeV1:
		p.setStages(dim, flashDecodeV1Stages[dim])
		splits = (flashDecodeV1CTAs + bh - 1) / bh
	case flashDecodeV2:
		p.flags = flashDecodeFlagsV2
		p.setStages(dim, flashDecodeStages[dim])
		splits = flashDecodeSMs * min(flashDecodeResident(dim, p.stages), flashDecodeWave[dim]) / bh
		if bh > flashDecodeMaxTickets {
			splits = 1
		}
	default:
		return p, fmt.Errorf("cuda: flash decode: no version %d", v)
	}
	p.split(bh, sq, dim, min(splits, p.tiles/flashDecodeMinTiles))
	return p, nil
}

// setStages sets the ring depth (clamped to what the kernels take) and the
// shared memory it needs.
func (p *flashDecodePlan) setStages(dim, stages int) {
	p.stages = max(2, min(stages, flashDecodeMaxStages[dim]))
	p.smem = flashDecodeSmem(dim, p.stages)
}

// split cuts p.tiles into at most splits chunks (at least one, at most
// flashDecodeMaxSplits) of equal whole tiles, none empty, and sizes the
// workspace: none for a fused launch of one chunk.
func (p *flashDecodePlan) split(bh, sq, dim, splits int) {
	splits = max(1, min(splits, p.tiles, flashDecodeMaxSplits))
	p.tilesPerSplit = max(1, (p.tiles+splits-1)/splits)
	p.splits = max(1, (p.tiles+p.tilesPerSplit-1)/p.tilesPerSplit)
	p.oBytes, p.lseBytes = 0, 0
	if p.flags&flashDecodeFused == 0 || p.splits > 1 {
		p.oBytes = ((bh*p.splits*sq*dim*4 + 255) / 256) * 256
		p.lseBytes = bh * p.splits * sq * 4
	}
}

func (p flashDecodePlan) workspaceBytes() int { return p.oBytes + p.lseBytes }

// String names the launch for tables and logs, e.g. "v2 2x32 r3" (version,
// chunks × tiles of 64 keys, ring depth; "+pf" with the prefetch hint).
func (p flashDecodePlan) String() string {
	s := fmt.Sprintf("%v %dx%d r%d", p.version, p.splits, p.tilesPerSplit, p.stages)
	if p.flags&flashDecodePF256 != 0 {
		s += "+pf"
	}
	return s
}

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

// flashDecodeVersionEnv reads FlashDecodeKernelEnv.
func flashDecodeVersionEnv() (flashDecodeVersion, error) {
	switch env := os.Getenv(FlashDecodeKernelEnv); env {
	case "", "v2":
		return flashDecodeV2, nil
	case "v1":
		return flashDecodeV1, nil
	default:
		return 0, fmt.Errorf("cuda: %s=%q: want v2 or unset (one wave, fused combine) or v1 (separate combine kernel)", FlashDecodeKernelEnv, env)
	}
}

// FlashForwardWorkspaceBytes is the device scratch FlashForwardWS needs for
// these arguments: the decode forward's partial results where
// flashDecodeApplies, else 0. It reads neither FlashDecodeEnv nor
// FlashDecodeKernelEnv: it is the larger of the two versions' needs, so a
// plan sized by it holds whichever forward runs.
func FlashForwardWorkspaceBytes(dt GemmType, bh, sq, sk, dim int, scale float32, causal bool) int {
	if !flashDecodeApplies(dt, sq, sk, dim, scale, causal) {
		return 0
	}
	n := 0
	for _, v := range []flashDecodeVersion{flashDecodeV1, flashDecodeV2} {
		p, err := planFlashDecodeAs(v, dt, bh, sq, sk, dim, causal)
		if err != nil {
			return 0 // FlashForwardWS reports it
		}
		n = max(n, p.workspaceBytes())
	}
	return n
}

// FlashDecodeChoice says which forward FlashForward runs for these
// arguments, for benchmark tables: "" where the decode forward does not
// apply or FlashDecodeEnv turns it off, else the decode launch, e.g.
// "v2 2x32 r3" (version, chunks × tiles of 64 keys per chunk, ring depth).
func FlashDecodeChoice(dt GemmType, bh, sq, sk, dim int, scale float32, causal bool) (string, error) {
	if !flashDecodeApplies(dt, sq, sk, dim, scale, causal) {
		return "", nil
	}
	if on, err := flashDecodeOn(); err != nil || !on {
		return "", err
	}
	p, err := planFlashDecode(dt, bh, sq, sk, dim, causal)
	if err != nil {
		return "", err
	}
	return p.String(), nil
}

// flashForwardDecode launches the decode kernel (and, for v1, the combine);
// workspace holds p.workspaceBytes() bytes (it may be 0 when that is 0).
func flashForwardDecode(d *Device, p flashDecodePlan, q, k, v, o, lse, workspace DevicePtr, bh, group, sq, sk, dim int, scale float32, causal bool) error {
	ks, err := flashKernelSet(d)
	if err != nil {
		return err
	}
	f, err := ks.Fn(p.kernel, p.smem)
	if err != nil {
		return err
	}
	if p.flags&flashDecodeFused != 0 && p.splits > 1 && bh > flashDecodeMaxTickets {
		return fmt.Errorf("cuda: flash decode: %d chunks of %d bh rows, the fused combine takes at most %d", p.splits, bh, flashDecodeMaxTickets)
	}
	var opart, lpart DevicePtr
	if p.workspaceBytes() > 0 {
		opart, lpart = workspace, workspace.Offset(p.oBytes)
	}
	if err := d.Launch(f, [3]uint32{uint32(bh), uint32(p.splits), 1}, [3]uint32{32 * flashDecodeWarps, 1, 1}, uint32(p.smem),
		q, k, v, o, lse, opart, lpart, int32(bh), int32(sq), int32(sk), int32(p.splits), int32(p.tilesPerSplit), scale, b2i(causal),
		int32(p.flags), int32(p.stages), int32(group)); err != nil {
		return err
	}
	if p.flags&flashDecodeFused != 0 {
		return nil
	}
	comb, err := ks.Fn(p.combine, 0)
	if err != nil {
		return err
	}
	return d.Launch(comb, [3]uint32{uint32(bh * sq), 1, 1}, [3]uint32{flashDecodeCombineThreads, 1, 1}, 0,
		opart, lpart, o, lse, int32(bh), int32(sq), int32(dim), int32(p.splits))
}

// withWorkspace runs f on workspace, or when it is 0 on n fresh bytes that
// it frees after waiting for the device (or on no memory when n is 0).
func withWorkspace(d *Device, workspace DevicePtr, n int, f func(DevicePtr) error) error {
	if workspace != 0 || n == 0 {
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
