// flash_sm90_bwd.cu: FlashAttention backward for Hopper (sm_90a): wgmma, TMA;
// one NVRTC compile unit (the forward is flash_sm90_fwd.cu's), holding only
// the kernels backend/cuda/flash_sm90.go selects. The shared device code,
// the contract and the shared-memory layout are flash_sm90_common.cuh's.
//
// Entry points (T in {bf16, fp16}):
//   flash_bwd_sm90_pp_<T>_d64(...)  the consumer warpgroups take turns
//     (see bwd_pp): block 384, dqtma's shared memory at D=64 (182848).
//   flash_bwd_sm90_alt_<T>_d128(...)  cols with each block's dQ taken by one
//     warpgroup in turn (see ALT in bwd's header): cols' block and shared
//     memory (232000).
//   Both have the arguments and contract of kernels/dev/flash_sm90_dev.cu's
//   flash_bwd_sm90_cols_<T>_d<D>:
//   (tq, tk, tv, tdo, tdk, tdv, lse, Dsum, dQaccum, BH,
//    Sq, Sk, scale, causal)
//     the main kernel of FlashBackward, same contract as flash_bwd_<T>_d<D> of
//     flash_attention.cu (run its flash_bwd_pre_<T> before, flash_bwd_convert_<T>
//     after, with swz = 1: see dq_stage); tq, tk, tv, tdo, tdk, tdv: CUtensorMaps
//     of Q, K, V, dO, dK, dV (boxes of 64 columns × 64 rows for Q, dO, dK and
//     dV, × 128 rows for K and V), see bwd and bwd_store_dkdv; dQaccum 16-byte
//     aligned; grid (ceil(Sk/128), BH), block 256 (two warpgroups), dynamic smem
//     2*128*D*2 + 6*64*D*2 + 2*128*64*2 + 6*64*4 + 64 + 1024 bytes (d64
//     117312, d128 199232) plus the dQ staging tiles, 2*64*64*4 (d64) or
//     64*128*4 (d128) bytes: d64 150080, d128 232000.

#include "flash_sm90_bwd.cuh"

FA90_BWD(flash_bwd_sm90_alt_bf16_d128, false, 128, true, true, true)
FA90_BWD(flash_bwd_sm90_alt_fp16_d128, true, 128, true, true, true)

#define FA90_BWD_PP(name, F16)                                                                            \
  extern "C" __global__ void __launch_bounds__(fa90::WS_THREADS, 1)                                      \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,             \
           const __grid_constant__ fa90::TmaMap tv, const __grid_constant__ fa90::TmaMap tdo,            \
           const __grid_constant__ fa90::TmaMap tdk, const __grid_constant__ fa90::TmaMap tdv,            \
           const float* lse, const float* dsum, float* dqacc, int BH, int Sq, int Sk, float scale,       \
           int causal) {                                                                                  \
    fa90::bwd_pp<F16>(&tq, &tk, &tv, &tdo, lse, dsum, dqacc, &tdk, &tdv, BH, Sq, Sk, scale, causal);     \
  }

FA90_BWD_PP(flash_bwd_sm90_pp_bf16_d64, false)
FA90_BWD_PP(flash_bwd_sm90_pp_fp16_d64, true)
