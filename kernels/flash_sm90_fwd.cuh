// flash_sm90_fwd.cuh: the device code of the Hopper forward (see
// flash_sm90_fwd.cu for its entry points), beyond flash_sm90_common.cuh's.
// A header so that kernels/dev/flash_sm90_dev.cu, whose variants build on
// it, compiles the same text.

#ifndef FLASH_SM90_FWD_CUH
#define FLASH_SM90_FWD_CUH

#include "flash_sm90_common.cuh"

namespace fa90 {

__device__ __forceinline__ float inf_f() { return __int_as_float(0x7f800000); }

// The pieces both forwards share. A consumer warpgroup owns 64 query rows;
// inside it warp w owns 16, and a thread holds, like mma.sync's accumulator,
// rows g and g+8 (g = lane/4) and, per 8-column block nt, columns 8nt+2t and
// 8nt+2t+1 (t = lane%4): s[4nt+e] is row g+8(e>>1), column 8nt+2t+(e&1). O
// accumulates in o[] the same way over D columns.

// Masks keys >= Sk and, when causal, keys above the diagonal, to -inf.
__device__ __forceinline__ void mask_scores(float* s, int kbase, int Sk, int wrow0, int g, int t, int causal) {
  if ((kbase + BC > Sk) || (causal && kbase + BC - 1 > wrow0)) {
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = kbase + nt * 8 + 2 * t + (e & 1);
        const int row = wrow0 + g + (e >> 1) * 8;
        if (col >= Sk || (causal && col > row)) s[4 * nt + e] = -inf_f();
      }
    }
  }
}

// Issues o += P·V (as pv_product, kernels/dev/flash_sm90_dev.cu) without
// waiting for it.
template <bool F16, int D>
__device__ __forceinline__ void pv_issue(float* o, u32 (*p)[4], u32 sV) {
  wgmma_fence();
  const u64 db0 = make_desc(sV, D == 64 ? 1024 : BC * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < BC / 16; kk++) {
    if constexpr (D == 64) {
      Wg<F16>::rs64(o, p[kk], desc_off(db0, kk * 16 * 128));
    } else {
      Wg<F16>::rs128(o, p[kk], desc_off(db0, kk * 16 * 128));
    }
  }
  wgmma_commit();
}

// ---------------------------------------------------------------- ping-pong
//
// warpspec's producer and NWG consumer warpgroups (BRQ = 64·NWG query rows
// per CTA) that take turns at the tensor cores. Each consumer warpgroup works
// in issue phases: the prologue issues S_0 = Q·K_0ᵀ, step j issues S_{j+1} and
// P_j·V_j together (P_j·V_j alone in the last step). A warpgroup enters a
// phase by waiting on its own named barrier (bar.sync 1+cw, 256) and leaves
// it, as soon as its wgmmas are issued, by arriving at the next warpgroup's
// (bar.arrive, 256: the waiting warpgroup's 128 threads plus the arriving
// one's). So the warpgroups' products reach the tensor cores in round-robin
// order, phase after phase, and one warpgroup's softmax runs while the next
// one's products do, instead of all products and all softmaxes at once.
// Warpgroup 0 starts its first phase without waiting; the last warpgroup does
// not arrive after its last phase, so every barrier sees as many arrivals as
// waits. All warpgroups of a CTA run the same number of phases (the tile
// count is the CTA's), so the turns never stall.
//
// OVERLAP (the "pingpong" kernels, two consumer warpgroups): inside a warpgroup the
// softmax of S_{j+1} also runs while P_j·V_j accumulates (as in a
// warpspec variant with the next Q·Kᵀ in flight during P·V, since gone).
// NVRTC 12.4's ptxas serialized every wgmma when ordinary instructions wrote
// a wgmma's accumulator while a group was in flight (C7515), and when one
// branch of the step packed P into the A registers and the other into a
// spare array copied over them (C7513). So: the softmax only reads S
// (softmax_pack) and packs P_{j+1} into the other of two P arrays, which
// steps use in turn (the loop unrolled by two), instead of that variant's
// 64-register copy of S; and the tiles that need a mask (a warpgroup's
// diagonal tile, the one crossing Sk: one or two of a CTA's) wait for
// P_j·V_j first and mask S in place. Without OVERLAP (the "pingpong3wg" kernels,
// three consumer warpgroups, D=64 only: 160 registers a consumer thread,
// too few for the second P array) a warpgroup waits for both products
// before its softmax; the other two warpgroups' products fill the tensor
// cores meanwhile.
//
// The K and V stages are released separately (emptyK once S_j is done,
// emptyV once P_j·V_j is): a warpgroup wants K_{j+1} while the one behind it
// still reads V_{j-1}, and with one release per stage the producer could not
// refill K before the slower warpgroup was done with V. One release per
// consumer warp (lane 0, after the warpgroup-wide wgmma wait), so the empty
// barriers count 4·NWG arrivals. The rings are STAGES tiles deep.

// Issues s = Q·Kᵀ (as qk_product, without waiting for it) for a Q tile of
// QROWS rows (its 64-column blocks QROWS·128 bytes apart).
template <bool F16, int D, int QROWS>
__device__ __forceinline__ void qk_issue_rows(float* s, u32 sQw, u32 sK) {
  wgmma_fence();
  const u64 da0 = make_desc(sQw, 16, 1024), db0 = make_desc(sK, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const u64 da = desc_off(da0, (kk >> 2) * QROWS * 128 + (kk & 3) * 32);
    const u64 db = desc_off(db0, (kk >> 2) * BC * 128 + (kk & 3) * 32);
    Wg<F16>::ss128(s, da, db, kk > 0);
  }
  wgmma_commit();
}

template <int D>
__device__ __forceinline__ void rescale_o(float* o, const float* alpha) {
#pragma unroll
  for (int dt = 0; dt < D / 8; dt++) {
    o[4 * dt + 0] *= alpha[0];
    o[4 * dt + 1] *= alpha[0];
    o[4 * dt + 2] *= alpha[1];
    o[4 * dt + 3] *= alpha[1];
  }
}

// softmax_rows followed by the packing of rescale_pack, reading s only: P
// goes packed into pn (k-step kk: S columns 16kk.., registers 0, 1 from the
// 8-column block 2kk, 2, 3 from 2kk+1; register q holds row g+8(q&1)).
template <bool F16>
__device__ __forceinline__ void softmax_pack(const float* s, float* m, float* l, float c, float* alpha,
                                             u32 (*pn)[4]) {
  float mc[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    // Four independent chains: with two or three warps per scheduler, one
    // chain of 32 dependent maxima would leave it idle most of the time.
    float mx4[4] = {-inf_f(), -inf_f(), -inf_f(), -inf_f()};
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 2; e++) mx4[2 * (nt & 1) + e] = fmaxf(mx4[2 * (nt & 1) + e], s[4 * nt + 2 * r + e]);
    }
    float mx = fmaxf(fmaxf(mx4[0], mx4[1]), fmaxf(mx4[2], mx4[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m[r], mx);
    const float muse = (mnew == -inf_f()) ? 0.f : mnew;  // no key seen yet: no NaN from inf-inf
    mc[r] = muse * c;
    alpha[r] = fexp2(m[r] * c - mc[r]);
    m[r] = mnew;
  }
  float rs[2][2] = {{0.f, 0.f}, {0.f, 0.f}};  // per row, two chains
#pragma unroll
  for (int kk = 0; kk < BC / 16; kk++) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const int r = q & 1;
      const float y0 = fmaf(s[8 * kk + 2 * q], c, -mc[r]), y1 = fmaf(s[8 * kk + 2 * q + 1], c, -mc[r]);
      const float x0 = fexp2(y0);
      const float x1 = fexp2(y1);
      rs[r][kk & 1] += x0 + x1;
      pn[kk][q] = pack2<F16>(x0, x1);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + (rs[r][0] + rs[r][1]);
}

// Whether the tile of keys kbase.. needs mask_scores for the warp whose first
// row is wrow0: it crosses Sk or (causal) the warp's diagonal.
__device__ __forceinline__ bool tile_masked(int kbase, int Sk, int wrow0, int causal) {
  return (kbase + BC > Sk) || (causal && kbase + BC - 1 > wrow0);
}

// The full and empty mbarriers of the K and V rings (one thread): a copy
// completes a full barrier; each of the 4·NWG consumer warps arrives on an
// empty one.
template <int STAGES, int NWG>
__device__ __forceinline__ void kv_ring_init(u32 fullK0, u32 fullV0, u32 emptyK0, u32 emptyV0) {
#pragma unroll
  for (int st = 0; st < STAGES; st++) {
    mbar_init(fullK0 + 8 * st, 1);
    mbar_init(fullV0 + 8 * st, 1);
    mbar_init(emptyK0 + 8 * st, 4 * NWG);
    mbar_init(emptyV0 + 8 * st, 4 * NWG);
  }
}

// A step's end without the softmax overlap: S_{j+1} and P_j·V_j done,
// K_{j+1} (stage st1) and V_j (stage st) released.
template <int D>
__device__ __forceinline__ void step_done(float* s, float* o, u32 (*pa)[4], u32 emptyK0, u32 emptyV0, int st, int st1,
                                          int lane) {
  wgmma_wait<0>();
  reg_fence<BC / 2>(s);
  reg_fence<D / 2>(o);
  reg_fence_u<BC / 4>(&pa[0][0]);
  if (lane == 0) {
    mbar_arrive(emptyK0 + 8 * st1);
    mbar_arrive(emptyV0 + 8 * st);
  }
}

// The overlapped end of a step (OVERLAP, unmasked tile): S_{j+1} is waited
// for and its softmax packed into pb while P_j·V_j (reading pa) still runs,
// then P_j·V_j is waited for; K_{j+1} (stage st1) and V_j (stage st) are
// released. ptxas moves instructions that do not depend on a wgmma past
// wgmma.wait_group: with a plain release every exponential ended up after
// the wait for P_j·V_j, so no softmax overlapped it. It keeps an mbarrier
// arrive ahead of the wait, though, so K_{j+1} is released only after the
// softmax, at an address computed from the row sums (l >= 0: the offset is
// 0), which pulls every exponential ahead.
template <bool F16, int D>
__device__ __forceinline__ void softmax_under_pv(float* s, float* o, float* m, float* l, float c, float* alpha,
                                                 u32 (*pa)[4], u32 (*pb)[4], u32 emptyK0, u32 emptyV0, int st,
                                                 int st1, int lane) {
  wgmma_wait<1>();
  reg_fence<BC / 2>(s);
  softmax_pack<F16>(s, m, l, c, alpha, pb);
  if (lane == 0) mbar_arrive(emptyK0 + 8 * st1 + (l[0] + l[1] < 0.f ? 8u : 0u));
  wgmma_wait<0>();
  reg_fence<D / 2>(o);
  reg_fence_u<BC / 4>(&pa[0][0]);
  if (lane == 0) mbar_arrive(emptyV0 + 8 * st);
}

// ---------------------------------------------------------------- persistent ping-pong
//
// fwd_pingpong with a CTA per SM (grid min(work items, SMs), 1-D) that walks
// tiles, a tile being one (head, block of BRQ query rows) of fwd_pingpong's grid.
// At short sequences a tile runs only a few K/V tiles, and fwd_pingpong's CTAs
// spent a good part of their time loading Q and the first K/V tile and
// storing O with the tensor cores idle; here the producer loads the next
// tile's Q and first K/V tiles while the consumers finish this one.
//
// Work: the tiles in flat order f = bh·nqb + pos (nqb query blocks a head,
// query block fastest, so the CTAs resident together work on a few heads and
// share their K and V in L2). Non-causal: CTA b takes f = b, b + G, b + 2G..
// (G = gridDim.x). Causal: a head's blocks in the order last, first, second
// last, second.. (pos 2i is block nqb-1-i, pos 2i+1 block i), and CTA b takes
// the pairs of tiles (2u, 2u+1) for u = b, b + G..: the two tiles of a pair
// have about as many K/V tiles together whichever pair it is (nqb+1 with
// 128-row blocks and Sk >= Sq; a pair may span two heads where nqb is odd),
// so the CTAs get about equal work, the heavy tile of each pair first.
// persistent_tile gives the flat index of a CTA's i-th tile; it grows with i.
//
// Dynamic schedule (sched != nullptr; the launcher's choice for causal
// attention): CTA b starts with tile b and takes each next one from a
// counter in global memory (sched[0], atomicAdd: tile G + the value it
// returns), drawn a tile ahead so that its latency hides behind the current
// tile's loads. A CTA that drew short tiles draws more, and the last tiles
// finish together whatever their lengths; the static pairs leave some CTAs
// a pair more than others (at S=2048, D=64: 16 against 15.5 on average).
// Order, causal: heads in sections of nh, and within a section the query
// blocks from the last (the longest tile) to the first, the section's heads
// fastest: heaviest first, so that short tiles fill in at the end. The
// launcher picks nh by measurement (H200: sections of 2 to 8 heads ran up
// to 8% slower than 16 to 96). Non-causal: f itself (all tiles are equal;
// measured no faster than static). The CTA that ends last
// (sched[1] counts the CTAs done, each after its last draw from sched[0])
// sets both back to 0 for the next launch: the launcher allocates them
// zeroed once per device.
//
// Producer (one thread): it alone walks the CTA's tiles. One K/V ring for
// all of them, its stage and parity counters running on across tiles. Two
// Q buffers: tile i's Q goes into buffer i % 2 once the consumers have
// released tile i-2's (mbarrier emptyQ of the buffer, 128·NWG arrivals, one
// per consumer thread after its epilogue: each thread's own arrival orders
// its reads of the tile's slot before the producer rewrites it; with one
// arrival per warp, compute-sanitizer's racecheck reported the other lanes'
// reads as racing with the rewrite). Per tile the producer issues K_0, then
// the tile's Q, then V_0, K_1, V_1..: the Q thus loads while the tile before
// runs. With each Q it writes the tile's head, first row and K/V tile count
// into slot i % 2 (16 bytes), which the buffer's barQ completion publishes
// to the consumers (arrive releases, try_wait acquires); after the last
// tile a count of 0, with a plain arrive on barQ, ends the consumers' loop.
// The consumers thus keep no tile index, tile count or head in registers
// (pingpong3wg's have none to spare) and read them again where they need them.
//
// Consumers: fwd_pingpong's issue phases, one per K/V tile of a tile (its S_0
// goes into the tile before's last phase, below), and its round-robin turns
// (named barriers 1..NWG) running on across tiles. Every warpgroup waits for
// its turn before each phase and passes it on after each; the last
// warpgroup hands warpgroup 0 its first turn at the start, and warpgroup 0
// takes the turn the last one passes on after its last phase with one more
// wait at the end. Every warpgroup walks the same tiles, so all run the same
// sequence of phases and each barrier sees as many arrivals (128 from the
// warpgroup before) as waits (128). Every CTA has a tile (the launcher's
// grid is at most the work) and every tile a K/V tile. o, m, l start afresh
// per tile.
//
// Each tile's S_0 goes into the last phase of the tile before, behind its
// last P·V, and runs while that tile's O is stored: a phase fewer per tile
// (the CTA's first tile's S_0 has a phase of its own). Its Q must be in by
// then: hence the two Q buffers. With one, the next tile's S_0 was issued
// only after this tile's O was stored, then waited for, and its softmax ran
// with no P·V of the warpgroup's own in flight. After the last tile the end
// marker's "S_0" is issued all the same (a product of whatever the buffers
// hold, never read; no copy is in flight then): with S_0 in flight on some
// paths only, ptxas serialized every wgmma (C7518). Faster than a phase of
// its own, for both persistent forwards (BENCHMARKS.md).

// Flat index of the i-th tile of this CTA (see above).
__device__ __forceinline__ int persistent_tile(int i, int causal) {
  return causal ? 2 * ((int)blockIdx.x + (i >> 1) * (int)gridDim.x) + (i & 1)
                : (int)blockIdx.x + i * (int)gridDim.x;
}

// Head, first query row and K/V tile count of flat tile f.
template <int BRQ>
__device__ __forceinline__ void persistent_decode(int f, int nqb, int Sk, int causal, int& bh, int& q0, int& ntiles) {
  bh = f / nqb;
  const int pos = f - bh * nqb;
  const int qb = causal ? ((pos & 1) ? (pos >> 1) : nqb - 1 - (pos >> 1)) : pos;
  q0 = qb * BRQ;
  const int kv_end = causal ? min(Sk, q0 + BRQ) : Sk;
  ntiles = (kv_end + BC - 1) / BC;
}

// Head, first query row and K/V tile count of flat tile f of the dynamic
// schedule (see above): causal in sections of nh heads, heaviest first.
template <int BRQ>
__device__ __forceinline__ void persistent_decode_dyn(int f, int nqb, int BH, int nh, int Sk, int causal, int& bh, int& q0,
                                               int& ntiles) {
  if (!causal) {
    persistent_decode<BRQ>(f, nqb, Sk, 0, bh, q0, ntiles);
    return;
  }
  const int sec = f / (nh * nqb), r = f - sec * nh * nqb;
  const int hs = min(nh, BH - sec * nh);  // heads in this section (the last may have fewer)
  const int qb = nqb - 1 - r / hs;
  bh = sec * nh + r % hs;
  q0 = qb * BRQ;
  ntiles = (min(Sk, q0 + BRQ) + BC - 1) / BC;
}

// atomicAdd without the warp aggregation the compiler wraps it in (the
// producer's one thread draws alone; the wrapper's registers made it spill
// at its 24).
__device__ __forceinline__ int atomic_add_global(int* p, int v) {
  int old;
  asm volatile("atom.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ int ld_shared(u32 addr) {
  int v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared(u32 addr, int v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// scale·log2e computed where it is used, not kept in a register through
// the tile loop (asm volatile: the compiler neither hoists nor merges it).
__device__ __forceinline__ float log2e_scale(float scale) {
  float c;
  asm volatile("mul.f32 %0, %1, %2;\n" : "=f"(c) : "f"(scale), "f"(kLog2e));
  return c;
}

// The persistent consumers' pieces that both of fwd_persistent's consumer bodies
// run. A tile's later softmax: masked where the K/V tile at kb crosses Sk
// or the warpgroup's diagonal (two copies of the softmax, as in fwd_pingpong).
template <bool F16>
__device__ __forceinline__ void persistent_softmax(float* s, float* m, float* l, float scale, float* alpha, u32 (*pb)[4],
                                            int kb, int Sk, int wgrow0, int warp, int g, int t, int causal) {
  if (tile_masked(kb, Sk, wgrow0, causal)) {
    mask_scores(s, kb, Sk, wgrow0 + (warp & 3) * 16, g, t, causal);
    softmax_pack<F16>(s, m, l, log2e_scale(scale), alpha, pb);
  } else {
    softmax_pack<F16>(s, m, l, log2e_scale(scale), alpha, pb);
  }
}

// The tile's O and LSE, its head and first row read from its slot. O leaves
// through shared memory: the warpgroup's 64 rows, divided by l and packed to
// 16 bits, go into its O tile sOw (stmatrix; the swizzled layout of the Q
// tiles, 64 rows) and the warpgroup's first thread stores the tile with TMA
// (rows past Sq are not written); LSE is stored directly. Storing O from
// registers (4-byte stores, 32 a thread at D=128) held the warps at every
// tile's end, waiting for the stores to drain (ncu's stall samples);
// through TMA the forward ran faster at D=128 (BENCHMARKS.md). The tile is
// written again only after the thread has waited for the store's read
// (bulk_wait_read before its turn in the next tile's last step).
template <bool F16, int D, int NWG>
__device__ __forceinline__ void persistent_store(const float* o, const float* m, const float* l, const TmaMap* to,
                                          float* __restrict__ LSE, u32 sOw, u32 slot, int cw, int warp, int lane,
                                          int Sq, int g, int t, float scale) {
  const int bh = ld_shared(slot);
  const int row0 = ld_shared(slot + 4) + cw * 64;  // the warpgroup's first row
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float lsum = l[r];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    const int row = row0 + (warp & 3) * 16 + g + r * 8;
    const bool ok = lsum > 0.f;
    inv[r] = ok ? 1.f / lsum : 0.f;
    if (t == 0 && row < Sq) LSE[(size_t)bh * Sq + row] = ok ? m[r] * scale + logf(lsum) : inf_f();
  }
  stage_rows<F16, D, 64>(o, inv, sOw, (warp & 3) * 16, lane);
  fence_proxy_async();
  named_bar_sync(1 + NWG + cw, 128);  // ids 1..NWG are the turns
  if ((threadIdx.x & 127) == 0) {
#pragma unroll
    for (int blk = 0; blk < D / 64; blk++) tma_store(to, sOw + blk * 64 * 128, blk * 64, row0, bh);
    bulk_commit();
  }
}

template <bool F16, int D, int NWG, int STAGES, bool OVERLAP>
__device__ __forceinline__ void fwd_persistent(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, const TmaMap* to,
                                        float* __restrict__ LSE, int BH, int Sq, int Sk, float scale, int causal,
                                        int* sched, int nh, int group) {
  static_assert(D == 64 || D == 128, "head dim");
  static_assert(NWG == 2 || NWG == 3, "consumer warpgroups");
  static_assert((STAGES & (STAGES - 1)) == 0, "STAGES a power of two");
  static_assert(NWG == 2 || !OVERLAP, "persistent3wg: no overlap");
  constexpr int NQ = 2;  // Q buffers: tile i's in buffer i % 2 (see above)
  constexpr int BRQ = 64 * NWG, QBYTES = BRQ * D * 2, KVBYTES = BC * D * 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 sQ0 = sbase;  // the Q tiles of even and odd tiles
  const u32 sK0 = sQ0 + NQ * QBYTES;
  const u32 sV0 = sK0 + STAGES * KVBYTES;
  const u32 sO0 = sV0 + STAGES * KVBYTES;  // each consumer warpgroup's O tile (persistent_store)
  const u32 bars = sO0 + NWG * 64 * D * 2;  // 4·STAGES + 2·NQ mbarriers of 8 bytes
  const u32 fullK0 = bars, fullV0 = fullK0 + 8 * STAGES;
  const u32 emptyK0 = fullV0 + 8 * STAGES, emptyV0 = emptyK0 + 8 * STAGES;
  const u32 barQ0 = emptyV0 + 8 * STAGES, emptyQ0 = barQ0 + 8 * NQ;  // one each per Q buffer
  // 2 tile slots {bh, q0, ntiles, -} of 16 bytes; the producer keeps its
  // next drawn tile in slot 0's last word.
  const u32 slots = emptyQ0 + 8 * NQ;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  if (tid == 0) {
#pragma unroll
    for (int b = 0; b < NQ; b++) {
      mbar_init(barQ0 + 8 * b, 1);
      mbar_init(emptyQ0 + 8 * b, 128 * NWG);
    }
    kv_ring_init<STAGES, NWG>(fullK0, fullV0, emptyK0, emptyV0);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Registers as in fwd_pingpong.
  if (warp >= 4 * NWG) {  // producer warpgroup: one thread issues every copy
    producer_regs<NWG>();
    if (warp == 4 * NWG && lane == 0) {
      const int nqb = (Sq + BRQ - 1) / BRQ;
      const int total = BH * nqb;  // the launcher checks that total + 2·gridDim.x fits in int
      // Tile i's slot and Q buffer (i % 2), once tile i-2 has released
      // them; with bh < 0 the count of 0 that ends the consumers' loop
      // instead.
      auto issue_q = [&](int i, int bh, int q0, int ntiles) {
        const int b = i & 1;
        if (i >= 2) mbar_wait(emptyQ0 + 8 * b, ((i - 2) >> 1) & 1);
        const u32 slot = slots + 16 * (i & 1);
        if (bh < 0) {
          st_shared(slot + 8, 0);
          mbar_arrive(barQ0 + 8 * b);
          return;
        }
        st_shared(slot, bh);
        st_shared(slot + 4, q0);
        st_shared(slot + 8, ntiles);
        mbar_expect_tx(barQ0 + 8 * b, QBYTES);
#pragma unroll
        for (int blk = 0; blk < D / 64; blk++)
          tma_load(sQ0 + b * QBYTES + blk * BRQ * 128, tq, blk * 64, q0, bh, barQ0 + 8 * b);
      };
      u32 kvi = 0;  // K/V tiles issued: stage kvi % STAGES, the stage's use kvi / STAGES
      int i = 0;
      // Dynamic: the tile after f, drawn while f's copies are issued, waits
      // in slot 0's last word (in a register it made the 24-register
      // producer of persistent spill one).
      const u32 fnext = slots + 12;
      int f = sched ? (int)blockIdx.x : persistent_tile(0, causal);
      if (sched && f < total) st_shared(fnext, (int)gridDim.x + atomic_add_global(sched, 1));
      for (; f < total; ++i) {
        int bh, q0, ntiles;
        if (sched) {
          persistent_decode_dyn<BRQ>(f, nqb, BH, nh, Sk, causal, bh, q0, ntiles);
        } else {
          persistent_decode<BRQ>(f, nqb, Sk, causal, bh, q0, ntiles);
        }
        for (int j = 0; j < ntiles; j++, kvi++) {
          // A stage's use u waits for the release of use u-1 (parity (u-1) & 1).
          const u32 st = kvi % STAGES, wait_ph = ((kvi / STAGES) & 1) ^ 1;
          if (kvi >= STAGES) mbar_wait(emptyK0 + 8 * st, wait_ph);
          mbar_expect_tx(fullK0 + 8 * st, KVBYTES);
#pragma unroll
          for (int blk = 0; blk < D / 64; blk++)
            tma_load(sK0 + st * KVBYTES + blk * BC * 128, tk, blk * 64, j * BC, bh / group, fullK0 + 8 * st);
          if (j == 0) issue_q(i, bh, q0, ntiles);
          if (kvi >= STAGES) mbar_wait(emptyV0 + 8 * st, wait_ph);
          mbar_expect_tx(fullV0 + 8 * st, KVBYTES);
#pragma unroll
          for (int blk = 0; blk < D / 64; blk++)
            tma_load(sV0 + st * KVBYTES + blk * BC * 128, tv, blk * 64, j * BC, bh / group, fullV0 + 8 * st);
        }
        if (sched) {
          f = ld_shared(fnext);
          if (f < total) st_shared(fnext, (int)gridDim.x + atomic_add_global(sched, 1));
        } else {
          f = persistent_tile(i + 1, causal);
        }
      }
      issue_q(i, -1, 0, 0);  // i = the CTA's tile count
      // Every CTA counts itself done after its last draw; the last one
      // resets the schedule for the next launch (see above).
      if (sched && atomic_add_global(sched + 1, 1) == (int)gridDim.x - 1) {
        atomicExch(sched, 0);
        atomicExch(sched + 1, 0);
      }
    }
  } else {  // consumer warpgroups
    consumer_regs<NWG>();
    const int cw = warpgroup_index();
    const int g = lane >> 2, t = lane & 3;
    const u32 my_turn = 1 + cw, next_turn = 1 + (cw + 1) % NWG;  // named barrier ids (0 is __syncthreads)
    // K/V tiles consumed in bits 0-29 (K_j, V_j are in stage kv % STAGES,
    // parity (kv / STAGES) & 1: STAGES divides 2^30), and in bits 30-31 the
    // tile count mod 4: its low bit picks the tile's slot and Q buffer, the
    // next bit is the parity of that buffer's barQ phase. One register for
    // fwd_pingpong's stage and parity counters and the tile's.
    u32 kv = 0;
    if (cw == NWG - 1) named_bar_arrive(next_turn, 256);  // warpgroup 0's first turn
    // S_0 of a tile: the CTA's first tile's in a phase of its own, every
    // later tile's in the last phase of the tile before, beside its last
    // P·V, so that it runs while that tile's O is stored.
    // Every CTA has a tile (the launcher's grid is at most the work), and
    // an S_0 is in flight at the top of every tile, also the end marker's
    // (a product of whatever the buffers hold, never read): with S_0 in
    // flight on some paths only, ptxas serialized every wgmma (C7518).
    float s[BC / 2];
    mbar_wait<false>(barQ0, 0);
    mbar_wait<false>(fullK0, 0);
    named_bar_sync(my_turn, 256);
    qk_issue_rows<F16, D, BRQ>(s, sQ0 + cw * 64 * 128, sK0);
    named_bar_arrive(next_turn, 256);
    for (;; kv += 1u << 30) {
      const u32 ti = kv >> 30;
      const u32 slot = slots + 16 * (ti & 1);
      // This tile's barQ was waited for by the tile before's last step (or above).
      const int ntiles = ld_shared(slot + 8);
      if (ntiles == 0) break;
      const u32 sQw = sQ0 + (ti & 1) * QBYTES + cw * 64 * 128;  // this warpgroup's rows of the Q tile
      float o[D / 2];
#pragma unroll
      for (int k = 0; k < D / 2; k++) o[k] = 0.f;
      float m[2] = {-inf_f(), -inf_f()};
      float l[2] = {0.f, 0.f};
      float alpha[2];
      u32 p[BC / 16][4];

      {
        wgmma_wait<0>();
        reg_fence<BC / 2>(s);
        if (lane == 0) mbar_arrive(emptyK0 + 8 * (kv % STAGES));
        // o = 0: no rescale
        const int wgrow0 = ld_shared(slot + 4) + cw * 64;  // the warpgroup's first row
        // One copy of the softmax: with a masked and an unmasked one, and
        // the descriptors in uniform registers, NVRTC 13 spilled at the
        // three warpgroups' 160 registers. A tile's first K/V tile only.
        if (tile_masked(0, Sk, wgrow0, causal)) mask_scores(s, 0, Sk, wgrow0 + (warp & 3) * 16, g, t, causal);
        softmax_pack<F16>(s, m, l, log2e_scale(scale), alpha, p);
      }

      // Step j < n-1: P_j from pa, P_{j+1} into pb (OVERLAP: the other
      // array, written while P_j·V_j runs; else the same one); kv counts
      // K_j, V_j on entry. As fwd_pingpong's step, but the turn always passes on.
      auto step = [&](int j, u32 (*pa)[4], u32 (*pb)[4]) {
        const int st = kv % STAGES, st1 = (kv + 1) % STAGES;
        const u32 ph = (kv / STAGES) & 1, ph1 = ((kv + 1) / STAGES) & 1;
        mbar_wait<false>(fullK0 + 8 * st1, ph1);
        mbar_wait<false>(fullV0 + 8 * st, ph);
        named_bar_sync(my_turn, 256);
        qk_issue_rows<F16, D, BRQ>(s, sQw, sK0 + st1 * KVBYTES);
        pv_issue<F16, D>(o, pa, sV0 + st * KVBYTES);
        named_bar_arrive(next_turn, 256);
        const int kb = (j + 1) * BC;
        const int wgrow0 = ld_shared(slot + 4) + cw * 64;
        if constexpr (OVERLAP) {
          if (!tile_masked(kb, Sk, wgrow0, causal)) {
            softmax_under_pv<F16, D>(s, o, m, l, log2e_scale(scale), alpha, pa, pb, emptyK0, emptyV0, st, st1,
                                     lane);
          } else {
            step_done<D>(s, o, pa, emptyK0, emptyV0, st, st1, lane);
            persistent_softmax<F16>(s, m, l, scale, alpha, pb, kb, Sk, wgrow0, warp, g, t, causal);
          }
        } else {
          // No overlap of the softmax with the warpgroup's own P·V (three
          // warpgroups' registers do not hold two P arrays).
          step_done<D>(s, o, pa, emptyK0, emptyV0, st, st1, lane);
          persistent_softmax<F16>(s, m, l, scale, alpha, pb, kb, Sk, wgrow0, warp, g, t, causal);
        }
        rescale_o<D>(o, alpha);
        kv++;
      };
      // The last step: P_{n-1}·V_{n-1}, then the next tile's S_0 (its Q and
      // K_0 waited for first; after the last tile, the end marker's), left
      // in flight while this tile's O is stored. P·V goes first, so waiting
      // for all groups but one waits for it.
      auto last_step = [&](u32 (*pa)[4]) {
        const int st = kv % STAGES, st1 = (kv + 1) % STAGES;
        const u32 ph = (kv / STAGES) & 1, ph1 = ((kv + 1) / STAGES) & 1;
        const u32 nb = (ti + 1) & 1;
        mbar_wait<false>(barQ0 + 8 * nb, ((ti + 1) >> 1) & 1);
        if (ld_shared(slots + 16 * nb + 8) > 0) mbar_wait<false>(fullK0 + 8 * st1, ph1);
        mbar_wait<false>(fullV0 + 8 * st, ph);
        // The tile before's O store has read the O tile (see persistent_store):
        // past the turn, the whole warpgroup knows.
        if ((tid & 127) == 0) bulk_wait_read<0>();
        named_bar_sync(my_turn, 256);
        pv_issue<F16, D>(o, pa, sV0 + st * KVBYTES);
        qk_issue_rows<F16, D, BRQ>(s, sQ0 + nb * QBYTES + cw * 64 * 128, sK0 + st1 * KVBYTES);
        named_bar_arrive(next_turn, 256);
        wgmma_wait<1>();
        reg_fence<D / 2>(o);
        reg_fence_u<BC / 4>(&pa[0][0]);
        if (lane == 0) mbar_arrive(emptyV0 + 8 * st);
        kv++;
      };
      // One last_step call, so with OVERLAP an odd step count copies
      // P_{n-1} back into p (32 moves a tile). With a last_step after each
      // of the two steps, ptxas built the Q·Kᵀ descriptors in ordinary
      // registers and moved them to uniform ones before every wgmma
      // (slower, see sass_test.go); with a loop exit that did not pass
      // through a last_step, it serialized every wgmma (C7514; far
      // slower).
      if constexpr (OVERLAP) {
        u32 p2[BC / 16][4];
        const int n = ld_shared(slot + 8);
        int j = 0;
        for (; j + 2 < n; j += 2) {
          step(j, p, p2);
          step(j + 1, p2, p);
        }
        if (j + 1 < n) {
          step(j, p, p2);
#pragma unroll
          for (int k = 0; k < BC / 16; k++) {
#pragma unroll
            for (int q = 0; q < 4; q++) p[k][q] = p2[k][q];
          }
        }
        last_step(p);
      } else {
        for (int j = 0; j + 1 < ld_shared(slot + 8); j++) step(j, p, p);
        last_step(p);
      }
      persistent_store<F16, D, NWG>(o, m, l, to, LSE, sO0 + cw * 64 * D * 2, slot, cw, warp, lane, Sq, g, t, scale);
      // The tile's slot and Q buffer are read for the last time (each
      // thread's own arrival orders its reads before the producer's rewrite).
      mbar_arrive(emptyQ0 + 8 * (ti & 1));
    }
    wgmma_wait<0>();  // the end marker's S_0
    if (cw == 0) named_bar_sync(my_turn, 256);  // the last warpgroup's last turn
    if ((tid & 127) == 0) bulk_wait<0>();        // the last O store done before the CTA's shared memory goes
  }
}

}  // namespace fa90

#endif  // FLASH_SM90_FWD_CUH
