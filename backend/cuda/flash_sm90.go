package cuda

// Launcher for kernels/flash_attention_sm90.cu: the Hopper (sm_90a, wgmma)
// FlashAttention forward. Same layout, masking and LSE contract as
// FlashForward's FA2 kernels (flash.go); FlashForward runs it instead of FA2
// when flashSM90Pick says so.

import (
	"fmt"
	"os"
	"sync"
)

const flashSM90File = "flash_attention_sm90.cu"

// FlashSM90Env selects the Hopper forward: "1" runs it on a compute
// capability 9.0 device for bf16/fp16 with head dim 64 or 128, "0" or unset
// keeps FA2. It is opt-in until the kernel has been checked and timed on an
// H200.
const FlashSM90Env = "FLASHGRAPH_FLASH_SM90"

// The sm90 forward's tiling, as flash_attention_sm90.cu fixes it: a CTA of two
// warpgroups owns 128 query rows; K/V tiles of 128 keys, double-buffered.
const (
	flashSM90Rows    = 128
	flashSM90Keys    = 128
	flashSM90Threads = 256
)

// flashSM90Smem is the forward's dynamic shared memory: the Q tile, two K and
// two V tiles (16-bit), and 1024 bytes to align the start to a swizzle block.
func flashSM90Smem(dim int) int { return (flashSM90Rows+4*flashSM90Keys)*dim*2 + 1024 }

// flashSM90Name is the sm90 forward kernel for dt and dim ("" when there is
// none). variant "" is the one FlashForward runs; for d128 the GPU test also
// runs "vsplit" (O += P·V as n64 halves) and "vswap" (V's descriptor offsets
// exchanged), which tell a wrong V descriptor apart from other faults.
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
	name := fmt.Sprintf("flash_fwd_sm90_%s_d%d", suffix, dim)
	if variant != "" {
		if dim != 128 {
			return ""
		}
		name += "_" + variant
	}
	return name
}

// flashSM90Pick says which sm90 forward kernel FlashForward runs ("" for
// FA2): only when env (the value of FlashSM90Env) asks for it, the device is
// compute capability 9.0 (the cubin is sm_90a) and the kernel exists for dt
// and dim; scale must be positive, as for FA2's tensor-core kernels.
func flashSM90Pick(ccMajor, ccMinor int, dt GemmType, dim int, scale float32, env string) (string, error) {
	switch env {
	case "", "0":
		return "", nil
	case "1":
	default:
		return "", fmt.Errorf("cuda: %s=%q: want 1 (Hopper forward) or 0 (FA2)", FlashSM90Env, env)
	}
	if ccMajor != 9 || ccMinor != 0 || !(scale > 0) {
		return "", nil
	}
	return flashSM90Name(dt, dim, ""), nil
}

// flashSM90Kernels caches the compiled flash_attention_sm90.cu per device.
var flashSM90Kernels struct {
	mu sync.Mutex
	m  map[*Device]*kernelSet
}

func (d *Device) flashSM90Kernels() (*kernelSet, error) {
	flashSM90Kernels.mu.Lock()
	defer flashSM90Kernels.mu.Unlock()
	if ks, ok := flashSM90Kernels.m[d]; ok {
		return ks, nil
	}
	if maj, mnr := d.ComputeCapability(); maj != 9 || mnr != 0 {
		return nil, fmt.Errorf("cuda: %s needs compute capability 9.0 (sm_90a), device has %d.%d", flashSM90File, maj, mnr)
	}
	ks, err := compileKernelSet(d, flashSM90File)
	if err != nil {
		return nil, err
	}
	if flashSM90Kernels.m == nil {
		flashSM90Kernels.m = map[*Device]*kernelSet{}
	}
	flashSM90Kernels.m[d] = ks
	return ks, nil
}

// flashForwardSM90 launches the sm90 forward kernel name (see flashSM90Name).
func flashForwardSM90(d *Device, name string, q, k, v, o, lse DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	ks, err := d.flashSM90Kernels()
	if err != nil {
		return err
	}
	smem := flashSM90Smem(dim)
	f, err := ks.fn(name, smem)
	if err != nil {
		return err
	}
	grid := [3]uint32{uint32(bh), uint32((sq + flashSM90Rows - 1) / flashSM90Rows), 1}
	block := [3]uint32{flashSM90Threads, 1, 1}
	return d.Launch(f, grid, block, uint32(smem), q, k, v, o, lse, int32(bh), int32(sq), int32(sk), scale, b2i(causal))
}

// flashSM90Choice is flashSM90Pick for d and the environment.
func flashSM90Choice(d *Device, dt GemmType, dim int, scale float32) (string, error) {
	maj, mnr := d.ComputeCapability()
	return flashSM90Pick(maj, mnr, dt, dim, scale, os.Getenv(FlashSM90Env))
}
