// flash_attention_sm90.cu: FlashAttention forward and backward for Hopper
// (sm_90a): wgmma, TMA.
//
// Compiled at run time by NVRTC for sm_90a only (wgmma needs the "a" target);
// backend/cuda/flash_sm90.go picks it on compute capability 9.0 and falls back
// to flash_attention.cu (FA2, mma.sync) elsewhere. It includes no header: the
// 16-bit element types travel as raw bits and are converted with PTX cvt.
//
// Same contract as flash_fwd_<T>_d<D> of flash_attention.cu: Q, O are [BH, Sq, D];
// K, V are [BH, Sk, D], contiguous; LSE is float32 [BH, Sq] (natural log). Causal
// masking is top-left aligned (key j visible to query i iff j <= i, also when
// Sq != Sk). A row that sees no key gets O = 0, LSE = +inf. Requires scale > 0
// (row maxima are taken on raw scores).
//
// Entry points (T in {bf16, fp16}, D in {64, 128}):
//   flash_fwd_sm90_tma_<T>_d<D>(tq, tk, tv, o, lse, BH, Sq, Sk, scale, causal)
//     tq, tk, tv: CUtensorMaps (128 bytes, by value) of Q, K, V, see fwd_ws;
//     grid (ceil(Sq/128), BH), block 384 (two consumer warpgroups, one
//     producer warpgroup), dynamic smem (128 + 4*128)*D*2 + 64 + 1024 bytes:
//     d64 83008, d128 164928.
//   flash_fwd_sm90_pp_<T>_d<D>(...)  the same arguments, ping-pong consumers
//     (version 4, see fwd_pp): grid (ceil(Sq/128), BH), block 384, K/V rings
//     of 4 (d64) or 2 (d128) tiles, dynamic smem 128·D·2 + 2·stages·128·D·2 +
//     8·(1 + 4·stages) + 1024 bytes: d64 148616, d128 164936.
//   flash_fwd_sm90_pp3_<T>_d64(...)  three ping-pong consumer warpgroups:
//     grid (ceil(Sq/192), BH), block 512, Q map box 64 × 192 rows, 4 stages,
//     dynamic smem 192·64·2 + 2·4·128·64·2 + 136 + 1024 = 156808 bytes.
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
//   flash_bwd_sm90_cols_<T>_d<D>(tq, tk, tv, tdo, tdk, tdv, lse, Dsum, dQaccum, BH,
//                                Sq, Sk, scale, causal)
//     the main kernel of FlashBackward, same contract as flash_bwd_<T>_d<D> of
//     flash_attention.cu (run its flash_bwd_pre_<T> before, flash_bwd_convert_<T>
//     after, with swz = 1: see dq_stage); tq, tk, tv, tdo, tdk, tdv: CUtensorMaps
//     of Q, K, V, dO, dK, dV (boxes of 64 columns × 64 rows for Q, dO, dK and
//     dV, × 128 rows for K and V), see bwd and bwd_store_dkdv; dQaccum 16-byte
//     aligned; grid (ceil(Sk/128), BH), block 256 (two warpgroups), dynamic smem
//     2*128*D*2 + 6*64*D*2 + 2*128*64*2 + 6*64*4 + 64 + 1024 bytes (d64
//     117312, d128 199232) plus the dQ staging tiles, 2*64*64*4 (d64) or
//     64*128*4 (d128) bytes: d64 150080, d128 232000.
//   flash_bwd_sm90_dqtma_<T>_d<D>(...)  the same without PIPE and, at D=64,
//     without COLS (see bwd): four staging tiles, d64 182848, d128 232000.
//   flash_bwd_sm90_pp_<T>_d64(...)  the consumer warpgroups take turns
//     (see bwd_pp): block 384, dqtma's shared memory at D=64 (182848).
//   flash_bwd_sm90_alt_<T>_d128(...)  cols with each block's dQ taken by one
//     warpgroup in turn (see ALT in bwd's header): cols' block and shared
//     memory (232000).
//
// Design: one CTA = 128 query rows = two consumer warpgroups of 64 rows each,
// K and V tiles of 128 keys double-buffered in 128-byte-swizzled shared memory.
// Version 2 (flash_fwd_sm90_tma_*; version 1, all threads loading with
// cp.async, and version 3, version 2 with the next Q·Kᵀ in flight during P·V,
// lost to version 4 on the H200 and are gone): a producer warpgroup (one
// thread of it) loads with TMA through an mbarrier ring and the consumer
// warpgroups run unsynchronised. Version 4
// (flash_fwd_sm90_pp_*, _pp3_*): the consumer warpgroups take turns issuing
// their products (named barriers), so one's softmax runs under another's
// wgmmas; see fwd_pp. Version 5 (flash_fwd_sm90_ppp*): version 4 with a
// CTA per SM that walks the tiles, loading the next one's Q and K/V while
// it finishes this one; see fwd_ppp.
//   S = Q·Kᵀ: wgmma m64n128k16, A = Q and B = K both K-major from shared memory.
//   softmax as in flash_attention.cu (exp2, running max, fully-masked-row rules).
//   O += P·V: wgmma m64nDk16, A = P from registers (the accumulator layout of S
//   packed to 16 bits is the A fragment layout), B = V read N-major
//   (imm-trans-b = 1) from the same row layout K uses.
//
// Shared memory tiles: a tile of ROWS rows × D columns (16-bit) is stored as D/64
// column blocks of ROWS rows × 128 bytes; inside a block, 16-byte chunk c of row
// r sits at chunk c ^ (r & 7). Every block starts on a 1024-byte boundary, so
// this is exactly the hardware's 128-byte swizzle ("Swizzle<3,4,3>") that the
// wgmma descriptors below declare (swizzle mode 1).
//   K-major operand (Q as A, K as B): 8-row core groups 1024 bytes apart (SBO);
//   the leading byte offset is unused for swizzled K-major layouts (set to 16);
//   k-step kk (16 columns) starts at block kk/4, byte offset (kk%4)*32.
//   N-major operand (V as B): rows are k (keys), 16 keys = two 8-row groups
//   1024 bytes apart (SBO); the 64-column blocks along N are ROWS*128 bytes
//   apart (LBO); k-step kk starts at byte offset kk*16*128. (The H200 confirmed
//   this reading of the PTX ISA's N-major swizzled layout: d128 with LBO and
//   SBO exchanged fails every shape, and d128 as two n64 products, which does
//   not depend on it, agrees.)

namespace fa90 {

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int BR = 128;  // query rows per CTA (two warpgroups of 64)
constexpr int BC = 128;  // keys per K/V tile
constexpr int NT = 256;  // threads per CTA

__device__ __forceinline__ float inf_f() { return __int_as_float(0x7f800000); }

__device__ __forceinline__ u32 smem_u32(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// Two floats to packed 16-bit values, lo in the low half (cvt puts its first
// source in the upper half).
template <bool F16> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<false>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <> __device__ __forceinline__ u32 pack2<true>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// 2^x on the SFU (ex2.approx.ftz: <= 2 ulp, 2^-inf = +0).
__device__ __forceinline__ float fexp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Makes this thread's generic-proxy writes to shared memory (cp.async lands
// there) visible to the async proxy that wgmma reads through; a barrier must
// follow before other threads' wgmmas read them.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of r across this point: wgmma
// writes its accumulators (and reads its A registers) asynchronously, so every
// use must stay after wgmma_wait.
template <int N> __device__ __forceinline__ void reg_fence(float* r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence_u(u32* r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

// Shared-memory matrix descriptor: start address, leading and stride byte
// offsets (each >> 4, 14 bits), swizzle mode 1 = 128 bytes (bits 62-63); base
// offset 0 since every swizzle block starts on a 1024-byte boundary.
__device__ __forceinline__ u64 make_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) |
         ((u64)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// The descriptor of the operand off bytes (a multiple of 16) past the one d
// describes. Shared addresses are below 2^18, so the start-address field
// (addr >> 4, bits 0-13) takes the offset without carrying into the next
// field: one 32-bit add instead of make_desc's masks and shifts per k-step.
// ptxas had rebuilt every descriptor from its address (ten integer
// instructions per wgmma, a third of the forward's non-float instructions).
__device__ __forceinline__ u64 desc_off(u64 d, u32 off) {
  u32 lo, hi;
  asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "l"(d));
  u64 r;
  asm("mov.b64 %0, {%1, %2};" : "=l"(r) : "r"(lo + (off >> 4)), "r"(hi));
  return r;
}

// The warpgroup index of this thread (threadIdx.x / 128), broadcast from
// lane 0: ptxas then knows it is one value for the whole warp and keeps what
// derives from it, the wgmma descriptors above all, in uniform registers
// (uniform datapath, no copy into them before each wgmma). From warp >> 2 it
// built every descriptor per thread and copied it over: with desc_off, the
// forward's consumer loop went from 688 to about 545 instructions per warp
// and K/V tile (ncu on the H200, D=128; BENCHMARKS.md).
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0); }

// Byte offset of 16-byte chunk c of row r in a ROWS-row tile (see the header).
template <int ROWS> __device__ __forceinline__ u32 tile_off(int r, int c) {
  return (u32)((c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// ---------------------------------------------------------------- wgmma wrappers
// (operand lists written out: inline asm takes no loops; TY is the PTX type
// of A and B, "bf16" or "f16")

#define FA90_ACC16                                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),   \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),        \
      "+f"(d[15])
#define FA90_ACC32                                                                                  \
  FA90_ACC16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),          \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),      \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FA90_ACC64                                                                                  \
  FA90_ACC32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),          \
      "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),      \
      "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),      \
      "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]),      \
      "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FA90_D32                                                                                    \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                        \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define FA90_D64                                                                                    \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                        \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                               \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                               \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
// m64n128k16, A and B in shared memory; scale-d from operand 66, A's and
// B's layouts from operands 67 and 68 (1 M-/N-major, 0 K-major).
#define FA90_SS128(TY)                                                                              \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                     \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " FA90_D64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
// m64n64k16 / m64n128k16, A from registers, B N-major in shared memory
// (m64n64k16: B's layout from operand 38, 1 N-major, 0 K-major).
#define FA90_RS64(TY)                                                                               \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                     \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " FA90_D32 ", {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
#define FA90_RS128(TY)                                                                              \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                     \
  "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " FA90_D64 ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"

// The three products of the forwards (Wg<F16>): d[0..63] (+)= A·B with
// ss128 (m64n128k16, A and B in shared memory, K-major unless TA / TB is 1:
// the backward's dQ has both transposed); d[0..31] or d[0..63] += A·B with
// rs64 / rs128 (m64n64k16 / m64n128k16, A from registers a[0..3], B N-major
// in shared memory).
template <bool F16> struct Wg {
  template <int TA = 0, int TB = 0>
  static __device__ __forceinline__ void ss128(float* d, u64 da, u64 db, int accumulate) {
    if constexpr (F16) {
      asm volatile(FA90_SS128("f16") : FA90_ACC64 : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
    } else {
      asm volatile(FA90_SS128("bf16") : FA90_ACC64 : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
    }
  }
  static __device__ __forceinline__ void rs64(float* d, const u32* a, u64 db) {
    if constexpr (F16) {
      asm volatile(FA90_RS64("f16")
                   : FA90_ACC32
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(1));
    } else {
      asm volatile(FA90_RS64("bf16")
                   : FA90_ACC32
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(1));
    }
  }
  // rs64 with B K-major, (+)= as accumulate says: the backward's Sᵀ and dPᵀ.
  static __device__ __forceinline__ void rs64k(float* d, const u32* a, u64 db, int accumulate) {
    if constexpr (F16) {
      asm volatile(FA90_RS64("f16")
                   : FA90_ACC32
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(0));
    } else {
      asm volatile(FA90_RS64("bf16")
                   : FA90_ACC32
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(0));
    }
  }
  static __device__ __forceinline__ void rs128(float* d, const u32* a, u64 db) {
    if constexpr (F16) {
      asm volatile(FA90_RS128("f16") : FA90_ACC64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    } else {
      asm volatile(FA90_RS128("bf16") : FA90_ACC64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
    }
  }
};

// The pieces both forwards share. A consumer warpgroup owns 64 query rows;
// inside it warp w owns 16, and a thread holds, like mma.sync's accumulator,
// rows g and g+8 (g = lane/4) and, per 8-column block nt, columns 8nt+2t and
// 8nt+2t+1 (t = lane%4): s[4nt+e] is row g+8(e>>1), column 8nt+2t+(e&1). O
// accumulates in o[] the same way over D columns.

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

// Issues o += P·V (see pv_product) without waiting for it.
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

// ---------------------------------------------------------------- version 2: TMA, warp-specialised
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
//
// The tensor maps are 3-D (D, S, BH) views of Q, K, V (innermost first) with
// a box of 64 × 128 × 1 elements: rows past S read as zeros, never as the next
// head's rows.

struct __align__(64) TmaMap {
  u64 v[16];
};

constexpr int WS_THREADS = 384;

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Waits until the phase with the given parity of bar has completed. With
// WATCH, after 2^26 failed tries (seconds: each try waits a while in
// hardware) an arrival or a copy was lost: the kernel traps, so the launch
// fails with an error instead of hanging. The pipelined consumers wait
// without the watch: its counter alone makes ptxas spill them.
template <bool WATCH = true>
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  if constexpr (WATCH) {
    for (u32 n = 0; !mbar_try(bar, parity);) {
      if (++n == (1u << 26)) __trap();
    }
  } else {
    while (!mbar_try(bar, parity)) {
    }
  }
}
// mbar_wait without the watch, the loop inside one asm statement: in bwd_pp's
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
// One TMA box (64 columns × 128 rows of one head) into shared memory at dst,
// completing on bar.
__device__ __forceinline__ void tma_load(u32 dst, const TmaMap* map, int col, int row, int head, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(col), "r"(row), "r"(head), "r"(bar)
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
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's bulk groups still read their
// shared-memory sources (their global writes may still be in flight).
template <int N> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until at most N of this thread's bulk groups are incomplete (reads
// and writes done).
template <int N> __device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// One TMA box from shared memory at src to (col, row, head) of the map's
// tensor; coordinates past the tensor's bounds are not written. Same rules
// for the source as bulk_reduce_add_f32.
__device__ __forceinline__ void tma_store(const TmaMap* map, u32 src, int col, int row, int head) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<u64>(map)),
               "r"(col), "r"(row), "r"(head), "r"(src)
               : "memory");
}

template <bool F16, int D>
__device__ __forceinline__ void fwd_ws(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, u16* __restrict__ O,
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

// ---------------------------------------------------------------- version 4: ping-pong
//
// Version 2's producer and NWG consumer warpgroups (BRQ = 64·NWG query rows
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
// OVERLAP (the "pp" kernels, two consumer warpgroups): inside a warpgroup the
// softmax of S_{j+1} also runs while P_j·V_j accumulates, as in version 3.
// NVRTC 12.4's ptxas serialized every wgmma when ordinary instructions wrote
// a wgmma's accumulator while a group was in flight (C7515), and when one
// branch of the step packed P into the A registers and the other into a
// spare array copied over them (C7513). So: the softmax only reads S
// (softmax_pack) and packs P_{j+1} into the other of two P arrays, which
// steps use in turn (the loop unrolled by two), instead of version 3's
// 64-register copy of S; and the tiles that need a mask (a warpgroup's
// diagonal tile, the one crossing Sk: one or two of a CTA's) wait for
// P_j·V_j first and mask S in place. Without OVERLAP (the "pp3" kernels,
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

__device__ __forceinline__ void named_bar_sync(u32 id, u32 n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(u32 id, u32 n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// The address lane gives an x4 ldmatrix / stmatrix for the 16 × 16 block
// (rows row0.., columns 16kk..) of a ROWS-row tile: matrix j = lane / 8, of
// which lane supplies row lane % 8, is rows row0 + 8(j&1).., columns
// 16kk + 8(j>>1)..; a matrix row is one 16-byte chunk of the tile. Register
// j of the four is then the same matrix: a wgmma A fragment of k-step kk.
template <int ROWS> __device__ __forceinline__ u32 x4_addr(u32 tile, int row0, int kk, int lane) {
  const int m = lane >> 3;
  return tile + tile_off<ROWS>(row0 + (m & 1) * 8 + (lane & 7), 2 * kk + (m >> 1));
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

// The ping-pong kernels' register handover: the launch bound leaves
// 65536 / (128·(NWG+1)) a thread, 168 or 128; the producer warpgroup gives
// them up and the consumers take them (24·128 + 2·240·128 = 168·384,
// 32·128 + 3·160·128 = 128·512).
template <int NWG>
__device__ __forceinline__ void producer_regs() {
  if constexpr (NWG == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 32;\n" ::: "memory");
  }
}
template <int NWG>
__device__ __forceinline__ void consumer_regs() {
  if constexpr (NWG == 2) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
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

template <bool F16, int D, int NWG, int STAGES, bool OVERLAP>
__device__ __forceinline__ void fwd_pp(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, u16* __restrict__ O,
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

// ---------------------------------------------------------------- version 5: persistent ping-pong
//
// fwd_pp with a CTA per SM (grid min(work items, SMs), 1-D) that walks
// tiles, a tile being one (head, block of BRQ query rows) of fwd_pp's grid.
// At short sequences a tile runs only a few K/V tiles, and fwd_pp's CTAs
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
// ppp_tile gives the flat index of a CTA's i-th tile; it grows with i.
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
// (pp3's have none to spare) and read them again where they need them.
//
// Consumers: fwd_pp's issue phases, one per K/V tile of a tile (its S_0
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
// paths only, ptxas serialized every wgmma (C7518). H200, bf16: ppp3
// 1.7–5.6% faster non-causal and 0–2.4% causal (run 47), ppp at D=128 0–2.6%
// non-causal and 0–4.2% causal (run 52).

// Flat index of the i-th tile of this CTA (see above).
__device__ __forceinline__ int ppp_tile(int i, int causal) {
  return causal ? 2 * ((int)blockIdx.x + (i >> 1) * (int)gridDim.x) + (i & 1)
                : (int)blockIdx.x + i * (int)gridDim.x;
}

// Head, first query row and K/V tile count of flat tile f.
template <int BRQ>
__device__ __forceinline__ void ppp_decode(int f, int nqb, int Sk, int causal, int& bh, int& q0, int& ntiles) {
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
__device__ __forceinline__ void ppp_decode_dyn(int f, int nqb, int BH, int nh, int Sk, int causal, int& bh, int& q0,
                                               int& ntiles) {
  if (!causal) {
    ppp_decode<BRQ>(f, nqb, Sk, 0, bh, q0, ntiles);
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

// The persistent consumers' pieces that both of fwd_ppp's consumer bodies
// run. A tile's later softmax: masked where the K/V tile at kb crosses Sk
// or the warpgroup's diagonal (two copies of the softmax, as in fwd_pp).
template <bool F16>
__device__ __forceinline__ void ppp_softmax(float* s, float* m, float* l, float scale, float* alpha, u32 (*pb)[4],
                                            int kb, int Sk, int wgrow0, int warp, int g, int t, int causal) {
  if (tile_masked(kb, Sk, wgrow0, causal)) {
    mask_scores(s, kb, Sk, wgrow0 + (warp & 3) * 16, g, t, causal);
    softmax_pack<F16>(s, m, l, log2e_scale(scale), alpha, pb);
  } else {
    softmax_pack<F16>(s, m, l, log2e_scale(scale), alpha, pb);
  }
}

// A warpgroup's 64 × D accumulator x (the layout of S and O: a thread has
// rows g and g+8 of its warp's 16 and two columns of each 8-column block),
// row g+8r times mul[r], packed to 16 bits into the warp's rows wrow0.. of a
// swizzled tile of ROWS rows (stmatrix, see x4_addr), as the source of a
// TMA store.
template <bool F16, int D, int ROWS>
__device__ __forceinline__ void stage_rows(const float* x, const float* mul, u32 tile, int wrow0, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    u32 a[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float* xj = x + 8 * kk + 2 * j;  // 8-column block 2kk + (j >> 1), row g + 8(j & 1)
      a[j] = pack2<F16>(xj[0] * mul[j & 1], xj[1] * mul[j & 1]);
    }
    const u32 addr = x4_addr<ROWS>(tile, wrow0, kk, lane);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a[0]),
                 "r"(a[1]), "r"(a[2]), "r"(a[3])
                 : "memory");
  }
}

// The tile's O and LSE, its head and first row read from its slot. O leaves
// through shared memory: the warpgroup's 64 rows, divided by l and packed to
// 16 bits, go into its O tile sOw (stmatrix; the swizzled layout of the Q
// tiles, 64 rows) and the warpgroup's first thread stores the tile with TMA
// (rows past Sq are not written); LSE is stored directly. Storing O from
// registers (4-byte stores, 32 a thread at D=128) held the warps at every
// tile's end (ncu on the H200, run 61: 7% of the stall samples, waiting for
// the stores to drain); through TMA the forward ran 1–10% faster at D=128
// (run 63). The tile is
// written again only after the thread has waited for the store's read
// (bulk_wait_read before its turn in the next tile's last step).
template <bool F16, int D, int NWG>
__device__ __forceinline__ void ppp_store(const float* o, const float* m, const float* l, const TmaMap* to,
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
__device__ __forceinline__ void fwd_ppp(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, const TmaMap* to,
                                        float* __restrict__ LSE, int BH, int Sq, int Sk, float scale, int causal,
                                        int* sched, int nh) {
  static_assert(D == 64 || D == 128, "head dim");
  static_assert(NWG == 2 || NWG == 3, "consumer warpgroups");
  static_assert((STAGES & (STAGES - 1)) == 0, "STAGES a power of two");
  static_assert(NWG == 2 || !OVERLAP, "ppp3: no overlap");
  constexpr int NQ = 2;  // Q buffers: tile i's in buffer i % 2 (see above)
  constexpr int BRQ = 64 * NWG, QBYTES = BRQ * D * 2, KVBYTES = BC * D * 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 sQ0 = sbase;  // the Q tiles of even and odd tiles
  const u32 sK0 = sQ0 + NQ * QBYTES;
  const u32 sV0 = sK0 + STAGES * KVBYTES;
  const u32 sO0 = sV0 + STAGES * KVBYTES;  // each consumer warpgroup's O tile (ppp_store)
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

  // Registers as in fwd_pp.
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
      // producer of ppp spill one).
      const u32 fnext = slots + 12;
      int f = sched ? (int)blockIdx.x : ppp_tile(0, causal);
      if (sched && f < total) st_shared(fnext, (int)gridDim.x + atomic_add_global(sched, 1));
      for (; f < total; ++i) {
        int bh, q0, ntiles;
        if (sched) {
          ppp_decode_dyn<BRQ>(f, nqb, BH, nh, Sk, causal, bh, q0, ntiles);
        } else {
          ppp_decode<BRQ>(f, nqb, Sk, causal, bh, q0, ntiles);
        }
        for (int j = 0; j < ntiles; j++, kvi++) {
          // A stage's use u waits for the release of use u-1 (parity (u-1) & 1).
          const u32 st = kvi % STAGES, wait_ph = ((kvi / STAGES) & 1) ^ 1;
          if (kvi >= STAGES) mbar_wait(emptyK0 + 8 * st, wait_ph);
          mbar_expect_tx(fullK0 + 8 * st, KVBYTES);
#pragma unroll
          for (int blk = 0; blk < D / 64; blk++)
            tma_load(sK0 + st * KVBYTES + blk * BC * 128, tk, blk * 64, j * BC, bh, fullK0 + 8 * st);
          if (j == 0) issue_q(i, bh, q0, ntiles);
          if (kvi >= STAGES) mbar_wait(emptyV0 + 8 * st, wait_ph);
          mbar_expect_tx(fullV0 + 8 * st, KVBYTES);
#pragma unroll
          for (int blk = 0; blk < D / 64; blk++)
            tma_load(sV0 + st * KVBYTES + blk * BC * 128, tv, blk * 64, j * BC, bh, fullV0 + 8 * st);
        }
        if (sched) {
          f = ld_shared(fnext);
          if (f < total) st_shared(fnext, (int)gridDim.x + atomic_add_global(sched, 1));
        } else {
          f = ppp_tile(i + 1, causal);
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
    // fwd_pp's stage and parity counters and the tile's.
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
      // K_j, V_j on entry. As fwd_pp's step, but the turn always passes on.
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
            ppp_softmax<F16>(s, m, l, scale, alpha, pb, kb, Sk, wgrow0, warp, g, t, causal);
          }
        } else {
          // No overlap of the softmax with the warpgroup's own P·V (three
          // warpgroups' registers do not hold two P arrays).
          step_done<D>(s, o, pa, emptyK0, emptyV0, st, st1, lane);
          ppp_softmax<F16>(s, m, l, scale, alpha, pb, kb, Sk, wgrow0, warp, g, t, causal);
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
        // The tile before's O store has read the O tile (see ppp_store):
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
      // registers and moved them to uniform ones before every wgmma (3–4%
      // slower on the H200, run 50); with a loop exit that did not pass
      // through a last_step, it serialized every wgmma (C7514; 25–30%
      // slower, run 51).
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
      ppp_store<F16, D, NWG>(o, m, l, to, LSE, sO0 + cw * 64 * D * 2, slot, cw, warp, lane, Sq, g, t, scale);
      // The tile's slot and Q buffer are read for the last time (each
      // thread's own arrival orders its reads before the producer's rewrite).
      mbar_arrive(emptyQ0 + 8 * (ti & 1));
    }
    wgmma_wait<0>();  // the end marker's S_0
    if (cw == 0) named_bar_sync(my_turn, 256);  // the last warpgroup's last turn
    if ((tid & 127) == 0) bulk_wait<0>();        // the last O store done before the CTA's shared memory goes
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
// accumulators ptxas serializes every wgmma (C7512). On the H200 (run 58,
// TestFlashSM90BwdSpeed, S=4096) 579 and 504 TFLOP/s non-causal and causal
// against cols' 512 and 447; ncu (run 57, before the last two changes):
// 4.24M cycles against cols' 4.59M and cuDNN's 4.01M.

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
    // shared-memory instructions that waited for the MIO queue, run 57).
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
// heads at a time share Q, dO and dQaccum in L2. On the H200 (run 67, bf16,
// B·S = 16384, H·D = 2048) that ran 1.3–3.6% faster with 16 to 64 key
// blocks a head (S 2048–8192) and 1.4% slower with 128 (S=16384, D=128,
// where one head's CTAs are about a wave already): up to BWD_GROUP_KB key
// blocks only. A group's heads keep their Q, dO and dQaccum (8·Sq·D bytes
// a head) within BWD_GROUP_BYTES, so fewer than eight above 4 MiB a head
// (D=128, S=8192: four). There eight heads (64 MiB, more than the L2 holds)
// read 676 MB from DRAM and wrote 412, four 406 and 269, and ran 0.7–0.9%
// faster (runs 72, 73: ncu, and three passes each); at S ≤ 4096 four
// instead of eight ran 2.3–2.5% slower (the longest CTAs less often first).
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

// dK (times scale) and dV leave through shared memory, the K and V tiles
// being free by then: each warpgroup stages its 64 keys (stage_rows) into
// its own rows of the V tile, which only its own products read; into its
// rows of the K tile only past cta_bar (nonzero: a barrier of both
// warpgroups) where the other warpgroup's dQ product reads all of K; then,
// past its barrier wg_bar0 + cw, its first thread stores them with TMA
// (keys past Sk are not written) and waits for the stores before the CTA
// ends. Storing from registers (4-byte
// stores, 64 a thread and tensor at D=128) kept the warps in the memory
// queue for 3% of the kernel's stall samples (ncu on the H200, run 57).
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

template <bool F16, int D, bool PIPE, bool COLS_ASKED, bool ALT_ASKED = false>
__device__ __forceinline__ void bwd(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, const TmaMap* tdo,
                                    const float* __restrict__ LSE, const float* __restrict__ Dsum,
                                    float* __restrict__ dQacc, const TmaMap* tdk, const TmaMap* tdv, int BH,
                                    int Sq, int Sk, float scale, int causal) {
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

  int bh, kb;
  bwd_tile<D>(causal, Sq, bh, kb);
  const int n0 = kb * BC;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int nqb = (Sq + BR - 1) / BR;
  const int qb0 = causal ? min(n0 / BR, nqb) : 0;
  const int nblk = nqb - qb0;
  const float* Lb = LSE + (size_t)bh * Sq;
  const float* Db = Dsum + (size_t)bh * Sq;

  if (tid == 0) {
    mbar_init(barKV, 1);
#pragma unroll
    for (int st = 0; st < 3; st++) mbar_init(full0 + 8 * st, 1 + BR);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid == 0) {
    mbar_expect_tx(barKV, 2 * KVBYTES);
#pragma unroll
    for (int blk = 0; blk < D / 64; blk++) {
      tma_load(sK + blk * BC * 128, tk, blk * 64, n0, bh, barKV);
      tma_load(sV + blk * BC * 128, tv, blk * 64, n0, bh, barKV);
    }
  }
  for (int i = 0; i < 2 && i < nblk; i++)
    bwd_load_block<D>(tq, tdo, Lb, Db, sQ0 + i * QBYTES, sdO0 + i * QBYTES, sLD + i * 2 * BR * 4, full0 + 8 * i,
                      (qb0 + i) * BR, bh, Sq, tid);

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
  float* dQb = dQacc + (size_t)bh * Sq * D;

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
    const int q0 = (qb0 + i) * BR;
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
        if (i + 2 < nblk) {
          const int sn = (i + 2) % 3;
          bwd_load_block<D>(tq, tdo, Lb, Db, sQ0 + sn * QBYTES, sdO0 + sn * QBYTES, sLD + sn * 2 * BR * 4,
                            full0 + 8 * sn, q0 + 2 * BR, bh, Sq, tid & 127);
        }
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
        if ((tid & 127) == 0) dq_reduce<D, COLS>(dQb, sdQ0, i, q0, Sq);
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
    if (i + 2 < nblk) {
      const int sn = (i + 2) % 3;
      bwd_load_block<D>(tq, tdo, Lb, Db, sQ0 + sn * QBYTES, sdO0 + sn * QBYTES, sLD + sn * 2 * BR * 4,
                        full0 + 8 * sn, q0 + 2 * BR, bh, Sq, tid);
    }
    // D=64: the same barrier ordered every thread's staging of block i-1's
    // dQ (and its proxy fence) before this: thread 0 hands it to the bulk
    // copy engine, which adds it into dQaccum while the tensor cores go on.
    if constexpr (D == 64) {
      if (i > 0 && tid == 0) dq_reduce<D, COLS>(dQb, sdQ0, i - 1, q0 - BR, Sq);
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
      if (tid == 0) dq_reduce<D, COLS>(dQb, sdQ0, i, q0, Sq);
      asm volatile("bar.warp.sync 0xffffffff;\n" ::: "memory");  // reconverge before the wgmma
    }
  }
  // D=64: the last block's dQ, staged by every thread before this barrier.
  // Thread 0 waits for every reduction to finish: the CTA's shared memory
  // must outlive their reads.
  if (D == 64 && nblk > 0) {
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (tid == 0) dq_reduce<D, COLS>(dQb, sdQ0, nblk - 1, (qb0 + nblk - 1) * BR, Sq);
  }
  if ((ALT ? (tid & 127) : tid) == 0) bulk_wait<0>();

  // ids 1-4 are the block barriers (ALT: 1, 2 and 3 + cw)
  bwd_store_dkdv<F16, D>(tdk, tdv, scale, dk, dv, causal, Sq, 5, 6);
}

// ------------------------------------------------ backward: ping-pong (D=64)
//
// bwd_pp: bwd's tiling (a CTA owns 128 keys, warpgroup cw keys 64cw..,
// blocks of 64 queries), built so that the two consumer warpgroups share
// nothing but the Q/dO ring and can take turns at the tensor cores, as the
// forward's fwd_pp does. In bwd they meet at a barrier every block (the dQ
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
//     by block parity); named barrier BWD_PP_FULL + 4cw + parity hands the
//     tile to its writer, which adds it to dQaccum with one bulk reduction
//     and, once the copy engine has read block i-1's tile, arrives on
//     BWD_PP_EMPTY + 4cw + parity, which the warpgroup waits on before it
//     stages block i+1 into that tile. Twice cols' reduction traffic (L2
//     74% busy in ncu at S=4096 against 41%), but no barrier between the
//     warpgroups: summing the two warpgroups' dQ in one tile first (one
//     reduction, L2 39%) made one wait for the other every block again and
//     ran at 380 instead of 400 TFLOP/s.
//   - A warpgroup's dSᵀ (64 keys × 64 queries) is read by its own dQ
//     product only: one buffer, a barrier of its four warps (BWD_PP_DS + cw).
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
//     from shared memory, 400 -> 462 (non-causal) and 379 -> 416 (causal)
//     TFLOP/s at S=4096 (runs 22, 33).
// Registers: dK, dV 64, dQ 32, Sᵀ and dPᵀ 64, Pᵀ and dSᵀ packed 32, K and
// V fragments 32.
constexpr u32 BWD_PP_FULL = 2;   // + 4cw + parity: a staged dQ tile (128 consumers + the writer)
constexpr u32 BWD_PP_EMPTY = 4;  // + 4cw + parity: that tile read by the copy engine
constexpr u32 BWD_PP_DS = 10;    // + cw: the warpgroup's dSᵀ stored
constexpr u32 BWD_TURN = 12;     // + cw: this warpgroup may issue its bundle

// The loader's copies of block i (bwd_pp's warp 8, every lane): lane 0 the TMA copies
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

template <bool F16>
__device__ __forceinline__ void bwd_pp(const TmaMap* tq, const TmaMap* tk, const TmaMap* tv, const TmaMap* tdo,
                                       const float* __restrict__ LSE, const float* __restrict__ Dsum,
                                       float* __restrict__ dQacc, const TmaMap* tdk, const TmaMap* tdv, int BH,
                                       int Sq, int Sk, float scale, int causal) {
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

  int bh, kb;
  bwd_tile<D>(causal, Sq, bh, kb);
  const int n0 = kb * BC;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int nqb = (Sq + BR - 1) / BR;
  const int qb0 = causal ? min(n0 / BR, nqb) : 0;
  const int nblk = nqb - qb0;
  float* dQb = dQacc + (size_t)bh * Sq * D;

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
      const float* Lb = LSE + (size_t)bh * Sq;
      const float* Db = Dsum + (size_t)bh * Sq;
      if (lane == 0) {
        mbar_expect_tx(barKV, 2 * KVBYTES);
        tma_load(sK, tk, 0, n0, bh, barKV);
        tma_load(sV, tv, 0, n0, bh, barKV);
      }
      int st = 0;
      u32 ph = 0;
      for (int i = 0; i < nblk; i++) {
        if (i >= 3) mbar_wait(empty0 + 8 * st, ph ^ 1);
        bwd_loader_block<D>(tq, tdo, Lb, Db, sQ0 + st * QBYTES, sdO0 + st * QBYTES, sLD + st * 2 * BR * 4,
                             full0 + 8 * st, (qb0 + i) * BR, bh, Sq, lane);
        if (++st == 3) {
          st = 0;
          ph ^= 1;
        }
      }
    } else if (warp <= 10) {  // the dQ writer of warpgroup cw
      const int cw = warp - 9;
      for (int i = 0; i < nblk; i++) {
        named_bar_sync(BWD_PP_FULL + 4 * cw + (i & 1), 160);
        if (lane == 0) {
          const int q0 = (qb0 + i) * BR;
          bulk_reduce_add_f32(dQb + (size_t)q0 * D, dq_tile<D, false>(sdQ0, i, cw), (u32)min(BR, Sq - q0) * (D * 4));
          bulk_commit();
          bulk_wait_read<1>();  // block i-1's tile, the one block i+1 stages into, is read
        }
        __syncwarp();
        if (i >= 1 && i + 1 < nblk) named_bar_arrive(BWD_PP_EMPTY + 4 * cw + ((i + 1) & 1), 160);
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
    const int q0 = (qb0 + i) * BR;
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
    named_bar_sync(BWD_PP_DS + cw, 128);  // the warpgroup's dSᵀ is stored

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

    if (i >= 2) named_bar_sync(BWD_PP_EMPTY + 4 * cw + (i & 1), 160);
    dq_stage<D, 8>(dq, dq_tile<D, false>(sdQ0, i, cw), wq, g, t);
    fence_proxy_async();
    named_bar_arrive(BWD_PP_FULL + 4 * cw + (i & 1), 160);
  }

  // K and V rows are the warpgroup's own (no barrier of both); ids 2-13 are taken
  bwd_store_dkdv<F16, D>(tdk, tdv, scale, dk, dv, causal, Sq, 0, 14);
}

}  // namespace fa90

#define FA90_FWD_WS(name, F16, D)                                                                    \
  extern "C" __global__ void __launch_bounds__(fa90::WS_THREADS, 1)                                 \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,        \
           const __grid_constant__ fa90::TmaMap tv, unsigned short* o, float* lse, int BH, int Sq,  \
           int Sk, float scale, int causal) {                                                       \
    fa90::fwd_ws<F16, D>(&tq, &tk, &tv, o, lse, BH, Sq, Sk, scale, causal);                         \
  }

FA90_FWD_WS(flash_fwd_sm90_tma_bf16_d64, false, 64)
FA90_FWD_WS(flash_fwd_sm90_tma_bf16_d128, false, 128)
FA90_FWD_WS(flash_fwd_sm90_tma_fp16_d64, true, 64)
FA90_FWD_WS(flash_fwd_sm90_tma_fp16_d128, true, 128)

// Versions 4 (fwd_pp) and 5 (fwd_ppp: fwd_pp's tilings, persistent): NWG
// consumer warpgroups and a producer warpgroup, K/V rings of STAGES tiles;
// OVERLAP: softmax under the warpgroup's own P·V. The persistent kernels
// take two more arguments: the dynamic schedule's counters (nullptr: the
// static schedule) and the heads of a causal section.
#define FA90_FWD_PP(name, F16, D, NWG, STAGES, OVERLAP)                                             \
  extern "C" __global__ void __launch_bounds__(128 * (NWG + 1), 1)                                  \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,        \
           const __grid_constant__ fa90::TmaMap tv, unsigned short* o, float* lse, int BH, int Sq,  \
           int Sk, float scale, int causal) {                                                       \
    fa90::fwd_pp<F16, D, NWG, STAGES, OVERLAP>(&tq, &tk, &tv, o, lse, BH, Sq, Sk, scale, causal);   \
  }
#define FA90_FWD_PPP(name, F16, D, NWG, STAGES, OVERLAP)                                            \
  extern "C" __global__ void __launch_bounds__(128 * (NWG + 1), 1)                                  \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,        \
           const __grid_constant__ fa90::TmaMap tv, const __grid_constant__ fa90::TmaMap to,        \
           float* lse, int BH, int Sq, int Sk, float scale, int causal, int* sched, int nh) {       \
    fa90::fwd_ppp<F16, D, NWG, STAGES, OVERLAP>(&tq, &tk, &tv, &to, lse, BH, Sq, Sk, scale, causal, \
                                                sched, nh);                                         \
  }

FA90_FWD_PP(flash_fwd_sm90_pp_bf16_d64, false, 64, 2, 4, true)
FA90_FWD_PP(flash_fwd_sm90_pp_bf16_d128, false, 128, 2, 2, true)
FA90_FWD_PP(flash_fwd_sm90_pp_fp16_d64, true, 64, 2, 4, true)
FA90_FWD_PP(flash_fwd_sm90_pp_fp16_d128, true, 128, 2, 2, true)
FA90_FWD_PP(flash_fwd_sm90_pp3_bf16_d64, false, 64, 3, 4, false)
FA90_FWD_PP(flash_fwd_sm90_pp3_fp16_d64, true, 64, 3, 4, false)

FA90_FWD_PPP(flash_fwd_sm90_ppp_bf16_d64, false, 64, 2, 4, true)
FA90_FWD_PPP(flash_fwd_sm90_ppp_bf16_d128, false, 128, 2, 2, true)
FA90_FWD_PPP(flash_fwd_sm90_ppp_fp16_d64, true, 64, 2, 4, true)
FA90_FWD_PPP(flash_fwd_sm90_ppp_fp16_d128, true, 128, 2, 2, true)
FA90_FWD_PPP(flash_fwd_sm90_ppp3_bf16_d64, false, 64, 3, 4, false)
FA90_FWD_PPP(flash_fwd_sm90_ppp3_fp16_d64, true, 64, 3, 4, false)

#define FA90_BWD(name, F16, D, PIPE, COLS, ALT)                                                           \
  extern "C" __global__ void __launch_bounds__(fa90::NT, 1)                                              \
      name(const __grid_constant__ fa90::TmaMap tq, const __grid_constant__ fa90::TmaMap tk,             \
           const __grid_constant__ fa90::TmaMap tv, const __grid_constant__ fa90::TmaMap tdo,            \
           const __grid_constant__ fa90::TmaMap tdk, const __grid_constant__ fa90::TmaMap tdv,            \
           const float* lse, const float* dsum, float* dqacc, int BH, int Sq, int Sk, float scale,       \
           int causal) {                                                                                  \
    fa90::bwd<F16, D, PIPE, COLS, ALT>(&tq, &tk, &tv, &tdo, lse, dsum, dqacc, &tdk, &tdv, BH, Sq, Sk, scale, causal); \
  }

FA90_BWD(flash_bwd_sm90_dqtma_bf16_d64, false, 64, false, false, false)
FA90_BWD(flash_bwd_sm90_dqtma_bf16_d128, false, 128, false, false, false)
FA90_BWD(flash_bwd_sm90_dqtma_fp16_d64, true, 64, false, false, false)
FA90_BWD(flash_bwd_sm90_dqtma_fp16_d128, true, 128, false, false, false)
FA90_BWD(flash_bwd_sm90_cols_bf16_d64, false, 64, true, true, false)
FA90_BWD(flash_bwd_sm90_cols_bf16_d128, false, 128, true, true, false)
FA90_BWD(flash_bwd_sm90_cols_fp16_d64, true, 64, true, true, false)
FA90_BWD(flash_bwd_sm90_cols_fp16_d128, true, 128, true, true, false)
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
