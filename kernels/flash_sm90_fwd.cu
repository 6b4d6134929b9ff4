// flash_sm90_fwd.cu: FlashAttention forward for Hopper (sm_90a): wgmma, TMA.
// One NVRTC compile unit (the backward is flash_sm90_bwd.cu's) that holds
// only the forwards backend/cuda/attention/flash_sm90.go selects; the shared device
// code, the contract and the shared-memory layout are
// flash_sm90_common.cuh's, the forward's device code flash_sm90_fwd.cuh's.
//
// Entry points (T in {bf16, fp16}):
//   flash_fwd_sm90_persistent_<T>_d<D> (D in {64, 128}),
//   flash_fwd_sm90_persistent3wg_<T>_d64
//       (tq, tk, tv, to, lse, BH, Sq, Sk, scale, causal, sched, nh, group)
//     Two (persistent) or three (persistent3wg) consumer warpgroups taking
//     turns at the tensor cores, in CTAs that walk the tiles (see
//     fwd_persistent). tq, tk, tv, to: CUtensorMaps (128 bytes, by value) of
//     Q, K, V and O (Q's and O's maps span all BH heads, K's and V's the
//     BH/group K/V heads: query head bh reads K/V head bh/group, grouped-query
//     attention; group 1 is multi-head; O's box 64 × 64 rows, see
//     persistent_store); 1-D grid of at most one CTA per SM and per work item
//     (a tile; a pair of tiles for the static causal schedule), each walking
//     (head, query block) tiles, a fixed stride apart (sched null) or drawn
//     from the counters at sched (two int32, zero before the launch and left
//     zero after it; nh heads a causal section), see "Dynamic schedule";
//     block 384 (persistent) or 512 (persistent3wg), Q map box 64 × BRQ rows,
//     dynamic smem 3·BRQ·D·2 + 2·stages·128·D·2 + 8·(4·stages + 4) + 32 +
//     1024 bytes (BRQ = 128 or 192 query rows; two Q buffers and the O
//     tiles; K/V rings of 4 tiles at D=64, 2 at D=128): d64 181440, d128
//     230528 (persistent), 206016 (persistent3wg).

#include "flash_sm90_fwd.cuh"

// fwd_persistent: NWG consumer warpgroups and a producer warpgroup, K/V
// rings of STAGES tiles; OVERLAP: softmax under the warpgroup's own P·V.
// Beyond dev's pingpong kernels' arguments, the dynamic schedule's counters
// (nullptr: the static schedule) and the heads of a causal section.
#define FA90_FWD_PERSISTENT(name, F16, D, NWG, STAGES, OVERLAP)                                            \
  extern "C" __global__ void __launch_bounds__(128 * (NWG + 1), 1)                                  \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,        \
           const __grid_constant__ fa90::TmaMap tv, const __grid_constant__ fa90::TmaMap to,        \
           float* lse, int BH, int Sq, int Sk, float scale, int causal, int* sched, int nh,         \
           int group) {                                                                              \
    fa90::fwd_persistent<F16, D, NWG, STAGES, OVERLAP>(&tq, &tk, &tv, &to, lse, BH, Sq, Sk, scale, causal, \
                                                sched, nh, group);                                  \
  }

FA90_FWD_PERSISTENT(flash_fwd_sm90_persistent_bf16_d64, false, 64, 2, 4, true)
FA90_FWD_PERSISTENT(flash_fwd_sm90_persistent_bf16_d128, false, 128, 2, 2, true)
FA90_FWD_PERSISTENT(flash_fwd_sm90_persistent_fp16_d64, true, 64, 2, 4, true)
FA90_FWD_PERSISTENT(flash_fwd_sm90_persistent_fp16_d128, true, 128, 2, 2, true)
FA90_FWD_PERSISTENT(flash_fwd_sm90_persistent3wg_bf16_d64, false, 64, 3, 4, false)
FA90_FWD_PERSISTENT(flash_fwd_sm90_persistent3wg_fp16_d64, true, 64, 3, 4, false)
