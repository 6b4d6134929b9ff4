// flash_sm90_fwd.cu: FlashAttention forward for Hopper (sm_90a): wgmma, TMA;
// one NVRTC compile unit (the backward is flash_sm90_bwd.cu's), holding only
// the kernels backend/cuda/flash_sm90.go selects. The shared device code,
// the contract and the shared-memory layout are flash_sm90_common.cuh's.
//
// Entry points (T in {bf16, fp16}, D in {64, 128}):
//   flash_fwd_sm90_ppp_<T>_d<D>, flash_fwd_sm90_ppp3_<T>_d64(tq, tk, tv, to, lse, BH, Sq, Sk,
//                                   scale, causal, sched, nh)
//     pp and pp3 persistent (version 5, see fwd_ppp), O stored with TMA
//     through the map to (box 64 × 64 rows, see ppp_store): 1-D grid of at most one
//     CTA per SM and per work item (a tile; a pair of tiles for the static
//     causal schedule), each walking (head, query block)
//     tiles, a fixed stride apart (sched null) or drawn from the counters at
//     sched (two int32, zero before the launch and left zero after it; nh
//     heads a causal section), see "Dynamic schedule"; block and Q map box
//     as pp and pp3 (the maps span all BH heads), dynamic smem 3·BRQ·D·2 +
//     2·stages·128·D·2 + 8·(4·stages + 4) + 32 + 1024 bytes (BRQ = 128 or
//     192 query rows; two Q buffers and the O tiles): d64 181440, d128
//     230528 (ppp), 206016 (ppp3).
//   (pp and pp3 are kernels/dev/flash_sm90_dev.cu's.)

#include "flash_sm90_fwd.cuh"

// Versions 4 (fwd_pp) and 5 (fwd_ppp: fwd_pp's tilings, persistent): NWG
// consumer warpgroups and a producer warpgroup, K/V rings of STAGES tiles;
// OVERLAP: softmax under the warpgroup's own P·V. The persistent kernels
// take two more arguments: the dynamic schedule's counters (nullptr: the
// static schedule) and the heads of a causal section.
#define FA90_FWD_PPP(name, F16, D, NWG, STAGES, OVERLAP)                                            \
  extern "C" __global__ void __launch_bounds__(128 * (NWG + 1), 1)                                  \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,        \
           const __grid_constant__ fa90::TmaMap tv, const __grid_constant__ fa90::TmaMap to,        \
           float* lse, int BH, int Sq, int Sk, float scale, int causal, int* sched, int nh) {       \
    fa90::fwd_ppp<F16, D, NWG, STAGES, OVERLAP>(&tq, &tk, &tv, &to, lse, BH, Sq, Sk, scale, causal, \
                                                sched, nh);                                         \
  }

FA90_FWD_PPP(flash_fwd_sm90_ppp_bf16_d64, false, 64, 2, 4, true)
FA90_FWD_PPP(flash_fwd_sm90_ppp_bf16_d128, false, 128, 2, 2, true)
FA90_FWD_PPP(flash_fwd_sm90_ppp_fp16_d64, true, 64, 2, 4, true)
FA90_FWD_PPP(flash_fwd_sm90_ppp_fp16_d128, true, 128, 2, 2, true)
FA90_FWD_PPP(flash_fwd_sm90_ppp3_bf16_d64, false, 64, 3, 4, false)
FA90_FWD_PPP(flash_fwd_sm90_ppp3_fp16_d64, true, 64, 3, 4, false)
