package attention

// Launchers for the Hopper (sm_90a: wgmma, TMA) FlashAttention kernels:
// kernels/flash_sm90_fwd.cu's forwards and kernels/flash_sm90_bwd.cu's
// backwards, which FlashForward and FlashBackward run instead of FA2's when
// flashSM90Pick and flashSM90BwdPick say so, and the variants of
// kernels/dev/flash_sm90_dev.cu, kept to time against. Same layout, masking
// and LSE contract as FA2's kernels (flash.go).

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/flashgraph/flashgraph/backend/cuda/driver"
)

// The sm90 compile units (see package kernels): the forward and the
// backward the dispatcher selects, each compiled on its first use, and the
// variants kept only to time against, compiled only when one is asked for by
// name (flashSM90UnitOf).
const (
	flashSM90FwdFile = "flash_sm90_fwd.cu"
	flashSM90BwdFile = "flash_sm90_bwd.cu"
	flashSM90DevFile = "dev/flash_sm90_dev.cu"
)

// flashSM90DevFwd and flashSM90DevBwd are the forward and backward variants
// of flashSM90DevFile; every other variant is flashSM90FwdFile's or
// flashSM90BwdFile's.
var (
	flashSM90DevFwd = []string{"warpspec", "pingpong", "pingpong3wg"}
	flashSM90DevBwd = []string{"pipelined", "baseline"}
)

// flashSM90UnitOf is the compile unit that defines the sm90 kernel name.
func flashSM90UnitOf(name string) string {
	if rest, ok := strings.CutPrefix(name, "flash_fwd_sm90_"); ok {
		if v, _, _ := strings.Cut(rest, "_"); slices.Contains(flashSM90DevFwd, v) {
			return flashSM90DevFile
		}
		return flashSM90FwdFile
	}
	rest := strings.TrimPrefix(name, "flash_bwd_sm90_")
	if v, _, _ := strings.Cut(rest, "_"); slices.Contains(flashSM90DevBwd, v) {
		return flashSM90DevFile
	}
	return flashSM90BwdFile
}

// FlashSM90Env chooses the forward on a compute capability 9.0 device for
// bf16/fp16 with head dim 64 or 128: unset or "1", the default for the
// shape (flashSM90DefaultFor); "0", FA2; or a variant by name:
//   - "persistent": two consumer warpgroups (128 query rows) taking turns at
//     the tensor cores (ping-pong), each overlapping the softmax of its next
//     K/V tile with the P·V of this one, in a CTA per SM that walks the
//     (head, query block) tiles and loads the next one's Q and K/V while it
//     finishes this one;
//   - "persistent3wg": the same with three consumer warpgroups (192 rows)
//     and no overlap inside a warpgroup; D=64 only ("persistent" at D=128,
//     where their registers do not fit).
//   - kept to time against (kernels/dev, compiled only when named):
//     "pingpong" and "pingpong3wg", the same without the persistent CTAs
//     (one CTA per query block); "warpspec", a producer warpgroup loading
//     with TMA and two consumer warpgroups that never wait on each other.
//
// The former names (BENCHMARKS.md's runs use them) still work:
// flashSM90FwdRenamed. Other devices, dtypes and head dims always run FA2.
// Every forward writes the LSE the backward reads the same way (natural log,
// +inf for a row that sees no key).
const FlashSM90Env = "FLASHGRAPH_FLASH_SM90"

// flashSM90FwdRenamed maps the forward variants' former names to theirs.
var flashSM90FwdRenamed = map[string]string{
	"ppp": "persistent", "ppp3": "persistent3wg", "pp": "pingpong", "pp3": "pingpong3wg", "tma": "warpspec",
}

// flashSM90Default is the kernel FlashSM90Env selects when unset or "1",
// unless a rule of flashSM90DefaultRules matches the shape: the persistent
// forwards beat the non-persistent ones at every shape timed (short
// sequences most: they load the next tile while finishing this one), and
// three warpgroups beat two at D=64 (BENCHMARKS.md, "Measurements the
// Hopper kernels' comments cite").
const flashSM90Default = "persistent3wg"

// flashSM90DefaultRules are the shapes where the default forward is another
// kernel than flashSM90Default: the first rule whose head dim and causality
// match and whose maxSq is at least Sq names it.
var flashSM90DefaultRules = []struct {
	dim     int
	causal  bool
	maxSq   int
	variant string
}{
	// Three warpgroups' 192-row tiles leave causal attention with few,
	// unequal tiles per head at short sequences: two warpgroups win there
	// up to S=1024 (BenchmarkFlashSM90CausalSchedule; BENCHMARKS.md).
	{64, true, 1024, "persistent"},
}

// flashSM90DefaultFor is the forward variant the default runs for a shape.
func flashSM90DefaultFor(dim, sq int, causal bool) string {
	for _, r := range flashSM90DefaultRules {
		if r.dim == dim && r.causal == causal && sq <= r.maxSq {
			return r.variant
		}
	}
	return flashSM90Default
}

// The warpspec forward's tiling, as kernels/dev/flash_sm90_dev.cu fixes it:
// a CTA of two consumer warpgroups and a producer warpgroup owns 128 query
// rows; K/V tiles of 128 keys (every sm90 forward's), double-buffered.
const (
	flashSM90Rows            = 128
	flashSM90Keys            = 128
	flashSM90WarpSpecThreads = 384
)

// flashSM90WarpSpecSmem is the warpspec forward's dynamic shared memory: the
// Q tile, two K and two V tiles (16-bit), 64 bytes of mbarriers and 1024 bytes to
// align the start to a swizzle block.
func flashSM90WarpSpecSmem(dim int) int { return (flashSM90Rows+4*flashSM90Keys)*dim*2 + 64 + 1024 }

// flashSM90PingPong is the tiling of a ping-pong forward (fwd_persistent in
// kernels/flash_sm90_fwd.cuh, fwd_pingpong in kernels/dev/flash_sm90_dev.cu)
// as its entry points fix it: consumer warpgroups of 64 query rows each, the
// depth of the K and V rings, and whether it is persistent (a CTA per SM
// walking the tiles).
type flashSM90PingPong struct {
	warpgroups, stages int
	persistent         bool
}

// flashSM90PingPongOf is the tiling of the ping-pong kernel of variant
// ("persistent", "persistent3wg", "pingpong" or "pingpong3wg") at dim: D=64
// tiles take half the shared memory of D=128 ones, so its rings hold four
// instead of two.
func flashSM90PingPongOf(variant string, dim int) flashSM90PingPong {
	t := flashSM90PingPong{warpgroups: 2, stages: 2}
	if dim == 64 {
		t.stages = 4
		if strings.HasSuffix(variant, "3wg") {
			t.warpgroups = 3
		}
	}
	t.persistent = strings.HasPrefix(variant, "persistent")
	return t
}

func (t flashSM90PingPong) rows() int    { return 64 * t.warpgroups }
func (t flashSM90PingPong) threads() int { return 128 * (t.warpgroups + 1) }

// smem is the kernel's dynamic shared memory: the Q tile, STAGES K and V
// tiles (16-bit), 1 + 4·STAGES mbarriers and 1024 bytes to align the start
// to a swizzle block; when persistent, two Q tiles (one for even and one for
// odd tiles, see fwd_persistent), an O tile (the rows of a Q tile, see
// persistent_store), 4·STAGES + 4 mbarriers and two 16-byte tile slots
// instead.
func (t flashSM90PingPong) smem(dim int) int {
	kv := 2 * t.stages * flashSM90Keys * dim * 2
	if t.persistent {
		return 3*t.rows()*dim*2 + kv + 8*(4*t.stages+4) + 16*2 + 1024
	}
	return t.rows()*dim*2 + kv + 8*(1+4*t.stages) + 1024
}

// flashSM90Name is the sm90 forward kernel for dt and dim ("" when there is
// none) of variant (see FlashSM90Env); at D=128 "persistent3wg" is
// "persistent" and "pingpong3wg" "pingpong".
func flashSM90Name(dt GemmType, dim int, variant string) string {
	var suffix string
	switch dt {
	case GemmBF16:
		suffix = "bf16"
	case GemmF16:
		suffix = "fp16"
	default:
		return ""
	}
	if dim != 64 && dim != 128 {
		return ""
	}
	if dim == 128 {
		switch variant {
		case "pingpong3wg":
			variant = "pingpong"
		case "persistent3wg":
			variant = "persistent"
		}
	}
	if !slices.Contains(flashSM90FwdVariants, variant) {
		return ""
	}
	return fmt.Sprintf("flash_fwd_sm90_%s_%s_d%d", variant, suffix, dim)
}

// flashSM90FwdVariants are the forward variants flashSM90Name knows (see
// FlashSM90Env).
var flashSM90FwdVariants = []string{"warpspec", "pingpong", "pingpong3wg", "persistent", "persistent3wg"}

// flashSM90Pick says which sm90 forward kernel FlashForward runs ("" for
// FA2): the one env (the value of FlashSM90Env) names, the default when it is
// unset, none when it is "0"; only on compute capability 9.0 (the cubin is
// sm_90a) and when the kernel exists for dt and dim; scale must be positive,
// as for FA2's tensor-core kernels.
func flashSM90Pick(ccMajor, ccMinor int, dt GemmType, dim, sq int, causal bool, scale float32, env string) (string, error) {
	variant := ""
	switch env {
	case "0":
		return "", nil
	case "", "1":
		variant = flashSM90DefaultFor(dim, sq, causal)
	default:
		if v, ok := flashSM90FwdRenamed[env]; ok {
			env = v
		}
		if !slices.Contains(flashSM90FwdVariants, env) {
			return "", fmt.Errorf("cuda: %s=%q: want 1 or unset (the default Hopper forward for the shape), persistent, persistent3wg, pingpong, pingpong3wg, warpspec (the last three kept to time against) or 0 (FA2)", FlashSM90Env, env)
		}
		variant = env
	}
	if ccMajor != 9 || ccMinor != 0 || !(scale > 0) {
		return "", nil
	}
	return flashSM90Name(dt, dim, variant), nil
}

// flashSM90Kernels caches each compiled sm90 unit (flashSM90FwdFile,
// flashSM90BwdFile, flashSM90DevFile) per device, or why it could not be
// compiled (so a default choice that falls back to FA2 does not recompile on
// every call). Each unit compiles on first use: a forward-only run never
// compiles the backward, and only a variant asked for by name the dev unit.
var flashSM90Kernels struct {
	mu   sync.Mutex
	m    map[flashSM90Unit]*driver.KernelSet
	errs map[flashSM90Unit]error
}

type flashSM90Unit struct {
	d    *Device
	file string
}

func flashSM90KernelSet(d *Device, file string) (*driver.KernelSet, error) {
	flashSM90Kernels.mu.Lock()
	defer flashSM90Kernels.mu.Unlock()
	u := flashSM90Unit{d, file}
	if ks, ok := flashSM90Kernels.m[u]; ok {
		return ks, nil
	}
	if err, ok := flashSM90Kernels.errs[u]; ok {
		return nil, err
	}
	ks, err := compileFlashSM90(d, file)
	if err != nil {
		if flashSM90Kernels.errs == nil {
			flashSM90Kernels.errs = map[flashSM90Unit]error{}
		}
		flashSM90Kernels.errs[u] = err
		return nil, err
	}
	if flashSM90Kernels.m == nil {
		flashSM90Kernels.m = map[flashSM90Unit]*driver.KernelSet{}
	}
	flashSM90Kernels.m[u] = ks
	return ks, nil
}

func compileFlashSM90(d *Device, file string) (*driver.KernelSet, error) {
	if maj, mnr := d.ComputeCapability(); maj != 9 || mnr != 0 {
		return nil, fmt.Errorf("cuda: %s needs compute capability 9.0 (sm_90a), device has %d.%d", file, maj, mnr)
	}
	return driver.CompileKernelSet(d, file)
}

// flashForwardSM90 launches the sm90 forward kernel name (see flashSM90Name);
// K and V have bh/group heads. Only the persistent forwards take grouped
// K/V heads (the warpspec and pingpong ones of kernels/dev, kept to time
// against, refuse group > 1).
func flashForwardSM90(d *Device, name string, q, k, v, o, lse DevicePtr, bh, group, sq, sk, dim int, scale float32, causal bool) error {
	ks, err := flashSM90KernelSet(d, flashSM90UnitOf(name))
	if err != nil {
		return err
	}
	if strings.HasPrefix(name, "flash_fwd_sm90_persistent") {
		return flashForwardSM90Persistent(d, ks, name, q, k, v, o, lse, bh, group, sq, sk, dim, scale, causal)
	}
	if group != 1 {
		return fmt.Errorf("cuda: %s: no grouped K/V heads (group %d); the persistent sm90 forwards take them", name, group)
	}
	if strings.HasPrefix(name, "flash_fwd_sm90_warpspec") {
		return flashForwardSM90WarpSpec(d, ks, name, q, k, v, o, lse, bh, sq, sk, dim, scale, causal)
	}
	if strings.HasPrefix(name, "flash_fwd_sm90_pingpong") {
		return flashForwardSM90PingPong(d, ks, name, q, k, v, o, lse, bh, sq, sk, dim, scale, causal)
	}
	return fmt.Errorf("cuda: %s: no such sm90 forward", name)
}

// flashMaxGridY is the largest grid y dimension a launch may have.
const flashMaxGridY = 65535

// flashHeadChunks calls launch for consecutive ranges [h0, h0+n) of the bh
// heads, each at most flashMaxGridY long and a whole number of groups of
// group heads (the query heads of one K/V head: K/V head h0/group starts a
// range; group 1 for multi-head attention). The sm90 kernels take the head
// from grid y and the query (forward) or key (backward) block from grid x,
// so that the CTAs resident together work on a few heads and share their K
// and V (forward) or Q, dO and dQaccum (backward) in L2; with the head on
// grid x, as before, each of the 132 resident CTAs streamed a different
// head's tensors from DRAM. (The causal backwards regroup their CTAs a
// little, a few heads at a time: see bwd_tile in the .cu.)
func flashHeadChunks(bh, group int, launch func(h0, n int) error) error {
	chunk := flashMaxGridY / group * group
	for h0 := 0; h0 < bh; h0 += chunk {
		if err := launch(h0, min(chunk, bh-h0)); err != nil {
			return err
		}
	}
	return nil
}

// flashHeadOffset is the byte offset of head h0 in a [bh, rows, pipelined]
// tensor of elem-byte elements.
func flashHeadOffset(h0, rows, pipelined, elem int) DevicePtr {
	return DevicePtr(h0 * rows * pipelined * elem)
}

// flashSM90Choice is flashSM90Pick for d and the environment. When the
// variable is unset and the Hopper kernels cannot run here (NVRTC older than
// 12.0 cannot target sm_90a; a driver without cuTensorMapEncodeTiled cannot
// encode the TMA maps), FA2 runs instead; a kernel asked for by name fails
// with the reason.
func flashSM90Choice(d *Device, dt GemmType, dim, sq int, causal bool, scale float32) (string, error) {
	maj, mnr := d.ComputeCapability()
	env := os.Getenv(FlashSM90Env)
	name, err := flashSM90Pick(maj, mnr, dt, dim, sq, causal, scale, env)
	if err != nil || name == "" || env != "" {
		return name, err
	}
	if _, err := flashSM90KernelSet(d, flashSM90UnitOf(name)); err != nil || !d.HasTensorMaps() {
		return "", nil
	}
	return name, nil
}

// flashForwardSM90WarpSpec launches a TMA forward: tensor maps of Q, K, V, then
// O, LSE and the sizes.
func flashForwardSM90WarpSpec(d *Device, ks *driver.KernelSet, name string, q, k, v, o, lse DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	smem := flashSM90WarpSpecSmem(dim)
	f, err := ks.Fn(name, smem)
	if err != nil {
		return err
	}
	return flashHeadChunks(bh, 1, func(h0, n int) error {
		qo, ko, lo := flashHeadOffset(h0, sq, dim, 2), flashHeadOffset(h0, sk, dim, 2), flashHeadOffset(h0, sq, 1, 4)
		grid := [3]uint32{uint32((sq + flashSM90Rows - 1) / flashSM90Rows), uint32(n), 1}
		maps := []flashTMATensor{{q + qo, sq, flashSM90Rows, 0}, {k + ko, sk, flashSM90Keys, 0}, {v + ko, sk, flashSM90Keys, 0}}
		return launchFlashTMA(d, f, name, grid, flashSM90WarpSpecThreads, smem, n, dim, maps,
			[]any{o + qo, lse + lo, int32(n), int32(sq), int32(sk), scale, b2i(causal)})
	})
}

// flashForwardSM90PingPong launches a ping-pong forward (flash_fwd_sm90_pingpong*_*):
// the arguments of the TMA kernels, with the Q map's box and the grid sized
// to its rows per CTA.
func flashForwardSM90PingPong(d *Device, ks *driver.KernelSet, name string, q, k, v, o, lse DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	variant, _, _ := strings.Cut(strings.TrimPrefix(name, "flash_fwd_sm90_"), "_")
	t := flashSM90PingPongOf(variant, dim)
	smem := t.smem(dim)
	f, err := ks.Fn(name, smem)
	if err != nil {
		return err
	}
	return flashHeadChunks(bh, 1, func(h0, n int) error {
		qo, ko, lo := flashHeadOffset(h0, sq, dim, 2), flashHeadOffset(h0, sk, dim, 2), flashHeadOffset(h0, sq, 1, 4)
		grid := [3]uint32{uint32((sq + t.rows() - 1) / t.rows()), uint32(n), 1}
		maps := []flashTMATensor{{q + qo, sq, t.rows(), 0}, {k + ko, sk, flashSM90Keys, 0}, {v + ko, sk, flashSM90Keys, 0}}
		return launchFlashTMA(d, f, name, grid, t.threads(), smem, n, dim, maps,
			[]any{o + qo, lse + lo, int32(n), int32(sq), int32(sk), scale, b2i(causal)})
	})
}

// flashSM90PersistentGrid, when positive, is the grid of the persistent
// forwards instead of one CTA per SM: tests set it small so that each CTA
// walks many tiles of different lengths.
var flashSM90PersistentGrid int

// flashSM90PersistentGridFor is the grid of a persistent forward (fwd_persistent)
// over bh heads of sq query rows, rows per tile: one CTA per SM (sms), or
// fewer where there are fewer work items (tiles; pairs of tiles for the
// static causal schedule), or flashSM90PersistentGrid. The kernel indexes
// tiles with int: it fails if the last index it forms does not fit.
func flashSM90PersistentGridFor(bh, sq, rows, sms int, causal, dynamic bool) (int, error) {
	tiles := int64(bh) * int64((sq+rows-1)/rows)
	items := tiles
	if causal && !dynamic {
		items = (tiles + 1) / 2
	}
	if sms <= 0 {
		sms = flashDecodeSMs // the H200's, as flash decode plans for
	}
	grid := int64(sms)
	if flashSM90PersistentGrid > 0 {
		grid = int64(flashSM90PersistentGrid)
	}
	grid = max(min(grid, items), 1)
	// The last flat index a CTA forms is below tiles + 2·grid.
	if tiles+2*grid > math.MaxInt32 {
		return 0, fmt.Errorf("cuda: persistent sm90 forward: %d heads × %d query blocks is too many tiles for the kernel's int indices", bh, tiles/int64(max(bh, 1)))
	}
	return int(grid), nil
}

// FlashSM90SchedEnv chooses how the persistent forwards (persistent, persistent3wg) hand
// out their tiles: "dynamic", each CTA drawing its next tile from a counter
// in device memory (causal: the longest tiles first, heads in sections of
// flashSM90SectionHeads), or "static", each CTA walking a fixed stride
// (causal: in pairs of a long and a short tile). Unset: dynamic for causal
// attention, whose tiles differ in length, static otherwise.
const FlashSM90SchedEnv = "FLASHGRAPH_FLASH_SM90_SCHED"

// flashSM90Dynamic says whether the persistent forward draws its tiles
// from the counter, for causal or non-causal attention, given the value of
// FlashSM90SchedEnv.
func flashSM90Dynamic(causal bool, env string) (bool, error) {
	switch env {
	case "":
		return causal, nil
	case "dynamic":
		return true, nil
	case "static":
		return false, nil
	}
	return false, fmt.Errorf("cuda: %s=%q: want dynamic or static (unset: dynamic for causal attention)", FlashSM90SchedEnv, env)
}

// flashSM90SectionHeadsOverride, when positive, is the heads of a causal
// section instead of flashSM90SectionHeads' count: tests set it small so
// that the sections' bounds are crossed.
var flashSM90SectionHeadsOverride int

// flashSM90SectionHeads is how many heads the dynamic causal schedule walks
// together, heaviest tiles first: about 4096/dim (64 at D=64, 32 at D=128),
// spread evenly over the sections (a short last section starts its long
// tiles late: 15 heads a section of 64 ran slower than 16), at least one,
// at most bh. Sections of 16 to 96 heads ran alike and faster than the
// static pairs; 2 to 8 heads were slower (the heaviest tiles of too few
// heads do not fill the GPU): BenchmarkFlashSM90CausalSchedule,
// BENCHMARKS.md.
func flashSM90SectionHeads(bh, dim int) int {
	bh = max(bh, 1)
	nh := max(4096/max(dim, 1), 1)
	if flashSM90SectionHeadsOverride > 0 {
		nh = flashSM90SectionHeadsOverride
	}
	sections := (bh + nh - 1) / nh
	return (bh + sections - 1) / sections
}

// flashForwardSM90Persistent launches a persistent ping-pong forward
// (flash_fwd_sm90_persistent*_*: persistent, persistent3wg): the arguments of the other ping-pong
// kernels and the schedule (the counters or 0, the heads of a causal
// section), all heads in one launch (the grid is 1-D, so flashHeadChunks'
// limit on grid y does not apply), a CTA per SM.
func flashForwardSM90Persistent(d *Device, ks *driver.KernelSet, name string, q, k, v, o, lse DevicePtr, bh, group, sq, sk, dim int, scale float32, causal bool) error {
	variant, _, _ := strings.Cut(strings.TrimPrefix(name, "flash_fwd_sm90_"), "_")
	t := flashSM90PingPongOf(variant, dim)
	smem := t.smem(dim)
	dynamic, err := flashSM90Dynamic(causal, os.Getenv(FlashSM90SchedEnv))
	if err != nil {
		return err
	}
	grid, err := flashSM90PersistentGridFor(bh, sq, t.rows(), d.SMCount(), causal, dynamic)
	if err != nil {
		return err
	}
	var sched DevicePtr
	if dynamic {
		if sched, err = d.FlashSM90Sched(); err != nil {
			return err
		}
	}
	f, err := ks.Fn(name, smem)
	if err != nil {
		return err
	}
	// O is stored with TMA too, a warpgroup's 64 rows a box.
	// K and V span the bh/group K/V heads.
	maps := []flashTMATensor{{q, sq, t.rows(), 0}, {k, sk, flashSM90Keys, bh / group}, {v, sk, flashSM90Keys, bh / group}, {o, sq, 64, 0}}
	return launchFlashTMA(d, f, name, [3]uint32{uint32(grid), 1, 1}, t.threads(), smem, bh, dim, maps,
		[]any{lse, int32(bh), int32(sq), int32(sk), scale, b2i(causal), sched, int32(flashSM90SectionHeads(bh, dim)), int32(group)})
}

// flashTMATensor is one [heads, rows, dim] tensor a TMA kernel reads, and
// the rows of its box; heads 0 is the launch's bh (K and V of grouped-query
// attention have fewer).
type flashTMATensor struct {
	ptr           DevicePtr
	rows, boxRows int
	heads         int
}

// launchFlashTMA launches f with the tensor maps of maps, passed by value
// (128 bytes each, which Launch's 8-byte argument slots cannot carry), as its
// first parameters and args after them.
func launchFlashTMA(d *Device, f *Function, name string, grid [3]uint32, threads, smem, bh, dim int, maps []flashTMATensor, args []any) error {
	slots, err := driver.PackArgs(args)
	if err != nil {
		return err
	}
	nm := len(maps)
	err = d.Do(func() error {
		var pin runtime.Pinner
		defer pin.Unpin()
		// 16-word maps, the first on a 64-byte boundary (the encoder
		// requires it). Encoded here, on the device's thread with its context
		// current, like every other driver call.
		buf := make([]uint64, nm*16+8)
		pin.Pin(&buf[0])
		off := int((64 - uintptr(unsafe.Pointer(&buf[0]))%64) % 64 / 8)
		mw := buf[off : off+nm*16]
		for i, t := range maps {
			heads := bh
			if t.heads > 0 {
				heads = t.heads
			}
			if err := d.EncodeFlashTensorMap(unsafe.Pointer(&mw[16*i]), t.ptr, heads, t.rows, dim, t.boxRows); err != nil {
				return err
			}
		}
		pin.Pin(&slots[0])
		params := make([]uintptr, nm+len(slots))
		for i := range nm {
			params[i] = uintptr(unsafe.Pointer(&mw[16*i]))
		}
		for i := range slots {
			params[nm+i] = uintptr(unsafe.Pointer(&slots[i]))
		}
		pin.Pin(&params[0])
		return d.LaunchParamsRaw(f, [3]uint32{grid[0], grid[1], 1}, [3]uint32{uint32(threads), 1, 1}, uint32(smem), params)
	})
	if err != nil {
		return fmt.Errorf("cuda: Launch %s grid %v smem %d: %w", name, grid, smem, err)
	}
	return nil
}

// FlashSM90BwdEnv chooses FlashBackward's main kernel on a compute
// capability 9.0 device for bf16/fp16 with head dim 64 or 128: unset or "1",
// the default (flashSM90BwdDefaultFor: "pingpong" at D=64, "alternating" at
// D=128); "0", FA2's; or a variant by name:
//   - "pingpong" (D=64; elsewhere the default): a producer warpgroup loads
//     and hands dQ to the copy engine, the two consumer warpgroups take turns
//     at the tensor cores;
//   - "alternating" (D=128; elsewhere the default): two warpgroups that load
//     and reduce dQ themselves, each block's dQ product taken by one of them
//     in turn while the other goes on to the next block;
//   - kept to time against (kernels/dev, compiled only when named):
//     "pipelined", both warpgroups in every block's dQ product (its columns
//     split between them) with the next block's scores in flight during it;
//     "baseline", the same without either.
//
// The former names still work (flashSM90BwdRenamed). Why the defaults:
// BENCHMARKS.md, "Measurements the Hopper kernels' comments cite". The preprocessing (Dsum, zeroed
// dQaccum) and the dQ conversion are FA2's either way, the conversion told
// that the Hopper kernels leave dQaccum's column blocks permuted.
const FlashSM90BwdEnv = "FLASHGRAPH_FLASH_SM90_BWD"

// flashSM90BwdRenamed maps the backward variants' former names to theirs.
var flashSM90BwdRenamed = map[string]string{"pp": "pingpong", "alt": "alternating", "cols": "pipelined", "dqtma": "baseline"}

// The sm90 backward's tiling, as kernels/flash_sm90_bwd.cuh fixes it: a CTA of
// two (consumer) warpgroups owns 128 keys and walks the queries in blocks of
// 64.
const (
	flashSM90BwdKeys = 128
	flashSM90BwdRows = 64
)

// flashSM90BwdThreads is the block size of the backward variant: "pingpong"
// adds a producer warpgroup to the two consumer ones.
func flashSM90BwdThreads(variant string) int {
	if variant == "pingpong" {
		return 384
	}
	return 256
}

// flashSM90BwdSmem is the dynamic shared memory of the backward variant
// (see flashSM90BwdName): K and V tiles, three stages of Q and dO blocks, two
// dSᵀ tiles (16-bit), three stages of LSE and Dsum rows (float32), 64 bytes
// of mbarriers, 1024 bytes to align the start to a swizzle block, and the
// float32 dQ staging tiles of 64 rows × dim: at D=64 two for "pipelined"
// (one per block, double-buffered) and four for "baseline" and "pingpong"
// (block parity × warpgroup), at D=128 one (a second would not fit in the
// 227 KiB a block may have).
func flashSM90BwdSmem(dim int, variant string) int {
	k, r := flashSM90BwdKeys, flashSM90BwdRows
	n := 2*k*dim*2 + 6*r*dim*2 + 2*k*r*2 + 6*r*4 + 64 + 1024
	tiles := 1
	if dim == 64 && variant == "pipelined" {
		tiles = 2
	} else if dim == 64 {
		tiles = 4
	}
	return n + tiles*r*dim*4
}

// flashSM90BwdVariants are the backward variants flashSM90BwdName knows
// (see FlashSM90BwdEnv).
var flashSM90BwdVariants = []string{"pingpong", "alternating", "pipelined", "baseline"}

// flashSM90BwdHasDim says which head dims variant has a kernel for:
// "pingpong" D=64 only, "alternating" D=128 only, the others both.
func flashSM90BwdHasDim(variant string, dim int) bool {
	switch variant {
	case "pingpong":
		return dim == 64
	case "alternating":
		return dim == 128
	}
	return true
}

// flashSM90BwdName is the sm90 backward kernel for dt, dim and variant (see
// flashSM90BwdVariants; "" when there is none).
func flashSM90BwdName(dt GemmType, dim int, variant string) string {
	fwd := flashSM90Name(dt, dim, "warpspec")
	if fwd == "" || !slices.Contains(flashSM90BwdVariants, variant) || !flashSM90BwdHasDim(variant, dim) {
		return ""
	}
	return "flash_bwd_sm90_" + variant + "_" + strings.TrimPrefix(fwd, "flash_fwd_sm90_warpspec_")
}

// flashSM90BwdDefaultFor is the backward variant FlashBackward runs at head
// dim dim when FlashSM90BwdEnv is unset or "1" (see there).
func flashSM90BwdDefaultFor(dim int) string {
	if dim == 64 {
		return "pingpong"
	}
	return "alternating"
}

// flashSM90BwdPick says which sm90 backward kernel FlashBackward runs ("" for
// FA2's): the variant env (the value of FlashSM90BwdEnv) names, on compute
// capability 9.0, for a dt and dim it exists for and scale > 0.
func flashSM90BwdPick(ccMajor, ccMinor int, dt GemmType, dim int, scale float32, env string) (string, error) {
	variant := ""
	switch env {
	case "", "1":
		variant = flashSM90BwdDefaultFor(dim)
	case "0":
		return "", nil
	default:
		if v, ok := flashSM90BwdRenamed[env]; ok {
			env = v
		}
		if !slices.Contains(flashSM90BwdVariants, env) {
			return "", fmt.Errorf("cuda: %s=%q: want 1 (the default Hopper backward), pingpong (D=64), alternating (D=128), pipelined, baseline (both kept to time against) or 0 (FA2's)", FlashSM90BwdEnv, env)
		}
		variant = env
	}
	if ccMajor != 9 || ccMinor != 0 || !(scale > 0) {
		return "", nil
	}
	if name := flashSM90BwdName(dt, dim, variant); name != "" {
		return name, nil
	}
	// A variant without a kernel for this head dim (pingpong at D=128,
	// alternating at D=64) runs the default one.
	return flashSM90BwdName(dt, dim, flashSM90BwdDefaultFor(dim)), nil
}

// flashSM90BwdChoice is flashSM90BwdPick for d and the environment.
func flashSM90BwdChoice(d *Device, dt GemmType, dim int, scale float32) (string, error) {
	maj, mnr := d.ComputeCapability()
	return flashSM90BwdPick(maj, mnr, dt, dim, scale, os.Getenv(FlashSM90BwdEnv))
}

// flashBackwardSM90 launches the sm90 backward kernel name: dQaccum += dS·K
// (float32, zeroed before), dK, dV written. dsum and dqacc are
// FlashBackward's workspace after flash_bwd_pre_<T>.
// K, V, dK, dV have bh/group heads: a CTA owns a key block of a K/V head and
// loops over the group's query heads (grid y over the K/V heads). With
// perHeadDKV (the grouped backward run as multi-head attention, see
// flash_bwd_repeat.go), K and V still have bh/group heads but dK and dV have
// bh, one per query head: the multi-head build runs, a CTA per key block of
// a query head (grid y over the query heads), reading its group's K/V head in
// place (bwd_kv_load_head) and writing its own dK and dV, which the caller
// sums over each group.
func flashBackwardSM90(d *Device, name string, q, k, v, dO, lse, dsum, dqacc, dk, dv DevicePtr, bh, group, sq, sk, dim int, scale float32, causal, perHeadDKV bool) error {
	ks, err := flashSM90KernelSet(d, flashSM90UnitOf(name))
	if err != nil {
		return err
	}
	variant := ""
	for _, v := range flashSM90BwdVariants {
		if strings.HasPrefix(name, "flash_bwd_sm90_"+v+"_") {
			variant = v
		}
	}
	// Bulk copies need 16-byte aligned global addresses; a row of dQaccum is
	// dim*4 bytes, so the base decides.
	if dqacc%16 != 0 {
		return fmt.Errorf("cuda: %s: dQaccum at %#x is not 16-byte aligned (the workspace must be)", name, uint64(dqacc))
	}
	smem := flashSM90BwdSmem(dim, variant)
	if group > 1 && !perHeadDKV {
		// Multi-head attention runs the build without the group loop's
		// arithmetic (see bwd_block in kernels/flash_sm90_bwd.cuh).
		name += "_gqa"
	}
	f, err := ks.Fn(name, smem)
	if err != nil {
		return err
	}
	return flashHeadChunks(bh, group, func(h0, n int) error {
		qo, ko := flashHeadOffset(h0, sq, dim, 2), flashHeadOffset(h0/group, sk, dim, 2)
		lo, ao := flashHeadOffset(h0, sq, 1, 4), flashHeadOffset(h0, sq, dim, 4)
		nkv := n / group
		// The CTAs' heads (grid y), and dK's and dV's: the K/V heads, or
		// with perHeadDKV the query heads.
		ctaHeads, dkvo := nkv, ko
		if perHeadDKV {
			ctaHeads, dkvo = n, flashHeadOffset(h0, sk, dim, 2)
		}
		grid := [3]uint32{uint32((sk + flashSM90BwdKeys - 1) / flashSM90BwdKeys), uint32(ctaHeads), 1}
		// dK and dV are stored with TMA too, a warpgroup's 64 keys a box.
		maps := []flashTMATensor{{q + qo, sq, flashSM90BwdRows, 0}, {k + ko, sk, flashSM90BwdKeys, nkv}, {v + ko, sk, flashSM90BwdKeys, nkv}, {dO + qo, sq, flashSM90BwdRows, 0},
			{dk + dkvo, sk, 64, ctaHeads}, {dv + dkvo, sk, 64, ctaHeads}}
		return launchFlashTMA(d, f, name, grid, flashSM90BwdThreads(variant), smem, n, dim, maps,
			[]any{lse + lo, dsum + lo, dqacc + ao, int32(n), int32(sq), int32(sk), scale, b2i(causal), int32(group)})
	})
}
