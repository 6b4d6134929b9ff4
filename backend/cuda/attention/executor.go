package attention

// What the executor (package cuda) asks of the launchers besides running them.

// CheckShape says whether the fused kernels take these sizes (checkFlashShape).
func CheckShape(bh, sq, sk, dim int) error { return checkFlashShape(bh, sq, sk, dim) }

// Supported says whether a FA2 plan serves dt, dim and scale (planFlash).
func Supported(dt GemmType, dim int, scale float32) error {
	_, err := planFlash(dt, dim, scale)
	return err
}

// WarmUp loads the flash kernels a bf16 head-dim-128 run uses on d: FA2's
// unit, and on compute capability 9.0 the sm90 forward's and backward's.
func WarmUp(d *Device) error {
	if _, err := flashKernelSet(d); err != nil {
		return err
	}
	// On compute capability 9.0 the forward and the backward are the sm90
	// units' (flash_sm90_fwd.cu, flash_sm90_bwd.cu), each its own compile.
	if name, err := flashSM90Choice(d, GemmBF16, 128, 4096, false, 1); err != nil {
		return err
	} else if name != "" {
		if _, err := flashSM90KernelSet(d, flashSM90UnitOf(name)); err != nil {
			return err
		}
	}
	if name, err := flashSM90BwdChoice(d, GemmBF16, 128, 1); err != nil {
		return err
	} else if name != "" {
		if _, err := flashSM90KernelSet(d, flashSM90UnitOf(name)); err != nil {
			return err
		}
	}
	return nil
}
