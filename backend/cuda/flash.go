package cuda

// Launchers for kernels/flash_attention.cu: FlashAttention forward and backward.
// Layout: Q, O, dO, dQ are [bh, sq, dim]; K, V, dK, dV are [bh, sk, dim], all
// contiguous, of element type dt; LSE is float32 [bh, sq] (natural log). Causal
// masking is top-left aligned (key j visible to query i iff j <= i).

import (
	"fmt"
	"sync"
)

// flashPlan says which kernels of flash_attention.cu serve a dtype and head dim,
// and how to launch them.
type flashPlan struct {
	tensorCore bool
	suffix     string // "bf16", "fp16", "fp32"
	fwd        string
	bwd        string // tensor-core main kernel (empty on the generic path)
	fwdRows    int    // query rows per CTA (forward)
	fwdThreads int
	fwdSmem    int
	bwdKeys    int // keys per CTA (tensor-core backward)
	bwdThreads int
	bwdSmem    int
	genDQSmem  int
	genKVSmem  int
}

// planFlash picks the kernels for dt and dim: bf16/fp16 with dim 64 or 128 run on
// tensor cores (which need scale > 0); every other dim <= 256, float32 included,
// runs on the generic CUDA-core path.
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
	if dt != GemmF32 && (dim == 64 || dim == 128) && scale > 0 {
		p.tensorCore = true
		p.fwd = fmt.Sprintf("flash_fwd_%s_d%d", p.suffix, dim)
		p.bwd = fmt.Sprintf("flash_bwd_%s_d%d", p.suffix, dim)
		// Tiles as shipped in flash_attention.cu (see its header table).
		if dim == 64 {
			p.fwdRows, p.fwdThreads, p.fwdSmem = 128, 256, (128+2*128)*64*2
			br := 128
			p.bwdKeys, p.bwdThreads = 128, 256
			p.bwdSmem = 2*128*dim*2 + 4*br*dim*2 + 128*br*2 + 4*br*4
		} else {
			p.fwdRows, p.fwdThreads, p.fwdSmem = 64, 128, (64+2*64)*128*2
			br := 64
			p.bwdKeys, p.bwdThreads = 128, 256
			p.bwdSmem = 2*128*dim*2 + 4*br*dim*2 + 128*br*2 + 4*br*4
		}
		return p, nil
	}
	p.fwd = "flash_fwd_generic_" + p.suffix
	p.fwdRows, p.fwdThreads = 16, 128
	p.fwdSmem = (64*(dim|1) + 16*dim) * 4
	p.genDQSmem = (64*(dim|1) + 32*dim) * 4
	p.genKVSmem = (64*(dim|1) + 32*dim + 64) * 4
	return p, nil
}

// flashModules caches the compiled flash_attention.cu per device.
var flashModules struct {
	mu  sync.Mutex
	m   map[*Device]*flashModule
	err map[*Device]error
}

type flashModule struct {
	mu   sync.Mutex
	mod  *Module
	fns  map[string]*Function
	smem map[string]int
}

func (d *Device) flashModule() (*flashModule, error) {
	flashModules.mu.Lock()
	defer flashModules.mu.Unlock()
	if fm, ok := flashModules.m[d]; ok {
		return fm, nil
	}
	if flashModules.m == nil {
		flashModules.m = map[*Device]*flashModule{}
	}
	mod, err := d.CompileFile("flash_attention.cu")
	if err != nil {
		return nil, err
	}
	fm := &flashModule{mod: mod, fns: map[string]*Function{}, smem: map[string]int{}}
	flashModules.m[d] = fm
	return fm, nil
}

// fn looks a kernel up and raises its dynamic shared memory limit to smem bytes.
func (fm *flashModule) fn(d *Device, name string, smem int) (*Function, error) {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	f, ok := fm.fns[name]
	if !ok {
		var err error
		if f, err = fm.mod.Function(name); err != nil {
			return nil, err
		}
		fm.fns[name] = f
	}
	if smem > fm.smem[name] {
		if smem > 48*1024 {
			if lim := d.MaxSharedMemoryPerBlockOptin(); lim > 0 && smem > lim {
				return nil, fmt.Errorf("cuda: %s needs %d bytes of shared memory, device allows %d", name, smem, lim)
			}
			if err := f.SetMaxDynamicSharedMemory(smem); err != nil {
				return nil, err
			}
		}
		fm.smem[name] = smem
	}
	return f, nil
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

func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// FlashForward computes O = softmax(scale·Q·Kᵀ [causal mask])·V and LSE (natural
// log, float32 [bh, sq]) on the device's stream. A query that sees no key gets
// O = 0 and LSE = +inf.
func FlashForward(d *Device, dt GemmType, q, k, v, o, lse DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	if err := checkFlashShape(bh, sq, sk, dim); err != nil {
		return err
	}
	p, err := planFlash(dt, dim, scale)
	if err != nil {
		return err
	}
	fm, err := d.flashModule()
	if err != nil {
		return err
	}
	f, err := fm.fn(d, p.fwd, p.fwdSmem)
	if err != nil {
		return err
	}
	grid := [3]uint32{uint32(bh), uint32((sq + p.fwdRows - 1) / p.fwdRows), 1}
	block := [3]uint32{uint32(p.fwdThreads), 1, 1}
	if p.tensorCore {
		return d.Launch(f, grid, block, uint32(p.fwdSmem), q, k, v, o, lse, int32(bh), int32(sq), int32(sk), scale, b2i(causal))
	}
	return d.Launch(f, grid, block, uint32(p.fwdSmem), q, k, v, o, lse, int32(bh), int32(sq), int32(sk), int32(dim), scale, b2i(causal))
}

// FlashBackwardWorkspaceBytes is the device scratch FlashBackward needs: float32
// Dsum [bh, sq] and, on the tensor-core path, float32 dQaccum [bh, sq, dim].
func FlashBackwardWorkspaceBytes(bh, sq, dim int) int {
	rows := bh * sq
	return ((rows*4+255)/256)*256 + rows*dim*4
}

// FlashBackward computes dQ, dK, dV from Q, K, V, O, dO and the forward's LSE.
// workspace must hold FlashBackwardWorkspaceBytes(bh, sq, dim) bytes; when it is 0,
// FlashBackward allocates it, waits for the kernels and frees it.
func FlashBackward(d *Device, dt GemmType, q, k, v, o, dO, lse, dq, dk, dv, workspace DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	if err := checkFlashShape(bh, sq, sk, dim); err != nil {
		return err
	}
	p, err := planFlash(dt, dim, scale)
	if err != nil {
		return err
	}
	fm, err := d.flashModule()
	if err != nil {
		return err
	}
	if workspace == 0 {
		ws, err := d.Alloc(FlashBackwardWorkspaceBytes(bh, sq, dim))
		if err != nil {
			return err
		}
		err = FlashBackward(d, dt, q, k, v, o, dO, lse, dq, dk, dv, ws, bh, sq, sk, dim, scale, causal)
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
	dqacc := workspace.Offset(((rows*4 + 255) / 256) * 256)
	pre, err := fm.fn(d, "flash_bwd_pre_"+p.suffix, 0)
	if err != nil {
		return err
	}
	preGrid := [3]uint32{Grid1D(rows, 8), 1, 1}
	blk256 := [3]uint32{256, 1, 1}
	if !p.tensorCore {
		if err := d.Launch(pre, preGrid, blk256, 0, o, dO, dsum, DevicePtr(0), int32(rows), int32(dim)); err != nil {
			return err
		}
		fdq, err := fm.fn(d, "flash_bwd_generic_dq_"+p.suffix, p.genDQSmem)
		if err != nil {
			return err
		}
		fkv, err := fm.fn(d, "flash_bwd_generic_dkdv_"+p.suffix, p.genKVSmem)
		if err != nil {
			return err
		}
		blk := [3]uint32{128, 1, 1}
		if err := d.Launch(fdq, [3]uint32{uint32(bh), uint32((sq + 15) / 16), 1}, blk, uint32(p.genDQSmem),
			q, k, v, dO, lse, dsum, dq, int32(bh), int32(sq), int32(sk), int32(dim), scale, b2i(causal)); err != nil {
			return err
		}
		return d.Launch(fkv, [3]uint32{uint32(bh), uint32((sk + 15) / 16), 1}, blk, uint32(p.genKVSmem),
			q, k, v, dO, lse, dsum, dk, dv, int32(bh), int32(sq), int32(sk), int32(dim), scale, b2i(causal))
	}
	if err := d.Launch(pre, preGrid, blk256, 0, o, dO, dsum, dqacc, int32(rows), int32(dim)); err != nil {
		return err
	}
	fb, err := fm.fn(d, p.bwd, p.bwdSmem)
	if err != nil {
		return err
	}
	if err := d.Launch(fb, [3]uint32{uint32(bh), uint32((sk + p.bwdKeys - 1) / p.bwdKeys), 1}, [3]uint32{uint32(p.bwdThreads), 1, 1},
		uint32(p.bwdSmem), q, k, v, dO, lse, dsum, dqacc, dk, dv, int32(bh), int32(sq), int32(sk), scale, b2i(causal)); err != nil {
		return err
	}
	conv, err := fm.fn(d, "flash_bwd_convert_"+p.suffix, 0)
	if err != nil {
		return err
	}
	n := int64(rows) * int64(dim)
	blocks := min((n+255)/256, 65535*16)
	return d.Launch(conv, [3]uint32{uint32(blocks), 1, 1}, blk256, 0, dqacc, dq, n, scale)
}
