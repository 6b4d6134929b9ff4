// flash_sm90_common.cuh: the device code that the Hopper (sm_90a: wgmma,
// TMA) FlashAttention forward (flash_sm90_fwd.cu) and backward
// (flash_sm90_bwd.cu) share. Each of those, and kernels/dev/flash_sm90_dev.cu
// (the variants kept to time against), is its own NVRTC compile unit that
// includes this file: package kernels inlines the include before NVRTC sees
// the text (kernels.Unit), so the cubin cache key covers it.
//
// Compiled at run time by NVRTC for sm_90a only (wgmma needs the "a" target);
// backend/cuda/attention/flash_sm90.go picks these kernels on compute capability 9.0
// and falls back to flash_attention.cu (FA2, mma.sync) elsewhere. No toolkit
// header: the 16-bit element types travel as raw bits and are converted with
// PTX cvt.
//
// Same contract as flash_fwd_<T>_d<D> of flash_attention.cu: Q, O are [BH, Sq, D];
// K, V are [BH, Sk, D], contiguous; LSE is float32 [BH, Sq] (natural log). Causal
// masking is top-left aligned (key j visible to query i iff j <= i, also when
// Sq != Sk). A row that sees no key gets O = 0, LSE = +inf. Requires scale > 0
// (row maxima are taken on raw scores).
//
// Design (forward): consumer warpgroups of 64 query rows each, K and V tiles
// of 128 keys in 128-byte-swizzled shared memory, loaded with TMA through an
// mbarrier ring by one thread of a producer warpgroup. The variants, from
// the first to the one that runs (kernels/dev holds those kept to time
// against): warpspec (flash_fwd_sm90_warpspec_*, dev; fwd_warpspec), the
// consumers unsynchronised; pingpong (flash_fwd_sm90_pingpong_*,
// _pingpong3wg_*, dev; fwd_pingpong), the consumer warpgroups taking turns
// issuing their products (named barriers), so one's softmax runs under
// another's wgmmas; persistent (flash_fwd_sm90_persistent*, flash_sm90_fwd.cu;
// fwd_persistent), pingpong with a CTA per SM that walks the tiles, loading
// the next one's Q and K/V while it finishes this one. (All threads loading
// with cp.async, and warpspec with the next Q·Kᵀ in flight during P·V, lost
// to pingpong on the H200 and are gone.)
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

#ifndef FLASH_SM90_COMMON_CUH
#define FLASH_SM90_COMMON_CUH

namespace fa90 {

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int BR = 128;  // query rows per CTA (two warpgroups of 64)
constexpr int BC = 128;  // keys per K/V tile
constexpr int NT = 256;  // threads per CTA

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

// The tensor maps are 3-D (D, S, BH) views of Q, K, V (innermost first) with
// a box of 64 × 128 × 1 elements: rows past S read as zeros, never as the next
// head's rows.
struct __align__(64) TmaMap {
  u64 v[16];
};

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

// One TMA box (64 columns × 128 rows of one head) into shared memory at dst,
// completing on bar.
__device__ __forceinline__ void tma_load(u32 dst, const TmaMap* map, int col, int row, int head, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(col), "r"(row), "r"(head), "r"(bar)
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

}  // namespace fa90

#endif  // FLASH_SM90_COMMON_CUH
