// flash_sm90_dev.cu: the Hopper FlashAttention variants the dispatcher
// (backend/cuda/attention/flash_sm90.go) never selects by default, kept to time the
// live ones (flash_sm90_fwd.cu, flash_sm90_bwd.cu) against: a separate NVRTC
// compile unit, compiled only when one of them is asked for by name
// (FLASHGRAPH_FLASH_SM90, FLASHGRAPH_FLASH_SM90_BWD; the tests and `bench
// -sm90` that time them), so a default run spends no NVRTC time on them.
// It compiles the live units' device code (the headers below) unchanged.
//
// Entry points (T in {bf16, fp16}, D in {64, 128}):
//   flash_fwd_sm90_warpspec_<T>_d<D>(tq, tk, tv, o, lse, BH, Sq, Sk, scale, causal)
//     tq, tk, tv: CUtensorMaps (128 bytes, by value) of Q, K, V, see
//     fwd_warpspec; grid (ceil(Sq/128), BH), block 384 (two consumer
//     warpgroups, one producer warpgroup), dynamic smem (128 + 4*128)*D*2 +
//     64 + 1024 bytes: d64 83008, d128 164928.
//   flash_fwd_sm90_pingpong_<T>_d<D>(...)  the same arguments, ping-pong
//     consumers (see fwd_pingpong): grid (ceil(Sq/128), BH), block 384, K/V
//     rings of 4 (d64) or 2 (d128) tiles, dynamic smem 128·D·2 +
//     2·stages·128·D·2 + 8·(1 + 4·stages) + 1024 bytes: d64 148616, d128
//     164936.
//   flash_fwd_sm90_pingpong3wg_<T>_d64(...)  three ping-pong consumer
//     warpgroups: grid (ceil(Sq/192), BH), block 512, Q map box 64 × 192
//     rows, 4 stages, dynamic smem 192·64·2 + 2·4·128·64·2 + 136 + 1024 =
//     156808 bytes.
//   flash_bwd_sm90_pipelined_<T>_d<D>(...)  the arguments and contract of
//     flash_sm90_bwd.cu's kernels; both warpgroups in every block's dQ
//     product (PIPE, COLS: see bwd): block 256, dynamic smem 2*128*D*2 +
//     6*64*D*2 + 2*128*64*2 + 6*64*4 + 64 + 1024 bytes (d64 117312, d128
//     199232) plus the dQ staging tiles, 2*64*64*4 (d64) or 64*128*4 (d128)
//     bytes: d64 150080, d128 232000.
//   flash_bwd_sm90_baseline_<T>_d<D>(...)  the same without PIPE and, at
//     D=64, without COLS (see bwd): four staging tiles, d64 182848, d128
//     232000.

#include "../flash_sm90_common.cuh"
#include "../flash_sm90_fwd.cuh"
#include "../flash_sm90_bwd.cuh"

namespace fa90 {

// s = Q·Kᵀ for the warpgroup's 64 rows: sQw is the Q tile's base plus the
// warpgroup's row offset (rows*128 bytes into each 64-column block of a BR-row
// tile), sK a BC-row K tile. Waits for the product.
template <bool F16, int D>
__device__ __forceinline__ void qk_product(float* s, u32 sQw, u32 sK) {
  wgmma_fence();
  const u64 da0 = make_desc(sQw, 16, 1024), db0 = make_desc(sK, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const u64 da = desc_off(da0, (kk >> 2) * BR * 128 + (kk & 3) * 32);
    const u64 db = desc_off(db0, (kk >> 2) * BC * 128 + (kk & 3) * 32);
    Wg<F16>::ss128(s, da, db, kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence<BC / 2>(s);
}

// Online softmax of one tile (c = scale·log2e), first half: updates the row
// maxima m and sums l, turns s into P (unnormalised, float) and returns in
// alpha the factor by which o must be rescaled; o itself is not touched, so a
// P·V product may still be accumulating into it.
__device__ __forceinline__ void softmax_rows(float* s, float* m, float* l, float c, float* alpha) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float mx = -inf_f();
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m[r], mx);
    const float muse = (mnew == -inf_f()) ? 0.f : mnew;  // no key seen yet: no NaN from inf-inf
    const float mc = muse * c;
    alpha[r] = fexp2(m[r] * c - mc);
    m[r] = mnew;
    float rs = 0.f;
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
      const float p0 = fexp2(fmaf(s[4 * nt + 2 * r], c, -mc));
      const float p1 = fexp2(fmaf(s[4 * nt + 2 * r + 1], c, -mc));
      s[4 * nt + 2 * r] = p0;
      s[4 * nt + 2 * r + 1] = p1;
      rs += p0 + p1;
    }
    l[r] = l[r] * alpha[r] + rs;
  }
}

// Second half: rescales o by alpha and packs P as the A fragments of P·V:
// k-step kk covers S columns 16kk..16kk+15, i.e. the 8-column blocks 2kk
// (registers 0, 1) and 2kk+1 (registers 2, 3).
template <bool F16, int D>
__device__ __forceinline__ void rescale_pack(const float* s, float* o, const float* alpha, u32 (*p)[4]) {
#pragma unroll
  for (int dt = 0; dt < D / 8; dt++) {
    o[4 * dt + 0] *= alpha[0];
    o[4 * dt + 1] *= alpha[0];
    o[4 * dt + 2] *= alpha[1];
    o[4 * dt + 3] *= alpha[1];
  }
#pragma unroll
  for (int kk = 0; kk < BC / 16; kk++) {
    p[kk][0] = pack2<F16>(s[8 * kk + 0], s[8 * kk + 1]);
    p[kk][1] = pack2<F16>(s[8 * kk + 2], s[8 * kk + 3]);
    p[kk][2] = pack2<F16>(s[8 * kk + 4], s[8 * kk + 5]);
    p[kk][3] = pack2<F16>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

template <bool F16, int D>
__device__ __forceinline__ void softmax_tile(float* s, float* o, float* m, float* l, float c, u32 (*p)[4]) {
  float alpha[2];
  softmax_rows(s, m, l, c, alpha);
  rescale_pack<F16, D>(s, o, alpha, p);
}

// o += P·V for a BC-row V tile sV. Waits for the product.
template <bool F16, int D>
__device__ __forceinline__ void pv_product(float* o, u32 (*p)[4], u32 sV) {
  pv_issue<F16, D>(o, p, sV);
  wgmma_wait<0>();
  reg_fence<D / 2>(o);
  reg_fence_u<BC / 4>(&p[0][0]);
}

// O = o / l and LSE = m·scale + ln(l) for the thread's rows; a row that saw no
// key (l = 0) gets O = 0, LSE = +inf. Rows >= Sq are not stored.
template <bool F16, int D>
__device__ __forceinline__ void store_rows(const float* o, const float* m, const float* l, u16* Ob, float* LSEb,
                                           int wrow0, int Sq, int g, int t, float scale) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float lsum = l[r];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    const int row = wrow0 + g + r * 8;
    const bool ok = lsum > 0.f;
    const float inv = ok ? 1.f / lsum : 0.f;
    if (row < Sq) {
      u16* orow = Ob + (size_t)row * D + 2 * t;
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++)
        *reinterpret_cast<u32*>(orow + dt * 8) = pack2<F16>(o[4 * dt + 2 * r] * inv, o[4 * dt + 2 * r + 1] * inv);
      if (t == 0) LSEb[row] = ok ? m[r] * scale + logf(lsum) : inf_f();
    }
  }
}

// ---------------------------------------------------------------- warpspec: TMA, warp-specialised
//
// 384 threads: warps 0-7 are two consumer warpgroups (query rows q0+64cw..,
// cw = warp/4), warps 8-11 the producer warpgroup, one thread of which issues
// every copy:
// the Q tile once, then K_j and V_j into a two-stage ring with TMA
// (cp.async.bulk.tensor, 128-byte swizzle: the tile layout described above).
// mbarriers: barQ and fullK/fullV[stage] complete when the copies' bytes have
// landed (expect_tx); empty[stage] when all 256 consumer threads have finished
// with the stage. The consumers never wait on each other, so one warpgroup's
// softmax overlaps the other's wgmma. Registers: the launch bound leaves 168
// a thread (65536 / 384); setmaxnreg moves them from the producer (24) to the
// consumers (240); the ping-pong versions need them (TestFlashSM90Compile
// checks for spills and serialized wgmmas).

template <bool F16, int D>
__device__ __forceinline__ void fwd_warpspec(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, u16* __restrict__ O,
                                       float* __restrict__ LSE, int BH, int Sq, int Sk, float scale, int causal) {
  static_assert(D == 64 || D == 128, "head dim");
  constexpr int QBYTES = BR * D * 2, KVBYTES = BC * D * 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 sQ = sbase;
  const u32 sK0 = sQ + QBYTES;
  const u32 sV0 = sK0 + 2 * KVBYTES;
  const u32 bars = sV0 + 2 * KVBYTES;  // 7 mbarriers of 8 bytes
  const u32 barQ = bars, fullK0 = bars + 8, fullV0 = bars + 24, empty0 = bars + 40;

  const int bh = blockIdx.y;
  const int qb = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int q0 = qb * BR;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kv_end = causal ? min(Sk, q0 + BR) : Sk;
  const int ntiles = (kv_end + BC - 1) / BC;

  if (tid == 0) {
    mbar_init(barQ, 1);
#pragma unroll
    for (int st = 0; st < 2; st++) {
      mbar_init(fullK0 + 8 * st, 1);
      mbar_init(fullV0 + 8 * st, 1);
      mbar_init(empty0 + 8 * st, 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= 8) {  // producer warpgroup: one thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (warp == 8 && lane == 0) {
      mbar_expect_tx(barQ, QBYTES);
#pragma unroll
      for (int blk = 0; blk < D / 64; blk++) tma_load(sQ + blk * BR * 128, tq, blk * 64, q0, bh, barQ);
      for (int j = 0; j < ntiles; j++) {
        const int st = j & 1;
        if (j >= 2) mbar_wait(empty0 + 8 * st, ((j >> 1) - 1) & 1);  // tile j-2 released
        mbar_expect_tx(fullK0 + 8 * st, KVBYTES);
#pragma unroll
        for (int blk = 0; blk < D / 64; blk++)
          tma_load(sK0 + st * KVBYTES + blk * BC * 128, tk, blk * 64, j * BC, bh, fullK0 + 8 * st);
        mbar_expect_tx(fullV0 + 8 * st, KVBYTES);
#pragma unroll
        for (int blk = 0; blk < D / 64; blk++)
          tma_load(sV0 + st * KVBYTES + blk * BC * 128, tv, blk * 64, j * BC, bh, fullV0 + 8 * st);
      }
    }
  } else {  // consumer warpgroups
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int cw = warpgroup_index();
    const int g = lane >> 2, t = lane & 3;
    const int wrow0 = q0 + cw * 64 + (warp & 3) * 16;
    const float c = scale * kLog2e;
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float m[2] = {-inf_f(), -inf_f()};
    float l[2] = {0.f, 0.f};

    mbar_wait(barQ, 0);
    const u32 sQw = sQ + cw * 64 * 128;
    for (int j = 0; j < ntiles; j++) {
      const int st = j & 1;
      const u32 parity = (j >> 1) & 1;
      float s[BC / 2];
      mbar_wait(fullK0 + 8 * st, parity);
      qk_product<F16, D>(s, sQw, sK0 + st * KVBYTES);
      mask_scores(s, j * BC, Sk, wrow0, g, t, causal);
      u32 p[BC / 16][4];
      softmax_tile<F16, D>(s, o, m, l, c, p);
      mbar_wait(fullV0 + 8 * st, parity);
      pv_product<F16, D>(o, p, sV0 + st * KVBYTES);
      mbar_arrive(empty0 + 8 * st);  // this thread is done with stage st
    }
    store_rows<F16, D>(o, m, l, O + (size_t)bh * Sq * D, LSE + (size_t)bh * Sq, wrow0, Sq, g, t, scale);
  }
}

template <bool F16, int D, int NWG, int STAGES, bool OVERLAP>
__device__ __forceinline__ void fwd_pingpong(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, u16* __restrict__ O,
                                       float* __restrict__ LSE, int BH, int Sq, int Sk, float scale, int causal) {
  static_assert(D == 64 || D == 128, "head dim");
  static_assert(NWG == 2 || NWG == 3, "consumer warpgroups");
  constexpr int BRQ = 64 * NWG, QBYTES = BRQ * D * 2, KVBYTES = BC * D * 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 sQ = sbase;
  const u32 sK0 = sQ + QBYTES;
  const u32 sV0 = sK0 + STAGES * KVBYTES;
  const u32 bars = sV0 + STAGES * KVBYTES;  // 1 + 4·STAGES mbarriers of 8 bytes
  const u32 barQ = bars, fullK0 = bars + 8, fullV0 = fullK0 + 8 * STAGES;
  const u32 emptyK0 = fullV0 + 8 * STAGES, emptyV0 = emptyK0 + 8 * STAGES;

  const int bh = blockIdx.y;
  const int qb = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int q0 = qb * BRQ;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kv_end = causal ? min(Sk, q0 + BRQ) : Sk;
  const int ntiles = (kv_end + BC - 1) / BC;

  if (tid == 0) {
    mbar_init(barQ, 1);
    kv_ring_init<STAGES, NWG>(fullK0, fullV0, emptyK0, emptyV0);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Registers: producer_regs / consumer_regs.
  if (warp >= 4 * NWG) {  // producer warpgroup: one thread issues every copy
    producer_regs<NWG>();
    if (warp == 4 * NWG && lane == 0) {
      mbar_expect_tx(barQ, QBYTES);
#pragma unroll
      for (int blk = 0; blk < D / 64; blk++) tma_load(sQ + blk * BRQ * 128, tq, blk * 64, q0, bh, barQ);
      int st = 0;
      u32 ph = 0;  // parity of the stage's current use
      for (int j = 0; j < ntiles; j++) {
        // Tile j reuses the stage of tile j-STAGES: wait for its release.
        if (j >= STAGES) mbar_wait(emptyK0 + 8 * st, ph ^ 1);
        mbar_expect_tx(fullK0 + 8 * st, KVBYTES);
#pragma unroll
        for (int blk = 0; blk < D / 64; blk++)
          tma_load(sK0 + st * KVBYTES + blk * BC * 128, tk, blk * 64, j * BC, bh, fullK0 + 8 * st);
        if (j >= STAGES) mbar_wait(emptyV0 + 8 * st, ph ^ 1);
        mbar_expect_tx(fullV0 + 8 * st, KVBYTES);
#pragma unroll
        for (int blk = 0; blk < D / 64; blk++)
          tma_load(sV0 + st * KVBYTES + blk * BC * 128, tv, blk * 64, j * BC, bh, fullV0 + 8 * st);
        if (++st == STAGES) {
          st = 0;
          ph ^= 1;
        }
      }
    }
  } else {  // consumer warpgroups
    consumer_regs<NWG>();
    const int cw = warp >> 2;  // warpgroup_index() made ptxas spill here
    const int g = lane >> 2, t = lane & 3;
    const int wgrow0 = q0 + cw * 64;  // the warpgroup's first row
    const int wrow0 = wgrow0 + (warp & 3) * 16;
    const float c = scale * kLog2e;
    const u32 my_turn = 1 + cw, next_turn = 1 + (cw + 1) % NWG;  // named barrier ids (0 is __syncthreads)
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float m[2] = {-inf_f(), -inf_f()};
    float l[2] = {0.f, 0.f};
    float alpha[2];
    u32 p[BC / 16][4];
    const u32 sQw = sQ + cw * 64 * 128;

    mbar_wait<false>(barQ, 0);
    mbar_wait<false>(fullK0, 0);
    if (cw != 0) named_bar_sync(my_turn, 256);
    {
      float s[BC / 2];
      qk_issue_rows<F16, D, BRQ>(s, sQw, sK0);
      named_bar_arrive(next_turn, 256);  // ntiles >= 1: a phase follows
      wgmma_wait<0>();
      reg_fence<BC / 2>(s);
      if (lane == 0) mbar_arrive(emptyK0);
      // o = 0: no rescale. (Here and below the two branches make the same
      // call; ptxas then compiles a copy of the softmax into each, which is
      // the code timed on the H200. Merged after the mask, the kernels
      // compile to other, smaller code that has not been timed.)
      if (tile_masked(0, Sk, wgrow0, causal)) {
        mask_scores(s, 0, Sk, wrow0, g, t, causal);
        softmax_pack<F16>(s, m, l, c, alpha, p);
      } else {
        softmax_pack<F16>(s, m, l, c, alpha, p);
      }
    }

    int st = 0;
    u32 ph = 0;
    // Step j: P_j from pa, P_{j+1} into pb.
    auto step = [&](int j, u32 (*pa)[4], u32 (*pb)[4]) {
      const bool next = j + 1 < ntiles;
      const int st1 = st + 1 == STAGES ? 0 : st + 1;
      const u32 ph1 = st1 == 0 ? ph ^ 1 : ph;
      if (next) mbar_wait<false>(fullK0 + 8 * st1, ph1);
      mbar_wait<false>(fullV0 + 8 * st, ph);
      float s[BC / 2];
      named_bar_sync(my_turn, 256);
      if (next) qk_issue_rows<F16, D, BRQ>(s, sQw, sK0 + st1 * KVBYTES);
      pv_issue<F16, D>(o, pa, sV0 + st * KVBYTES);
      if (next || cw != NWG - 1) named_bar_arrive(next_turn, 256);
      if (next) {
        const int kb = (j + 1) * BC;
        const bool masked = tile_masked(kb, Sk, wgrow0, causal);
        if (OVERLAP && !masked) {
          softmax_under_pv<F16, D>(s, o, m, l, c, alpha, pa, pb, emptyK0, emptyV0, st, st1, lane);
        } else {
          step_done<D>(s, o, pa, emptyK0, emptyV0, st, st1, lane);
          if (masked) {
            mask_scores(s, kb, Sk, wrow0, g, t, causal);
            softmax_pack<F16>(s, m, l, c, alpha, pb);
          } else {
            softmax_pack<F16>(s, m, l, c, alpha, pb);
          }
        }
        rescale_o<D>(o, alpha);
      } else {
        wgmma_wait<0>();
        reg_fence<D / 2>(o);
        reg_fence_u<BC / 4>(&pa[0][0]);
        if (lane == 0) mbar_arrive(emptyV0 + 8 * st);
      }
      st = st1;
      ph = ph1;
    };
    if constexpr (OVERLAP) {
      // Two P arrays in turn (the loop unrolled by two): packing P_{j+1}
      // into a spare array and copying it over P_j's after P_j·V_j would cost
      // 32 moves a step.
      u32 p2[BC / 16][4];
      for (int j = 0; j < ntiles; j += 2) {
        step(j, p, p2);
        if (j + 1 < ntiles) step(j + 1, p2, p);
      }
    } else {
      for (int j = 0; j < ntiles; j++) step(j, p, p);  // P_{j+1} packed once P_j·V_j is done
    }
    store_rows<F16, D>(o, m, l, O + (size_t)bh * Sq * D, LSE + (size_t)bh * Sq, wrow0, Sq, g, t, scale);
  }
}

}  // namespace fa90

#define FA90_FWD_WARPSPEC(name, F16, D)                                                                    \
  extern "C" __global__ void __launch_bounds__(fa90::WS_THREADS, 1)                                 \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,        \
           const __grid_constant__ fa90::TmaMap tv, unsigned short* o, float* lse, int BH, int Sq,  \
           int Sk, float scale, int causal) {                                                       \
    fa90::fwd_warpspec<F16, D>(&tq, &tk, &tv, o, lse, BH, Sq, Sk, scale, causal);                         \
  }

FA90_FWD_WARPSPEC(flash_fwd_sm90_warpspec_bf16_d64, false, 64)
FA90_FWD_WARPSPEC(flash_fwd_sm90_warpspec_bf16_d128, false, 128)
FA90_FWD_WARPSPEC(flash_fwd_sm90_warpspec_fp16_d64, true, 64)
FA90_FWD_WARPSPEC(flash_fwd_sm90_warpspec_fp16_d128, true, 128)

// fwd_pingpong: NWG consumer warpgroups and a producer warpgroup,
// K/V rings of STAGES tiles; OVERLAP: softmax under the warpgroup's own P·V.
#define FA90_FWD_PINGPONG(name, F16, D, NWG, STAGES, OVERLAP)                                             \
  extern "C" __global__ void __launch_bounds__(128 * (NWG + 1), 1)                                  \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,        \
           const __grid_constant__ fa90::TmaMap tv, unsigned short* o, float* lse, int BH, int Sq,  \
           int Sk, float scale, int causal) {                                                       \
    fa90::fwd_pingpong<F16, D, NWG, STAGES, OVERLAP>(&tq, &tk, &tv, o, lse, BH, Sq, Sk, scale, causal);   \
  }

FA90_FWD_PINGPONG(flash_fwd_sm90_pingpong_bf16_d64, false, 64, 2, 4, true)
FA90_FWD_PINGPONG(flash_fwd_sm90_pingpong_bf16_d128, false, 128, 2, 2, true)
FA90_FWD_PINGPONG(flash_fwd_sm90_pingpong_fp16_d64, true, 64, 2, 4, true)
FA90_FWD_PINGPONG(flash_fwd_sm90_pingpong_fp16_d128, true, 128, 2, 2, true)
FA90_FWD_PINGPONG(flash_fwd_sm90_pingpong3wg_bf16_d64, false, 64, 3, 4, false)
FA90_FWD_PINGPONG(flash_fwd_sm90_pingpong3wg_fp16_d64, true, 64, 3, 4, false)

FA90_BWD(flash_bwd_sm90_baseline_bf16_d64, false, 64, false, false, false)
FA90_BWD(flash_bwd_sm90_baseline_bf16_d128, false, 128, false, false, false)
FA90_BWD(flash_bwd_sm90_baseline_fp16_d64, true, 64, false, false, false)
FA90_BWD(flash_bwd_sm90_baseline_fp16_d128, true, 128, false, false, false)
FA90_BWD(flash_bwd_sm90_pipelined_bf16_d64, false, 64, true, true, false)
FA90_BWD(flash_bwd_sm90_pipelined_bf16_d128, false, 128, true, true, false)
FA90_BWD(flash_bwd_sm90_pipelined_fp16_d64, true, 64, true, true, false)
FA90_BWD(flash_bwd_sm90_pipelined_fp16_d128, true, 128, true, true, false)
