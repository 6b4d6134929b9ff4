// harness.cu: host launch wrappers around kernels/flash_attention.cu for the
// development loop (tools/reference/flash_dev.py loads the shared library with
// ctypes). Built on the GPU machine with
//   nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a
// Variant 0 launches the shipped extern "C" entry points; other variants are
// alternative tile shapes (bf16 only) used to pick the shipped ones.
#include <cuda_runtime.h>
#include "../flash_attention.cu"

namespace {

template <typename T, int D, int NW, int BC>
__global__ void __launch_bounds__(NW * 32) fwd_var(const T* q, const T* k, const T* v, T* o, float* lse, int BH, int Sq,
                                                   int Sk, float scale, int causal, int group) {
  flash::fwd_tc<T, D, NW, BC>(q, k, v, o, lse, BH, Sq, Sk, scale, causal, group);
}
template <typename T, int D, int BR, int NW>
__global__ void __launch_bounds__(NW * 32, 1)
    bwd_var(const T* q, const T* k, const T* v, const T* dO, const float* lse, const float* dsum, float* dqacc, T* dk,
            T* dv, int BH, int Sq, int Sk, float scale, int causal, int group) {
  flash::bwd_tc<T, D, BR, NW>(q, k, v, dO, lse, dsum, dqacc, dk, dv, BH, Sq, Sk, scale, causal, group);
}

template <typename T>
using FwdFn = void (*)(const T*, const T*, const T*, T*, float*, int, int, int, float, int, int);
template <typename T>
using BwdFn = void (*)(const T*, const T*, const T*, const T*, const float*, const float*, float*, T*, T*, int, int,
                       int, float, int, int);

struct FwdCfg { int nw, bc; };
struct BwdCfg { int br, nw; };

template <typename T>
int fwd_launch(FwdFn<T> f, int D, FwdCfg c, const void* q, const void* k, const void* v, void* o, float* lse, int BH,
               int Sq, int Sk, float scale, int causal, cudaStream_t st) {
  const int BR = 16 * c.nw;
  const size_t smem = (size_t)(BR + 2 * c.bc) * D * 2;
  cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return (int)e;
  dim3 grid((Sq + BR - 1) / BR, BH);  // heads on grid y, as backend/cuda/attention/flash.go launches it
  f<<<grid, c.nw * 32, smem, st>>>((const T*)q, (const T*)k, (const T*)v, (T*)o, lse, BH, Sq, Sk, scale, causal, 1);
  return (int)cudaGetLastError();
}

template <typename T>
int fwd_tc_dispatch(int D, int variant, const void* q, const void* k, const void* v, void* o, float* lse, int BH,
                    int Sq, int Sk, float scale, int causal, cudaStream_t st);

template <>
int fwd_tc_dispatch<float>(int, int, const void*, const void*, const void*, void*, float*, int, int, int, float, int,
                           cudaStream_t) {
  return -1;
}

template <>
int fwd_tc_dispatch<__nv_bfloat16>(int D, int variant, const void* q, const void* k, const void* v, void* o,
                                   float* lse, int BH, int Sq, int Sk, float scale, int causal, cudaStream_t st) {
  typedef __nv_bfloat16 T;
  if (D == 64) {
    switch (variant) {
      case 0: return fwd_launch<T>(flash_fwd_bf16_d64, 64, {8, 128}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
      case 1: return fwd_launch<T>(fwd_var<T, 64, 8, 64>, 64, {8, 64}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
      case 2: return fwd_launch<T>(fwd_var<T, 64, 4, 128>, 64, {4, 128}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
      case 3: return fwd_launch<T>(fwd_var<T, 64, 4, 64>, 64, {4, 64}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
    }
  } else if (D == 128) {
    switch (variant) {
      case 0: return fwd_launch<T>(flash_fwd_bf16_d128, 128, {4, 64}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
      case 1: return fwd_launch<T>(fwd_var<T, 128, 8, 64>, 128, {8, 64}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
      case 2: return fwd_launch<T>(fwd_var<T, 128, 4, 128>, 128, {4, 128}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
      case 3: return fwd_launch<T>(fwd_var<T, 128, 8, 32>, 128, {8, 32}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
    }
  }
  return -1;
}

template <>
int fwd_tc_dispatch<__half>(int D, int variant, const void* q, const void* k, const void* v, void* o, float* lse,
                            int BH, int Sq, int Sk, float scale, int causal, cudaStream_t st) {
  typedef __half T;
  if (variant != 0) return -1;
  if (D == 64) return fwd_launch<T>(flash_fwd_fp16_d64, 64, {8, 128}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
  if (D == 128) return fwd_launch<T>(flash_fwd_fp16_d128, 128, {4, 64}, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
  return -1;
}

template <typename T>
int bwd_launch(BwdFn<T> f, int D, BwdCfg c, const void* q, const void* k, const void* v, const void* dO,
               const float* lse, const float* dsum, float* dqacc, void* dk, void* dv, int BH, int Sq, int Sk,
               float scale, int causal, cudaStream_t st) {
  const int BC = 16 * c.nw;
  const size_t smem = (size_t)2 * BC * D * 2 + (size_t)4 * c.br * D * 2 + (size_t)BC * c.br * 2 + 4 * c.br * 4;
  cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return (int)e;
  dim3 grid((Sk + BC - 1) / BC, BH);  // heads on grid y, as backend/cuda/attention/flash.go launches it
  f<<<grid, c.nw * 32, smem, st>>>((const T*)q, (const T*)k, (const T*)v, (const T*)dO, lse, dsum, dqacc, (T*)dk,
                                   (T*)dv, BH, Sq, Sk, scale, causal, 1);
  return (int)cudaGetLastError();
}

template <typename T>
int bwd_tc_dispatch(int D, int variant, const void* q, const void* k, const void* v, const void* dO, const float* lse,
                    const float* dsum, float* dqacc, void* dk, void* dv, int BH, int Sq, int Sk, float scale,
                    int causal, cudaStream_t st);

template <>
int bwd_tc_dispatch<float>(int, int, const void*, const void*, const void*, const void*, const float*, const float*,
                           float*, void*, void*, int, int, int, float, int, cudaStream_t) {
  return -1;
}

template <>
int bwd_tc_dispatch<__nv_bfloat16>(int D, int variant, const void* q, const void* k, const void* v, const void* dO,
                                   const float* lse, const float* dsum, float* dqacc, void* dk, void* dv, int BH,
                                   int Sq, int Sk, float scale, int causal, cudaStream_t st) {
  typedef __nv_bfloat16 T;
#define BWD_ARGS q, k, v, dO, lse, dsum, dqacc, dk, dv, BH, Sq, Sk, scale, causal, st
  if (D == 64) {
    switch (variant) {
      case 0: return bwd_launch<T>(flash_bwd_bf16_d64, 64, {128, 8}, BWD_ARGS);
      case 1: return bwd_launch<T>(bwd_var<T, 64, 64, 8>, 64, {64, 8}, BWD_ARGS);
      case 2: return bwd_launch<T>(bwd_var<T, 64, 64, 4>, 64, {64, 4}, BWD_ARGS);
    }
  } else if (D == 128) {
    switch (variant) {
      case 0: return bwd_launch<T>(flash_bwd_bf16_d128, 128, {64, 8}, BWD_ARGS);
      case 1: return bwd_launch<T>(bwd_var<T, 128, 64, 4>, 128, {64, 4}, BWD_ARGS);
      case 2: return bwd_launch<T>(bwd_var<T, 128, 128, 8>, 128, {128, 8}, BWD_ARGS);
    }
  }
  return -1;
}

template <>
int bwd_tc_dispatch<__half>(int D, int variant, const void* q, const void* k, const void* v, const void* dO,
                            const float* lse, const float* dsum, float* dqacc, void* dk, void* dv, int BH, int Sq,
                            int Sk, float scale, int causal, cudaStream_t st) {
  typedef __half T;
  if (variant != 0) return -1;
  if (D == 64) return bwd_launch<T>(flash_bwd_fp16_d64, 64, {128, 8}, BWD_ARGS);
  if (D == 128) return bwd_launch<T>(flash_bwd_fp16_d128, 128, {64, 8}, BWD_ARGS);
  return -1;
#undef BWD_ARGS
}

size_t gen_fwd_smem(int D) { return (size_t)(32 * (D | 1) * 2 + 16 * D) * 4; }
size_t gen_dq_smem(int D) { return (size_t)(32 * (D | 1) * 2 + 32 * D) * 4; }
size_t gen_dkdv_smem(int D) { return (size_t)(32 * (D | 1) * 2 + 32 * D + 64) * 4; }

template <typename T, typename F>
int set_smem(F f, size_t smem) {
  return (int)cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

template <typename T>
int run_fwd(int D, int variant, int generic, const void* q, const void* k, const void* v, void* o, float* lse, int BH,
            int Sq, int Sk, float scale, int causal, cudaStream_t st, void (*genf)(const T*, const T*, const T*, T*,
                                                                                     float*, int, int, int, int, float,
                                                                                     int, int)) {
  if (!generic) return fwd_tc_dispatch<T>(D, variant, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st);
  if (D > 256 || D < 1) return -1;
  size_t smem = gen_fwd_smem(D);
  int e = set_smem<T>(genf, smem);
  if (e) return e;
  genf<<<dim3(BH, (Sq + 15) / 16), 128, smem, st>>>((const T*)q, (const T*)k, (const T*)v, (T*)o, lse, BH, Sq, Sk, D,
                                                     scale, causal, 1);
  return (int)cudaGetLastError();
}

template <typename T>
int run_bwd(int D, int variant, int generic, const void* q, const void* k, const void* v, const void* o,
            const void* dO, const float* lse, void* dq, void* dk, void* dv, float* dsum, float* dqacc, int BH, int Sq,
            int Sk, float scale, int causal, cudaStream_t st,
            void (*pre)(const T*, const T*, float*, float*, int, int),
            void (*conv)(const float*, T*, long long, int, int, float, int),
            void (*gdq)(const T*, const T*, const T*, const T*, const float*, const float*, T*, int, int, int, int,
                        float, int, int),
            void (*gdkdv)(const T*, const T*, const T*, const T*, const float*, const float*, T*, T*, int, int, int,
                          int, float, int, int)) {
  const int rows = BH * Sq;
  if (!generic) {
    pre<<<(rows + 7) / 8, 256, 0, st>>>((const T*)o, (const T*)dO, dsum, dqacc, rows, D);
    int e = (int)cudaGetLastError();
    if (e) return e;
    e = bwd_tc_dispatch<T>(D, variant, q, k, v, dO, lse, dsum, dqacc, dk, dv, BH, Sq, Sk, scale, causal, st);
    if (e) return e;
    long long n = (long long)rows * D;
    long long blocks = (n + 255) / 256;
    if (blocks > 65535LL * 16) blocks = 65535LL * 16;
    conv<<<(unsigned)blocks, 256, 0, st>>>(dqacc, (T*)dq, n, D, Sq, scale, 0);
    return (int)cudaGetLastError();
  }
  if (D > 256 || D < 1) return -1;
  pre<<<(rows + 7) / 8, 256, 0, st>>>((const T*)o, (const T*)dO, dsum, nullptr, rows, D);
  int e = (int)cudaGetLastError();
  if (e) return e;
  size_t s1 = gen_dq_smem(D), s2 = gen_dkdv_smem(D);
  if ((e = set_smem<T>(gdq, s1))) return e;
  if ((e = set_smem<T>(gdkdv, s2))) return e;
  gdq<<<dim3(BH, (Sq + 15) / 16), 128, s1, st>>>((const T*)q, (const T*)k, (const T*)v, (const T*)dO, lse, dsum,
                                                  (T*)dq, BH, Sq, Sk, D, scale, causal, 1);
  if ((e = (int)cudaGetLastError())) return e;
  gdkdv<<<dim3(BH, (Sk + 15) / 16), 128, s2, st>>>((const T*)q, (const T*)k, (const T*)v, (const T*)dO, lse, dsum,
                                                    (T*)dk, (T*)dv, BH, Sq, Sk, D, scale, causal, 1);
  return (int)cudaGetLastError();
}

}  // namespace

// dt: 0 = float32, 1 = bfloat16, 2 = float16. Returns 0 or a cudaError_t (-1: unsupported).
extern "C" int fa_fwd(int dt, int variant, int generic, const void* q, const void* k, const void* v, void* o,
                      float* lse, int BH, int Sq, int Sk, int D, float scale, int causal, void* stream) {
  cudaStream_t st = (cudaStream_t)stream;
  switch (dt) {
    case 0:
      return run_fwd<float>(D, variant, 1, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st, flash_fwd_generic_fp32);
    case 1:
      return run_fwd<__nv_bfloat16>(D, variant, generic, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st,
                                    flash_fwd_generic_bf16);
    case 2:
      return run_fwd<__half>(D, variant, generic, q, k, v, o, lse, BH, Sq, Sk, scale, causal, st,
                             flash_fwd_generic_fp16);
  }
  return -1;
}

extern "C" int fa_bwd(int dt, int variant, int generic, const void* q, const void* k, const void* v, const void* o,
                      const void* dO, const float* lse, void* dq, void* dk, void* dv, float* dsum, float* dqacc,
                      int BH, int Sq, int Sk, int D, float scale, int causal, void* stream) {
  cudaStream_t st = (cudaStream_t)stream;
  switch (dt) {
    case 0:
      return run_bwd<float>(D, variant, 1, q, k, v, o, dO, lse, dq, dk, dv, dsum, dqacc, BH, Sq, Sk, scale, causal,
                            st, flash_bwd_pre_fp32, nullptr, flash_bwd_generic_dq_fp32,
                            flash_bwd_generic_dkdv_fp32);
    case 1:
      return run_bwd<__nv_bfloat16>(D, variant, generic, q, k, v, o, dO, lse, dq, dk, dv, dsum, dqacc, BH, Sq, Sk,
                                    scale, causal, st, flash_bwd_pre_bf16, flash_bwd_convert_bf16,
                                    flash_bwd_generic_dq_bf16, flash_bwd_generic_dkdv_bf16);
    case 2:
      return run_bwd<__half>(D, variant, generic, q, k, v, o, dO, lse, dq, dk, dv, dsum, dqacc, BH, Sq, Sk, scale,
                             causal, st, flash_bwd_pre_fp16, flash_bwd_convert_fp16, flash_bwd_generic_dq_fp16,
                             flash_bwd_generic_dkdv_fp16);
  }
  return -1;
}

extern "C" const char* fa_error_string(int e) { return e < 0 ? "unsupported configuration" : cudaGetErrorString((cudaError_t)e); }
extern "C" int fa_sync() { return (int)cudaDeviceSynchronize(); }
