// flash_sm90_bwd.cuh: the device code of the Hopper backward (see
// flash_sm90_bwd.cu for its entry points), beyond flash_sm90_common.cuh's.
// A header so that kernels/dev/flash_sm90_dev.cu, whose variants build on
// it, compiles the same text.

#ifndef FLASH_SM90_BWD_CUH
#define FLASH_SM90_BWD_CUH

#include "flash_sm90_common.cuh"

namespace fa90 {

constexpr int WS_THREADS = 384;

// mbar_wait without the watch, the loop inside one asm statement: in bwd_pingpong's
// consumers (240 registers) the watch's counter made NVRTC 13 spill.
__device__ __forceinline__ void mbar_spin(u32 bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Bulk asynchronous reduction global[gaddr..+bytes) += shared[saddr..+bytes)
// (float32 adds in L2), in this thread's current bulk group: both addresses
// 16-byte aligned, bytes a multiple of 16. The shared source must have been
// written before through the generic proxy, fenced with fence_proxy_async by
// each writer, then a barrier; it may be rewritten once bulk_wait_read says
// the group has read it.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gaddr, u32 saddr, u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gaddr), "r"(saddr),
               "r"(bytes)
               : "memory");
}

// The warp's 16 rows (row0..) of a ROWS-row tile of KSTEPS·16 columns as
// wgmma A fragments of its k-steps (ldmatrix, see x4_addr).
template <int ROWS, int KSTEPS>
__device__ __forceinline__ void load_a_frags(u32 (*a)[4], u32 tile, int row0, int lane) {
#pragma unroll
  for (int kk = 0; kk < KSTEPS; kk++) {
    const u32 addr = x4_addr<ROWS>(tile, row0, kk, lane);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a[kk][0]), "=r"(a[kk][1]), "=r"(a[kk][2]), "=r"(a[kk][3])
                 : "r"(addr)
                 : "memory");
  }
}

// ---------------------------------------------------------------- backward: TMA
//
// One CTA owns BWD_BC = 128 keys and keeps dK and dV for them in registers:
// consumer warpgroup cw (warps 4cw..4cw+3) owns keys n0+64cw.., and inside it
// warp w keys 16w.., a thread keys g and g+8 as in the forward. It loops over
// blocks of BWD_BR = 64 queries (causal: from the block holding query n0, the
// first that sees any of its keys). Per block, with P and dS transposed so
// that keys are the wgmma M dimension:
//   Sᵀ = K_w·Qᵀ, dPᵀ = V_w·dOᵀ   wgmma m64n64k16, A and B K-major (smem)
//   Pᵀ = exp2(Sᵀ·c − LSE·log2e)   (masked: 0; LSE = +inf gives 0 too),
//                                 dSᵀ = Pᵀ∘(dPᵀ − Dsum)
//   dV += Pᵀ·dO, dK += dSᵀ·Q      m64nDk16, A from registers (the accumulator
//                                 layout packed to 16 bits, as P in the
//                                 forward), B N-major (smem), as V in the forward
//   dQ += dS·K                    dSᵀ goes to shared memory (a 128-key ×
//                                 64-query tile in the swizzled layout), then
//                                 wgmma with A = dS M-major and B = K N-major:
//                                 D=128: warpgroup cw the 64 columns 64cw..
//                                 over all 128 keys (m64n64k16); D=64 with
//                                 COLS the 32 columns 32cw.. over all 128 keys
//                                 (m64n32k16), without it all 64 columns over
//                                 its own 64 keys.
// dK = scale·ΣdSᵀQ and dV are stored at the end (bwd_store_dkdv).
//
// dQ leaves through shared memory: each warpgroup stores its dQ into a
// float32 staging tile (dq_stage), and thread 0 adds the tile to dQaccum with
// one cp.reduce.async.bulk (dq_reduce; flash_bwd_pre_<T> zeroes dQaccum,
// flash_bwd_convert_<T> scales, unpermutes and converts it): rows q0..q0+63
// of one bh are one contiguous range. Per-thread float32 atomics instead (16 vector atomics
// a thread per block) kept every warp issuing them while no tensor-core work
// was in flight: 365 against 421 TFLOP/s at D=128 on the H200. At D=64 the
// tiles are double-buffered, so a block's reduction is issued after the next
// block's barrier and its read waited for before the barrier after that: no
// barrier added. Without COLS the two warpgroups' partial sums (each over its
// own 64 keys) go into two tiles and two reductions, twice the L2 traffic;
// COLS (one tile, split by columns) took D=64 from 282 to 350 TFLOP/s. At
// D=128 one 32 KiB tile is all that fits: the reduction is issued at the end
// of its block after a barrier of its own and its read waited for before the
// next block's barrier, before anyone stores into the tile again.
//
// PIPE: the next block's Sᵀ is issued right behind this block's dQ product
// (once dV and dK are done), so it runs while dQ is staged and reduced, and
// dPᵀ runs while Pᵀ is computed.
//
// No producer warpgroup: dK and dV take 128 registers a thread at D=128, and
// ptxas (NVRTC 12.4) keeps a 384-thread kernel within 168 registers whatever
// setmaxnreg says, so the consumers would spill; with 256 threads it may use
// 255. Thread 0 issues the TMA copies instead: K and V once, Q_i and dO_i
// into a three-stage ring; threads 0-63 copy LSE and Dsum rows into the
// same stage with cp.async. Block i+2 is loaded during block i, right after the consumer
// barrier that also orders the dSᵀ stores before the dQ product: every
// thread has finished block i-1 by then, so its stage is free. dSᵀ is double
// buffered by block parity, so that one barrier per block also orders the
// stores of block i+2 after every read of block i.
//
// ALT (D=128, with PIPE): each block's dQ is one warpgroup's, block i's
// warpgroup i&1's: dQ = dS·K for all 64 queries and all 128 columns over
// all 128 keys (m64n128k16, B = K N-major across both of its 64-column
// blocks; dQ's 64 accumulators take the place that Sᵀ and dPᵀ held).
// The other warpgroup only arrives at the block's barrier (bar.arrive, as
// soon as its dSᵀ is stored) and goes on to the next block, so the two run
// half a block apart and one's softmax overlaps the other's products, as in
// the ping-pong forwards; they swap roles every block. The barrier
// alternates between ids 1 and 2 by block parity: the warpgroup that only
// arrived may reach the next block's barrier before the other has left this
// one. The dQ warpgroup issues the next block's Sᵀ behind dQ, stages dQ
// (dq_stage, one tile, all 128 columns), and its first thread issues the
// reduction after a warpgroup barrier; before its warpgroup next arrives
// at a block barrier that thread waits for the reduction's read, so the
// tile is free for the next block's dQ warpgroup. The dQ warpgroup also
// issues the loads of block i+2 (its threads 0-63), once past the barrier.
// Both wait for their dV and dK before dQ: with them in flight beside dQ's
// accumulators ptxas serializes every wgmma (C7512). Faster than pipelined
// at D=128, causal and not, in fewer cycles (BENCHMARKS.md, "Measurements
// the Hopper kernels' comments cite").

constexpr int BWD_BR = 64;
constexpr int BWD_BC = 128;

#define FA90_SS64(TY)                                                                               \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                     \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                      \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                        \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, %35, %36;\n}\n"

// d[0..31] (+)= A·B, m64n64k16, A and B in shared memory; TA, TB: 1 when A
// is M-major, B N-major (the transposed layouts), 0 when K-major.
template <bool F16, int TA, int TB>
__device__ __forceinline__ void wgmma_ss_n64(float* d, u64 da, u64 db, int accumulate) {
  if constexpr (F16) {
    asm volatile(FA90_SS64("f16") : FA90_ACC32 : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  } else {
    asm volatile(FA90_SS64("bf16") : FA90_ACC32 : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  }
}

#define FA90_SS32(TY)                                                                               \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                     \
  "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " "                                      \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, %20;\n}\n"

// d[0..15] (+)= A·B, m64n32k16, A and B in shared memory, as wgmma_ss_n64.
template <bool F16, int TA, int TB>
__device__ __forceinline__ void wgmma_ss_n32(float* d, u64 da, u64 db, int accumulate) {
  if constexpr (F16) {
    asm volatile(FA90_SS32("f16") : FA90_ACC16 : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  } else {
    asm volatile(FA90_SS32("bf16") : FA90_ACC16 : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  }
}

// d += A·B, m64nDk16, A from registers, B N-major in shared memory
// (descriptor db: make_desc(tile, lbo, 1024), its 64-column blocks lbo bytes
// apart; the leading offset is not read at D=64).
template <bool F16, int D>
__device__ __forceinline__ void wgmma_rs_nd(float* d, const u32* a, u64 db) {
  if constexpr (D == 64) {
    Wg<F16>::rs64(d, a, db);
  } else {
    Wg<F16>::rs128(d, a, db);
  }
}

// 4-byte async copy global->shared; zero-filled when src_bytes is 0.
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Thread 0 issues the TMA copies of block i (Q_i and dO_i into stage i%3,
// completing on full[i%3]); threads 0-63 copy its LSE and Dsum rows into the
// same stage with cp.async (zeros for rows >= Sq, which the mask covers), and
// each arrives on full[i%3] when its copies have landed (count 1 + 64), so no
// thread waits for global memory here.
template <int D>
__device__ __forceinline__ void bwd_load_block(const TmaMap* tq, const TmaMap* tdo, const float* Lb, const float* Db,
                                               u32 sQ, u32 sdO, u32 sLD, u32 full, int q0, int bh, int Sq, int tid) {
  constexpr int BR = BWD_BR, QBYTES = BR * D * 2;
  if (tid == 0) {
    mbar_expect_tx(full, 2 * QBYTES);
#pragma unroll
    for (int blk = 0; blk < D / 64; blk++) {
      tma_load(sQ + blk * BR * 128, tq, blk * 64, q0, bh, full);
      tma_load(sdO + blk * BR * 128, tdo, blk * 64, q0, bh, full);
    }
  }
  if (tid < BR) {
    const int q = q0 + tid;
    const bool ok = q < Sq;
    cp_async4(sLD + 4 * tid, Lb + (ok ? q : 0), ok ? 4 : 0);
    cp_async4(sLD + 4 * (BR + tid), Db + (ok ? q : 0), ok ? 4 : 0);
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(full) : "memory");
  }
  asm volatile("bar.warp.sync 0xffffffff;\n" ::: "memory");  // the warp reconverges before its next wgmma
}

// The dQ staging tile that consumer warpgroup cw of the CTA writes
// for block i: a float32 tile of BWD_BR rows × D columns, row-major (rows
// D*4 bytes apart), so that rows q0.. of one bh are one contiguous range of
// dQaccum and of the tile. D=128: one tile, warpgroup cw writes columns
// 64cw..; D=64: each warpgroup its own tile (they sum over different keys),
// double-buffered by block parity.
//
// COLS (D=64 only): the warpgroups split dQ's columns as at D=128 (cw owns
// columns 32cw.., summed over all 128 keys), so one tile per block, double
// buffered by parity, and one reduction per block instead of two.
template <int D, bool COLS>
__device__ __forceinline__ u32 dq_tile(u32 sdQ0, int i, int cw) {
  constexpr u32 DQBYTES = BWD_BR * D * 4;
  if constexpr (D == 64 && COLS) {
    return sdQ0 + (u32)((i & 1) * DQBYTES + cw * 32 * 4);
  } else if constexpr (D == 64) {
    return sdQ0 + (u32)(((i & 1) * 2 + cw) * DQBYTES);
  } else {
    return sdQ0 + (u32)(cw * 64 * 4);
  }
}

// Stores the warpgroup's dQ accumulator (dq[4nt+e]: row 16wq + g + 8(e>>1)
// of the block, column 8nt + 2t + (e&1) of the warpgroup's 64) into its
// staging tile at wt (dq_tile), 8-column block j of a row at block j ^ x,
// x = g & 3, the low two bits of the row's index in its head (q0 + 16wq + g
// + 8(e>>1), q0 a multiple of 64): every row of dQaccum holds its column
// blocks permuted by its index in the head (flash_bwd_convert's swz undoes
// it). Rows are a multiple of 128 bytes apart, so with the blocks in place
// the 8 rows (g) that one store of a warp covers would all fall in the same
// 8 banks (4-way conflicts in each half-warp, which is what one wavefront
// of 8-byte stores serves); permuted, the four rows of a half-warp use four
// different 32-byte bank groups. Storing in place conflict-free instead
// needs the permutation in registers: two rounds of selects (a
// thread-dependent register index would go through local memory), 64 of
// the ~550 instructions a consumer warp issued per block.
template <int D, int NT>
__device__ __forceinline__ void dq_stage(const float* dq, u32 wt, int wq, int g, int t) {
  static_assert(NT == 16 || NT == 8 || NT == 4, "n-tiles of a warpgroup's dQ");
  const int x = g & 3;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const u32 row = wt + (u32)(wq * 16 + g + 8 * r) * (D * 4) + 8 * t;
#pragma unroll
    for (int j = 0; j < NT; j++) {
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(row + 32 * (j ^ x)), "f"(dq[4 * j + 2 * r]),
                   "f"(dq[4 * j + 2 * r + 1])
                   : "memory");
    }
  }
}

// Thread 0: dQaccum rows q0.. += the staging tile(s) of block i, one bulk
// reduction per tile (D=64: two, one per warpgroup), as one bulk group. Only
// rows < Sq: the tile's rows past the end would land in the next bh's rows
// or past the buffer (bytes stay a multiple of 16: a row is D*4 bytes).
template <int D, bool COLS>
__device__ __forceinline__ void dq_reduce(float* dQb, u32 sdQ0, int i, int q0, int Sq) {
  const u32 bytes = (u32)min(BWD_BR, Sq - q0) * (D * 4);
  bulk_reduce_add_f32(dQb + (size_t)q0 * D, dq_tile<D, COLS>(sdQ0, i, 0), bytes);
  if constexpr (D == 64 && !COLS) bulk_reduce_add_f32(dQb + (size_t)q0 * D, dq_tile<D, COLS>(sdQ0, i, 1), bytes);
  bulk_commit();
}

// d = A_w·Bᵀ over the D columns (m64n64k16 steps, both K-major in shared
// memory): Sᵀ with A_w = the warpgroup's 64 keys of K and B = the block's
// queries Q, or dPᵀ with V and dO. Issued, not committed or waited for.
template <bool F16, int D>
__device__ __forceinline__ void bwd_scores(float* d, u32 sAw, u32 sB) {
  const u64 da0 = make_desc(sAw, 16, 1024), db0 = make_desc(sB, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const u32 ko = (kk >> 2) * BWD_BC * 128 + (kk & 3) * 32, qo = (kk >> 2) * BWD_BR * 128 + (kk & 3) * 32;
    wgmma_ss_n64<F16, 0, 0>(d, desc_off(da0, ko), desc_off(db0, qo), kk > 0);
  }
}

// PIPE: block j's Sᵀ into s (bwd_scores), issued and committed once block
// j's stage (j%3 of the Q ring at sQ0, its barrier at full0 + 8(j%3)) has
// landed; the block before issues it, so that it runs behind that block's
// last products.
template <bool F16, int D>
__device__ __forceinline__ void bwd_issue_scores(float* s, u32 sKw, u32 sQ0, u32 full0, int j) {
  constexpr u32 QBYTES = BWD_BR * D * 2;
  const int st = j % 3;
  mbar_wait(full0 + 8 * st, (j / 3) & 1);
  wgmma_fence();
  bwd_scores<F16, D>(s, sKw, sQ0 + st * QBYTES);
  wgmma_commit();
}

// bwd_scores with A from registers (a[kk]: k-step kk's fragments, see
// load_a_frags), D=64.
template <bool F16>
__device__ __forceinline__ void bwd_scores_rs(float* d, const u32 (*a)[4], u32 sB) {
  const u64 db0 = make_desc(sB, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) Wg<F16>::rs64k(d, a[kk], desc_off(db0, kk * 32), kk > 0);
}

// Pᵀ for the thread's 32 (key, query) pairs of a block: s[4nt+e] is key
// key0 + 8(e>>1), query q0+8nt+2t+(e&1); ld the block's LSE row (natural
// log; +inf gives 0). The mask zeroes keys >= Sk, queries >= Sq and, when
// causal, keys above the query: MASK 0 never, 1 always, 2 where need_mask.
// At D=64 bwd_probs_block picks 0 or 1 per block: with 2, ptxas if-converted the
// mask into predicated compares and selects that every block paid for
// (about 200 instructions a block and warp). At D=128 (255 registers) the
// two copies made ptxas spill, so it stays 2 there.
template <int MASK, int BR>
__device__ __forceinline__ void bwd_probs(float* pr, const float* s, const float* ld, float c, int key0, int q0,
                                          int t, int Sk, int Sq, int causal, bool need_mask = true) {
#pragma unroll
  for (int nt = 0; nt < BR / 8; nt++) {
    // One 8-byte load for the pair (two 4-byte ones were a third of the
    // shared-memory instructions that waited for the MIO queue, under ncu).
    const float2 lp = *reinterpret_cast<const float2*>(ld + nt * 8 + 2 * t);
    const float l0 = lp.x * kLog2e, l1 = lp.y * kLog2e;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float p = fexp2(fmaf(s[4 * nt + e], c, -((e & 1) ? l1 : l0)));
      if (MASK == 1 || (MASK == 2 && need_mask)) {
        const int key = key0 + (e >> 1) * 8;
        const int q = q0 + nt * 8 + 2 * t + (e & 1);
        if (key >= Sk || q >= Sq || (causal && key > q)) p = 0.f;
      }
      pr[4 * nt + e] = p;
    }
  }
}

// bwd_probs for a block, masked only when need_mask: at D=64 as two copies
// (masked, unmasked), at D=128 as one with the mask under need_mask (see
// bwd_probs for why).
template <int D, int BR>
__device__ __forceinline__ void bwd_probs_block(float* pr, const float* s, const float* ld, float c, int key0, int q0,
                                                int t, int Sk, int Sq, int causal, bool need_mask) {
  if constexpr (D == 64) {
    if (need_mask) {
      bwd_probs<1, BR>(pr, s, ld, c, key0, q0, t, Sk, Sq, causal);
    } else {
      bwd_probs<0, BR>(pr, s, ld, c, key0, q0, t, Sk, Sq, causal);
    }
  } else {
    bwd_probs<2, BR>(pr, s, ld, c, key0, q0, t, Sk, Sq, causal, need_mask);
  }
}

// Stores a warp's 16 keys × 16 queries of dSᵀ (the A fragment a[0..3] of
// k-step kk: register j holds key row g + 8(j&1), queries 16kk + 8(j>>1) +
// 2t, +1) into the swizzled BC-row tile at sdS with one stmatrix: register j
// is 8×8 matrix j, whose rows (keys) lanes 8j..8j+7 address; a row of a
// matrix is one 16-byte chunk of the tile. krow0 is the warp's first key
// in the tile. Thirty-two 4-byte stores a block and thread before, each
// with its own address arithmetic.
template <int BCROWS>
__device__ __forceinline__ void bwd_store_ds(u32 sdS, int krow0, int kk, int lane, const u32* a) {
  const u32 addr = x4_addr<BCROWS>(sdS, krow0, kk, lane);
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a[0]), "r"(a[1]),
               "r"(a[2]), "r"(a[3])
               : "memory");
}

// dSᵀ = Pᵀ∘(dPᵀ − Dsum) for the thread's 32 (key, query) pairs (ld: the
// block's LSE row, then its Dsum row), and Pᵀ and dSᵀ packed to 16 bits as
// wgmma A fragments (k-step kk: queries 16kk..16kk+15), as P in the forward.
template <bool F16, int BR>
__device__ __forceinline__ void bwd_ds_pack(const float* pr, const float* dp, const float* ld, int t,
                                            u32 (*pa)[4], u32 (*dsa)[4]) {
  float dsr[BR / 2];
#pragma unroll
  for (int nt = 0; nt < BR / 8; nt++) {
    const float2 dp2 = *reinterpret_cast<const float2*>(ld + BR + nt * 8 + 2 * t);
    const float d0 = dp2.x, d1 = dp2.y;
#pragma unroll
    for (int e = 0; e < 4; e++) dsr[4 * nt + e] = pr[4 * nt + e] * (dp[4 * nt + e] - ((e & 1) ? d1 : d0));
  }
#pragma unroll
  for (int kk = 0; kk < BR / 16; kk++) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      pa[kk][j] = pack2<F16>(pr[8 * kk + 2 * j], pr[8 * kk + 2 * j + 1]);
      dsa[kk][j] = pack2<F16>(dsr[8 * kk + 2 * j], dsr[8 * kk + 2 * j + 1]);
    }
  }
}

// dV += Pᵀ·dO and dK += dSᵀ·Q for one block (issued, not committed): A
// from registers (pa, dsa: bwd_ds_pack), B = the stage's dO and Q tiles, rows
// are queries, 64-column blocks BR*128 bytes apart.
template <bool F16, int D, int BR>
__device__ __forceinline__ void bwd_dv_dk(float* dv, float* dk, u32 (*pa)[4], u32 (*dsa)[4], u32 sdO, u32 sQ) {
  constexpr u32 lbo = D == 64 ? 1024 : BR * 128;
  const u64 ddo = make_desc(sdO, lbo, 1024), dq0 = make_desc(sQ, lbo, 1024);
#pragma unroll
  for (int kk = 0; kk < BR / 16; kk++) wgmma_rs_nd<F16, D>(dv, pa[kk], desc_off(ddo, kk * 16 * 128));
#pragma unroll
  for (int kk = 0; kk < BR / 16; kk++) wgmma_rs_nd<F16, D>(dk, dsa[kk], desc_off(dq0, kk * 16 * 128));
}

// The CTA's head and first key. Non-causal: grid (key block, head), as
// launched. Causal: key block k does nqb − 2k query blocks, so with the
// heads one after another (block order is x fastest) the last head's
// longest CTAs started when most SMs were nearly done. Instead the heads
// go in groups of BWD_GROUP, and a group's CTAs take the key blocks in
// order, each key block for every head of the group before the next one:
// the longest CTAs of a group come first, its shortest last, and a few
// heads at a time share Q, dO and dQaccum in L2. That helps with 16 to 64
// key blocks a head and not with 128 (S=16384 at D=128, where one head's
// CTAs are about a wave already): up to BWD_GROUP_KB key blocks only. A
// group's heads keep their Q, dO and dQaccum (8·Sq·D bytes a head) within
// BWD_GROUP_BYTES, so fewer than eight above 4 MiB a head (D=128, S=8192:
// four): eight heads there (64 MiB) overflow the L2 and move more bytes
// through DRAM; at S ≤ 4096 four instead of eight ran slower (the longest
// CTAs less often first). The measurements: BENCHMARKS.md, "Measurements
// the Hopper kernels' comments cite".
constexpr int BWD_GROUP = 8, BWD_GROUP_KB = 64, BWD_GROUP_BYTES = 32 << 20;
template <int D>
__device__ __forceinline__ void bwd_tile(int causal, int Sq, int& bh, int& kb) {
  if (!causal || (int)gridDim.x > BWD_GROUP_KB) {
    bh = blockIdx.y;
    kb = blockIdx.x;
    return;
  }
  const int heads = max(1, min(BWD_GROUP, BWD_GROUP_BYTES / (8 * D) / Sq));
  const int nkb = gridDim.x, l = blockIdx.y * nkb + blockIdx.x;
  const int g = l / (heads * nkb), r = l - g * heads * nkb;
  const int gh = min(heads, (int)gridDim.y - g * heads);  // heads in this group
  kb = r / gh;
  bh = g * heads + (r - kb * gh);
}

// Grouped-query attention: a CTA owns keys of one K/V head (bwd_tile's bh,
// on a grid of BH/group heads) and loops over the blocks of all group query
// heads that read it, head after head, so that its dK and dV sum the group
// in registers (no scratch, no reduction kernel; the sums in a fixed order)
// and each query head's dQ goes to its own rows of dQaccum. Block i of that
// loop (nblk blocks a head, from qb0) is query rows q0.. of query head bh.
// With group 1 it is block qb0 + i of the K/V head itself. GQA false is
// multi-head attention (group 1) compiled as it was before grouped heads: the
// division and the head arithmetic it needs made D=64 causal backward 7.5%
// slower on the H200 (BENCHMARKS.md), so the kernels come in two builds.
// The head of K and V that CTA head hkv (see bwd_tile) loads. The grouped
// builds (GQA) own a K/V head: hkv itself. The multi-head builds own a
// query head and load K/V head hkv / group: group 1 for multi-head
// attention; the group when a grouped backward runs as multi-head attention
// (flash_bwd_repeat.go), each query head's CTA then reading its group's K
// and V where they are, not a repeated copy, and writing its own dK and dV.
// Once a CTA, by the thread that issues the loads' address.
template <bool GQA>
__device__ __forceinline__ int bwd_kv_load_head(int hkv, int group) {
  if constexpr (GQA) {
    return hkv;
  }
  return group > 1 ? hkv / group : hkv;
}

template <bool GQA>
__device__ __forceinline__ void bwd_block(int i, int nblk, int qb0, int h0, int& bh, int& q0) {
  if constexpr (!GQA) {
    bh = h0;
    q0 = (qb0 + i) * BWD_BR;
    return;
  }
  const int hh = i / nblk;
  bh = h0 + hh;
  q0 = (qb0 + i - hh * nblk) * BWD_BR;
}

// dK (times scale) and dV leave through shared memory, the K and V tiles
// being free by then: each warpgroup stages its 64 keys (stage_rows) into
// its own rows of the V tile, which only its own products read; into its
// rows of the K tile only past cta_bar (nonzero: a barrier of both
// warpgroups) where the other warpgroup's dQ product reads all of K; then,
// past its barrier wg_bar0 + cw, its first thread stores them with TMA
// (keys past Sk are not written) and waits for the stores before the CTA
// ends. Storing from registers (4-byte
// stores, 64 a thread and tensor at D=128) kept the warps in the memory
// queue at the end (ncu's stall samples).
template <bool F16, int D>
__device__ __forceinline__ void bwd_store_dkdv(const TmaMap* tdk, const TmaMap* tdv, float scale, const float* dk,
                                               const float* dv, int causal, int Sq, u32 cta_bar, u32 wg_bar0) {
  constexpr int BC = BWD_BC;
  wgmma_wait<0>();
  // The K and V tiles open both kernels' shared memory. Their addresses,
  // the warpgroup and the keys are computed here again rather than kept
  // live through the callers' loops.
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 sK = (smem_u32(smem_raw) + 1023u) & ~1023u, sV = sK + BC * D * 2;
  const int cw = warpgroup_index(), wq = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  int bh, kb;
  bwd_tile<D>(causal, Sq, bh, kb);
  const int kw0 = kb * BC + cw * 64;
  const float one[2] = {1.f, 1.f}, sc[2] = {scale, scale};
  stage_rows<F16, D, BC>(dv, one, sV, cw * 64 + wq * 16, lane);
  if (cta_bar) named_bar_sync(cta_bar, 256);
  stage_rows<F16, D, BC>(dk, sc, sK, cw * 64 + wq * 16, lane);
  fence_proxy_async();
  named_bar_sync(wg_bar0 + cw, 128);
  if ((threadIdx.x & 127) == 0) {
#pragma unroll
    for (int blk = 0; blk < D / 64; blk++) {
      tma_store(tdk, sK + blk * BC * 128 + cw * 64 * 128, blk * 64, kw0, bh);
      tma_store(tdv, sV + blk * BC * 128 + cw * 64 * 128, blk * 64, kw0, bh);
    }
    bulk_commit();
    bulk_wait<0>();
  }
}

template <bool F16, int D, bool PIPE, bool COLS_ASKED, bool ALT_ASKED, bool GQA>
__device__ __forceinline__ void bwd(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, const TmaMap* tdo,
                                    const float* __restrict__ LSE, const float* __restrict__ Dsum,
                                    float* __restrict__ dQacc, const TmaMap* tdk, const TmaMap* tdv, int BH,
                                    int Sq, int Sk, float scale, int causal, int group) {
  static_assert(D == 64 || D == 128, "head dim");
  // COLS: see dq_tile; at D=128 the columns are split that way already.
  constexpr bool COLS = COLS_ASKED && D == 64;
  // ALT: see the header; D=128 with PIPE only.
  constexpr bool ALT = ALT_ASKED && D == 128 && PIPE;
  constexpr int BR = BWD_BR, BC = BWD_BC;
  constexpr int KVBYTES = BC * D * 2, QBYTES = BR * D * 2, DSBYTES = BC * BR * 2;
  // dQ staging tiles (dq_tile), double-buffered at D=64; D=128 one (two
  // would need 64 KiB: 259 KiB in all, over the 227 KiB a block may have).
  constexpr int DQBYTES = BR * D * 4, NDQ = D == 64 ? (COLS ? 2 : 4) : 1;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 sraw = smem_u32(smem_raw);
  const u32 sbase = (sraw + 1023u) & ~1023u;
  const u32 sK = sbase, sV = sK + KVBYTES;
  const u32 sQ0 = sV + KVBYTES;        // Q of stages 0, 1, 2
  const u32 sdO0 = sQ0 + 3 * QBYTES;   // dO of stages 0, 1, 2
  const u32 sdS0 = sdO0 + 3 * QBYTES;  // dSᵀ of even and odd blocks
  const u32 sdQ0 = sdS0 + 2 * DSBYTES;  // dQ staging tiles
  const u32 sLD = sdQ0 + NDQ * DQBYTES;  // per stage: BR floats LSE, BR floats Dsum
  float* const gLD = reinterpret_cast<float*>(smem_raw + (sLD - sraw));
  const u32 bars = sLD + 3 * 2 * BR * 4;  // 4 mbarriers of 8 bytes
  const u32 barKV = bars, full0 = bars + 8;

  int hkv, kb;  // the K/V head (see bwd_block)
  bwd_tile<D>(causal, Sq, hkv, kb);
  const int n0 = kb * BC;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int nqb = (Sq + BR - 1) / BR;
  const int qb0 = causal ? min(n0 / BR, nqb) : 0;
  const int hblk = nqb - qb0;      // blocks of one query head
  const int nblk = GQA ? group * hblk : hblk;  // blocks of the group
  const int h0 = GQA ? hkv * group : hkv;
  // Block j's copies into stage slot st (see bwd_load_block).
  auto load_block = [&](int j, int st, int tid_) {
    int bh, q0;
    bwd_block<GQA>(j, hblk, qb0, h0, bh, q0);
    bwd_load_block<D>(tq, tdo, LSE + (size_t)bh * Sq, Dsum + (size_t)bh * Sq, sQ0 + st * QBYTES, sdO0 + st * QBYTES,
                      sLD + st * 2 * BR * 4, full0 + 8 * st, q0, bh, Sq, tid_);
  };
  // Block j's dQ staging tile(s) into dQaccum (see dq_reduce).
  auto reduce_block = [&](int j) {
    int bh, q0;
    bwd_block<GQA>(j, hblk, qb0, h0, bh, q0);
    dq_reduce<D, COLS>(dQacc + (size_t)bh * Sq * D, sdQ0, j, q0, Sq);
  };

  if (tid == 0) {
    mbar_init(barKV, 1);
#pragma unroll
    for (int st = 0; st < 3; st++) mbar_init(full0 + 8 * st, 1 + BR);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid == 0) {
    const int kvload = bwd_kv_load_head<GQA>(hkv, group);
    mbar_expect_tx(barKV, 2 * KVBYTES);
#pragma unroll
    for (int blk = 0; blk < D / 64; blk++) {
      tma_load(sK + blk * BC * 128, tk, blk * 64, n0, kvload, barKV);
      tma_load(sV + blk * BC * 128, tv, blk * 64, n0, kvload, barKV);
    }
  }
  for (int i = 0; i < 2 && i < nblk; i++) load_block(i, i, tid);

  const int cw = warpgroup_index(), wq = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  const int kw0 = n0 + cw * 64;        // first key of this warpgroup
  const int key0 = kw0 + wq * 16 + g;  // this thread's keys: key0, key0 + 8
  const float c = scale * kLog2e;
  const u32 sKw = sK + cw * 64 * 128, sVw = sV + cw * 64 * 128;
  // The dQ product's operands (see the header): A rows (keys) from dqk0,
  // B columns from block dqnb of the K tile.
  // COLS: all 128 keys, columns 32cw.. (64 bytes into each 128-byte row of
  // the K tile: the start address moves inside the swizzle atom, as the
  // k-steps of K-major operands do).
  constexpr int DQK = (D == 128 || COLS) ? BC / 16 : 64 / 16;  // its k-steps
  constexpr int DQN = COLS ? 16 : 32;                           // its accumulators
  const int dqk0 = (D == 128 || COLS) ? 0 : cw * 64;
  const int dqnb = D == 128 ? cw : 0;
  const u32 dqcol = COLS ? cw * 64 : 0;

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;

  // Sᵀ and dPᵀ of the current block; with PIPE they are issued at the end
  // of the block before (see PIPE in the header).
  float s[BR / 2], dp[BR / 2];
  mbar_wait(barKV, 0);
  if (PIPE && nblk > 0) bwd_issue_scores<F16, D>(s, sKw, sQ0, full0, 0);
  for (int i = 0; i < nblk; i++) {
    const int st = i % 3;
    int bhq, q0;  // the block's query head and first row
    bwd_block<GQA>(i, hblk, qb0, h0, bhq, q0);
    const u32 sQ = sQ0 + st * QBYTES, sdO = sdO0 + st * QBYTES, sdS = sdS0 + (i & 1) * DSBYTES;
    const float* ld = gLD + st * 2 * BR;
    if constexpr (!PIPE) {
      mbar_wait(full0 + 8 * st, (i / 3) & 1);
      wgmma_fence();
      bwd_scores<F16, D>(s, sKw, sQ);
      bwd_scores<F16, D>(dp, sVw, sdO);
      wgmma_commit();
      wgmma_wait<0>();
    } else {
      // Sᵀ is in flight since the block before; dPᵀ runs while Pᵀ is computed.
      wgmma_fence();
      bwd_scores<F16, D>(dp, sVw, sdO);
      wgmma_commit();
      wgmma_wait<1>();
    }
    reg_fence<BR / 2>(s);

    // Pᵀ into pr, then dSᵀ (bwd_ds_pack). s[4nt+e]: key key0 + 8(e>>1), query
    // q0+8nt+2t+(e&1). Into copies: ptxas serializes every wgmma (C7515)
    // when ordinary instructions write a wgmma accumulator (s, dp) while
    // another wgmma group is in flight, which the pipelined variants have.
    float pr[BR / 2];
    const bool need_mask = (n0 + BC > Sk) || (q0 + BR > Sq) || (causal && kw0 + 63 > q0);
    bwd_probs_block<D, BR>(pr, s, ld, c, key0, q0, t, Sk, Sq, causal, need_mask);
    if constexpr (PIPE) wgmma_wait<0>();
    reg_fence<BR / 2>(dp);
    u32 pa[BR / 16][4], dsa[BR / 16][4];
    bwd_ds_pack<F16, BR>(pr, dp, ld, t, pa, dsa);
    // dSᵀ to shared memory for the dQ product (row = key, 16-byte chunk q/8
    // holds queries 8(q/8)..+7).
#pragma unroll
    for (int kk = 0; kk < BR / 16; kk++) bwd_store_ds<BC>(sdS, cw * 64 + wq * 16, kk, lane, dsa[kk]);
    fence_proxy_async();  // the stores are read by wgmma (the async proxy)

    wgmma_fence();
    bwd_dv_dk<F16, D, BR>(dv, dk, pa, dsa, sdO, sQ);
    wgmma_commit();

    if constexpr (ALT) {
      // Warpgroup i&1 takes block i's dQ (see ALT in the header); the other
      // one arrives at the block's barrier without waiting (ids 1 and 2 by
      // parity: it may reach the next block's barrier before the first has
      // left this one) as soon as its dSᵀ is stored, and goes on to the next
      // block. The thread that issued the last reduction (block i-1's, the
      // other warpgroup's first thread) waits for its read before arriving,
      // so the tile is free once the barrier is passed.
      const bool mine = (i & 1) == cw;
      const u32 turn = 1 + (i & 1);
      if ((tid & 127) == 0) bulk_wait_read<0>();
      asm volatile("bar.warp.sync 0xffffffff;\n" ::: "memory");
      if (mine) {
        named_bar_sync(turn, 256);
      } else {
        named_bar_arrive(turn, 256);
      }
      // dV and dK are waited for before dQ: with them in flight (Pᵀ and dSᵀ
      // still held) beside dQ's 64 accumulators, ptxas serializes every
      // wgmma (C7512).
      wgmma_wait<0>();
      reg_fence<D / 2>(dv);
      reg_fence<D / 2>(dk);
      reg_fence_u<BR / 4>(&pa[0][0]);
      reg_fence_u<BR / 4>(&dsa[0][0]);
      if (mine) {
        // dQ = dS·K for the block's 64 queries, all D columns, over all 128
        // keys: m64n128k16, A = dS M-major, B = K N-major (its two 64-column
        // blocks BC*128 bytes apart).
        float dq[D / 2];
        wgmma_fence();
        const u64 dqa0 = make_desc(sdS, 1024, 1024);
        const u64 dqb0 = make_desc(sK, BC * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
          const u32 ko = kk * 16 * 128;
          Wg<F16>::template ss128<1, 1>(dq, desc_off(dqa0, ko), desc_off(dqb0, ko), kk > 0);
        }
        wgmma_commit();
        // Both warpgroups have finished block i-1 (see the stage ring), so
        // block i+2 loads into its stage; issued behind dQ, which would
        // otherwise wait for the copies' issue (a wgmma starts once all
        // four warps of the warpgroup have reached it).
        if (i + 2 < nblk) load_block(i + 2, (i + 2) % 3, tid & 127);
        // The next block's Sᵀ goes in behind dQ and runs while dQ is staged.
        if (i + 1 < nblk) {
          bwd_issue_scores<F16, D>(s, sKw, sQ0, full0, i + 1);
          wgmma_wait<1>();
        } else {
          wgmma_wait<0>();
        }
        reg_fence<D / 2>(dq);
        dq_stage<D, D / 8>(dq, sdQ0, wq, g, t);
        fence_proxy_async();  // the bulk reduction reads the tile through the async proxy
        named_bar_sync(3 + cw, 128);
        if ((tid & 127) == 0) dq_reduce<D, COLS>(dQacc + (size_t)bhq * Sq * D, sdQ0, i, q0, Sq);
        asm volatile("bar.warp.sync 0xffffffff;\n" ::: "memory");  // reconverge before the wgmma
      } else if (i + 1 < nblk) {
        bwd_issue_scores<F16, D>(s, sKw, sQ0, full0, i + 1);
      }
      continue;
    }

    // Block i stages into the tiles that the last reduction issued reads
    // (D=64: block i-2's, issued after the previous block's barrier; D=128:
    // the one tile, block i-1's, issued at the end of that block); the
    // barrier below lets no thread store before that read is done.
    if (tid == 0) bulk_wait_read<0>();
    asm volatile("bar.warp.sync 0xffffffff;\n" ::: "memory");  // warp 0 reconverges before the barrier
    // Every thread has stored its dSᵀ and finished block i-1, so stage
    // (i+2)%3, block i-1's, is free: block i+2 loads into it.
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (i + 2 < nblk) load_block(i + 2, (i + 2) % 3, tid);
    // D=64: the same barrier ordered every thread's staging of block i-1's
    // dQ (and its proxy fence) before this: thread 0 hands it to the bulk
    // copy engine, which adds it into dQaccum while the tensor cores go on.
    if constexpr (D == 64) {
      if (i > 0 && tid == 0) reduce_block(i - 1);
      asm volatile("bar.warp.sync 0xffffffff;\n" ::: "memory");  // reconverge before the wgmma
    }

    float dq[DQN];
    wgmma_fence();
    const u64 dqa0 = make_desc(sdS + dqk0 * 128, 1024, 1024);
    const u64 dqb0 = make_desc(sK + dqnb * BC * 128 + dqk0 * 128 + dqcol, 1024, 1024);
#pragma unroll
    for (int kk = 0; kk < DQK; kk++) {
      const u32 ko = kk * 16 * 128;
      if constexpr (COLS) {
        wgmma_ss_n32<F16, 1, 1>(dq, desc_off(dqa0, ko), desc_off(dqb0, ko), kk > 0);
      } else {
        wgmma_ss_n64<F16, 1, 1>(dq, desc_off(dqa0, ko), desc_off(dqb0, ko), kk > 0);
      }
    }
    wgmma_commit();
    if (PIPE && i + 1 < nblk) {
      // dV and dK are done once one group (dQ) is left; then the next
      // block's Sᵀ goes in behind dQ and runs while dQ is staged and reduced.
      // (dPᵀ too would hold dK, dV, dQ and both score tiles at once: over 255
      // registers at D=128, where ptxas then serializes the wgmmas, C7512,
      // and no faster at D=64 on the H200.)
      wgmma_wait<1>();
      reg_fence<D / 2>(dv);
      reg_fence<D / 2>(dk);
      reg_fence_u<BR / 4>(&pa[0][0]);
      reg_fence_u<BR / 4>(&dsa[0][0]);
      bwd_issue_scores<F16, D>(s, sKw, sQ0, full0, i + 1);
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    reg_fence<D / 2>(dv);
    reg_fence<D / 2>(dk);
    reg_fence<DQN>(dq);
    reg_fence_u<BR / 4>(&pa[0][0]);
    reg_fence_u<BR / 4>(&dsa[0][0]);

    dq_stage<D, DQN / 4>(dq, dq_tile<D, COLS>(sdQ0, i, cw), wq, g, t);
    fence_proxy_async();  // the bulk reduction reads the tile through the async proxy
    // D=128: one tile, so its reduction cannot wait for the next block's
    // barrier (that barrier is where its read must be over); a barrier of
    // its own here, and the read has the next block's S, dP and softmax to
    // finish in.
    if constexpr (D == 128) {
      asm volatile("bar.sync 2, 256;\n" ::: "memory");
      if (tid == 0) dq_reduce<D, COLS>(dQacc + (size_t)bhq * Sq * D, sdQ0, i, q0, Sq);
      asm volatile("bar.warp.sync 0xffffffff;\n" ::: "memory");  // reconverge before the wgmma
    }
  }
  // D=64: the last block's dQ, staged by every thread before this barrier.
  // Thread 0 waits for every reduction to finish: the CTA's shared memory
  // must outlive their reads.
  if (D == 64 && nblk > 0) {
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (tid == 0) reduce_block(nblk - 1);
  }
  if ((ALT ? (tid & 127) : tid) == 0) bulk_wait<0>();

  // ids 1-4 are the block barriers (ALT: 1, 2 and 3 + cw)
  bwd_store_dkdv<F16, D>(tdk, tdv, scale, dk, dv, causal, Sq, 5, 6);
}

// ------------------------------------------------ backward: ping-pong (D=64)
//
// bwd_pingpong: bwd's tiling (a CTA owns 128 keys, warpgroup cw keys 64cw..,
// blocks of 64 queries), built so that the two consumer warpgroups share
// nothing but the Q/dO ring and can take turns at the tensor cores, as the
// forward's fwd_pingpong does. In bwd they meet at a barrier every block (the dQ
// product reads both halves of dSᵀ), so both compute Pᵀ and dSᵀ (exp2,
// packing, stores) at the same time while the tensor cores idle; here one
// does that while the other's products run.
//   - A producer warpgroup (setmaxnreg: 24 registers, the consumers 240):
//     warp 8 loads K and V once, then Q_i, dO_i (TMA) and LSE, Dsum rows
//     (cp.async) into a three-stage ring, waiting on the stage's empty
//     mbarrier (every consumer thread arrives once its block's products are
//     done) instead of a CTA-wide barrier; warp 9 + cw is warpgroup cw's dQ
//     writer.
//   - dQ as in bwd without COLS: warpgroup cw sums dS·K over its own 64 keys
//     for all 64 columns (m64n64k16) and stages it into its own tile (two,
//     by block parity); named barrier BWD_PINGPONG_FULL + 4cw + parity hands the
//     tile to its writer, which adds it to dQaccum with one bulk reduction
//     and, once the copy engine has read block i-1's tile, arrives on
//     BWD_PINGPONG_EMPTY + 4cw + parity, which the warpgroup waits on before it
//     stages block i+1 into that tile. Twice pipelined' reduction traffic (L2
//     74% busy in ncu at S=4096 against 41%), but no barrier between the
//     warpgroups: summing the two warpgroups' dQ in one tile first (one
//     reduction, L2 39%) made one wait for the other every block again and
//     ran at 380 instead of 400 TFLOP/s.
//   - A warpgroup's dSᵀ (64 keys × 64 queries) is read by its own dQ
//     product only: one buffer, a barrier of its four warps (BWD_PINGPONG_DS + cw).
//   - Per block: Sᵀ and dPᵀ (dPᵀ while Pᵀ is computed), Pᵀ, dSᵀ, then in
//     the warpgroup's turn (named barriers BWD_TURN + cw; warpgroup 0 first)
//     one bundle, dV, dK and dQ; then dQ staged. Issuing the next block's
//     Sᵀ before staging (as bwd's PIPE) took non-causal S=4096 from 400 to
//     416 TFLOP/s but causal from 379 to 363, and NVRTC 13 spilled.
//   - Sᵀ and dPᵀ take A (the warpgroup's 64 keys of K and V, the same for
//     every block) from registers, loaded once with ldmatrix: each of their
//     wgmmas then reads 2 KiB of shared memory (its Q or dO slice) instead
//     of 4 KiB. At D=64 a block's products read ~64 KiB a warpgroup, the
//     dQ staging and its reduction 32 KiB more, against 128 bytes a cycle:
//     from shared memory, the limit; with K and V from registers the
//     backward ran faster, causal and not (BENCHMARKS.md).
// Registers: dK, dV 64, dQ 32, Sᵀ and dPᵀ 64, Pᵀ and dSᵀ packed 32, K and
// V fragments 32.
constexpr u32 BWD_PINGPONG_FULL = 2;   // + 4cw + parity: a staged dQ tile (128 consumers + the writer)
constexpr u32 BWD_PINGPONG_EMPTY = 4;  // + 4cw + parity: that tile read by the copy engine
constexpr u32 BWD_PINGPONG_DS = 10;    // + cw: the warpgroup's dSᵀ stored
constexpr u32 BWD_TURN = 12;     // + cw: this warpgroup may issue its bundle

// The loader's copies of block i (bwd_pingpong's warp 8, every lane): lane 0 the TMA copies
// of Q_i and dO_i; lane l LSE and Dsum of rows l and l+32 (zeros for rows >=
// Sq, which the mask covers) by cp.async, then an arrival when they landed,
// so full counts 1 + 32.
template <int D>
__device__ __forceinline__ void bwd_loader_block(const TmaMap* tq, const TmaMap* tdo, const float* Lb,
                                                  const float* Db, u32 sQ, u32 sdO, u32 sLD, u32 full, int q0, int bh,
                                                  int Sq, int lane) {
  constexpr int BR = BWD_BR, QBYTES = BR * D * 2;
  if (lane == 0) {
    mbar_expect_tx(full, 2 * QBYTES);
#pragma unroll
    for (int blk = 0; blk < D / 64; blk++) {
      tma_load(sQ + blk * BR * 128, tq, blk * 64, q0, bh, full);
      tma_load(sdO + blk * BR * 128, tdo, blk * 64, q0, bh, full);
    }
  }
#pragma unroll
  for (int h = 0; h < BR / 32; h++) {
    const int r = lane + 32 * h, q = q0 + r;
    const bool ok = q < Sq;
    cp_async4(sLD + 4 * r, Lb + (ok ? q : 0), ok ? 4 : 0);
    cp_async4(sLD + 4 * (BR + r), Db + (ok ? q : 0), ok ? 4 : 0);
  }
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(full) : "memory");
  __syncwarp();
}

template <bool F16, bool GQA>
__device__ __forceinline__ void bwd_pingpong(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, const TmaMap* tdo,
                                       const float* __restrict__ LSE, const float* __restrict__ Dsum,
                                       float* __restrict__ dQacc, const TmaMap* tdk, const TmaMap* tdv, int BH,
                                       int Sq, int Sk, float scale, int causal, int group) {
  constexpr int D = 64;
  constexpr int BR = BWD_BR, BC = BWD_BC;
  constexpr int KVBYTES = BC * D * 2, QBYTES = BR * D * 2, DSBYTES = BC * BR * 2;
  constexpr int DQBYTES = BR * D * 4;  // four staging tiles: (parity, warpgroup)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 sraw = smem_u32(smem_raw);
  const u32 sbase = (sraw + 1023u) & ~1023u;
  const u32 sK = sbase, sV = sK + KVBYTES;
  const u32 sQ0 = sV + KVBYTES;
  const u32 sdO0 = sQ0 + 3 * QBYTES;
  const u32 sdS = sdO0 + 3 * QBYTES;        // dSᵀ, warpgroup cw in rows 64cw..
  const u32 sdQ0 = sdS + 2 * DSBYTES;       // as bwd's layout (the second dSᵀ buffer unused)
  const u32 sLD = sdQ0 + 4 * DQBYTES;
  float* const gLD = reinterpret_cast<float*>(smem_raw + (sLD - sraw));
  const u32 bars = sLD + 3 * 2 * BR * 4;
  const u32 barKV = bars, full0 = bars + 8, empty0 = bars + 32;

  int hkv, kb;  // the K/V head (see bwd_block)
  bwd_tile<D>(causal, Sq, hkv, kb);
  const int n0 = kb * BC;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int nqb = (Sq + BR - 1) / BR;
  const int qb0 = causal ? min(n0 / BR, nqb) : 0;
  const int hblk = nqb - qb0;     // blocks of one query head
  const int nblk = GQA ? group * hblk : hblk;  // blocks of the group
  const int h0 = GQA ? hkv * group : hkv;

  if (tid == 0) {
    mbar_init(barKV, 1);
#pragma unroll
    for (int st = 0; st < 3; st++) {
      mbar_init(full0 + 8 * st, 1 + 32);
      mbar_init(empty0 + 8 * st, 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= 8) {
    producer_regs<2>();
    if (warp == 8) {
      if (lane == 0) {
        const int kvload = bwd_kv_load_head<GQA>(hkv, group);
        mbar_expect_tx(barKV, 2 * KVBYTES);
        tma_load(sK, tk, 0, n0, kvload, barKV);
        tma_load(sV, tv, 0, n0, kvload, barKV);
      }
      int st = 0;
      u32 ph = 0;
      for (int i = 0; i < nblk; i++) {
        if (i >= 3) mbar_wait(empty0 + 8 * st, ph ^ 1);
        int bh, q0;
        bwd_block<GQA>(i, hblk, qb0, h0, bh, q0);
        bwd_loader_block<D>(tq, tdo, LSE + (size_t)bh * Sq, Dsum + (size_t)bh * Sq, sQ0 + st * QBYTES,
                             sdO0 + st * QBYTES, sLD + st * 2 * BR * 4, full0 + 8 * st, q0, bh, Sq, lane);
        if (++st == 3) {
          st = 0;
          ph ^= 1;
        }
      }
    } else if (warp <= 10) {  // the dQ writer of warpgroup cw
      const int cw = warp - 9;
      for (int i = 0; i < nblk; i++) {
        named_bar_sync(BWD_PINGPONG_FULL + 4 * cw + (i & 1), 160);
        if (lane == 0) {
          int bh, q0;
          bwd_block<GQA>(i, hblk, qb0, h0, bh, q0);
          bulk_reduce_add_f32(dQacc + ((size_t)bh * Sq + q0) * D, dq_tile<D, false>(sdQ0, i, cw),
                              (u32)min(BR, Sq - q0) * (D * 4));
          bulk_commit();
          bulk_wait_read<1>();  // block i-1's tile, the one block i+1 stages into, is read
        }
        __syncwarp();
        if (i >= 1 && i + 1 < nblk) named_bar_arrive(BWD_PINGPONG_EMPTY + 4 * cw + ((i + 1) & 1), 160);
      }
      if (lane == 0) bulk_wait<0>();
    }
    return;
  }

  consumer_regs<2>();
  const int cw = warpgroup_index(), wq = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  const int kw0 = n0 + cw * 64;
  const int key0 = kw0 + wq * 16 + g;
  const float c = scale * kLog2e;
  const u32 sKw = sK + cw * 64 * 128;
  const u32 my_turn = BWD_TURN + cw, other_turn = BWD_TURN + (cw ^ 1);

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;

  mbar_wait(barKV, 0);
  // The warp's rows of K and V as A fragments (see above).
  u32 ka[4][4], va[4][4];
  load_a_frags<BC, 4>(ka, sK, cw * 64 + wq * 16, lane);
  load_a_frags<BC, 4>(va, sV, cw * 64 + wq * 16, lane);
  for (int i = 0; i < nblk; i++) {
    const int st = i % 3;
    int bhq, q0;  // the block's query head (unused here) and first row
    bwd_block<GQA>(i, hblk, qb0, h0, bhq, q0);
    const u32 sQ = sQ0 + st * QBYTES, sdO = sdO0 + st * QBYTES;
    const float* ld = gLD + st * 2 * BR;
    // Sᵀ, then dPᵀ, which runs while Pᵀ is computed.
    float s[BR / 2], dp[BR / 2];
    mbar_spin(full0 + 8 * st, (i / 3) & 1);
    wgmma_fence();
    bwd_scores_rs<F16>(s, ka, sQ);
    wgmma_commit();
    bwd_scores_rs<F16>(dp, va, sdO);
    wgmma_commit();
    wgmma_wait<1>();
    reg_fence<BR / 2>(s);

    float pr[BR / 2];
    const bool need_mask = (n0 + BC > Sk) || (q0 + BR > Sq) || (causal && kw0 + 63 > q0);
    bwd_probs_block<D, BR>(pr, s, ld, c, key0, q0, t, Sk, Sq, causal, need_mask);
    wgmma_wait<0>();
    reg_fence<BR / 2>(dp);
    u32 pa[BR / 16][4], dsa[BR / 16][4];
    bwd_ds_pack<F16, BR>(pr, dp, ld, t, pa, dsa);
#pragma unroll
    for (int kk = 0; kk < BR / 16; kk++) bwd_store_ds<BC>(sdS, cw * 64 + wq * 16, kk, lane, dsa[kk]);
    fence_proxy_async();
    named_bar_sync(BWD_PINGPONG_DS + cw, 128);  // the warpgroup's dSᵀ is stored

    // This warpgroup's turn (warpgroup 0 takes the first).
    float dq[32];
    if (i > 0 || cw == 1) named_bar_sync(my_turn, 256);
    wgmma_fence();
    bwd_dv_dk<F16, D, BR>(dv, dk, pa, dsa, sdO, sQ);
    {
      // dQ over the warpgroup's 64 keys: A = dS (queries × keys, from the
      // dSᵀ rows 64cw..), B = its K rows, all 64 columns.
      const u64 dqa0 = make_desc(sdS + cw * 64 * 128, 1024, 1024), dqb0 = make_desc(sKw, 1024, 1024);
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        const u32 ko = kk * 16 * 128;
        wgmma_ss_n64<F16, 1, 1>(dq, desc_off(dqa0, ko), desc_off(dqb0, ko), kk > 0);
      }
    }
    wgmma_commit();
    if (i + 1 < nblk || cw == 0) named_bar_arrive(other_turn, 256);  // warpgroup 1's last is not waited for

    wgmma_wait<0>();
    reg_fence<D / 2>(dv);
    reg_fence<D / 2>(dk);
    reg_fence<32>(dq);
    reg_fence_u<BR / 4>(&pa[0][0]);
    reg_fence_u<BR / 4>(&dsa[0][0]);
    mbar_arrive(empty0 + 8 * st);  // stage st's last readers are done

    if (i >= 2) named_bar_sync(BWD_PINGPONG_EMPTY + 4 * cw + (i & 1), 160);
    dq_stage<D, 8>(dq, dq_tile<D, false>(sdQ0, i, cw), wq, g, t);
    fence_proxy_async();
    named_bar_arrive(BWD_PINGPONG_FULL + 4 * cw + (i & 1), 160);
  }

  // K and V rows are the warpgroup's own (no barrier of both); ids 2-13 are taken
  bwd_store_dkdv<F16, D>(tdk, tdv, scale, dk, dv, causal, Sq, 0, 14);
}

}  // namespace fa90

// Each backward has two entry points: name for multi-head attention (group
// 1) and name_gqa for grouped K/V heads (see bwd_block).
#define FA90_BWD_ENTRY(name, F16, D, PIPE, COLS, ALT, GQA)                                                 \
  extern "C" __global__ void __launch_bounds__(fa90::NT, 1)                                              \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,             \
           const __grid_constant__ fa90::TmaMap tv, const __grid_constant__ fa90::TmaMap tdo,            \
           const __grid_constant__ fa90::TmaMap tdk, const __grid_constant__ fa90::TmaMap tdv,            \
           const float* lse, const float* dsum, float* dqacc, int BH, int Sq, int Sk, float scale,       \
           int causal, int group) {                                                                       \
    fa90::bwd<F16, D, PIPE, COLS, ALT, GQA>(&tq, &tk, &tv, &tdo, lse, dsum, dqacc, &tdk, &tdv, BH, Sq, Sk, scale,  \
                                            causal, group);                                               \
  }
#define FA90_BWD(name, F16, D, PIPE, COLS, ALT)            \
  FA90_BWD_ENTRY(name, F16, D, PIPE, COLS, ALT, false)     \
  FA90_BWD_ENTRY(name##_gqa, F16, D, PIPE, COLS, ALT, true)

#endif  // FLASH_SM90_BWD_CUH
