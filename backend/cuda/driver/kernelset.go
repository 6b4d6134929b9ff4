package driver

import (
	"fmt"
	"sync"
)

// KernelSet is one embedded compile unit compiled for one device, and the
// entry points looked up in it so far: the one kernel cache of the backend
// (the Backend holds ops.cu's; flash.go holds flash_attention.cu's and
// flash_sm90.go each sm90 unit's per device).
type KernelSet struct {
	dev *Device
	mod *Module

	mu   sync.Mutex
	fns  map[string]*Function
	smem map[string]int // dynamic shared memory each kernel's limit is raised to
}

// CompileKernelSet compiles an embedded compile unit (see package kernels).
func CompileKernelSet(d *Device, file string, opts ...string) (*KernelSet, error) {
	mod, err := d.CompileFile(file, opts...)
	if err != nil {
		return nil, err
	}
	return &KernelSet{dev: d, mod: mod, fns: map[string]*Function{}, smem: map[string]int{}}, nil
}

// Fn looks a kernel up (once) and makes sure it may launch with smem bytes
// of dynamic shared memory: above the default 48 KiB the limit is raised,
// up to what the device allows.
func (ks *KernelSet) Fn(name string, smem int) (*Function, error) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	f, ok := ks.fns[name]
	if !ok {
		var err error
		if f, err = ks.mod.Function(name); err != nil {
			return nil, err
		}
		ks.fns[name] = f
	}
	if smem > ks.smem[name] {
		if smem > 48*1024 {
			if lim := ks.dev.MaxSharedMemoryPerBlockOptin(); lim > 0 && smem > lim {
				return nil, fmt.Errorf("cuda: %s needs %d bytes of shared memory, device allows %d", name, smem, lim)
			}
			if err := f.SetMaxDynamicSharedMemory(smem); err != nil {
				return nil, err
			}
		}
		ks.smem[name] = smem
	}
	return f, nil
}
