package cuda

import "github.com/flashgraph/flashgraph/backend/cuda/attention"

// The fused attention launchers are package attention's; these are their
// names as this package has always given them to its importers (bench, the
// CLI), unchanged.

// The environment variables that choose the attention kernels (see
// package attention).
const (
	FlashSM90Env         = attention.FlashSM90Env
	FlashSM90BwdEnv      = attention.FlashSM90BwdEnv
	FlashSM90SchedEnv    = attention.FlashSM90SchedEnv
	FlashDecodeEnv       = attention.FlashDecodeEnv
	FlashDecodeKernelEnv = attention.FlashDecodeKernelEnv
	FlashGQABwdEnv       = attention.FlashGQABwdEnv
)

// FlashForward is attention.FlashForward.
func FlashForward(d *Device, dt GemmType, q, k, v, o, lse DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	return attention.FlashForward(d, dt, q, k, v, o, lse, bh, sq, sk, dim, scale, causal)
}

// FlashForwardWS is attention.FlashForwardWS.
func FlashForwardWS(d *Device, dt GemmType, q, k, v, o, lse, workspace DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	return attention.FlashForwardWS(d, dt, q, k, v, o, lse, workspace, bh, sq, sk, dim, scale, causal)
}

// FlashForwardWorkspaceBytes is attention.FlashForwardWorkspaceBytes.
func FlashForwardWorkspaceBytes(dt GemmType, bh, sq, sk, dim int, scale float32, causal bool) int {
	return attention.FlashForwardWorkspaceBytes(dt, bh, sq, sk, dim, scale, causal)
}

// FlashBackward is attention.FlashBackward.
func FlashBackward(d *Device, dt GemmType, q, k, v, o, dO, lse, dq, dk, dv, workspace DevicePtr, bh, sq, sk, dim int, scale float32, causal bool) error {
	return attention.FlashBackward(d, dt, q, k, v, o, dO, lse, dq, dk, dv, workspace, bh, sq, sk, dim, scale, causal)
}

// FlashBackwardWorkspaceBytes is attention.FlashBackwardWorkspaceBytes
// (group query heads per K/V head; it reads FlashGQABwdEnv).
func FlashBackwardWorkspaceBytes(dt GemmType, bh, group, sq, sk, dim int, scale float32) int {
	return attention.FlashBackwardWorkspaceBytes(dt, bh, group, sq, sk, dim, scale)
}

// FlashDecodeChoice is attention.FlashDecodeChoice.
func FlashDecodeChoice(dt GemmType, bh, sq, sk, dim int, scale float32, causal bool) (string, error) {
	return attention.FlashDecodeChoice(dt, bh, sq, sk, dim, scale, causal)
}

// FlashForwardGroupedWS is attention.FlashForwardGroupedWS (K and V of
// bh/group heads).
func FlashForwardGroupedWS(d *Device, dt GemmType, q, k, v, o, lse, workspace DevicePtr, bh, group, sq, sk, dim int, scale float32, causal bool) error {
	return attention.FlashForwardGroupedWS(d, dt, q, k, v, o, lse, workspace, bh, group, sq, sk, dim, scale, causal)
}

// FlashBackwardGrouped is attention.FlashBackwardGrouped (K, V, dK and dV of
// bh/group heads).
func FlashBackwardGrouped(d *Device, dt GemmType, q, k, v, o, dO, lse, dq, dk, dv, workspace DevicePtr, bh, group, sq, sk, dim int, scale float32, causal bool) error {
	return attention.FlashBackwardGrouped(d, dt, q, k, v, o, dO, lse, dq, dk, dv, workspace, bh, group, sq, sk, dim, scale, causal)
}
