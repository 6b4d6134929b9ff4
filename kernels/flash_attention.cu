// flash_attention.cu: FlashAttention-2 style forward and backward kernels.
//
// Compiled at run time by NVRTC (options: --gpu-architecture=sm_90a -std=c++17
// -I<cuda>/include) and, for development, by nvcc through kernels/dev/harness.cu.
// Only <cuda_bf16.h> and <cuda_fp16.h> are included; every entry point is an
// extern "C" __global__ function with a fixed name.
//
// Layout: Q, O, dO, dQ are [BH, Sq, D]; K, V, dK, dV are [BH/group, Sk, D]; all
// contiguous. group >= 1 query heads share each K/V head (grouped-query
// attention; group = 1 is multi-head): query head bh reads K/V head bh/group, and
// the backward's dK, dV of a K/V head sum over its group, looped inside the CTA
// that owns the K/V block (no scratch, no reduction kernel, fixed order; where that grid
// is too small, the launcher runs multi-head attention on repeated K/V instead: see
// flash_bwd_kv_repeat). LSE (natural log) and Dsum are float32 [BH, Sq]; dQaccum is float32
// [BH, Sq, D]. Causal masking is top-left aligned: key j is visible to query i iff
// j <= i (also when Sq != Sk). A row that sees no key gets O = 0, LSE = +inf.
//
// Entry points and launch configurations (T in {bf16, fp16}; D in {64, 128}):
//
//   flash_fwd_<T>_d<D>(q, k, v, o, lse, BH, Sq, Sk, scale, causal, group)
//     grid (ceil(Sq/FWD_BR), BH), block FWD_NW*32, dynamic smem (FWD_BR + 2*FWD_BC)*D*2
//     (FWD_BR = 16*FWD_NW), above 48 KB so the opt-in limit must be raised:
//       d64 : FWD_BR=128, FWD_BC=128, FWD_NW=8 -> 49152 B
//       d128: FWD_BR=64,  FWD_BC=64,  FWD_NW=4 -> 49152 B
//   flash_bwd_pre_<T|fp32>(o, dO, Dsum, dQaccum, rows=BH*Sq, D)
//     grid ceil(rows/8), block 256: Dsum = rowsum(dO*O); dQaccum = 0 (if non-null).
//   flash_bwd_<T>_d<D>(q, k, v, dO, lse, Dsum, dQaccum, dK, dV, BH, Sq, Sk, scale, causal, group)
//     grid (ceil(Sk/(16*BWD_NW)), BH/group), block BWD_NW*32,
//     dynamic smem 2*BC*D*2 + 4*BR*D*2 + BC*BR*2 + 4*BR*4 (BC = 16*BWD_NW).
//       d64 : BWD_BR=128, BWD_NW=8 -> 133120 B;  d128: BWD_BR=64, BWD_NW=8 -> 148480 B
//   flash_bwd_convert_<T>(dQaccum, dQ, n, D, Sq, scale, swz)   any grid (grid-stride), block 256:
//     dQ = dQaccum*scale (D a power of two); swz = 1: dQaccum holds 8-column block j of a row at block
//     j ^ (r & 3), r the row's index in its head (as flash_sm90_bwd.cu's backward leaves it; D a
//     multiple of 32), 0: in place.
//   flash_bwd_prevec_<T>(o, dO, Dsum, dQaccum, rows, D), flash_bwd_convertvec_<T>(dQaccum, dQ, n/8, D,
//     Sq, scale, swz) the same, 16 bytes of each 16-bit tensor a thread (all four tensors 16-byte aligned;
//     D in {64, 128, 256}, dQaccum non-null): grid ceil(rows*D/8/256) and any (grid-stride), block 256.
//
//   flash_bwd_kv_repeat(k, v, kr, vr, rows, chunks, Sk, group)   grid (any, 2) (y: 0 for K, 1 for V),
//     block 256, grid-stride: kr, vr [BH, Sk, D] with head h a copy of k, v head h/group; rows = BH*Sk,
//     chunks = D/8 16-byte chunks a row (a power of two); 16-bit elements, all four tensors 16-byte aligned.
//   flash_bwd_kv_sum_<T>(dkr, dvr, dk, dv, rows, chunks, Sk, group)   grid (any, 2), block 256, grid-stride:
//     dk, dv [BH/group, Sk, D] = the sum over g = 0, 1, ..., group-1 (that order, float32) of dkr, dvr
//     [BH, Sk, D] head h*group + g, rounded once; rows = BH/group*Sk, chunks and alignment as above.
//     These two let a grouped backward run as multi-head attention: K and V repeated to every query
//     head, the group-1 flash_bwd (or flash_sm90_bwd.cu's) into per-query-head dK, dV, then their
//     sums (the launcher does so when the grouped grid of BH/group K/V heads is too small to fill
//     the GPU, e.g. multi-query attention).
//
// The tensor-core path requires scale > 0 (row maxima are taken on raw scores).
//
// Generic path (any D <= 256; CUDA cores; T in {fp32, bf16, fp16}): the oracle and
// the float32 path.
//   flash_fwd_generic_<T>(q, k, v, o, lse, BH, Sq, Sk, D, scale, causal, group)
//     grid (BH, ceil(Sq/16)), block 128, smem (64*(D|1) + 16*D)*4
//   flash_bwd_generic_dq_<T>(q, k, v, dO, lse, Dsum, dQ, BH, Sq, Sk, D, scale, causal, group)
//     grid (BH, ceil(Sq/16)), block 128, smem (64*(D|1) + 32*D)*4
//   flash_bwd_generic_dkdv_<T>(q, k, v, dO, lse, Dsum, dK, dV, BH, Sq, Sk, D, scale, causal, group)
//     grid (BH/group, ceil(Sk/16)), block 128, smem (64*(D|1) + 32*D + 64)*4
//   (run flash_bwd_pre_<T> first with dQaccum = NULL.)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef FLASH_INF
#define FLASH_INF __int_as_float(0x7f800000)
#endif

namespace flash {

typedef unsigned int u32;
typedef unsigned long long u64;

constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------- dtype traits

template <typename T> struct Ty;

template <> struct Ty<float> {
  static __device__ __forceinline__ float to_f(float x) { return x; }
  static __device__ __forceinline__ float from_f(float x) { return x; }
};

template <> struct Ty<__nv_bfloat16> {
  static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<u32*>(&v);
  }
  // The two values packed in v (lo in the low half), as floats.
  static __device__ __forceinline__ float2 unpack(u32 v) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  }
  // d += a * b, m16n8k16, f32 accumulate.
  static __device__ __forceinline__ void mma(float* d, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <> struct Ty<__half> {
  static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<u32*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(u32 v) {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
  static __device__ __forceinline__ void mma(float* d, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---------------------------------------------------------------- PTX helpers

__device__ __forceinline__ u32 smem_u32(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global->shared; bytes past src_bytes are zero-filled.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// 2^x on the SFU (ex2.approx.ftz: <= 2 ulp, 2^-inf = +0).
__device__ __forceinline__ float fexp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Swizzled tile of 16-bit elements: rows of CH 16-byte chunks; logical chunk c of
// row r lives at physical chunk c ^ (r & 7). CH must be a multiple of 8.
template <int CH> __device__ __forceinline__ u32 swz(u32 base, int r, int c) {
  return base + (u32)(r * CH * 16) + (u32)(((c ^ (r & 7))) * 16);
}

// Loads rows [row0, row0+ROWS) of a [nvalid, D] matrix into a swizzled tile;
// rows >= nvalid are zero-filled.
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile(u32 dst, const T* src, int row0, int nvalid, int tid) {
  constexpr int CH = D / 8;
#pragma unroll
  for (int it = 0; it < (ROWS * CH + NT - 1) / NT; it++) {
    const int idx = tid + it * NT;
    if ((ROWS * CH) % NT != 0 && idx >= ROWS * CH) break;
    int r = idx / CH, c = idx % CH;
    int gr = row0 + r;
    bool ok = gr < nvalid;
    const T* p = src + (size_t)(ok ? gr : 0) * D + c * 8;
    cp_async16(swz<CH>(dst, r, c), p, ok ? 16 : 0);
  }
}

__device__ __forceinline__ float warp_max4(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}
__device__ __forceinline__ float warp_sum4(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// ---------------------------------------------------------------- forward (tensor cores)
//
// CTA: NW warps, BR = 16*NW query rows (warp w owns rows 16w..16w+15), loops over
// key tiles of BC rows. Q fragments live in registers; K and V are single-buffered
// tiles whose loads overlap compute: V_j loads during Q.K_j^T, K_{j+1} during
// softmax and P.V_j.

template <typename T, int D, int NW, int BC>
__device__ __forceinline__ void fwd_tc(const T* __restrict__ Q, const T* __restrict__ K,
                                       const T* __restrict__ V, T* __restrict__ O,
                                       float* __restrict__ LSE, int BH, int Sq, int Sk, float scale,
                                       int causal, int group) {
  constexpr int BR = 16 * NW;
  constexpr int NT = 32 * NW;
  constexpr int CH = D / 8;
  static_assert(D % 64 == 0 && BC % 16 == 0, "tile shape");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const u32 sQ = smem_u32(smem_raw);
  const u32 sK = sQ + BR * D * 2;
  const u32 sV = sK + BC * D * 2;

  // The head from grid y, the query block from grid x: the CTAs resident
  // together then share a few heads' K and V in L2.
  const int bh = blockIdx.y;
  const int qb = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int q0 = qb * BR;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const T* Qb = Q + (size_t)bh * Sq * D;
  const T* Kb = K + (size_t)(bh / group) * Sk * D;
  const T* Vb = V + (size_t)(bh / group) * Sk * D;

  const int kv_end = causal ? min(Sk, q0 + BR) : Sk;
  const int ntiles = (kv_end + BC - 1) / BC;
  const float c = scale * kLog2e;
  const int wrow0 = q0 + warp * 16;  // first query row of this warp

  load_tile<T, BR, D, NT>(sQ, Qb, q0, Sq, tid);
  if (ntiles > 0) load_tile<T, BC, D, NT>(sK, Kb, 0, Sk, tid);
  cp_async_commit();

  u32 qf[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-FLASH_INF, -FLASH_INF};
  float l[2] = {0.f, 0.f};

  for (int j = 0; j < ntiles; j++) {
    cp_async_wait<0>();
    __syncthreads();  // K_j landed; every warp is done with V_{j-1}
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) ldsm_x4(qf[kk], swz<CH>(sQ, warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
    }
    const int kbase = j * BC;
    load_tile<T, BC, D, NT>(sV, Vb, kbase, Sk, tid);
    cp_async_commit();

    float s[BC / 8][4];
#pragma unroll
    for (int i = 0; i < BC / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
      for (int nn = 0; nn < BC / 16; nn++) {
        u32 b[4];
        ldsm_x4(b, swz<CH>(sK, nn * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
        Ty<T>::mma(s[2 * nn], qf[kk], b[0], b[1]);
        Ty<T>::mma(s[2 * nn + 1], qf[kk], b[2], b[3]);
      }
    }

    cp_async_wait<0>();
    __syncthreads();  // V_j landed; every warp is done with K_j
    if (j + 1 < ntiles) load_tile<T, BC, D, NT>(sK, Kb, kbase + BC, Sk, tid);
    cp_async_commit();

    const bool need_mask = (kbase + BC > Sk) || (causal && kbase + BC - 1 > wrow0);
    if (need_mask) {
#pragma unroll
      for (int nt = 0; nt < BC / 8; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int col = kbase + nt * 8 + 2 * t + (e & 1);
          int row = wrow0 + g + (e >> 1) * 8;
          if (col >= Sk || (causal && col > row)) s[nt][e] = -FLASH_INF;
        }
      }
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = -FLASH_INF;
#pragma unroll
      for (int nt = 0; nt < BC / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = warp_max4(mx);
      const float mnew = fmaxf(m[r], mx);
      const float muse = (mnew == -FLASH_INF) ? 0.f : mnew;
      const float mc = muse * c;
      const float alpha = fexp2(m[r] * c - mc);
      m[r] = mnew;
      float rs = 0.f;
#pragma unroll
      for (int nt = 0; nt < BC / 8; nt++) {
        float p0 = fexp2(fmaf(s[nt][2 * r], c, -mc));
        float p1 = fexp2(fmaf(s[nt][2 * r + 1], c, -mc));
        s[nt][2 * r] = p0;
        s[nt][2 * r + 1] = p1;
        rs += p0 + p1;
      }
      l[r] = l[r] * alpha + rs;
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }

#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++) {
      u32 a[4];
      a[0] = Ty<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      a[1] = Ty<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      a[2] = Ty<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = Ty<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < D / 16; dn++) {
        u32 b[4];
        ldsm_x4_t(b, swz<CH>(sV, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dn * 2 + (lane >> 4)));
        Ty<T>::mma(o[2 * dn], a, b[0], b[1]);
        Ty<T>::mma(o[2 * dn + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

  T* Ob = O + (size_t)bh * Sq * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float lsum = warp_sum4(l[r]);
    const int row = wrow0 + g + r * 8;
    const bool ok = lsum > 0.f;
    const float inv = ok ? 1.f / lsum : 0.f;
    if (row < Sq) {
      T* orow = Ob + (size_t)row * D + 2 * t;
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++) {
        u32 v = Ty<T>::pack(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
        *reinterpret_cast<u32*>(orow + dt * 8) = v;
      }
      if (t == 0) LSE[(size_t)bh * Sq + row] = ok ? m[r] * scale + logf(lsum) : FLASH_INF;
    }
  }
}

// ---------------------------------------------------------------- backward (tensor cores)
//
// CTA: NW warps own BC = 16*NW keys (warp w: keys 16w..16w+15) and keep dK, dV for
// them in registers. It loops over query blocks of BR rows (causal: from the block
// holding the first visible query), Q/dO/LSE/Dsum double-buffered with cp.async.
// Per block, transposed products keep P^T and dS^T in registers as A fragments:
//   S^T = K Q^T, P^T = exp2(S^T c - LSE log2e), dV += P^T dO, dP^T = V dO^T,
//   dS^T = P^T (dP^T - Dsum), dK += dS^T Q; dS^T goes to smem for dQ += dS K
//   (atomicAdd into fp32 dQaccum).

template <typename T, int D, int BR, int NW>
__device__ __forceinline__ void bwd_tc(const T* __restrict__ Q, const T* __restrict__ K,
                                       const T* __restrict__ V, const T* __restrict__ dO,
                                       const float* __restrict__ LSE, const float* __restrict__ Dsum,
                                       float* __restrict__ dQacc, T* __restrict__ dK,
                                       T* __restrict__ dV, int BH, int Sq, int Sk, float scale,
                                       int causal, int group) {
  constexpr int BC = 16 * NW;
  constexpr int NT = 32 * NW;
  constexpr int CH = D / 8;
  constexpr int CHS = BR / 8;  // chunks per dS^T row
  constexpr int MTQ = BR / 16;  // m16 tiles of the dQ product
  constexpr int QSPLIT = NW / MTQ;  // warps per dQ m-tile
  constexpr int QCOLS = D / QSPLIT;  // dQ columns per warp
  static_assert(D % 64 == 0 && BR % 64 == 0, "tile shape");
  static_assert(NW % MTQ == 0 && QCOLS % 16 == 0, "dQ split");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const u32 sK = smem_u32(smem_raw);
  const u32 sV = sK + BC * D * 2;
  const u32 sQ0 = sV + BC * D * 2;          // 2 stages of BR x D
  const u32 sdO0 = sQ0 + 2 * BR * D * 2;    // 2 stages of BR x D
  const u32 sdS = sdO0 + 2 * BR * D * 2;    // BC x BR
  float* sL = reinterpret_cast<float*>(smem_raw + 2 * BC * D * 2 + 4 * BR * D * 2 + BC * BR * 2);  // [2][BR]
  float* sDs = sL + 2 * BR;                                                                      // [2][BR]

  // The K/V head from grid y (as in the forward: heads on grid y, key blocks
  // on x); its dK, dV sum over the group query heads that read it, one after
  // the other: the loop runs over (head, query block) pairs.
  const int hkv = blockIdx.y;
  const int n0 = blockIdx.x * BC;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const T* Kb = K + (size_t)hkv * Sk * D;
  const T* Vb = V + (size_t)hkv * Sk * D;
  const float c = scale * kLog2e;

  const int nqb = (Sq + BR - 1) / BR;
  const int qb_start = causal ? n0 / BR : 0;
  const int h0 = hkv * group;  // the group's first query head

  auto load_q_block = [&](int h, int qb, int stage) {
    const int q0 = qb * BR;
    load_tile<T, BR, D, NT>(sQ0 + stage * BR * D * 2, Q + (size_t)h * Sq * D, q0, Sq, tid);
    load_tile<T, BR, D, NT>(sdO0 + stage * BR * D * 2, dO + (size_t)h * Sq * D, q0, Sq, tid);
    const float* Lb = LSE + (size_t)h * Sq;
    const float* Db = Dsum + (size_t)h * Sq;
    for (int i = tid; i < BR; i += NT) {
      const int q = q0 + i;
      const bool ok = q < Sq;
      cp_async4(smem_u32(sL + stage * BR + i), Lb + (ok ? q : 0), ok ? 4 : 0);
      cp_async4(smem_u32(sDs + stage * BR + i), Db + (ok ? q : 0), ok ? 4 : 0);
    }
  };

  load_tile<T, BC, D, NT>(sK, Kb, n0, Sk, tid);
  load_tile<T, BC, D, NT>(sV, Vb, n0, Sk, tid);
  if (qb_start < nqb) load_q_block(h0, qb_start, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; i++) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.f;
  }
  const int wkey0 = n0 + warp * 16;  // first key of this warp

  // (h, qb) walks the group's heads, each over query blocks qb_start..nqb-1;
  // with group 1 it is the plain loop over query blocks.
  const int steps = group * (nqb - qb_start);
  int h = h0, qb = qb_start;
  for (int it = 0; it < steps; it++) {
    const int stage = it & 1;
    const u32 sQ = sQ0 + stage * BR * D * 2;
    const u32 sdOs = sdO0 + stage * BR * D * 2;
    const float* sLs = sL + stage * BR;
    const float* sDss = sDs + stage * BR;
    const int q0 = qb * BR;
    float* dQb = dQacc + (size_t)h * Sq * D;

    cp_async_wait<0>();
    __syncthreads();  // this stage landed; the other stage and sdS are free
    // The next (head, block) pair.
    int nh = h, nqb_next = qb + 1;
    if (nqb_next == nqb) nh++, nqb_next = qb_start;
    if (it + 1 < steps) load_q_block(nh, nqb_next, stage ^ 1);
    cp_async_commit();

    // S^T = K Q^T  (16 keys x BR queries per warp)
    float s[BR / 8][4];
#pragma unroll
    for (int i = 0; i < BR / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      u32 a[4];
      ldsm_x4(a, swz<CH>(sK, warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
      for (int nn = 0; nn < BR / 16; nn++) {
        u32 b[4];
        ldsm_x4(b, swz<CH>(sQ, nn * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
        Ty<T>::mma(s[2 * nn], a, b[0], b[1]);
        Ty<T>::mma(s[2 * nn + 1], a, b[2], b[3]);
      }
    }

    // P^T
    const bool need_mask = (n0 + BC > Sk) || (q0 + BR > Sq) || (causal && wkey0 + 15 > q0);
#pragma unroll
    for (int nt = 0; nt < BR / 8; nt++) {
      const float2 lse2 = *reinterpret_cast<const float2*>(sLs + nt * 8 + 2 * t);
      const float l0 = lse2.x * kLog2e, l1 = lse2.y * kLog2e;
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = fexp2(fmaf(s[nt][e], c, -((e & 1) ? l1 : l0)));
      if (need_mask) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = wkey0 + g + (e >> 1) * 8;
          const int q = q0 + nt * 8 + 2 * t + (e & 1);
          if (key >= Sk || q >= Sq || (causal && key > q)) s[nt][e] = 0.f;
        }
      }
    }

    // dP^T = V dO^T
    float dp[BR / 8][4];
#pragma unroll
    for (int i = 0; i < BR / 8; i++) dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      u32 a[4];
      ldsm_x4(a, swz<CH>(sV, warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
      for (int nn = 0; nn < BR / 16; nn++) {
        u32 b[4];
        ldsm_x4(b, swz<CH>(sdOs, nn * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
        Ty<T>::mma(dp[2 * nn], a, b[0], b[1]);
        Ty<T>::mma(dp[2 * nn + 1], a, b[2], b[3]);
      }
    }

    // dV += P^T dO
#pragma unroll
    for (int kk = 0; kk < BR / 16; kk++) {
      u32 a[4];
      a[0] = Ty<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      a[1] = Ty<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      a[2] = Ty<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = Ty<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < D / 16; dn++) {
        u32 b[4];
        ldsm_x4_t(b, swz<CH>(sdOs, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dn * 2 + (lane >> 4)));
        Ty<T>::mma(dv[2 * dn], a, b[0], b[1]);
        Ty<T>::mma(dv[2 * dn + 1], a, b[2], b[3]);
      }
    }

    // dS^T = P^T (dP^T - Dsum), kept in dp; also stored to smem as T.
#pragma unroll
    for (int nt = 0; nt < BR / 8; nt++) {
      const float2 d2 = *reinterpret_cast<const float2*>(sDss + nt * 8 + 2 * t);
      dp[nt][0] = s[nt][0] * (dp[nt][0] - d2.x);
      dp[nt][1] = s[nt][1] * (dp[nt][1] - d2.y);
      dp[nt][2] = s[nt][2] * (dp[nt][2] - d2.x);
      dp[nt][3] = s[nt][3] * (dp[nt][3] - d2.y);
      const int r0 = warp * 16 + g;
      const u32 w0 = Ty<T>::pack(dp[nt][0], dp[nt][1]);
      const u32 w1 = Ty<T>::pack(dp[nt][2], dp[nt][3]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(swz<CHS>(sdS, r0, nt) + 4 * t), "r"(w0) : "memory");
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(swz<CHS>(sdS, r0 + 8, nt) + 4 * t), "r"(w1) : "memory");
    }

    // dK += dS^T Q
#pragma unroll
    for (int kk = 0; kk < BR / 16; kk++) {
      u32 a[4];
      a[0] = Ty<T>::pack(dp[2 * kk][0], dp[2 * kk][1]);
      a[1] = Ty<T>::pack(dp[2 * kk][2], dp[2 * kk][3]);
      a[2] = Ty<T>::pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      a[3] = Ty<T>::pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < D / 16; dn++) {
        u32 b[4];
        ldsm_x4_t(b, swz<CH>(sQ, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dn * 2 + (lane >> 4)));
        Ty<T>::mma(dk[2 * dn], a, b[0], b[1]);
        Ty<T>::mma(dk[2 * dn + 1], a, b[2], b[3]);
      }
    }

    __syncthreads();  // dS^T complete in smem

    // dQ[q0 + mt*16 .., qc0 ..] += dS K
    {
      const int mt = warp % MTQ;
      const int qc0 = (warp / MTQ) * QCOLS;
      float dq[QCOLS / 8][4];
#pragma unroll
      for (int i = 0; i < QCOLS / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BC / 16; kk++) {
        u32 a[4];
        ldsm_x4_t(a, swz<CHS>(sdS, kk * 16 + (lane & 7) + ((lane >> 4) << 3), mt * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int dn = 0; dn < QCOLS / 16; dn++) {
          u32 b[4];
          ldsm_x4_t(b, swz<CH>(sK, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), qc0 / 8 + dn * 2 + (lane >> 4)));
          Ty<T>::mma(dq[2 * dn], a, b[0], b[1]);
          Ty<T>::mma(dq[2 * dn + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int q = q0 + mt * 16 + g + r * 8;
        if (q < Sq) {
          float* dst = dQb + (size_t)q * D + qc0 + 2 * t;
#pragma unroll
          for (int dt = 0; dt < QCOLS / 8; dt++) {
#if defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ >= 12 && __CUDA_ARCH__ >= 900
            // The vector atomic exists from sm_90 on (CUDA 12): one
            // instruction for the pair.
            atomicAdd(reinterpret_cast<float2*>(dst + dt * 8), make_float2(dq[dt][2 * r], dq[dt][2 * r + 1]));
#else
            atomicAdd(dst + dt * 8, dq[dt][2 * r]);
            atomicAdd(dst + dt * 8 + 1, dq[dt][2 * r + 1]);
#endif
          }
        }
      }
    }
    h = nh, qb = nqb_next;
  }
  cp_async_wait<0>();

  T* dKb = dK + (size_t)hkv * Sk * D;
  T* dVb = dV + (size_t)hkv * Sk * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int key = wkey0 + g + r * 8;
    if (key < Sk) {
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++) {
        *reinterpret_cast<u32*>(dKb + (size_t)key * D + dt * 8 + 2 * t) =
            Ty<T>::pack(dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
        *reinterpret_cast<u32*>(dVb + (size_t)key * D + dt * 8 + 2 * t) =
            Ty<T>::pack(dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
    }
  }
}

// Dsum[r] = sum_d dO[r,d]*O[r,d]; dQacc[r,:] = 0 when dQacc != NULL. One warp per row.
template <typename T>
__device__ __forceinline__ void bwd_pre(const T* __restrict__ O, const T* __restrict__ dO,
                                        float* __restrict__ Dsum, float* __restrict__ dQacc, int rows,
                                        int dim) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + warp;
  if (row >= rows) return;
  const T* o = O + (size_t)row * dim;
  const T* d = dO + (size_t)row * dim;
  float acc = 0.f;
  for (int i = lane; i < dim; i += 32) acc += Ty<T>::to_f(o[i]) * Ty<T>::to_f(d[i]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) Dsum[row] = acc;
  if (dQacc) {
    float* q = dQacc + (size_t)row * dim;
    for (int i = lane; i < dim; i += 32) q[i] = 0.f;
  }
}

// The index in dQaccum of element (row, col) of a dim-column dQ (row
// counting over all BH·Sq rows): with swz, 8-column block j of a row sits
// at block j ^ (r & 3), r the row's index in its head (the Hopper backward
// stages dQ that way, see dq_stage in flash_sm90_bwd.cuh). When Sq is
// a multiple of 4, r & 3 is row & 3 and no division is needed.
__device__ __forceinline__ long long dq_acc_index(long long row, int col, int dim, int sq, int swz) {
  if (!swz) return row * dim + col;
  const int r = (sq & 3) == 0 ? (int)row : (int)(row % sq);
  return row * dim + (col ^ ((r & 3) << 3));
}

template <typename T>
__device__ __forceinline__ void bwd_convert(const float* __restrict__ acc, T* __restrict__ out, long long n,
                                            int dim, int sq, float scale, int swz) {
  const int shift = __ffs(dim) - 1;  // dim is a power of two
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long row = i >> shift;
    out[i] = Ty<T>::from_f(acc[dq_acc_index(row, (int)(i - row * dim), dim, sq, swz)] * scale);
  }
}

// The tensor-core path's bwd_pre and bwd_convert, 16 bytes of every 16-bit
// tensor a thread: the one-element-a-lane versions above issue four times the
// loads and stores for the same bytes and left these memory-bound kernels
// well short of the bandwidth (O, dO, dQ and dQaccum must be 16-byte aligned;
// the launcher falls back to the versions above when they are not).
//
// bwd_pre_vec: dim/8 consecutive threads share a row (dim in {64, 128, 256}:
// a power of two dividing the warp), each reading 8 elements of O and dO and
// zeroing 8 floats of dQaccum. Threads past the last row still join the
// shuffles.
template <typename T>
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  const u32 x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const float2 u = Ty<T>::unpack(x[k]), v = Ty<T>::unpack(y[k]);
    acc = fmaf(u.x, v.x, acc);
    acc = fmaf(u.y, v.y, acc);
  }
  return acc;
}

template <typename T>
__device__ __forceinline__ void bwd_pre_vec(const T* __restrict__ O, const T* __restrict__ dO,
                                            float* __restrict__ Dsum, float* __restrict__ dQacc, int rows,
                                            int dim) {
  const int per = dim >> 3, shift = __ffs(per) - 1;  // threads a row, a power of two
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long row = i >> shift;
  const int c = (int)(i - row * per);
  float acc = 0.f;
  if (row < rows) {
    const size_t off = (size_t)row * dim + 8 * c;
    acc = dot8<T>(*reinterpret_cast<const uint4*>(O + off), *reinterpret_cast<const uint4*>(dO + off));
    float4* q = reinterpret_cast<float4*>(dQacc + off);
    q[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    q[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int s = per >> 1; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  if (row < rows && c == 0) Dsum[row] = acc;
}

// bwd_convert_vec: n8 = n/8 groups of 8 elements, one a thread (grid-stride).
template <typename T>
__device__ __forceinline__ void bwd_convert_vec(const float* __restrict__ acc, T* __restrict__ out, long long n8,
                                                int dim, int sq, float scale, int swz) {
  const int per = dim >> 3, shift = __ffs(per) - 1;  // groups a row, a power of two
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
       i += (long long)gridDim.x * blockDim.x) {
    const long long row = i >> shift;
    const long long src = dq_acc_index(row, 8 * (int)(i - row * per), dim, sq, swz) >> 3;
    const float4 a = reinterpret_cast<const float4*>(acc)[2 * src];
    const float4 b = reinterpret_cast<const float4*>(acc)[2 * src + 1];
    uint4 r;
    r.x = Ty<T>::pack(a.x * scale, a.y * scale);
    r.y = Ty<T>::pack(a.z * scale, a.w * scale);
    r.z = Ty<T>::pack(b.x * scale, b.y * scale);
    r.w = Ty<T>::pack(b.z * scale, b.w * scale);
    reinterpret_cast<uint4*>(out)[i] = r;
  }
}

// ---------------------------------------------------------------- generic path (CUDA cores)
//
// 4 warps per CTA, 4 rows per warp (16 rows per CTA), tiles of 32 rows of the
// other operand in smem (row stride D|1 floats: conflict-free per-lane rows).
// Lane j of a warp handles row j of the staged tile; sums over the tile go
// through shuffles. Accumulators: lane owns columns lane + 32k, k < 8 (D <= 256).

constexpr int GEN_ROWS = 4;   // rows per warp
constexpr int GEN_TILE = 32;  // staged rows
constexpr int GEN_KMAX = 8;   // D <= 256

template <typename T>
__device__ __forceinline__ void gen_fwd(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                                        T* __restrict__ O, float* __restrict__ LSE, int BH, int Sq, int Sk, int D,
                                        float scale, int causal, int group) {
  extern __shared__ __align__(16) float gsm[];
  const int KS = D | 1;
  float* sK = gsm;                     // [32][KS]
  float* sV = sK + GEN_TILE * KS;      // [32][KS]
  float* sQ = sV + GEN_TILE * KS;      // [16][D]
  const int bh = blockIdx.x;
  const int r0 = blockIdx.y * 16;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const T* Qb = Q + (size_t)bh * Sq * D;
  const T* Kb = K + (size_t)(bh / group) * Sk * D;
  const T* Vb = V + (size_t)(bh / group) * Sk * D;
  for (int i = tid; i < 16 * D; i += blockDim.x) {
    int r = i / D, d = i % D;
    sQ[i] = (r0 + r < Sq) ? Ty<T>::to_f(Qb[(size_t)(r0 + r) * D + d]) : 0.f;
  }
  float o[GEN_ROWS][GEN_KMAX];
  float m[GEN_ROWS], l[GEN_ROWS];
#pragma unroll
  for (int r = 0; r < GEN_ROWS; r++) {
    m[r] = -FLASH_INF;
    l[r] = 0.f;
#pragma unroll
    for (int k = 0; k < GEN_KMAX; k++) o[r][k] = 0.f;
  }
  const int kv_end = causal ? min(Sk, r0 + 16) : Sk;
  for (int kt = 0; kt < kv_end; kt += GEN_TILE) {
    __syncthreads();
    for (int i = tid; i < GEN_TILE * D; i += blockDim.x) {
      int r = i / D, d = i % D;
      bool ok = kt + r < Sk;
      sK[r * KS + d] = ok ? Ty<T>::to_f(Kb[(size_t)(kt + r) * D + d]) : 0.f;
      sV[r * KS + d] = ok ? Ty<T>::to_f(Vb[(size_t)(kt + r) * D + d]) : 0.f;
    }
    __syncthreads();
    const int key = kt + lane;
    float s[GEN_ROWS];
#pragma unroll
    for (int r = 0; r < GEN_ROWS; r++) s[r] = 0.f;
    for (int d = 0; d < D; d++) {
      const float kv = sK[lane * KS + d];
#pragma unroll
      for (int r = 0; r < GEN_ROWS; r++) s[r] = fmaf(sQ[(warp * GEN_ROWS + r) * D + d], kv, s[r]);
    }
#pragma unroll
    for (int r = 0; r < GEN_ROWS; r++) {
      const int row = r0 + warp * GEN_ROWS + r;
      const bool valid = key < Sk && (!causal || key <= row);
      const float sv = valid ? s[r] * scale : -FLASH_INF;
      float mx = sv;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float mnew = fmaxf(m[r], mx);
      const float muse = (mnew == -FLASH_INF) ? 0.f : mnew;
      const float p = valid ? expf(sv - muse) : 0.f;
      const float alpha = expf(m[r] - muse);
      float ps = p;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
      l[r] = l[r] * alpha + ps;
      m[r] = mnew;
#pragma unroll
      for (int k = 0; k < GEN_KMAX; k++) o[r][k] *= alpha;
      s[r] = p;
    }
    for (int j = 0; j < GEN_TILE; j++) {
      float pj[GEN_ROWS];
#pragma unroll
      for (int r = 0; r < GEN_ROWS; r++) pj[r] = __shfl_sync(0xffffffffu, s[r], j);
#pragma unroll
      for (int k = 0; k < GEN_KMAX; k++) {
        const int d = lane + 32 * k;
        if (d < D) {
          const float vv = sV[j * KS + d];
#pragma unroll
          for (int r = 0; r < GEN_ROWS; r++) o[r][k] = fmaf(pj[r], vv, o[r][k]);
        }
      }
    }
  }
  T* Ob = O + (size_t)bh * Sq * D;
#pragma unroll
  for (int r = 0; r < GEN_ROWS; r++) {
    const int row = r0 + warp * GEN_ROWS + r;
    if (row >= Sq) continue;
    const bool ok = l[r] > 0.f;
    const float inv = ok ? 1.f / l[r] : 0.f;
#pragma unroll
    for (int k = 0; k < GEN_KMAX; k++) {
      const int d = lane + 32 * k;
      if (d < D) Ob[(size_t)row * D + d] = Ty<T>::from_f(o[r][k] * inv);
    }
    if (lane == 0) LSE[(size_t)bh * Sq + row] = ok ? m[r] + logf(l[r]) : FLASH_INF;
  }
}

// dQ[i] = scale * sum_j P_ij (dP_ij - Dsum_i) K_j; one pass over keys per query row.
template <typename T>
__device__ __forceinline__ void gen_bwd_dq(const T* __restrict__ Q, const T* __restrict__ K,
                                           const T* __restrict__ V, const T* __restrict__ dO,
                                           const float* __restrict__ LSE, const float* __restrict__ Dsum,
                                           T* __restrict__ dQ, int BH, int Sq, int Sk, int D, float scale,
                                           int causal, int group) {
  extern __shared__ __align__(16) float gsm[];
  const int KS = D | 1;
  float* sK = gsm;                 // [32][KS]
  float* sV = sK + GEN_TILE * KS;  // [32][KS]
  float* sQ = sV + GEN_TILE * KS;  // [16][D]
  float* sdO = sQ + 16 * D;        // [16][D]
  const int bh = blockIdx.x;
  const int r0 = blockIdx.y * 16;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const T* Qb = Q + (size_t)bh * Sq * D;
  const T* dOb = dO + (size_t)bh * Sq * D;
  const T* Kb = K + (size_t)(bh / group) * Sk * D;
  const T* Vb = V + (size_t)(bh / group) * Sk * D;
  for (int i = tid; i < 16 * D; i += blockDim.x) {
    int r = i / D, d = i % D;
    bool ok = r0 + r < Sq;
    sQ[i] = ok ? Ty<T>::to_f(Qb[(size_t)(r0 + r) * D + d]) : 0.f;
    sdO[i] = ok ? Ty<T>::to_f(dOb[(size_t)(r0 + r) * D + d]) : 0.f;
  }
  float lse[GEN_ROWS], dsum[GEN_ROWS], acc[GEN_ROWS][GEN_KMAX];
#pragma unroll
  for (int r = 0; r < GEN_ROWS; r++) {
    const int row = r0 + warp * GEN_ROWS + r;
    lse[r] = row < Sq ? LSE[(size_t)bh * Sq + row] : FLASH_INF;
    dsum[r] = row < Sq ? Dsum[(size_t)bh * Sq + row] : 0.f;
#pragma unroll
    for (int k = 0; k < GEN_KMAX; k++) acc[r][k] = 0.f;
  }
  const int kv_end = causal ? min(Sk, r0 + 16) : Sk;
  for (int kt = 0; kt < kv_end; kt += GEN_TILE) {
    __syncthreads();
    for (int i = tid; i < GEN_TILE * D; i += blockDim.x) {
      int r = i / D, d = i % D;
      bool ok = kt + r < Sk;
      sK[r * KS + d] = ok ? Ty<T>::to_f(Kb[(size_t)(kt + r) * D + d]) : 0.f;
      sV[r * KS + d] = ok ? Ty<T>::to_f(Vb[(size_t)(kt + r) * D + d]) : 0.f;
    }
    __syncthreads();
    const int key = kt + lane;
    float s[GEN_ROWS], dp[GEN_ROWS];
#pragma unroll
    for (int r = 0; r < GEN_ROWS; r++) s[r] = dp[r] = 0.f;
    for (int d = 0; d < D; d++) {
      const float kv = sK[lane * KS + d];
      const float vv = sV[lane * KS + d];
#pragma unroll
      for (int r = 0; r < GEN_ROWS; r++) {
        s[r] = fmaf(sQ[(warp * GEN_ROWS + r) * D + d], kv, s[r]);
        dp[r] = fmaf(sdO[(warp * GEN_ROWS + r) * D + d], vv, dp[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < GEN_ROWS; r++) {
      const int row = r0 + warp * GEN_ROWS + r;
      const bool valid = key < Sk && row < Sq && (!causal || key <= row);
      const float p = valid ? expf(s[r] * scale - lse[r]) : 0.f;
      s[r] = p * (dp[r] - dsum[r]);  // dS
    }
    for (int j = 0; j < GEN_TILE; j++) {
      float dsj[GEN_ROWS];
#pragma unroll
      for (int r = 0; r < GEN_ROWS; r++) dsj[r] = __shfl_sync(0xffffffffu, s[r], j);
#pragma unroll
      for (int k = 0; k < GEN_KMAX; k++) {
        const int d = lane + 32 * k;
        if (d < D) {
          const float kv = sK[j * KS + d];
#pragma unroll
          for (int r = 0; r < GEN_ROWS; r++) acc[r][k] = fmaf(dsj[r], kv, acc[r][k]);
        }
      }
    }
  }
  T* dQb = dQ + (size_t)bh * Sq * D;
#pragma unroll
  for (int r = 0; r < GEN_ROWS; r++) {
    const int row = r0 + warp * GEN_ROWS + r;
    if (row >= Sq) continue;
#pragma unroll
    for (int k = 0; k < GEN_KMAX; k++) {
      const int d = lane + 32 * k;
      if (d < D) dQb[(size_t)row * D + d] = Ty<T>::from_f(acc[r][k] * scale);
    }
  }
}

// dV[j] = sum_i P_ij dO_i; dK[j] = scale * sum_i dS_ij Q_i; one pass over queries per key row.
template <typename T>
__device__ __forceinline__ void gen_bwd_dkdv(const T* __restrict__ Q, const T* __restrict__ K,
                                             const T* __restrict__ V, const T* __restrict__ dO,
                                             const float* __restrict__ LSE, const float* __restrict__ Dsum,
                                             T* __restrict__ dK, T* __restrict__ dV, int BH, int Sq, int Sk,
                                             int D, float scale, int causal, int group) {
  extern __shared__ __align__(16) float gsm[];
  const int KS = D | 1;
  float* sQ = gsm;                   // [32][KS]
  float* sdO = sQ + GEN_TILE * KS;   // [32][KS]
  float* sK = sdO + GEN_TILE * KS;   // [16][D]
  float* sV = sK + 16 * D;           // [16][D]
  float* sL = sV + 16 * D;           // [32]
  float* sD = sL + GEN_TILE;         // [32]
  const int hkv = blockIdx.x;  // the K/V head; its group's query heads are looped below
  const int k0 = blockIdx.y * 16;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const T* Kb = K + (size_t)hkv * Sk * D;
  const T* Vb = V + (size_t)hkv * Sk * D;
  for (int i = tid; i < 16 * D; i += blockDim.x) {
    int r = i / D, d = i % D;
    bool ok = k0 + r < Sk;
    sK[i] = ok ? Ty<T>::to_f(Kb[(size_t)(k0 + r) * D + d]) : 0.f;
    sV[i] = ok ? Ty<T>::to_f(Vb[(size_t)(k0 + r) * D + d]) : 0.f;
  }
  float ak[GEN_ROWS][GEN_KMAX], av[GEN_ROWS][GEN_KMAX];
#pragma unroll
  for (int r = 0; r < GEN_ROWS; r++)
#pragma unroll
    for (int k = 0; k < GEN_KMAX; k++) ak[r][k] = av[r][k] = 0.f;
  const int qstart = causal ? (k0 / GEN_TILE) * GEN_TILE : 0;
  for (int bh = hkv * group; bh < (hkv + 1) * group; bh++) {
    const T* Qb = Q + (size_t)bh * Sq * D;
    const T* dOb = dO + (size_t)bh * Sq * D;
    for (int qt = qstart; qt < Sq; qt += GEN_TILE) {
      __syncthreads();
      for (int i = tid; i < GEN_TILE * D; i += blockDim.x) {
        int r = i / D, d = i % D;
        bool ok = qt + r < Sq;
        sQ[r * KS + d] = ok ? Ty<T>::to_f(Qb[(size_t)(qt + r) * D + d]) : 0.f;
        sdO[r * KS + d] = ok ? Ty<T>::to_f(dOb[(size_t)(qt + r) * D + d]) : 0.f;
      }
      for (int i = tid; i < GEN_TILE; i += blockDim.x) {
        bool ok = qt + i < Sq;
        sL[i] = ok ? LSE[(size_t)bh * Sq + qt + i] : FLASH_INF;
        sD[i] = ok ? Dsum[(size_t)bh * Sq + qt + i] : 0.f;
      }
      __syncthreads();
      const int q = qt + lane;
      float s[GEN_ROWS], dp[GEN_ROWS];
#pragma unroll
      for (int r = 0; r < GEN_ROWS; r++) s[r] = dp[r] = 0.f;
      for (int d = 0; d < D; d++) {
        const float qv = sQ[lane * KS + d];
        const float ov = sdO[lane * KS + d];
#pragma unroll
        for (int r = 0; r < GEN_ROWS; r++) {
          s[r] = fmaf(sK[(warp * GEN_ROWS + r) * D + d], qv, s[r]);
          dp[r] = fmaf(sV[(warp * GEN_ROWS + r) * D + d], ov, dp[r]);
        }
      }
      const float lq = sL[lane], dq = sD[lane];
      float p[GEN_ROWS];
#pragma unroll
      for (int r = 0; r < GEN_ROWS; r++) {
        const int key = k0 + warp * GEN_ROWS + r;
        const bool valid = q < Sq && key < Sk && (!causal || key <= q);
        p[r] = valid ? expf(s[r] * scale - lq) : 0.f;
        s[r] = p[r] * (dp[r] - dq);  // dS
      }
      for (int j = 0; j < GEN_TILE; j++) {
        float pj[GEN_ROWS], dsj[GEN_ROWS];
#pragma unroll
        for (int r = 0; r < GEN_ROWS; r++) {
          pj[r] = __shfl_sync(0xffffffffu, p[r], j);
          dsj[r] = __shfl_sync(0xffffffffu, s[r], j);
        }
#pragma unroll
        for (int k = 0; k < GEN_KMAX; k++) {
          const int d = lane + 32 * k;
          if (d < D) {
            const float ov = sdO[j * KS + d];
            const float qv = sQ[j * KS + d];
#pragma unroll
            for (int r = 0; r < GEN_ROWS; r++) {
              av[r][k] = fmaf(pj[r], ov, av[r][k]);
              ak[r][k] = fmaf(dsj[r], qv, ak[r][k]);
            }
          }
        }
      }
    }
  }
  T* dKb = dK + (size_t)hkv * Sk * D;
  T* dVb = dV + (size_t)hkv * Sk * D;
#pragma unroll
  for (int r = 0; r < GEN_ROWS; r++) {
    const int key = k0 + warp * GEN_ROWS + r;
    if (key >= Sk) continue;
#pragma unroll
    for (int k = 0; k < GEN_KMAX; k++) {
      const int d = lane + 32 * k;
      if (d < D) {
        dKb[(size_t)key * D + d] = Ty<T>::from_f(ak[r][k] * scale);
        dVb[(size_t)key * D + d] = Ty<T>::from_f(av[r][k]);
      }
    }
  }
}

}  // namespace flash

// ---------------------------------------------------------------- entry points

#define FLASH_FWD_TC(NAME, T, D, NW, BC)                                                                \
  extern "C" __global__ void __launch_bounds__(NW * 32)                                                \
      NAME(const T* q, const T* k, const T* v, T* o, float* lse, int BH, int Sq, int Sk, float scale, \
           int causal, int group) {                                                                    \
    flash::fwd_tc<T, D, NW, BC>(q, k, v, o, lse, BH, Sq, Sk, scale, causal, group);                    \
  }

#define FLASH_BWD_TC(NAME, T, D, BR, NW)                                                                       \
  extern "C" __global__ void __launch_bounds__(NW * 32, 1)                                                    \
      NAME(const T* q, const T* k, const T* v, const T* dO, const float* lse, const float* dsum, float* dqacc, \
           T* dk, T* dv, int BH, int Sq, int Sk, float scale, int causal, int group) {                        \
    flash::bwd_tc<T, D, BR, NW>(q, k, v, dO, lse, dsum, dqacc, dk, dv, BH, Sq, Sk, scale, causal, group);     \
  }

// Shipped configurations (see the table at the top of the file); picked on the H200
// from the variants timed by tools/reference/flash_dev.py --variants 0,1,2.
FLASH_FWD_TC(flash_fwd_bf16_d64, __nv_bfloat16, 64, 8, 128)
FLASH_FWD_TC(flash_fwd_bf16_d128, __nv_bfloat16, 128, 4, 64)
FLASH_FWD_TC(flash_fwd_fp16_d64, __half, 64, 8, 128)
FLASH_FWD_TC(flash_fwd_fp16_d128, __half, 128, 4, 64)
FLASH_BWD_TC(flash_bwd_bf16_d64, __nv_bfloat16, 64, 128, 8)
FLASH_BWD_TC(flash_bwd_bf16_d128, __nv_bfloat16, 128, 64, 8)
FLASH_BWD_TC(flash_bwd_fp16_d64, __half, 64, 128, 8)
FLASH_BWD_TC(flash_bwd_fp16_d128, __half, 128, 64, 8)

#define FLASH_TYPED(SUF, T)                                                                                   \
  extern "C" __global__ void flash_bwd_pre_##SUF(const T* o, const T* dO, float* dsum, float* dqacc, int rows, \
                                                 int dim) {                                                   \
    flash::bwd_pre<T>(o, dO, dsum, dqacc, rows, dim);                                                        \
  }                                                                                                           \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      flash_fwd_generic_##SUF(const T* q, const T* k, const T* v, T* o, float* lse, int BH, int Sq, int Sk,   \
                              int D, float scale, int causal, int group) {                                    \
    flash::gen_fwd<T>(q, k, v, o, lse, BH, Sq, Sk, D, scale, causal, group);                                 \
  }                                                                                                           \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      flash_bwd_generic_dq_##SUF(const T* q, const T* k, const T* v, const T* dO, const float* lse,          \
                                 const float* dsum, T* dq, int BH, int Sq, int Sk, int D, float scale,       \
                                 int causal, int group) {                                                     \
    flash::gen_bwd_dq<T>(q, k, v, dO, lse, dsum, dq, BH, Sq, Sk, D, scale, causal, group);                   \
  }                                                                                                           \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      flash_bwd_generic_dkdv_##SUF(const T* q, const T* k, const T* v, const T* dO, const float* lse,        \
                                   const float* dsum, T* dk, T* dv, int BH, int Sq, int Sk, int D,            \
                                   float scale, int causal, int group) {                                      \
    flash::gen_bwd_dkdv<T>(q, k, v, dO, lse, dsum, dk, dv, BH, Sq, Sk, D, scale, causal, group);             \
  }

FLASH_TYPED(fp32, float)
FLASH_TYPED(bf16, __nv_bfloat16)
FLASH_TYPED(fp16, __half)

// The tensor-core backward's dQ conversion: 16-bit types only (float32
// never takes the tensor-core path).
#define FLASH_CONVERT(SUF, T)                                                                                     \
  extern "C" __global__ void flash_bwd_convert_##SUF(const float* acc, T* out, long long n, int dim, int sq,     \
                                                     float scale, int swz) {                                      \
    flash::bwd_convert<T>(acc, out, n, dim, sq, scale, swz);                                                 \
  }

FLASH_CONVERT(bf16, __nv_bfloat16)
FLASH_CONVERT(fp16, __half)

#define FLASH_VEC(SUF, T)                                                                                       \
  extern "C" __global__ void flash_bwd_prevec_##SUF(const T* o, const T* dO, float* dsum, float* dqacc, int rows, \
                                                    int dim) {                                                   \
    flash::bwd_pre_vec<T>(o, dO, dsum, dqacc, rows, dim);                                                       \
  }                                                                                                              \
  extern "C" __global__ void flash_bwd_convertvec_##SUF(const float* acc, T* out, long long n8, int dim, int sq, \
                                                        float scale, int swz) {                                 \
    flash::bwd_convert_vec<T>(acc, out, n8, dim, sq, scale, swz);                                               \
  }

FLASH_VEC(bf16, __nv_bfloat16)
FLASH_VEC(fp16, __half)

// ---------------------------------------------------------------- grouped backward as multi-head
//
// flash_bwd_kv_repeat and flash_bwd_kv_sum_<T> (see the header): memory-bound
// copies, 16 bytes a thread. Output chunk i lies in row i >> shift (chunks =
// 1 << shift a row); a row's index fits an int (BH*Sk does, as the launcher
// checks), so the divisions by Sk and group are 32-bit.

namespace flash {

// dst [BH, Sk, D] (rows = BH*Sk) head h = src head h/group.
__device__ __forceinline__ void kv_repeat(const uint4* __restrict__ src, uint4* __restrict__ dst, int rows,
                                          int chunks, int sk, int group) {
  const int shift = __ffs(chunks) - 1;
  const long long n = (long long)rows << shift;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const int row = (int)(i >> shift);
    const int h = row / sk, r = row - h * sk;
    const long long from = (((long long)(h / group) * sk + r) << shift) + (i & (chunks - 1));
    dst[i] = src[from];
  }
}

// dst [BH/group, Sk, D] (rows = BH/group*Sk) head h = the sum of src heads
// h*group .. h*group + group-1, added in that order in float32 and rounded
// once: the same bits every run.
template <typename T>
__device__ __forceinline__ void kv_sum(const uint4* __restrict__ src, uint4* __restrict__ dst, int rows,
                                       int chunks, int sk, int group) {
  const int shift = __ffs(chunks) - 1;
  const long long n = (long long)rows << shift;
  const long long head = (long long)sk << shift;  // chunks a head
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const int row = (int)(i >> shift);
    const int h = row / sk, r = row - h * sk;
    const uint4* p = src + (((long long)h * group * sk + r) << shift) + (i & (chunks - 1));
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] = 0.f;
#pragma unroll 4
    for (int g = 0; g < group; g++) {
      const uint4 x = p[g * head];
      const u32 w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const float2 f = Ty<T>::unpack(w[k]);
        acc[2 * k] += f.x;
        acc[2 * k + 1] += f.y;
      }
    }
    uint4 o;
    o.x = Ty<T>::pack(acc[0], acc[1]);
    o.y = Ty<T>::pack(acc[2], acc[3]);
    o.z = Ty<T>::pack(acc[4], acc[5]);
    o.w = Ty<T>::pack(acc[6], acc[7]);
    dst[i] = o;
  }
}

}  // namespace flash

// Any 16-bit type: a copy.
extern "C" __global__ void __launch_bounds__(256)
    flash_bwd_kv_repeat(const uint4* k, const uint4* v, uint4* kr, uint4* vr, int rows, int chunks, int sk,
                        int group) {
  if (blockIdx.y == 0)
    flash::kv_repeat(k, kr, rows, chunks, sk, group);
  else
    flash::kv_repeat(v, vr, rows, chunks, sk, group);
}

#define FLASH_KV_SUM(SUF, T)                                                                                 \
  extern "C" __global__ void __launch_bounds__(256)                                                         \
      flash_bwd_kv_sum_##SUF(const uint4* dkr, const uint4* dvr, uint4* dk, uint4* dv, int rows, int chunks, \
                             int sk, int group) {                                                           \
    if (blockIdx.y == 0)                                                                                    \
      flash::kv_sum<T>(dkr, dk, rows, chunks, sk, group);                                                   \
    else                                                                                                    \
      flash::kv_sum<T>(dvr, dv, rows, chunks, sk, group);                                                   \
  }

FLASH_KV_SUM(bf16, __nv_bfloat16)
FLASH_KV_SUM(fp16, __half)

// ---------------------------------------------------------------- decode forward (split K/V)
//
// Flash-decoding for a few query rows (Sq <= 16) against a long K/V: the visible
// key range [0, kv_end) (kv_end = Sk, or min(Sk, Sq) when causal: top-left, as
// above) is cut into `splits` chunks of tiles_per_split tiles of DEC_BC keys, and
// CTA (bh, split) scans one chunk, so that BH*splits CTAs share the K/V reads
// that one CTA per (bh, query tile) would do alone.
//
//   flash_decode_<T>_d<D>(q, k, v, o, lse, Opart, Lpart, BH, Sq, Sk, splits, tiles_per_split,
//                         scale, causal, flags, stages, group)
//     grid (BH, splits), block DEC_NW*32, dynamic smem (16 + 2*stages*DEC_BC)*D*2 for a
//     K/V ring of 2 <= stages <= MAXST tiles (MAXST: the instantiation's, the most that fit):
//       decode d64 : up to 14 stages -> 231424 B;  decode d128: up to 6 stages -> 200704 B
//     (d64: 4 stages -> 67584 B, 3 CTAs per SM; 6 -> 100352 B, 2 per SM; 14: 1 per SM.
//      d128: 3 stages -> 102400 B, 2 CTAs per SM; 6: 1 per SM.)
//     Opart float32 [BH, splits, Sq, D]: the chunk's softmax-normalised output;
//     Lpart float32 [BH, splits, Sq]: the chunk's logsumexp (-inf: no key visible).
//     flags: DEC_FUSED, DEC_PF256 (below). Without DEC_FUSED every CTA writes
//     its chunk's Opart and Lpart and o, lse are not touched: run the combine.
//     With DEC_FUSED a single chunk (splits == 1) writes O and LSE directly
//     (Opart and Lpart are not touched and may be null), and with more chunks
//     the last CTA of each bh to finish combines its partials into O and LSE
//     (a ticket per bh in dec_tickets, which that CTA sets back to 0; BH <=
//     DEC_MAX_TICKETS, at most one launch in flight per module, as on one stream).
//   flash_decode_combine_<T>(Opart, Lpart, o, lse, BH, Sq, D, splits)
//     grid BH*Sq, block 128: LSE = log sum_s exp(Lpart_s), O = sum_s exp(Lpart_s - LSE) Opart_s
//     (O = 0, LSE = +inf for a row that sees no key); splits <= DEC_MAX_SPLITS.
//
// The CTA keeps the (zero-padded) 16 x D query tile in registers as mma A
// fragments; warp w takes keys 16w..16w+15 of each K/V tile (a stages-deep
// cp.async ring, one barrier per tile) with its own running max, sum and
// output, and the warps merge through shared memory at the end.

namespace flash {

constexpr int DEC_NW = 4;               // warps per CTA
constexpr int DEC_BC = 16 * DEC_NW;     // keys per K/V tile
constexpr int DEC_ROWS = 16;            // query rows: one m16 tile
constexpr int DEC_MAX_SPLITS = 256;     // the combines' shared weights
constexpr int DEC_MAX_TICKETS = 1024;   // bh rows of dec_tickets: the fused combine's BH limit
constexpr int DEC_FUSED = 1;            // flags: write O and LSE (one chunk) or combine in the last CTA
constexpr int DEC_PF256 = 2;            // flags: K/V loads ask L2 to fetch whole 256-byte blocks

// dec_tickets[bh] counts the chunks of bh that are done (DEC_FUSED, splits > 1).
// A module global is zero when the module loads and every launch leaves it
// zero (the last CTA resets its bh), so no launch has to clear it first, and
// the workspace, which the memory plan may share with other tensors, holds no
// state between launches.
__device__ unsigned int dec_tickets[DEC_MAX_TICKETS];

// cp_async16 with the L2 prefetch-size hint: the whole aligned 256-byte block
// around the 16 bytes is fetched from DRAM into L2 (K/V tiles are contiguous,
// so the rest of the block is wanted by the same CTA right away).
__device__ __forceinline__ void cp_async16_pf256(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

// load_tile for the decode K/V ring, with or without the prefetch hint.
template <typename T, int ROWS, int D, int NT, bool PF>
__device__ __forceinline__ void dec_load_tile(u32 dst, const T* src, int row0, int nvalid, int tid) {
  constexpr int CH = D / 8;
  static_assert((ROWS * CH) % NT == 0, "whole rounds of 16-byte copies");
#pragma unroll
  for (int it = 0; it < ROWS * CH / NT; it++) {
    const int idx = tid + it * NT;
    const int r = idx / CH, c = idx % CH;
    const int gr = row0 + r;
    const bool ok = gr < nvalid;
    const T* p = src + (size_t)(ok ? gr : 0) * D + c * 8;
    if (PF)
      cp_async16_pf256(swz<CH>(dst, r, c), p, ok ? 16 : 0);
    else
      cp_async16(swz<CH>(dst, r, c), p, ok ? 16 : 0);
  }
}

template <typename T, int D, int NT>
__device__ __forceinline__ void dec_load_kv(u32 st, const T* Kb, const T* Vb, int row0, int nvalid, int tid,
                                            bool pf) {
  constexpr u32 TILE = DEC_BC * D * 2;
  if (pf) {
    dec_load_tile<T, DEC_BC, D, NT, true>(st, Kb, row0, nvalid, tid);
    dec_load_tile<T, DEC_BC, D, NT, true>(st + TILE, Vb, row0, nvalid, tid);
  } else {
    dec_load_tile<T, DEC_BC, D, NT, false>(st, Kb, row0, nvalid, tid);
    dec_load_tile<T, DEC_BC, D, NT, false>(st + TILE, Vb, row0, nvalid, tid);
  }
}

// Stores 4 consecutive outputs (8 bytes; D/4-aligned columns).
template <typename T>
__device__ __forceinline__ void dec_store4(T* dst, float4 x) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(Ty<T>::pack(x.x, x.y), Ty<T>::pack(x.z, x.w));
}

// The fused combine, run by the last CTA of bh to finish (all NT threads):
// the same arithmetic as decode_combine, reading the other CTAs' partials
// from L2 (ld.global.cg: this SM's L1 may not hold them). sw: 16-byte
// aligned, splits*Sq + DEC_ROWS + 3 + 4*NT floats of shared memory. When
// the rows have few columns (Sq*D/4 < NT) the splits are shared among
// groups of threads and summed through shared memory, so that a long list
// of splits is not one thread's serial chain of loads.
template <typename T, int D, int NT>
__device__ __forceinline__ void dec_combine_cta(const float* __restrict__ Opart, const float* __restrict__ Lpart,
                                                T* __restrict__ O, float* __restrict__ LSE, int bh, int Sq,
                                                int splits, float* sw) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int n = splits * Sq;  // Lpart of bh: [splits][Sq]
  float* slse = sw + n;
  float4* red = reinterpret_cast<float4*>(sw + ((n + DEC_ROWS + 3) & ~3));  // 16-byte aligned
  const float* lp = Lpart + (size_t)bh * n;
  for (int i = tid; i < n; i += NT) sw[i] = __ldcg(lp + i);
  __syncthreads();
  for (int r = warp; r < Sq; r += NT / 32) {
    float mx = -FLASH_INF;
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, sw[s * Sq + r]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    if (mx != -FLASH_INF)
      for (int s = lane; s < splits; s += 32) sum += expf(sw[s * Sq + r] - mx);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      const float lse = sum > 0.f ? mx + logf(sum) : FLASH_INF;
      slse[r] = lse;
      LSE[(size_t)bh * Sq + r] = lse;
    }
  }
  __syncthreads();
  for (int i = tid; i < n; i += NT) {
    const float lse = slse[i % Sq];
    sw[i] = lse == FLASH_INF ? 0.f : expf(sw[i] - lse);
  }
  __syncthreads();
  constexpr int C4 = D / 4;
  const int items = Sq * C4;
  const int groups = items >= NT ? 1 : NT / items;
  const float* ob = Opart + (size_t)bh * splits * Sq * D;
  T* orow = O + (size_t)bh * Sq * D;
  for (int idx = tid; idx < items * groups; idx += NT) {
    const int item = idx % items, g = idx / items;
    const int r = item / C4, c4 = (item % C4) * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int s = g; s < splits; s += groups) {
      const float w = sw[s * Sq + r];
      const float4 x = __ldcg(reinterpret_cast<const float4*>(ob + ((size_t)s * Sq + r) * D + c4));
      acc.x = fmaf(w, x.x, acc.x);
      acc.y = fmaf(w, x.y, acc.y);
      acc.z = fmaf(w, x.z, acc.z);
      acc.w = fmaf(w, x.w, acc.w);
    }
    if (groups == 1)
      dec_store4<T>(orow + (size_t)r * D + c4, acc);
    else
      red[idx] = acc;
  }
  if (groups > 1) {
    __syncthreads();
    if (tid < items) {
      float4 acc = red[tid];
      for (int g = 1; g < groups; g++) {
        const float4 x = red[g * items + tid];
        acc.x += x.x;
        acc.y += x.y;
        acc.z += x.z;
        acc.w += x.w;
      }
      dec_store4<T>(orow + (size_t)(tid / C4) * D + (tid % C4) * 4, acc);
    }
  }
}

// cp.async.wait_group n for a run-time n in [0, N] (the instruction takes
// an immediate).
template <int N> __device__ __forceinline__ void dec_wait_group(int n) {
  if constexpr (N == 0) {
    cp_async_wait<0>();
  } else {
    if (n >= N)
      cp_async_wait<N>();
    else
      dec_wait_group<N - 1>(n);
  }
}

template <typename T, int D, int MAXST>
__device__ __forceinline__ void decode_fwd(const T* __restrict__ Q, const T* __restrict__ K,
                                           const T* __restrict__ V, T* __restrict__ O, float* __restrict__ LSE,
                                           float* __restrict__ Opart, float* __restrict__ Lpart, int BH, int Sq,
                                           int Sk, int splits, int tiles_per_split, float scale, int causal,
                                           int flags, int stages, int group) {
  constexpr int NT = 32 * DEC_NW;
  constexpr int CH = D / 8;
  constexpr int DS = D + 8;  // float stride of the merge rows (conflict-free float2 stores)
  constexpr u32 TILE = DEC_BC * D * 2;
  static_assert(D % 64 == 0 && MAXST >= 2, "tile shape");
  static_assert((DEC_NW * DEC_ROWS * DS + 2 * DEC_NW * DEC_ROWS) * 4 <= 2 * 2 * TILE,
                "the merge buffers must fit in two K/V stages");
  static_assert((DEC_MAX_SPLITS * DEC_ROWS + DEC_ROWS + 3 + 4 * NT) * 4 <= 2 * 2 * TILE,
                "the fused combine's buffers must fit in two K/V stages");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ int s_last;
  const u32 sQ = smem_u32(smem_raw);
  const u32 sKV = sQ + DEC_ROWS * D * 2;  // stages x {K tile, V tile}

  const int bh = blockIdx.x, split = blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const T* Qb = Q + (size_t)bh * Sq * D;
  const T* Kb = K + (size_t)(bh / group) * Sk * D;
  const T* Vb = V + (size_t)(bh / group) * Sk * D;
  const bool fused = flags & DEC_FUSED, pf = flags & DEC_PF256;
  stages = min(max(stages, 2), MAXST);

  const int kv_end = causal ? min(Sk, Sq) : Sk;
  const int k0 = split * tiles_per_split * DEC_BC;
  const int k1 = min(kv_end, k0 + tiles_per_split * DEC_BC);
  const int ntiles = k1 > k0 ? (k1 - k0 + DEC_BC - 1) / DEC_BC : 0;
  const float c = scale * kLog2e;

  load_tile<T, DEC_ROWS, D, NT>(sQ, Qb, 0, Sq, tid);
  for (int s = 0; s < stages - 1; s++) {
    if (s < ntiles) dec_load_kv<T, D, NT>(sKV + s * 2 * TILE, Kb, Vb, k0 + s * DEC_BC, k1, tid, pf);
    cp_async_commit();
  }
  int rd = 0, wr = stages - 1;  // ring slots of tile j and of tile j + stages - 1

  u32 qf[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-FLASH_INF, -FLASH_INF};
  float l[2] = {0.f, 0.f};

  for (int j = 0; j < ntiles; j++) {
    dec_wait_group<MAXST - 2>(stages - 2);
    __syncthreads();  // tile j landed; every warp is done with tile j-1's stage
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) ldsm_x4(qf[kk], swz<CH>(sQ, lane & 15, kk * 2 + (lane >> 4)));
    }
    {
      const int jn = j + stages - 1;
      if (jn < ntiles) dec_load_kv<T, D, NT>(sKV + wr * 2 * TILE, Kb, Vb, k0 + jn * DEC_BC, k1, tid, pf);
      cp_async_commit();
      wr = wr + 1 == stages ? 0 : wr + 1;
    }
    const u32 sK = sKV + rd * 2 * TILE;
    const u32 sV = sK + TILE;
    rd = rd + 1 == stages ? 0 : rd + 1;
    const int kbase = k0 + j * DEC_BC + warp * 16;  // this warp's first key

    float s[2][4];
#pragma unroll
    for (int i = 0; i < 2; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      u32 b[4];
      ldsm_x4(b, swz<CH>(sK, warp * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
      Ty<T>::mma(s[0], qf[kk], b[0], b[1]);
      Ty<T>::mma(s[1], qf[kk], b[2], b[3]);
    }
    if (causal || kbase + 16 > k1) {
#pragma unroll
      for (int nt = 0; nt < 2; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int col = kbase + nt * 8 + 2 * t + (e & 1);
          const int row = g + (e >> 1) * 8;
          if (col >= k1 || (causal && col > row)) s[nt][e] = -FLASH_INF;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
      mx = warp_max4(mx);
      const float mnew = fmaxf(m[r], mx);
      const float mc = ((mnew == -FLASH_INF) ? 0.f : mnew) * c;
      const float alpha = fexp2(m[r] * c - mc);
      m[r] = mnew;
      float rs = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; nt++) {
        const float p0 = fexp2(fmaf(s[nt][2 * r], c, -mc));
        const float p1 = fexp2(fmaf(s[nt][2 * r + 1], c, -mc));
        s[nt][2 * r] = p0;
        s[nt][2 * r + 1] = p1;
        rs += p0 + p1;
      }
      l[r] = l[r] * alpha + rs;
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }
    u32 a[4];
    a[0] = Ty<T>::pack(s[0][0], s[0][1]);
    a[1] = Ty<T>::pack(s[0][2], s[0][3]);
    a[2] = Ty<T>::pack(s[1][0], s[1][1]);
    a[3] = Ty<T>::pack(s[1][2], s[1][3]);
#pragma unroll
    for (int dn = 0; dn < D / 16; dn++) {
      u32 b[4];
      ldsm_x4_t(b, swz<CH>(sV, warp * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dn * 2 + (lane >> 4)));
      Ty<T>::mma(o[2 * dn], a, b[0], b[1]);
      Ty<T>::mma(o[2 * dn + 1], a, b[2], b[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: they hold the merge buffers now

  float* sO = reinterpret_cast<float*>(smem_raw + DEC_ROWS * D * 2);  // [NW][16][DS]
  float* sM = sO + DEC_NW * DEC_ROWS * DS;                             // [NW][16] running max (raw score)
  float* sL = sM + DEC_NW * DEC_ROWS;                                  // [NW][16] sum
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = warp * DEC_ROWS + g + r * 8;
    const float lsum = warp_sum4(l[r]);
    if (t == 0) {
      sM[row] = m[r];
      sL[row] = lsum;
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
      *reinterpret_cast<float2*>(sO + row * DS + dt * 8 + 2 * t) = make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
  }
  __syncthreads();

  // A single chunk with DEC_FUSED is the whole row: O and LSE directly.
  const bool direct = fused && splits == 1;
  const size_t part = (size_t)bh * splits + split;  // this chunk's partial (not direct)
  for (int idx = tid; idx < Sq * (D / 4); idx += NT) {
    const int r = idx / (D / 4), c4 = (idx % (D / 4)) * 4;
    float mx = -FLASH_INF;
#pragma unroll
    for (int w = 0; w < DEC_NW; w++) mx = fmaxf(mx, sM[w * DEC_ROWS + r]);
    const float mc = ((mx == -FLASH_INF) ? 0.f : mx) * c;
    float lsum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < DEC_NW; w++) {
      const float f = fexp2(sM[w * DEC_ROWS + r] * c - mc);
      lsum += f * sL[w * DEC_ROWS + r];
      const float4 x = *reinterpret_cast<const float4*>(sO + (w * DEC_ROWS + r) * DS + c4);
      acc.x += f * x.x;
      acc.y += f * x.y;
      acc.z += f * x.z;
      acc.w += f * x.w;
    }
    const bool ok = lsum > 0.f;
    const float inv = ok ? 1.f / lsum : 0.f;
    const float4 out = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    const float lse = ok ? mx * scale + logf(lsum) : -FLASH_INF;
    if (direct) {
      dec_store4<T>(O + ((size_t)bh * Sq + r) * D + c4, out);
      if (c4 == 0) LSE[(size_t)bh * Sq + r] = ok ? lse : FLASH_INF;
    } else {
      *reinterpret_cast<float4*>(Opart + (part * Sq + r) * D + c4) = out;
      if (c4 == 0) Lpart[part * Sq + r] = lse;
    }
  }
  if (!fused || direct) return;

  // Fused combine: publish this chunk's partials, take a ticket; the CTA that
  // takes the last one sees every chunk's partials and combines them.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned int done = atomicAdd(&dec_tickets[bh], 1u);
    const bool last = done == (unsigned int)(splits - 1);
    if (last) atomicExch(&dec_tickets[bh], 0u);  // every chunk of bh has counted: ready for the next launch
    s_last = last;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  dec_combine_cta<T, D, NT>(Opart, Lpart, O, LSE, bh, Sq, splits, sO);
}

// One CTA per query row (bh*Sq + i): weights exp(Lpart_s - LSE) in shared
// memory, then thread d sums the splits' column d.
template <typename T>
__device__ __forceinline__ void decode_combine(const float* __restrict__ Opart, const float* __restrict__ Lpart,
                                               T* __restrict__ O, float* __restrict__ LSE, int BH, int Sq, int D,
                                               int splits) {
  __shared__ float sw[DEC_MAX_SPLITS];
  __shared__ float slse;
  const int row = blockIdx.x;
  const int bh = row / Sq, i = row % Sq;
  const float* lp = Lpart + (size_t)bh * splits * Sq + i;        // split s at s*Sq
  const float* op = Opart + ((size_t)bh * splits * Sq + i) * D;  // split s at s*Sq*D
  const int tid = threadIdx.x;
  for (int s = tid; s < splits; s += blockDim.x) sw[s] = lp[(size_t)s * Sq];
  __syncthreads();
  if (tid < 32) {
    float mx = -FLASH_INF;
    for (int s = tid; s < splits; s += 32) mx = fmaxf(mx, sw[s]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    if (mx != -FLASH_INF)
      for (int s = tid; s < splits; s += 32) sum += expf(sw[s] - mx);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (tid == 0) slse = sum > 0.f ? mx + logf(sum) : FLASH_INF;
  }
  __syncthreads();
  const float lse = slse;
  for (int s = tid; s < splits; s += blockDim.x) sw[s] = lse == FLASH_INF ? 0.f : expf(sw[s] - lse);
  __syncthreads();
  T* orow = O + (size_t)row * D;
  for (int d = tid; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < splits; s++) acc = fmaf(sw[s], op[(size_t)s * Sq * D + d], acc);
    orow[d] = Ty<T>::from_f(acc);
  }
  if (tid == 0) LSE[row] = lse;
}

}  // namespace flash

#define FLASH_DECODE(NAME, T, D, MAXST)                                                                        \
  extern "C" __global__ void __launch_bounds__(flash::DEC_NW * 32, 2)                                          \
      NAME(const T* q, const T* k, const T* v, T* o, float* lse, float* opart, float* lpart, int BH, int Sq,   \
           int Sk, int splits, int tiles_per_split, float scale, int causal, int flags, int stages,           \
           int group) {                                                                                        \
    flash::decode_fwd<T, D, MAXST>(q, k, v, o, lse, opart, lpart, BH, Sq, Sk, splits, tiles_per_split, scale,  \
                                   causal, flags, stages, group);                                              \
  }

#define FLASH_DECODE_COMBINE(NAME, T)                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      NAME(const float* opart, const float* lpart, T* o, float* lse, int BH, int Sq, int D, int splits) {      \
    flash::decode_combine<T>(opart, lpart, o, lse, BH, Sq, D, splits);                                         \
  }

FLASH_DECODE(flash_decode_bf16_d64, __nv_bfloat16, 64, 14)
FLASH_DECODE(flash_decode_bf16_d128, __nv_bfloat16, 128, 6)
FLASH_DECODE(flash_decode_fp16_d64, __half, 64, 14)
FLASH_DECODE(flash_decode_fp16_d128, __half, 128, 6)
FLASH_DECODE_COMBINE(flash_decode_combine_bf16, __nv_bfloat16)
FLASH_DECODE_COMBINE(flash_decode_combine_fp16, __half)
