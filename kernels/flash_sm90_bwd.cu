// flash_sm90_bwd.cu: FlashAttention backward for Hopper (sm_90a): wgmma, TMA.
// One NVRTC compile unit (the forward is flash_sm90_fwd.cu's) that holds
// only the backwards backend/cuda/attention/flash_sm90.go selects; the shared device
// code and the shared-memory layout are flash_sm90_common.cuh's, the
// backward's device code flash_sm90_bwd.cuh's.
//
// Entry points (T in {bf16, fp16}):
//   flash_bwd_sm90_pingpong_<T>_d64, flash_bwd_sm90_alternating_<T>_d128
//       (tq, tk, tv, tdo, tdk, tdv, lse, Dsum, dQaccum, BH, Sq, Sk, scale, causal, group)
//     and the same names with _gqa for group > 1 (multi-head attention keeps
//     the code it had before grouped K/V heads: see bwd_block)
//     the main kernel of FlashBackward, same contract as flash_bwd_<T>_d<D> of
//     flash_attention.cu (run its flash_bwd_pre_<T> before, flash_bwd_convert_<T>
//     after, with swz = 1: see dq_stage); tq, tk, tv, tdo, tdk, tdv: CUtensorMaps
//     of Q, K, V, dO, dK, dV (boxes of 64 columns × 64 rows for Q, dO, dK and
//     dV, × 128 rows for K and V), see bwd and bwd_store_dkdv; dQaccum 16-byte
//     aligned; grid (ceil(Sk/128), BH/group): a CTA owns keys of one K/V
//     head and loops over its group's query heads (see bwd_block), K, V, dK,
//     dV maps spanning the BH/group K/V heads.
//   pingpong: the consumer warpgroups take turns, a producer warpgroup loads
//     (see bwd_pingpong): block 384, dynamic smem 2*128*D*2 + 6*64*D*2 +
//     2*128*64*2 + 6*64*4 + 64 + 1024 bytes (d64 117312) plus four dQ
//     staging tiles of 64*64*4 bytes: 182848.
//   alternating: two warpgroups that load themselves, each block's dQ taken
//     by one of them in turn (see ALT in bwd's header): block 256, dynamic
//     smem as above (d128 199232) plus one dQ staging tile of 64*128*4
//     bytes: 232000.
//   (The pipelined and baseline backwards are kernels/dev/flash_sm90_dev.cu's.)

#include "flash_sm90_bwd.cuh"

FA90_BWD(flash_bwd_sm90_alternating_bf16_d128, false, 128, true, true, true)
FA90_BWD(flash_bwd_sm90_alternating_fp16_d128, true, 128, true, true, true)

#define FA90_BWD_PINGPONG_ENTRY(name, F16, GQA)                                                                 \
  extern "C" __global__ void __launch_bounds__(fa90::WS_THREADS, 1)                                      \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,             \
           const __grid_constant__ fa90::TmaMap tv, const __grid_constant__ fa90::TmaMap tdo,            \
           const __grid_constant__ fa90::TmaMap tdk, const __grid_constant__ fa90::TmaMap tdv,            \
           const float* lse, const float* dsum, float* dqacc, int BH, int Sq, int Sk, float scale,       \
           int causal, int group) {                                                                       \
    fa90::bwd_pingpong<F16, GQA>(&tq, &tk, &tv, &tdo, lse, dsum, dqacc, &tdk, &tdv, BH, Sq, Sk, scale, causal, group); \
  }
// name for multi-head attention, name_gqa for grouped K/V heads (see bwd_block).
#define FA90_BWD_PINGPONG(name, F16)              \
  FA90_BWD_PINGPONG_ENTRY(name, F16, false)       \
  FA90_BWD_PINGPONG_ENTRY(name##_gqa, F16, true)

FA90_BWD_PINGPONG(flash_bwd_sm90_pingpong_bf16_d64, false)
FA90_BWD_PINGPONG(flash_bwd_sm90_pingpong_fp16_d64, true)
