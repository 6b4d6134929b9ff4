// ops.cu: the per-op kernels of the CUDA backend (backend/cuda/ops*.go launches them).
//
// Compiled by NVRTC with -std=c++17 --fmad=false. No header is included: bfloat16
// and half conversions are written out (bit arithmetic and one PTX cvt), so the
// file compiles with any NVRTC without the toolkit's include directory.
// --fmad=false keeps a*b+c as two rounded operations, as the CPU reference (Go)
// computes it, so elementwise results agree bit for bit where the math is the same.
//
// Storage types are runtime codes (DT_*), one per operand: the mixed-precision
// mode stores activations in bfloat16 next to float32 weights, so one kernel reads
// and writes any pairing. The codes are uniform across a launch, so the switches in
// ld/st do not diverge. Reductions accumulate in double, or in float for 16-bit
// data.
//
// Index math: tensors are contiguous row-major; an operand read with broadcasting,
// a permutation or a slice is described by per-axis element strides over the
// output's (coalesced, at most 6) dims, innermost last. Strides may be 0
// (broadcast) or negative (a slice with a negative step).
//
// Errors a kernel can detect (an index out of range, a bad step) are reported by
// writing a code into *flag with atomicCAS(flag, 0, code): the first one wins and
// the host reads it after the run.

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned short u16;
typedef unsigned char u8;

#define DT_F32 0
#define DT_F64 1
#define DT_BF16 2
#define DT_F16 3
#define DT_I64 4
#define DT_BOOL 5

#define MAXR 6

// ---------------------------------------------------------------- conversions

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((unsigned)h) << 16); }

// Round to nearest even, NaN kept quiet: the same as the host's BF16FromFloat32.
__device__ __forceinline__ u16 f2bf(float f)
{
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x40);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

__device__ __forceinline__ float h2f(u16 h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f)
{
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// ld reads element i of an operand of storage type dt as T.
template <typename T>
__device__ __forceinline__ T ld(const void* p, int dt, i64 i)
{
    switch (dt) {
    case DT_F32: return (T)((const float*)p)[i];
    case DT_F64: return (T)((const double*)p)[i];
    case DT_BF16: return (T)bf2f(((const u16*)p)[i]);
    case DT_F16: return (T)h2f(((const u16*)p)[i]);
    case DT_I64: return (T)((const i64*)p)[i];
    default: return (T)(((const u8*)p)[i] != 0 ? 1 : 0);
    }
}

// st writes v as element i of an operand of storage type dt (rounding to nearest
// even for floats, truncating toward zero for int64, v != 0 for bool).
template <typename T>
__device__ __forceinline__ void st(void* p, int dt, i64 i, T v)
{
    switch (dt) {
    case DT_F32: ((float*)p)[i] = (float)v; break;
    case DT_F64: ((double*)p)[i] = (double)v; break;
    case DT_BF16: ((u16*)p)[i] = f2bf((float)v); break;
    case DT_F16: ((u16*)p)[i] = f2h((float)v); break;
    case DT_I64: ((i64*)p)[i] = (i64)v; break;
    default: ((u8*)p)[i] = (v != (T)0) ? 1 : 0; break;
    }
}

// move copies one element: raw bits when the storage types match (int64 values
// above 2^53 survive), else converted through double.
__device__ __forceinline__ void move(void* dst, int ddt, i64 di, const void* src, int sdt, i64 si)
{
    if (ddt == sdt) {
        switch (ddt) {
        case DT_F64:
        case DT_I64: ((u64*)dst)[di] = ((const u64*)src)[si]; return;
        case DT_F32: ((unsigned*)dst)[di] = ((const unsigned*)src)[si]; return;
        case DT_BF16:
        case DT_F16: ((u16*)dst)[di] = ((const u16*)src)[si]; return;
        default: ((u8*)dst)[di] = ((const u8*)src)[si]; return;
        }
    }
    st<double>(dst, ddt, di, ld<double>(src, sdt, si));
}

// Infinity and NaN without a division by zero in a constant expression.
template <typename T>
__device__ __forceinline__ T tinf()
{
    return (T)__longlong_as_double(0x7ff0000000000000LL);
}

__device__ __forceinline__ double dnan() { return __longlong_as_double(0x7ff8000000000000LL); }

__device__ __forceinline__ void set_flag(int* flag, int code)
{
    if (flag != 0) {
        atomicCAS(flag, 0, code);
    }
}

// ---------------------------------------------------------------- block reductions
//
// Shuffles in a fixed butterfly, then warp 0 over the warp totals: the order is
// the same on every run, so results are deterministic. sh holds 32 entries. Every
// thread of the block must call; the leading __syncthreads lets one sh serve
// several reductions in a row.

template <typename T>
__device__ __forceinline__ T nanmax(T a, T b)
{
    return (b > a || b != b || a != a) ? (a != a ? a : b) : a;
}

template <typename T>
__device__ T block_sum(T v, T* sh)
{
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if ((threadIdx.x & 31) == 0) {
        sh[w] = v;
    }
    __syncthreads();
    if (w == 0) {
        v = (threadIdx.x < nw) ? sh[threadIdx.x] : (T)0;
        for (int o = 16; o > 0; o >>= 1) {
            v += __shfl_xor_sync(0xffffffffu, v, o);
        }
        if (threadIdx.x == 0) {
            sh[0] = v;
        }
    }
    __syncthreads();
    return sh[0];
}

template <typename T>
__device__ T block_max(T v, T* sh)
{
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) {
        v = nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if ((threadIdx.x & 31) == 0) {
        sh[w] = v;
    }
    __syncthreads();
    if (w == 0) {
        v = (threadIdx.x < nw) ? sh[threadIdx.x] : -tinf<T>();
        for (int o = 16; o > 0; o >>= 1) {
            v = nanmax(v, __shfl_xor_sync(0xffffffffu, v, o));
        }
        if (threadIdx.x == 0) {
            sh[0] = v;
        }
    }
    __syncthreads();
    return sh[0];
}

// ---------------------------------------------------------------- elementwise

// Elementwise work is not here: the backend generates a kernel per node from
// the op table's expressions (backend/cuda/codegen/fused.go).

// copy2d: dst[r*dstRow + j] = src[r*srcRow + j] for r < rows, j < cols (Concat
// writes each input into its columns of the output this way).
extern "C" __global__ void copy2d(i64 rows, i64 cols, void* dst, int ddt, i64 dstRow, const void* src, int sdt,
                                  i64 srcRow)
{
    i64 n = rows * cols;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 r = i / cols, j = i - r * cols;
        move(dst, ddt, r * dstRow + j, src, sdt, r * srcRow + j);
    }
}

// trilu keeps the upper (j - i >= k) or lower (j - i <= k) triangle of every
// rows×cols matrix and zeroes the rest.
extern "C" __global__ void trilu(i64 n, i64 rows, i64 cols, i64 k, int upper, const void* x, int xdt, void* y,
                                 int ydt)
{
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 j = i % cols, r = (i / cols) % rows;
        bool keep = upper ? (j - r >= k) : (j - r <= k);
        if (keep) {
            move(y, ydt, i, x, xdt, i);
        } else {
            st<double>(y, ydt, i, 0.0);
        }
    }
}

// ---------------------------------------------------------------- reductions
//
// One output element reduces count input elements. kd/ks: kept dims and their
// input strides (the output is contiguous over them); rd/rs: reduced dims and
// strides. op: 0 sum, 2 max, 1 product (reduce_cols only: ReduceProd runs
// there in one chunk); a sum is divided by div at the end (1, or the count
// for a mean).

__device__ __forceinline__ i64 kept_offset(i64 o, int kr, const i64 (&kd)[MAXR], const i64 (&ks)[MAXR])
{
    i64 off = 0;
#pragma unroll
    for (int k = MAXR - 1; k >= 0; k--) {
        if (k < kr) {
            i64 x = o % kd[k];
            o /= kd[k];
            off += x * ks[k];
        }
    }
    return off;
}

#define RED_PARAMS                                                                                            \
    int op, double div, i64 nout, i64 count, i64 clen, const void *x, int xdt, void *y, int ydt, int kr, i64 kd0, \
        i64 kd1, i64 kd2, i64 kd3, i64 kd4, i64 kd5, i64 ks0, i64 ks1, i64 ks2, i64 ks3, i64 ks4, i64 ks5, int rr,  \
        i64 rd0, i64 rd1, i64 rd2, i64 rd3, i64 rd4, i64 rd5, i64 rs0, i64 rs1, i64 rs2, i64 rs3, i64 rs4, i64 rs5

#define RED_ARGS                                                                                                   \
    op, div, nout, count, clen, x, xdt, y, ydt, kr, kd0, kd1, kd2, kd3, kd4, kd5, ks0, ks1, ks2, ks3, ks4, ks5, rr, \
        rd0, rd1, rd2, rd3, rd4, rd5, rs0, rs1, rs2, rs3, rs4, rs5

#define RED_ARRAYS                                       \
    const i64 kd[MAXR] = {kd0, kd1, kd2, kd3, kd4, kd5}; \
    const i64 ks[MAXR] = {ks0, ks1, ks2, ks3, ks4, ks5}; \
    const i64 rd[MAXR] = {rd0, rd1, rd2, rd3, rd4, rd5}; \
    const i64 rs[MAXR] = {rs0, rs1, rs2, rs3, rs4, rs5};

// reduce_rows: one block per output element, threads strided over the reduced
// elements (for reductions over the innermost axis: reads are coalesced).
template <typename A>
__device__ void reduce_rows_impl(RED_PARAMS)
{
    RED_ARRAYS
    __shared__ A sh[32];
    for (i64 o = blockIdx.x; o < nout; o += gridDim.x) {
        i64 base = kept_offset(o, kr, kd, ks);
        A acc = (op == 2) ? -tinf<A>() : (A)0;
        for (i64 r = threadIdx.x; r < count; r += blockDim.x) {
            i64 off = base, rem = r;
#pragma unroll
            for (int k = MAXR - 1; k >= 0; k--) {
                if (k < rr) {
                    i64 q = rem % rd[k];
                    rem /= rd[k];
                    off += q * rs[k];
                }
            }
            A v = ld<A>(x, xdt, off);
            acc = (op == 2) ? nanmax(acc, v) : acc + v;
        }
        acc = (op == 2) ? block_max(acc, sh) : block_sum(acc, sh);
        if (threadIdx.x == 0) {
            st<A>(y, ydt, o, op == 2 ? acc : acc / (A)div);
        }
    }
}

// reduce_cols: one thread per output element and chunk of clen reduced
// elements (blockIdx.y), walked in order (for reductions over outer axes:
// neighbouring threads read neighbouring addresses). Chunk c writes element
// c*nout + o of y: with several chunks y is a partials buffer that a second
// pass (reduce_rows over the chunk axis, a block per output) sums.
template <typename A>
__device__ void reduce_cols_impl(RED_PARAMS)
{
    RED_ARRAYS
    const i64 r0 = (i64)blockIdx.y * clen;
    const i64 r1 = r0 + clen < count ? r0 + clen : count;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < nout; o += (i64)gridDim.x * blockDim.x) {
        A acc = (op == 2) ? -tinf<A>() : (op == 1 ? (A)1 : (A)0);
        i64 idx[MAXR] = {0, 0, 0, 0, 0, 0};
        i64 off = kept_offset(o, kr, kd, ks);
        i64 rem = r0;
#pragma unroll
        for (int k = MAXR - 1; k >= 0; k--) {
            if (k < rr) {
                idx[k] = rem % rd[k];
                rem /= rd[k];
                off += idx[k] * rs[k];
            }
        }
        for (i64 r = r0; r < r1; r++) {
            A v = ld<A>(x, xdt, off);
            acc = (op == 2) ? nanmax(acc, v) : (op == 1 ? acc * v : acc + v);
            // Odometer over the reduced dims, innermost first.
#pragma unroll
            for (int k = MAXR - 1; k >= 0; k--) {
                if (k < rr) {
                    idx[k]++;
                    off += rs[k];
                    if (idx[k] < rd[k]) {
                        break;
                    }
                    off -= idx[k] * rs[k];
                    idx[k] = 0;
                }
            }
        }
        st<A>(y, ydt, (i64)blockIdx.y * nout + o, op == 2 ? acc : acc / (A)div);
    }
}

// reduce_rows_warp: one warp per output element, for rows of at most a few
// thousand elements read at one stride (the reduced dims merged into one: rr
// is 1). Lanes stride over the row and combine with shuffles, in a fixed
// order; no shared memory and no block barrier per row, which is what made a
// block per 768- or 64-element row slow.
template <typename A>
__device__ void reduce_rows_warp_impl(RED_PARAMS)
{
    RED_ARRAYS
    const int lane = threadIdx.x & 31;
    const i64 nwarps = ((i64)gridDim.x * blockDim.x) >> 5;
    const i64 stride = rs[0];
    for (i64 o = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; o < nout; o += nwarps) {
        const i64 base = kept_offset(o, kr, kd, ks);
        A acc = (op == 2) ? -tinf<A>() : (A)0;
        for (i64 r = lane; r < count; r += 32) {
            A v = ld<A>(x, xdt, base + r * stride);
            acc = (op == 2) ? nanmax(acc, v) : acc + v;
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            A other = __shfl_xor_sync(0xffffffffu, acc, m);
            acc = (op == 2) ? nanmax(acc, other) : acc + other;
        }
        if (lane == 0) {
            st<A>(y, ydt, o, op == 2 ? acc : acc / (A)div);
        }
    }
}

extern "C" __global__ void reduce_rows_warp_f64(RED_PARAMS) { reduce_rows_warp_impl<double>(RED_ARGS); }
extern "C" __global__ void reduce_rows_warp_f32(RED_PARAMS) { reduce_rows_warp_impl<float>(RED_ARGS); }
extern "C" __global__ void reduce_rows_f64(RED_PARAMS) { reduce_rows_impl<double>(RED_ARGS); }
extern "C" __global__ void reduce_rows_f32(RED_PARAMS) { reduce_rows_impl<float>(RED_ARGS); }
extern "C" __global__ void reduce_cols_f64(RED_PARAMS) { reduce_cols_impl<double>(RED_ARGS); }
extern "C" __global__ void reduce_cols_f32(RED_PARAMS) { reduce_cols_impl<float>(RED_ARGS); }

// ---------------------------------------------------------------- softmax family
//
// A row is m elements at stride inner, starting at (r / inner)*m*inner + r % inner:
// Softmax over any axis without a transpose. One block per row. The math is in
// double for every storage type, as the CPU reference computes it: in float, a
// log-softmax of values near 60 loses 4e-6 absolute to x − lse, more than a
// float16 result near 0 allows. The kernels are memory-bound, so double costs
// nothing measurable on the GPUs we target.

// mode 0: softmax, 1: log-softmax.
template <typename T>
__device__ void softmax_impl(int mode, i64 rows, i64 m, i64 inner, const void* x, int xdt, void* y, int ydt)
{
    __shared__ T sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 base = (r / inner) * m * inner + r % inner;
        T mx = -tinf<T>();
        for (i64 j = threadIdx.x; j < m; j += blockDim.x) {
            mx = nanmax(mx, ld<T>(x, xdt, base + j * inner));
        }
        mx = block_max(mx, sh);
        if (mx == -tinf<T>()) {
            mx = 0; // a fully masked row: NaN results, as exp(-inf - -inf) gives
        }
        T s = 0;
        for (i64 j = threadIdx.x; j < m; j += blockDim.x) {
            s += exp(ld<T>(x, xdt, base + j * inner) - mx);
        }
        s = block_sum(s, sh);
        if (mode == 1) {
            T lse = mx + log(s);
            for (i64 j = threadIdx.x; j < m; j += blockDim.x) {
                st<T>(y, ydt, base + j * inner, ld<T>(x, xdt, base + j * inner) - lse);
            }
        } else {
            T inv = (T)1 / s;
            for (i64 j = threadIdx.x; j < m; j += blockDim.x) {
                st<T>(y, ydt, base + j * inner, exp(ld<T>(x, xdt, base + j * inner) - mx) * inv);
            }
        }
    }
}

extern "C" __global__ void softmax_f64(int mode, i64 rows, i64 m, i64 inner, const void* x, int xdt, void* y,
                                       int ydt)
{
    softmax_impl<double>(mode, rows, m, inner, x, xdt, y, ydt);
}

// dX = Y·(dY − sum(dY·Y)) along the row.
template <typename T>
__device__ void softmax_grad_impl(i64 rows, i64 m, i64 inner, const void* yv, int ydt, const void* dy, int dydt,
                                  void* dx, int dxdt)
{
    __shared__ T sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 base = (r / inner) * m * inner + r % inner;
        T dot = 0;
        for (i64 j = threadIdx.x; j < m; j += blockDim.x) {
            i64 i = base + j * inner;
            dot += ld<T>(dy, dydt, i) * ld<T>(yv, ydt, i);
        }
        dot = block_sum(dot, sh);
        for (i64 j = threadIdx.x; j < m; j += blockDim.x) {
            i64 i = base + j * inner;
            st<T>(dx, dxdt, i, ld<T>(yv, ydt, i) * (ld<T>(dy, dydt, i) - dot));
        }
    }
}

extern "C" __global__ void softmax_grad_f64(i64 rows, i64 m, i64 inner, const void* y, int ydt, const void* dy,
                                            int dydt, void* dx, int dxdt)
{
    softmax_grad_impl<double>(rows, m, inner, y, ydt, dy, dydt, dx, dxdt);
}

// ---------------------------------------------------------------- cross-entropy

// sce_rows: rowloss[r] = logsumexp(scores[r]) − scores[r, label[r]] (double). A
// label outside [0, C) sets the flag and makes the row NaN.
template <typename T>
__device__ void sce_rows_impl(i64 rows, i64 C, const void* s, int sdt, const i64* labels, double* rowloss,
                              int* flag, int code)
{
    __shared__ T sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 base = r * C;
        T mx = -tinf<T>();
        for (i64 j = threadIdx.x; j < C; j += blockDim.x) {
            mx = nanmax(mx, ld<T>(s, sdt, base + j));
        }
        mx = block_max(mx, sh);
        T sum = 0;
        for (i64 j = threadIdx.x; j < C; j += blockDim.x) {
            sum += exp(ld<T>(s, sdt, base + j) - mx);
        }
        sum = block_sum(sum, sh);
        if (threadIdx.x == 0) {
            i64 l = labels[r];
            if (l < 0 || l >= C) {
                set_flag(flag, code);
                rowloss[r] = dnan();
            } else {
                rowloss[r] = (double)(mx + log(sum)) - (double)ld<T>(s, sdt, base + l);
            }
        }
    }
}

extern "C" __global__ void sce_rows_f64(i64 rows, i64 C, const void* s, int sdt, const i64* labels, double* rowloss,
                                        int* flag, int code)
{
    sce_rows_impl<double>(rows, C, s, sdt, labels, rowloss, flag, code);
}

// sum_scalar: out[0] = sum(x[0..n)) / div, in one block, in a fixed order.
extern "C" __global__ void sum_scalar(i64 n, const double* x, double div, void* out, int odt)
{
    __shared__ double sh[32];
    double acc = 0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        acc += x[i];
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) {
        st<double>(out, odt, 0, acc / div);
    }
}

// sce_grad: dS[r, j] = dLoss/div · (softmax(scores[r])[j] − [j == label[r]]).
template <typename T>
__device__ void sce_grad_impl(i64 rows, i64 C, const void* dl, int dldt, double div, const void* s, int sdt,
                              const i64* labels, void* ds, int dsdt, int* flag, int code)
{
    __shared__ T sh[32];
    T g = (T)(ld<double>(dl, dldt, 0) / div);
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 base = r * C;
        T mx = -tinf<T>();
        for (i64 j = threadIdx.x; j < C; j += blockDim.x) {
            mx = nanmax(mx, ld<T>(s, sdt, base + j));
        }
        mx = block_max(mx, sh);
        T sum = 0;
        for (i64 j = threadIdx.x; j < C; j += blockDim.x) {
            sum += exp(ld<T>(s, sdt, base + j) - mx);
        }
        sum = block_sum(sum, sh);
        T inv = (T)1 / sum;
        i64 l = labels[r];
        if (l < 0 || l >= C) {
            if (threadIdx.x == 0) {
                set_flag(flag, code);
            }
            l = -1;
        }
        for (i64 j = threadIdx.x; j < C; j += blockDim.x) {
            T p = exp(ld<T>(s, sdt, base + j) - mx) * inv;
            if (j == l) {
                p -= (T)1;
            }
            st<T>(ds, dsdt, base + j, g * p);
        }
    }
}

extern "C" __global__ void sce_grad_f64(i64 rows, i64 C, const void* dl, int dldt, double div, const void* s, int sdt,
                                        const i64* labels, void* ds, int dsdt, int* flag, int code)
{
    sce_grad_impl<double>(rows, C, dl, dldt, div, s, sdt, labels, ds, dsdt, flag, code);
}

// ---------------------------------------------------------------- gather

// gather: y[(p*nidx + i)*inner + q] = x[(p*dim + idx[i])*inner + q]; negative
// indices count from the end; an index out of range sets the flag (and y gets 0).
extern "C" __global__ void gather(i64 outer, i64 dim, i64 inner, i64 nidx, const void* x, int xdt, const i64* idx,
                                  void* y, int ydt, int* flag, int code)
{
    i64 n = outer * nidx * inner;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 q = o % inner, t = o / inner;
        i64 i = t % nidx, p = t / nidx;
        i64 a = idx[i];
        if (a < 0) {
            a += dim;
        }
        if (a < 0 || a >= dim) {
            set_flag(flag, code);
            st<double>(y, ydt, o, 0.0);
            continue;
        }
        move(y, ydt, o, x, xdt, (p * dim + a) * inner + q);
    }
}

// gather_grad: dx[p, a, q] = Σ_{i: idx[i] == a} dy[p, i, q], each output row owned
// by one block (blockIdx.x = a, blockIdx.y = p) that scans the indices in order:
// no atomics, the sum order is the index order (as on the CPU), so the result is
// deterministic. blockIdx.z tiles q in chunks of blockDim.x*GG_PER.
//
// A row that many indices hit (a byte-level vocabulary's space, a frequent
// token) sums hundreds of dy rows one after another; loading one match at a
// time left that block waiting on memory latency per match (the step of a
// gpt2-size model trained on bytes ran 7% slower than on uniform tokens). So
// each chunk's matches are first listed in index order in shared memory, and
// GG_BATCH of them are loaded together before they are added, still one
// after another and in index order: the same sums, bit for bit.
#define GG_PER 8
constexpr int GG_BATCH = 4; // kernel-internal: no Go mirror
template <typename T>
__device__ void gather_grad_impl(i64 outer, i64 dim, i64 inner, i64 nidx, const void* dy, int dydt, const i64* idx,
                                 void* dx, int dxdt, int* flag, int code)
{
    __shared__ i64 sidx[256];
    __shared__ unsigned smask[8];
    __shared__ short slist[256]; // the chunk's matches, in index order
    const i64 a = blockIdx.x;
    const i64 q0 = (i64)blockIdx.z * blockDim.x * GG_PER;
    for (i64 p = blockIdx.y; p < outer; p += gridDim.y) {
        T acc[GG_PER];
#pragma unroll
        for (int k = 0; k < GG_PER; k++) {
            acc[k] = 0;
        }
        for (i64 c0 = 0; c0 < nidx; c0 += 256) {
            __syncthreads();
            for (int t = threadIdx.x; t < 256; t += blockDim.x) {
                i64 v = -1;
                if (c0 + t < nidx) {
                    v = idx[c0 + t];
                    if (v < 0) {
                        v += dim;
                    }
                    if (v < 0 || v >= dim) {
                        set_flag(flag, code);
                        v = -1;
                    }
                }
                sidx[t] = v;
            }
            if (threadIdx.x < 8) {
                smask[threadIdx.x] = 0;
            }
            __syncthreads();
            // Which of the 256 entries are row a, as a bit mask.
            for (int t = threadIdx.x; t < 256; t += blockDim.x) {
                if (sidx[t] == a) {
                    atomicOr(&smask[t >> 5], 1u << (t & 31));
                }
            }
            __syncthreads();
            // Each match's place in index order is the number of matches
            // before it: the popcounts of the earlier words and of the
            // lower bits of its own.
            int before[8];
            int count = 0;
#pragma unroll
            for (int w = 0; w < 8; w++) {
                before[w] = count;
                count += __popc(smask[w]);
            }
            for (int t = threadIdx.x; t < 256; t += blockDim.x) {
                const unsigned m = smask[t >> 5];
                if (m & (1u << (t & 31))) {
                    slist[before[t >> 5] + __popc(m & ((1u << (t & 31)) - 1u))] = (short)t;
                }
            }
            __syncthreads();
            for (int j = 0; j < count; j += GG_BATCH) {
                T v[GG_BATCH][GG_PER];
#pragma unroll
                for (int m = 0; m < GG_BATCH; m++) {
                    const i64 row = (p * nidx + c0 + (j + m < count ? slist[j + m] : 0)) * inner;
#pragma unroll
                    for (int k = 0; k < GG_PER; k++) {
                        i64 q = q0 + (i64)k * blockDim.x + threadIdx.x;
                        v[m][k] = (j + m < count && q < inner) ? ld<T>(dy, dydt, row + q) : (T)0;
                    }
                }
#pragma unroll
                for (int m = 0; m < GG_BATCH; m++) {
                    if (j + m < count) {
#pragma unroll
                        for (int k = 0; k < GG_PER; k++) {
                            acc[k] += v[m][k];
                        }
                    }
                }
            }
            __syncthreads(); // smask, slist and sidx are rewritten for the next chunk
        }
#pragma unroll
        for (int k = 0; k < GG_PER; k++) {
            i64 q = q0 + (i64)k * blockDim.x + threadIdx.x;
            if (q < inner) {
                st<T>(dx, dxdt, (p * dim + a) * inner + q, acc[k]);
            }
        }
    }
}

extern "C" __global__ void gather_grad_f32(i64 outer, i64 dim, i64 inner, i64 nidx, const void* dy, int dydt,
                                           const i64* idx, void* dx, int dxdt, int* flag, int code)
{
    gather_grad_impl<float>(outer, dim, inner, nidx, dy, dydt, idx, dx, dxdt, flag, code);
}
extern "C" __global__ void gather_grad_f64(i64 outer, i64 dim, i64 inner, i64 nidx, const void* dy, int dydt,
                                           const i64* idx, void* dx, int dxdt, int* flag, int code)
{
    gather_grad_impl<double>(outer, dim, inner, nidx, dy, dydt, idx, dx, dxdt, flag, code);
}

// ---------------------------------------------------------------- AdamW
//
// The CPU reference's formula and operation order, in T (float for float32
// params, double for float64); the scalar coefficients in double, rounded once:
//   m' = β1·m + (1−β1)·g;  v' = β2·v + (1−β2)·g²;  m̂ = m'/(1−β1^t);  v̂ = v'/(1−β2^t)
//   p' = p − lr·(m̂/(√v̂ + eps) + wd·p)
// lr and step are device scalars (so a schedule needs no recompile); step < 1
// sets the flag and, like an error flagged earlier in the run, writes nothing.
// adamw_skip reports whether an AdamW kernel must write nothing: an earlier
// kernel of the run reported an error (the executor may update the weights in
// place, and a failed run must leave them as they were), or the step is
// below 1, which it reports. Every block decides alone, so a grouped launch
// never writes part of an update.
__device__ __forceinline__ bool adamw_skip(double t, int* flag, int code)
{
    if (*(volatile const int*)flag != 0) {
        return true;
    }
    if (!(t >= 1.0)) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            set_flag(flag, code);
        }
        return true;
    }
    return false;
}

template <typename T>
__device__ void adamw_impl(i64 n, const void* p, int pdt, const void* g, int gdt, const void* m, int mdt, const void* v,
                           int vdt, const void* lrp, int lrdt, const void* stepp, int stepdt, void* po, int podt,
                           void* mo, int modt, void* vo, int vodt, double b1d, double b2d, double epsd, double wdd,
                           int* flag, int code)
{
    double lrd = ld<double>(lrp, lrdt, 0), t = ld<double>(stepp, stepdt, 0);
    if (adamw_skip(t, flag, code)) {
        return;
    }
    const T b1 = (T)b1d, b2 = (T)b2d, eps = (T)epsd, wd = (T)wdd, lr = (T)lrd;
    const T omb1 = (T)(1.0 - b1d), omb2 = (T)(1.0 - b2d);
    const T bc1 = (T)(1.0 - pow(b1d, t)), bc2 = (T)(1.0 - pow(b2d, t));
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        T gi = ld<T>(g, gdt, i), pi = ld<T>(p, pdt, i);
        T mi = b1 * ld<T>(m, mdt, i) + omb1 * gi;
        T vi = b2 * ld<T>(v, vdt, i) + omb2 * gi * gi;
        T mh = mi / bc1;
        T vh = vi / bc2;
        // sqrt of T: IEEE sqrt is correctly rounded in float as in double,
        // so sqrtf gives what rounding the double root gave, at float speed.
        st<T>(po, podt, i, pi - lr * (mh / (sqrt(vh) + eps) + wd * pi));
        st<T>(mo, modt, i, mi);
        st<T>(vo, vodt, i, vi);
    }
}

#define ADAMW_PARAMS                                                                                            \
    i64 n, const void *p, int pdt, const void *g, int gdt, const void *m, int mdt, const void *v, int vdt,       \
        const void *lrp, int lrdt, const void *stepp, int stepdt, void *po, int podt, void *mo, int modt, void *vo, \
        int vodt, double b1, double b2, double eps, double wd, int *flag, int code
#define ADAMW_ARGS \
    n, p, pdt, g, gdt, m, mdt, v, vdt, lrp, lrdt, stepp, stepdt, po, podt, mo, modt, vo, vodt, b1, b2, eps, wd, flag, code

extern "C" __global__ void adamw_f32(ADAMW_PARAMS) { adamw_impl<float>(ADAMW_ARGS); }

// adamw_vec4_f32: adamw_f32's arithmetic, four elements per thread with
// 16-byte loads and stores, for float32 parameters and state (the gradient
// float32, bfloat16 or float16) whose buffers are 16-byte aligned and whose
// length is a multiple of 4. n is the element count.
extern "C" __global__ void adamw_vec4_f32(i64 n, const float4* p, const void* g, int gdt, const float4* m,
                                          const float4* v, const void* lrp, int lrdt, const void* stepp, int stepdt,
                                          float4* po, float4* mo, float4* vo, double b1d, double b2d, double epsd,
                                          double wdd, int* flag, int code)
{
    double lrd = ld<double>(lrp, lrdt, 0), t = ld<double>(stepp, stepdt, 0);
    if (adamw_skip(t, flag, code)) {
        return;
    }
    const float b1 = (float)b1d, b2 = (float)b2d, eps = (float)epsd, wd = (float)wdd, lr = (float)lrd;
    const float omb1 = (float)(1.0 - b1d), omb2 = (float)(1.0 - b2d);
    const float bc1 = (float)(1.0 - pow(b1d, t)), bc2 = (float)(1.0 - pow(b2d, t));
    const i64 n4 = n / 4;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n4; i += (i64)gridDim.x * blockDim.x) {
        float gs[4];
        if (gdt == DT_F32) {
            float4 q = ((const float4*)g)[i];
            gs[0] = q.x, gs[1] = q.y, gs[2] = q.z, gs[3] = q.w;
        } else {
            uint2 q = ((const uint2*)g)[i];
            u16 hs[4] = {(u16)(q.x & 0xffffu), (u16)(q.x >> 16), (u16)(q.y & 0xffffu), (u16)(q.y >> 16)};
            for (int k = 0; k < 4; k++) {
                gs[k] = gdt == DT_BF16 ? bf2f(hs[k]) : h2f(hs[k]);
            }
        }
        float4 pv = p[i], mv = m[i], vv = v[i];
        float ps[4] = {pv.x, pv.y, pv.z, pv.w}, ms[4] = {mv.x, mv.y, mv.z, mv.w}, vs[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float mi = b1 * ms[k] + omb1 * gs[k];
            float vi = b2 * vs[k] + omb2 * gs[k] * gs[k];
            float mh = mi / bc1;
            float vh = vi / bc2;
            ps[k] = ps[k] - lr * (mh / (sqrtf(vh) + eps) + wd * ps[k]);
            ms[k] = mi;
            vs[k] = vi;
        }
        po[i] = make_float4(ps[0], ps[1], ps[2], ps[3]);
        mo[i] = make_float4(ms[0], ms[1], ms[2], ms[3]);
        vo[i] = make_float4(vs[0], vs[1], vs[2], vs[3]);
    }
}
extern "C" __global__ void adamw_f64(ADAMW_PARAMS) { adamw_impl<double>(ADAMW_ARGS); }

// adamw_multi_f32: the updates of many AdamW nodes in one launch (the
// executor groups the nodes of a training step that share beta1, beta2, eps,
// gradient type and lr/step inputs; see backend/cuda/adamw_multi.go). Each
// node is one segment of a device table; segment s owns the blocks from its
// block0 to the next segment's. A block of ADAMW_MULTI_BLOCK threads covers
// ADAMW_MULTI_BLOCK * 4 * ADAMW_MULTI_GROUPS consecutive elements of its
// segment: thread t updates the groups of four elements that start at
// 4 * (k * ADAMW_MULTI_BLOCK + t), k < ADAMW_MULTI_GROUPS, so that each of a
// warp's accesses is 512 contiguous bytes.
//
// Why several groups per thread: the update is a stream (26 bytes per element
// with a 16-bit gradient), and what limits it is how many bytes each SM has
// in flight. A block first finds its segment (a binary search of the table),
// reads lr, step and the error flag, and computes the bias corrections (two
// double pows); with one group per thread these were paid for every 1024
// elements, before any load was issued, and a branch on the gradient's type
// stood between a thread's gradient load and its other loads (so they need
// not have been in flight together). Now a block whose groups are all whole
// and 16-byte aligned (full: every block of an aligned segment but its last)
// issues every load of its groups, straight-line, before anything uses them;
// the scalars, the skip decision and the pows come after, hidden behind those
// loads, and are paid once per 4 * ADAMW_MULTI_GROUPS times as many elements.
// The other blocks (a segment's last, a segment not aligned for 16-byte
// access) go group by group, with 16-byte access where a whole group is
// aligned and element by element otherwise. Loads and stores use the default
// cache policy: every byte is touched once, so an evict-first hint would
// change which dead lines L2 drops, not how many bytes cross the bus.
//
// The arithmetic and its order are adamw_impl<float>'s and adamw_vec4_f32's
// (adamw_multi_elem), so the results are bit-identical. The layout of
// adamw_seg is written out in adamw_multi.go (adamwSegFields), and
// ADAMW_MULTI_BLOCK and ADAMW_MULTI_GROUPS there (adamwMultiBlock,
// adamwMultiGroups), which lay the table out and launch the grid.
#define ADAMW_MULTI_BLOCK 256
#define ADAMW_MULTI_GROUPS 4

struct adamw_seg {
    const float* p;
    const void* g;
    const float* m;
    const float* v;
    float* po;
    float* mo;
    float* vo;
    i64 n;      // elements
    i64 block0; // the segment's first block
    double wd;  // the node's weight_decay
    i64 vec;    // 1: p, m, v, po, mo, vo 16-byte aligned, g 16 (float32) or 8 (16-bit)
};

// adamw_multi_coefs are a block's float coefficients, each converted from
// double as adamw_impl<float> converts it.
struct adamw_multi_coefs {
    float b1, b2, omb1, omb2, eps, lr, wd, bc1, bc2;
};

// adamw_multi_elem updates one element: adamw_impl<float>'s expressions,
// in its order.
__device__ __forceinline__ void adamw_multi_elem(const adamw_multi_coefs& c, float g, float& p, float& m, float& v)
{
    const float mi = c.b1 * m + c.omb1 * g;
    const float vi = c.b2 * v + c.omb2 * g * g;
    const float mh = mi / c.bc1;
    const float vh = vi / c.bc2;
    p = p - c.lr * (mh / (sqrtf(vh) + c.eps) + c.wd * p);
    m = mi;
    v = vi;
}

// adamw_multi_g16 is element k (0..3) of four 16-bit gradients read as one
// 8-byte word (little-endian: element 0 in the low half of q.x).
__device__ __forceinline__ float adamw_multi_g16(uint2 q, int k, int gdt)
{
    const unsigned w = k < 2 ? q.x : q.y;
    const u16 h = (u16)((k & 1) != 0 ? (w >> 16) : (w & 0xffffu));
    return gdt == DT_BF16 ? bf2f(h) : h2f(h);
}

// adamw_multi_setup fills c for a segment of weight decay wd and reports
// whether the block updates (adamw_skip). Every thread of the block calls it:
// the answer is the same for all of them (the flag changes during the launch
// only when the step is below 1, which every thread sees), and thread 0
// computes the bias corrections once for the block (two double pows per
// thread would cost more than the memory time they hide behind), shared
// through bcs after a barrier that every thread reaches.
__device__ __forceinline__ bool adamw_multi_setup(adamw_multi_coefs& c, double wdd, const void* lrp, int lrdt,
                                                  const void* stepp, int stepdt, double b1d, double b2d, double epsd,
                                                  int* flag, int code, float* bcs)
{
    const double lrd = ld<double>(lrp, lrdt, 0), t = ld<double>(stepp, stepdt, 0);
    if (adamw_skip(t, flag, code)) {
        return false;
    }
    if (threadIdx.x == 0) {
        bcs[0] = (float)(1.0 - pow(b1d, t));
        bcs[1] = (float)(1.0 - pow(b2d, t));
    }
    __syncthreads();
    c.b1 = (float)b1d;
    c.b2 = (float)b2d;
    c.omb1 = (float)(1.0 - b1d);
    c.omb2 = (float)(1.0 - b2d);
    c.eps = (float)epsd;
    c.lr = (float)lrd;
    c.wd = (float)wdd;
    c.bc1 = bcs[0];
    c.bc2 = bcs[1];
    return true;
}

// adamw_multi_full updates a full block (every group whole, the segment
// aligned for 16-byte access) whose first element is e0, its gradient of
// storage type GDT: all loads first, in one straight-line run, so that a
// thread has 4 * ADAMW_MULTI_GROUPS loads in flight while the block reads its
// scalars and computes its bias corrections; then the arithmetic; then the
// stores. A thread reads each of its elements before it writes it, so an
// output may be its own input (in place).
template <int GDT>
__device__ __forceinline__ void adamw_multi_full(const adamw_seg& s, i64 e0, const void* lrp, int lrdt,
                                                 const void* stepp, int stepdt, double b1d, double b2d, double epsd,
                                                 int* flag, int code, float* bcs)
{
    const i64 q0 = e0 / 4 + threadIdx.x; // the thread's first group, in 16-byte units
    float4 pv[ADAMW_MULTI_GROUPS], mv[ADAMW_MULTI_GROUPS], vv[ADAMW_MULTI_GROUPS], gf[ADAMW_MULTI_GROUPS];
    uint2 gh[ADAMW_MULTI_GROUPS];
#pragma unroll
    for (int k = 0; k < ADAMW_MULTI_GROUPS; k++) {
        const i64 q = q0 + k * ADAMW_MULTI_BLOCK;
        if (GDT == DT_F32) {
            gf[k] = ((const float4*)s.g)[q];
        } else {
            gh[k] = ((const uint2*)s.g)[q];
        }
        pv[k] = ((const float4*)s.p)[q];
        mv[k] = ((const float4*)s.m)[q];
        vv[k] = ((const float4*)s.v)[q];
    }
    adamw_multi_coefs c;
    if (!adamw_multi_setup(c, s.wd, lrp, lrdt, stepp, stepdt, b1d, b2d, epsd, flag, code, bcs)) {
        return;
    }
#pragma unroll
    for (int k = 0; k < ADAMW_MULTI_GROUPS; k++) {
        float gs[4];
        if (GDT == DT_F32) {
            gs[0] = gf[k].x, gs[1] = gf[k].y, gs[2] = gf[k].z, gs[3] = gf[k].w;
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                gs[j] = adamw_multi_g16(gh[k], j, GDT);
            }
        }
        adamw_multi_elem(c, gs[0], pv[k].x, mv[k].x, vv[k].x);
        adamw_multi_elem(c, gs[1], pv[k].y, mv[k].y, vv[k].y);
        adamw_multi_elem(c, gs[2], pv[k].z, mv[k].z, vv[k].z);
        adamw_multi_elem(c, gs[3], pv[k].w, mv[k].w, vv[k].w);
    }
#pragma unroll
    for (int k = 0; k < ADAMW_MULTI_GROUPS; k++) {
        const i64 q = q0 + k * ADAMW_MULTI_BLOCK;
        ((float4*)s.po)[q] = pv[k];
        ((float4*)s.mo)[q] = mv[k];
        ((float4*)s.vo)[q] = vv[k];
    }
}

// adamw_multi_part updates a block that is not full (a segment's last block,
// or any block of a segment not aligned for 16-byte access), group by group:
// a group of four whole elements of an aligned segment with 16-byte access,
// the others element by element.
__device__ __forceinline__ void adamw_multi_part(const adamw_seg& s, i64 e0, int gdt, const adamw_multi_coefs& c)
{
    for (int k = 0; k < ADAMW_MULTI_GROUPS; k++) {
        const i64 i0 = e0 + ((i64)k * ADAMW_MULTI_BLOCK + threadIdx.x) * 4;
        if (i0 >= s.n) {
            break; // the thread's later groups lie further on
        }
        const int cnt = s.n - i0 < 4 ? (int)(s.n - i0) : 4;
        float gs[4], ps[4], ms[4], vs[4];
        const bool vec = s.vec != 0 && cnt == 4;
        if (vec) {
            const i64 q4 = i0 / 4;
            if (gdt == DT_F32) {
                const float4 q = ((const float4*)s.g)[q4];
                gs[0] = q.x, gs[1] = q.y, gs[2] = q.z, gs[3] = q.w;
            } else {
                const uint2 q = ((const uint2*)s.g)[q4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    gs[j] = adamw_multi_g16(q, j, gdt);
                }
            }
            const float4 pv = ((const float4*)s.p)[q4], mv = ((const float4*)s.m)[q4], vv = ((const float4*)s.v)[q4];
            ps[0] = pv.x, ps[1] = pv.y, ps[2] = pv.z, ps[3] = pv.w;
            ms[0] = mv.x, ms[1] = mv.y, ms[2] = mv.z, ms[3] = mv.w;
            vs[0] = vv.x, vs[1] = vv.y, vs[2] = vv.z, vs[3] = vv.w;
        } else {
            // Unrolled with constant indices, so the arrays stay in registers.
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (j < cnt) {
                    gs[j] = ld<float>(s.g, gdt, i0 + j);
                    ps[j] = s.p[i0 + j];
                    ms[j] = s.m[i0 + j];
                    vs[j] = s.v[i0 + j];
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (j < cnt) {
                adamw_multi_elem(c, gs[j], ps[j], ms[j], vs[j]);
            }
        }
        if (vec) {
            const i64 q4 = i0 / 4;
            ((float4*)s.po)[q4] = make_float4(ps[0], ps[1], ps[2], ps[3]);
            ((float4*)s.mo)[q4] = make_float4(ms[0], ms[1], ms[2], ms[3]);
            ((float4*)s.vo)[q4] = make_float4(vs[0], vs[1], vs[2], vs[3]);
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (j < cnt) {
                    s.po[i0 + j] = ps[j];
                    s.mo[i0 + j] = ms[j];
                    s.vo[i0 + j] = vs[j];
                }
            }
        }
    }
}

// At most 128 registers a thread, so that two blocks fit an SM: a full
// block's thread holds 4 * ADAMW_MULTI_GROUPS 16-byte loads (56 or 64
// registers) while its block computes the bias corrections.
extern "C" __global__ void __launch_bounds__(ADAMW_MULTI_BLOCK, 2)
    adamw_multi_f32(const adamw_seg* segs, int nseg, int gdt, const void* lrp, int lrdt, const void* stepp,
                    int stepdt, double b1d, double b2d, double epsd, int* flag, int code)
{
    __shared__ float bcs[2];
    // The segment of this block: the last whose block0 is <= blockIdx.x
    // (block0 rises with s and segs[0].block0 is 0).
    const i64 b = blockIdx.x;
    int lo = 0, hi = nseg - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (segs[mid].block0 <= b) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    const adamw_seg s = segs[lo];
    const i64 per = (i64)ADAMW_MULTI_BLOCK * 4 * ADAMW_MULTI_GROUPS;
    const i64 e0 = (b - s.block0) * per; // the block's first element in its segment
    if (s.vec != 0 && e0 + per <= s.n) {
        switch (gdt) {
        case DT_F32:
            adamw_multi_full<DT_F32>(s, e0, lrp, lrdt, stepp, stepdt, b1d, b2d, epsd, flag, code, bcs);
            break;
        case DT_BF16:
            adamw_multi_full<DT_BF16>(s, e0, lrp, lrdt, stepp, stepdt, b1d, b2d, epsd, flag, code, bcs);
            break;
        default:
            adamw_multi_full<DT_F16>(s, e0, lrp, lrdt, stepp, stepdt, b1d, b2d, epsd, flag, code, bcs);
            break;
        }
        return;
    }
    adamw_multi_coefs c;
    if (!adamw_multi_setup(c, s.wd, lrp, lrdt, stepp, stepdt, b1d, b2d, epsd, flag, code, bcs)) {
        return;
    }
    adamw_multi_part(s, e0, gdt, c);
}

// ---------------------------------------------------------------- composed attention
//
// The unfused lowering of FlashAttention(Grad) when the fused kernels do not
// apply: S = scale·Q·Kᵀ by cuBLAS into a [BH, Sq, Sk] scratch, then these row
// kernels, then cuBLAS again. Causal masking is top-left aligned: query i sees
// keys j <= i. A row that sees no key gets P = 0 and L = +inf (so that the
// backward pass gives it zero probabilities), as the fused kernels do.

// attn_softmax: P = softmax over the visible keys of each S row (in place; masked
// entries become 0) and L = the row's logsumexp.
template <typename T>
__device__ void attn_softmax_impl(i64 rows, i64 sq, i64 sk, int causal, void* s, int sdt, void* l, int ldt)
{
    __shared__ T sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 i = r % sq, base = r * sk;
        i64 vis = causal ? (i + 1 < sk ? i + 1 : sk) : sk;
        T mx = -tinf<T>();
        for (i64 j = threadIdx.x; j < vis; j += blockDim.x) {
            mx = nanmax(mx, ld<T>(s, sdt, base + j));
        }
        mx = block_max(mx, sh);
        T sum = 0;
        for (i64 j = threadIdx.x; j < vis; j += blockDim.x) {
            sum += exp(ld<T>(s, sdt, base + j) - mx);
        }
        sum = block_sum(sum, sh);
        T inv = (T)1 / sum;
        for (i64 j = threadIdx.x; j < sk; j += blockDim.x) {
            T pv = (j < vis) ? exp(ld<T>(s, sdt, base + j) - mx) * inv : (T)0;
            st<T>(s, sdt, base + j, pv);
        }
        if (threadIdx.x == 0) {
            st<T>(l, ldt, r, vis > 0 ? mx + log(sum) : tinf<T>());
        }
    }
}

extern "C" __global__ void attn_softmax_f64(i64 rows, i64 sq, i64 sk, int causal, void* s, int sdt, void* l, int ldt)
{
    attn_softmax_impl<double>(rows, sq, sk, causal, s, sdt, l, ldt);
}

// attn_probs: P = exp(S − L) on the visible keys, 0 elsewhere (in place).
template <typename T>
__device__ void attn_probs_impl(i64 rows, i64 sq, i64 sk, int causal, void* s, int sdt, const void* l, int ldt)
{
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 i = r % sq, base = r * sk;
        i64 vis = causal ? (i + 1 < sk ? i + 1 : sk) : sk;
        T lse = ld<T>(l, ldt, r);
        for (i64 j = threadIdx.x; j < sk; j += blockDim.x) {
            T pv = (j < vis) ? exp(ld<T>(s, sdt, base + j) - lse) : (T)0;
            st<T>(s, sdt, base + j, pv);
        }
    }
}

extern "C" __global__ void attn_probs_f64(i64 rows, i64 sq, i64 sk, int causal, void* s, int sdt, const void* l,
                                          int ldt)
{
    attn_probs_impl<double>(rows, sq, sk, causal, s, sdt, l, ldt);
}

// attn_dscores: dS = P ∘ (dP − rowsum(dY∘Y)), in place over dP. Y is the given
// forward output, as the op defines (and the fused kernels compute) it.
template <typename T>
__device__ void attn_dscores_impl(i64 rows, i64 sk, i64 d, const void* p, int pdt, void* dp, int dpdt, const void* y,
                                  int ydt, const void* dy, int dydt)
{
    __shared__ T sh[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        T dsum = 0;
        for (i64 k = threadIdx.x; k < d; k += blockDim.x) {
            dsum += ld<T>(dy, dydt, r * d + k) * ld<T>(y, ydt, r * d + k);
        }
        dsum = block_sum(dsum, sh);
        for (i64 j = threadIdx.x; j < sk; j += blockDim.x) {
            i64 i = r * sk + j;
            st<T>(dp, dpdt, i, ld<T>(p, pdt, i) * (ld<T>(dp, dpdt, i) - dsum));
        }
    }
}

extern "C" __global__ void attn_dscores_f64(i64 rows, i64 sk, i64 d, const void* p, int pdt, void* dp, int dpdt,
                                            const void* y, int ydt, const void* dy, int dydt)
{
    attn_dscores_impl<double>(rows, sk, d, p, pdt, dp, dpdt, y, ydt, dy, dydt);
}

// ---------------------------------------------------------------- float64 GEMM
//
// cuBLAS is bound for float32/bfloat16/float16 only; float64 graphs (the exact
// reference configuration) use this tiled kernel. Row-major, per batch entry z:
//   C[z] = alpha·op(A[z])·op(B[z]) + beta·C[z],  op(A) M×K, op(B) K×N,
// A stored M×K (K×M when ta), B stored K×N (N×K when tb); strides in elements.
// grid (ceil(N/16), ceil(M/16), batch), block (16, 16).
#define G64 16
extern "C" __global__ void gemm_f64(int ta, int tb, i64 M, i64 N, i64 K, double alpha, const double* A, i64 strideA,
                                    const double* B, i64 strideB, double beta, double* C, i64 strideC)
{
    __shared__ double as[G64][G64 + 1];
    __shared__ double bs[G64][G64 + 1];
    i64 z = blockIdx.z;
    A += z * strideA;
    B += z * strideB;
    C += z * strideC;
    i64 row = (i64)blockIdx.y * G64 + threadIdx.y, col = (i64)blockIdx.x * G64 + threadIdx.x;
    double acc = 0;
    for (i64 k0 = 0; k0 < K; k0 += G64) {
        // as[ty][tx] = op(A)[row][k0+tx]; bs[ty][tx] = op(B)[k0+ty][col]
        i64 ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        double av = 0, bv = 0;
        if (row < M && ka < K) {
            av = ta ? A[ka * M + row] : A[row * K + ka];
        }
        if (col < N && kb < K) {
            bv = tb ? B[col * K + kb] : B[kb * N + col];
        }
        as[threadIdx.y][threadIdx.x] = av;
        bs[threadIdx.y][threadIdx.x] = bv;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < G64; k++) {
            acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        double c = alpha * acc;
        if (beta != 0) {
            c += beta * C[row * N + col];
        }
        C[row * N + col] = c;
    }
}

// ---------------------------------------------------------------- index ops
//
// The ops the ONNX backend test suite added (graph/ops_conform.go,
// ops_index.go, ops_tensor.go), each the op table's Eval as one thread per
// output element (or line). Shapes of up to MAXR dims come as six scalars
// each (D6/A6); an index out of range sets the flag and writes 0.

#define D6(p) i64 p##0, i64 p##1, i64 p##2, i64 p##3, i64 p##4, i64 p##5
#define A6(p) const i64 p[MAXR] = {p##0, p##1, p##2, p##3, p##4, p##5}

// norm_index makes a negative index count from the end; -1 when out of range.
__device__ __forceinline__ i64 norm_index(i64 a, i64 n)
{
    if (a < 0) {
        a += n;
    }
    return (a < 0 || a >= n) ? -1 : a;
}

// gather_elements: y[o] = x[o with its axis coordinate replaced by idx[o]];
// idx and y have dims id (rank r), x has strides xs over the same axes.
extern "C" __global__ void gather_elements(i64 n, int r, int axis, i64 dim, D6(id), D6(xs), const void* x, int xdt,
                                           const i64* idx, void* y, int ydt, int* flag, int code)
{
    A6(id);
    A6(xs);
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 rem = o, off = 0;
        bool bad = false;
        for (int k = r - 1; k >= 0; k--) {
            i64 c = rem % id[k];
            rem /= id[k];
            if (k == axis) {
                c = norm_index(idx[o], dim);
                bad = c < 0;
            }
            off += c * xs[k];
        }
        if (bad) {
            set_flag(flag, code);
            st<double>(y, ydt, o, 0.0);
            continue;
        }
        move(y, ydt, o, x, xdt, off);
    }
}

// combine is ScatterElements' and ScatterND's reduction of the value v at a
// position with an update u (0 none, 1 add, 2 mul, 3 max, 4 min).
template <typename T>
__device__ __forceinline__ T combine(int red, T v, T u)
{
    switch (red) {
    case 1: return v + u;
    case 2: return v * u;
    case 3: return v > u ? v : u;
    case 4: return v < u ? v : u;
    default: return u;
    }
}

// scatter_elements: each output element (data's dims dd, rank r) scans the
// indices along axis at its other coordinates in order, so repeated indices
// combine in the order the reference applies them; idx and upd have dims id.
extern "C" __global__ void scatter_elements(i64 n, int r, int axis, int red, D6(dd), D6(id), const void* x, int xdt,
                                            const i64* idx, const void* upd, int udt, void* y, int ydt, int* flag,
                                            int code)
{
    A6(dd);
    A6(id);
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 c[MAXR] = {0, 0, 0, 0, 0, 0};
        i64 rem = o;
        bool hit = true; // the indices reach this position's other coordinates
        for (int k = r - 1; k >= 0; k--) {
            c[k] = rem % dd[k];
            rem /= dd[k];
            if (k != axis && c[k] >= id[k]) {
                hit = false;
            }
        }
        bool ints = ydt == DT_I64 && xdt == DT_I64 && udt == DT_I64;
        i64 vi = ints ? ((const i64*)x)[o] : 0;
        double vf = ints ? 0.0 : ld<double>(x, xdt, o);
        bool bad = false;
        for (i64 i = 0; hit && i < id[axis]; i++) {
            i64 q = 0;
            for (int k = 0; k < r; k++) {
                q = q * id[k] + (k == axis ? i : c[k]);
            }
            i64 a = norm_index(idx[q], dd[axis]);
            if (a < 0) {
                bad = true;
                continue;
            }
            if (a == c[axis]) {
                if (ints) {
                    vi = combine<i64>(red, vi, ((const i64*)upd)[q]);
                } else {
                    vf = combine<double>(red, vf, ld<double>(upd, udt, q));
                }
            }
        }
        if (bad) {
            set_flag(flag, code);
        }
        if (ints) {
            ((i64*)y)[o] = vi;
        } else {
            st<double>(y, ydt, o, vf);
        }
    }
}

// argmax over the middle axis of [outer, dim, inner]: a NaN is the largest
// (the first, or the last with last set), as the reference scans.
extern "C" __global__ void argmax(i64 outer, i64 dim, i64 inner, int last, const void* x, int xdt, i64* y)
{
    i64 n = outer * inner;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 p = o / inner, q = o % inner;
        double best = -tinf<double>();
        i64 bi = -1;
        for (i64 j = 0; j < dim; j++) {
            double v = ld<double>(x, xdt, (p * dim + j) * inner + q);
            if (best != best && !(last && v != v)) {
                continue;
            }
            if (bi < 0 || v != v || v > best || (last && v == best)) {
                best = v;
                bi = j;
            }
        }
        y[o] = bi;
    }
}

// one_hot: y [outer, depth, inner] is vals[1] where the position along depth
// equals the index (negative from depth), vals[0] elsewhere.
extern "C" __global__ void one_hot(i64 n, i64 depth, i64 inner, const void* idx, int idt, const void* vals, int vdt,
                                   void* y, int ydt)
{
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 q = o % inner, a = (o / inner) % depth, p = o / (inner * depth);
        i64 k = idt == DT_I64 ? ((const i64*)idx)[p * inner + q] : (i64)ld<double>(idx, idt, p * inner + q);
        if (k < 0) {
            k += depth;
        }
        move(y, ydt, o, vals, vdt, k == a ? 1 : 0);
    }
}

// cumsum along the middle axis of [outer, dim, inner], one thread per line:
// int64 sums exact (wrapping), floats in double.
extern "C" __global__ void cumsum(i64 outer, i64 dim, i64 inner, int exclusive, int reverse, const void* x, int xdt,
                                  void* y, int ydt)
{
    i64 n = outer * inner;
    bool ints = xdt == DT_I64 && ydt == DT_I64;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 p = o / inner, q = o % inner;
        i64 si = 0;
        double sf = 0;
        for (i64 s = 0; s < dim; s++) {
            i64 j = reverse ? dim - 1 - s : s;
            i64 at = (p * dim + j) * inner + q;
            if (ints) {
                i64 v = ((const i64*)x)[at];
                if (!exclusive) {
                    si += v;
                }
                ((i64*)y)[at] = si;
                if (exclusive) {
                    si += v;
                }
                continue;
            }
            double v = ld<double>(x, xdt, at);
            if (!exclusive) {
                sf += v;
            }
            st<double>(y, ydt, at, sf);
            if (exclusive) {
                sf += v;
            }
        }
    }
}

// gather_nd: tuple t of k coordinates (axes nd after the batch axes) picks a
// slice of slice elements; batch entry t / per_batch.
extern "C" __global__ void gather_nd(i64 n, int k, i64 slice, i64 per_batch, D6(nd), const void* x, int xdt,
                                     const i64* idx, void* y, int ydt, int* flag, int code)
{
    A6(nd);
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 t = o / slice, j = o % slice;
        i64 p = t / per_batch;
        bool bad = false;
        for (int d = 0; d < k; d++) {
            i64 a = norm_index(idx[t * k + d], nd[d]);
            bad = bad || a < 0;
            p = p * nd[d] + (a < 0 ? 0 : a);
        }
        if (bad) {
            set_flag(flag, code);
            st<double>(y, ydt, o, 0.0);
            continue;
        }
        move(y, ydt, o, x, xdt, p * slice + j);
    }
}

// atomic_combine applies a reduction at y[q] atomically (compare-and-swap on
// the element's bits): float32, float64 and int64 storage.
__device__ void atomic_combine(void* y, int ydt, i64 q, int red, double uf, i64 ui)
{
    if (ydt == DT_F64) {
        unsigned long long* a = (unsigned long long*)y + q;
        unsigned long long old = *a, prev;
        do {
            prev = old;
            double v = combine<double>(red, __longlong_as_double((long long)prev), uf);
            old = atomicCAS(a, prev, (unsigned long long)__double_as_longlong(v));
        } while (old != prev);
    } else if (ydt == DT_F32) {
        unsigned* a = (unsigned*)y + q;
        unsigned old = *a, prev;
        do {
            prev = old;
            float v = (float)combine<double>(red, (double)__uint_as_float(prev), uf);
            old = atomicCAS(a, prev, __float_as_uint(v));
        } while (old != prev);
    } else {
        unsigned long long* a = (unsigned long long*)y + q;
        unsigned long long old = *a, prev;
        do {
            prev = old;
            i64 v = combine<i64>(red, (i64)prev, ui);
            old = atomicCAS(a, prev, (unsigned long long)v);
        } while (old != prev);
    }
}

// scatter_nd_updates: after y holds the data (copy2d), each update element
// is written (red 0) or combined atomically at the slice its tuple names.
extern "C" __global__ void scatter_nd_updates(i64 n, int k, i64 slice, int red, D6(nd), const i64* idx,
                                              const void* upd, int udt, void* y, int ydt, int* flag, int code)
{
    A6(nd);
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 t = o / slice, j = o % slice;
        i64 p = 0;
        bool bad = false;
        for (int d = 0; d < k; d++) {
            i64 a = norm_index(idx[t * k + d], nd[d]);
            bad = bad || a < 0;
            p = p * nd[d] + (a < 0 ? 0 : a);
        }
        if (bad) {
            set_flag(flag, code);
            continue;
        }
        i64 q = p * slice + j;
        if (red == 0) {
            move(y, ydt, q, upd, udt, o);
            continue;
        }
        bool ints = udt == DT_I64;
        atomic_combine(y, ydt, q, red, ints ? 0.0 : ld<double>(upd, udt, o), ints ? ((const i64*)upd)[o] : 0);
    }
}

// pad: output dims od, input dims id, leading pads pb (rank r); mode 0
// constant (fill, or 0 when fill is null), 1 reflect, 2 edge.
extern "C" __global__ void pad(i64 n, int r, int mode, D6(od), D6(id), D6(pb), const void* x, int xdt,
                               const void* fill, int fdt, void* y, int ydt)
{
    A6(od);
    A6(id);
    A6(pb);
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 rem = o, off = 0, stride = 1;
        bool inside = true;
        for (int k = r - 1; k >= 0; k--) {
            i64 i = rem % od[k] - pb[k];
            rem /= od[k];
            if (i < 0 || i >= id[k]) {
                if (mode == 2) {
                    i = i < 0 ? 0 : id[k] - 1;
                } else if (mode == 1) {
                    i = i < 0 ? -i : 2 * (id[k] - 1) - i;
                } else {
                    inside = false;
                }
            }
            off += i * stride;
            stride *= id[k];
        }
        if (!inside) {
            if (fill != 0) {
                move(y, ydt, o, fill, fdt, 0);
            } else {
                st<double>(y, ydt, o, 0.0);
            }
            continue;
        }
        move(y, ydt, o, x, xdt, off);
    }
}

// reverse_sequence: x viewed [a0, a1, inner] with time and batch the first
// two axes (batch_axis says which is the batch): the first lens[b] steps of
// each batch entry reversed, the rest kept.
extern "C" __global__ void reverse_sequence(i64 n, i64 a1, i64 inner, int batch_axis, i64 steps, const i64* lens,
                                            const void* x, int xdt, void* y, int ydt, int* flag, int code)
{
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 q = o % inner, i1 = (o / inner) % a1, i0 = o / (inner * a1);
        i64 t = batch_axis == 1 ? i0 : i1, b = batch_axis == 1 ? i1 : i0;
        i64 l = lens[b];
        if (l < 0 || l > steps) {
            set_flag(flag, code);
            st<double>(y, ydt, o, 0.0);
            continue;
        }
        if (t < l) {
            t = l - 1 - t;
        }
        i64 s0 = batch_axis == 1 ? t : b, s1 = batch_axis == 1 ? b : t;
        move(y, ydt, o, x, xdt, (s0 * a1 + s1) * inner + q);
    }
}

// zero_fill: y = 0.
extern "C" __global__ void zero_fill(i64 n, void* y, int ydt)
{
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        st<double>(y, ydt, o, 0.0);
    }
}

// max_unpool_scatter: x[i] goes to the multi-index that idx[i] numbers in
// the default unpooled shape (dims dd), in the output (dims od, rank r).
extern "C" __global__ void max_unpool_scatter(i64 n, int r, D6(dd), D6(od), const void* x, int xdt, const i64* idx,
                                              void* y, int ydt, int* flag, int code)
{
    A6(dd);
    A6(od);
    i64 total = 1;
    for (int k = 0; k < r; k++) {
        total *= dd[k];
    }
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 q = idx[i];
        if (q < 0 || q >= total) {
            set_flag(flag, code);
            continue;
        }
        i64 off = 0, stride = 1;
        for (int k = r - 1; k >= 0; k--) {
            off += (q % dd[k]) * stride;
            q /= dd[k];
            stride *= od[k];
        }
        move(y, ydt, off, x, xdt, i);
    }
}

// ---------------------------------------------------------------- spatial ops
//
// Conv, ConvTranspose, MaxPool, AveragePool (graph/ops_conv.go), Interpolate
// (ops_resize.go), GridSample, RoiAlign, LRN, TopK, Det and Einsum: each the op
// table's Eval as one thread per output element (or matrix), accumulating in
// double in the order the reference does. A window comes resolved by the host
// (graph.ConvWindow, PoolWindow, ConvTransposeWindow): per spatial axis (ns of
// them) the input, kernel and output dims, strides, dilations and the begin and
// end pads.

#define F6(p) double p##0, double p##1, double p##2, double p##3, double p##4, double p##5
#define AF6(p) const double p[MAXR] = {p##0, p##1, p##2, p##3, p##4, p##5}

struct win {
    int ns;
    i64 in[MAXR], k[MAXR], out[MAXR], st[MAXR], dl[MAXR], pb[MAXR], pe[MAXR];
    i64 inN, kN, outN;
};

#define WIN_PARAMS int ns, D6(wi), D6(wk), D6(wo), D6(ws), D6(wd), D6(wb), D6(we)

// prod_dims is the element count of the first n of dims.
__device__ __forceinline__ i64 prod_dims(const i64* dims, int n)
{
    i64 p = 1;
    for (int d = 0; d < n; d++) {
        p *= dims[d];
    }
    return p;
}

// unravel_dims writes the multi-index of flat position o over the first n of dims.
__device__ __forceinline__ void unravel_dims(i64 o, const i64* dims, int n, i64* idx)
{
    for (int d = n - 1; d >= 0; d--) {
        idx[d] = o % dims[d];
        o /= dims[d];
    }
}

__device__ __forceinline__ win make_win(int ns, const i64* wi, const i64* wk, const i64* wo, const i64* ws,
                                        const i64* wd, const i64* wb, const i64* we)
{
    win w;
    w.ns = ns;
    for (int d = 0; d < MAXR; d++) {
        w.in[d] = wi[d];
        w.k[d] = wk[d];
        w.out[d] = wo[d];
        w.st[d] = ws[d];
        w.dl[d] = wd[d];
        w.pb[d] = wb[d];
        w.pe[d] = we[d];
    }
    w.inN = prod_dims(w.in, ns);
    w.kN = prod_dims(w.k, ns);
    w.outN = prod_dims(w.out, ns);
    return w;
}

#define WIN_INIT(w)                                                                                                    \
    A6(wi);                                                                                                            \
    A6(wk);                                                                                                            \
    A6(wo);                                                                                                            \
    A6(ws);                                                                                                            \
    A6(wd);                                                                                                            \
    A6(wb);                                                                                                            \
    A6(we);                                                                                                            \
    const win w = make_win(ns, wi, wk, wo, ws, wd, wb, we)

// win_tap is the input position (flat over the spatial axes) that kernel offset
// kp of output position op (a multi-index) reads, -1 where it falls in a pad;
// *in_pad says whether it lies within the explicit pads (a ceil_mode window may
// reach past them), as window.each in graph/ops_conv.go.
__device__ i64 win_tap(const win& w, const i64* op, i64 kp, bool* in_pad)
{
    i64 kk[MAXR];
    unravel_dims(kp, w.k, w.ns, kk);
    i64 pos = 0;
    bool valid = true;
    *in_pad = true;
    for (int d = 0; d < w.ns; d++) {
        i64 c = op[d] * w.st[d] - w.pb[d] + kk[d] * w.dl[d];
        if (c < -w.pb[d] || c >= w.in[d] + w.pe[d]) {
            *in_pad = false;
        }
        if (c < 0 || c >= w.in[d]) {
            valid = false;
        }
        pos = pos * w.in[d] + c;
    }
    return valid ? pos : -1;
}

// conv: y [nb, m, out...] = b[mi] + the sum over the channels ci of mi's group
// (cin / group of them) and the kernel offsets of x·w, in that order.
extern "C" __global__ void conv(i64 nb, i64 m, i64 cin, i64 group, WIN_PARAMS, const void* x, int xdt,
                                const void* wt, int wdt, const void* b, int bdt, void* y, int ydt)
{
    WIN_INIT(w);
    i64 cg = cin / group, mg = m / group;
    i64 n = nb * m * w.outN;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 sp = o % w.outN, mi = (o / w.outN) % m, bi = o / (w.outN * m);
        i64 grp = mi / mg;
        i64 op[MAXR];
        unravel_dims(sp, w.out, ns, op);
        double s = b != 0 ? ld<double>(b, bdt, mi) : 0.0;
        for (i64 ci = 0; ci < cg; ci++) {
            i64 xc = (bi * cin + grp * cg + ci) * w.inN, wc = (mi * cg + ci) * w.kN;
            for (i64 kp = 0; kp < w.kN; kp++) {
                bool in_pad;
                i64 p = win_tap(w, op, kp, &in_pad);
                if (p >= 0) {
                    s += ld<double>(x, xdt, xc + p) * ld<double>(wt, wdt, wc + kp);
                }
            }
        }
        st<double>(y, ydt, o, s);
    }
}

// conv_transpose: y [nb, m, out...] starts at b[mi]; every x[bi, ci, i] of
// mi's group adds x·w[ci, mj, k] where i·stride − pb + k·dilation lands on it.
// The window's in and out are X's and Y's spatial dims. The terms of one output
// come in the reference's order: by channel, then by input position; running the
// kernel offsets down on every axis runs the input positions up.
extern "C" __global__ void conv_transpose(i64 nb, i64 m, i64 cin, i64 group, WIN_PARAMS, const void* x, int xdt,
                                          const void* wt, int wdt, const void* b, int bdt, void* y, int ydt)
{
    WIN_INIT(w);
    i64 cg = cin / group, mg = m / group;
    i64 n = nb * m * w.outN;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 sp = o % w.outN, mi = (o / w.outN) % m, bi = o / (w.outN * m);
        i64 grp = mi / mg, mj = mi % mg;
        i64 op[MAXR], kk[MAXR];
        unravel_dims(sp, w.out, ns, op);
        double s = b != 0 ? ld<double>(b, bdt, mi) : 0.0;
        for (i64 ci = grp * cg; ci < (grp + 1) * cg; ci++) {
            for (i64 t = 0; t < w.kN; t++) {
                i64 kp = w.kN - 1 - t;
                unravel_dims(kp, w.k, ns, kk);
                i64 pos = 0;
                bool hit = true;
                for (int d = 0; d < ns; d++) {
                    i64 num = op[d] + w.pb[d] - kk[d] * w.dl[d];
                    if (num < 0 || num % w.st[d] != 0 || num / w.st[d] >= w.in[d]) {
                        hit = false;
                        break;
                    }
                    pos = pos * w.in[d] + num / w.st[d];
                }
                if (hit) {
                    s += ld<double>(x, xdt, (bi * cin + ci) * w.inN + pos) * ld<double>(wt, wdt, (ci * mg + mj) * w.kN + kp);
                }
            }
        }
        st<double>(y, ydt, o, s);
    }
}

// max_pool: the first maximum of each window of each of planes [in...] planes
// (a NaN wins; pads never do), copied, so int64 data stays exact; idx (when
// not null) gets its flat index in x, the spatial axes numbered column-major
// with col_major. A window of padding alone is −∞ with index −1 (an int64
// output has no −∞: the flag is set).
extern "C" __global__ void max_pool(i64 planes, WIN_PARAMS, int col_major, const void* x, int xdt, void* y, int ydt,
                                    i64* idx, int* flag, int code)
{
    WIN_INIT(w);
    i64 n = planes * w.outN;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 pl = o / w.outN, sp = o % w.outN;
        i64 op[MAXR];
        unravel_dims(sp, w.out, ns, op);
        i64 best = -1;
        double bv = 0;
        for (i64 kp = 0; kp < w.kN; kp++) {
            bool in_pad;
            i64 p = win_tap(w, op, kp, &in_pad);
            if (p < 0) {
                continue;
            }
            double v = ld<double>(x, xdt, pl * w.inN + p);
            if (best < 0 || (bv == bv && (v > bv || v != v))) {
                best = p;
                bv = v;
            }
        }
        if (best < 0) {
            if (ydt == DT_I64) {
                set_flag(flag, code);
                st<double>(y, ydt, o, 0.0);
            } else {
                st<double>(y, ydt, o, -tinf<double>());
            }
            if (idx != 0) {
                idx[o] = -1;
            }
            continue;
        }
        move(y, ydt, o, x, xdt, pl * w.inN + best);
        if (idx != 0) {
            i64 q = best;
            if (col_major) {
                i64 ip[MAXR];
                unravel_dims(best, w.in, ns, ip);
                q = 0;
                for (int d = ns - 1; d >= 0; d--) {
                    q = q * w.in[d] + ip[d];
                }
            }
            idx[o] = pl * w.inN + q;
        }
    }
}

// avg_pool: the mean over each window; with_pad counts the positions in the
// explicit pads.
extern "C" __global__ void avg_pool(i64 planes, WIN_PARAMS, int with_pad, const void* x, int xdt, void* y, int ydt)
{
    WIN_INIT(w);
    i64 n = planes * w.outN;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 pl = o / w.outN, sp = o % w.outN;
        i64 op[MAXR];
        unravel_dims(sp, w.out, ns, op);
        double acc = 0;
        i64 cnt = 0;
        for (i64 kp = 0; kp < w.kN; kp++) {
            bool in_pad;
            i64 p = win_tap(w, op, kp, &in_pad);
            if (p < 0) {
                if (with_pad && in_pad) {
                    cnt++;
                }
                continue;
            }
            acc += ld<double>(x, xdt, pl * w.inN + p);
            cnt++;
        }
        st<double>(y, ydt, o, acc / (double)cnt);
    }
}

// resize_source is the input coordinate of output coordinate x of one axis
// (input length n, output length m, scale s, crop box start..end), false when
// tf_crop_and_resize puts it outside the input: resizeSource in
// graph/ops_resize.go. ct: 0 half_pixel, 1 pytorch_half_pixel, 2 align_corners,
// 3 asymmetric, 4 tf_half_pixel_for_nn, 5 tf_crop_and_resize.
__device__ bool resize_source(int ct, double x, i64 n, i64 m, double s, double start, double end, double* v)
{
    double l = (double)n * s;
    bool one = fabs(l - 1) < 1e-9;
    switch (ct) {
    case 1: *v = (l > 1 && !one) ? (x + 0.5) / s - 0.5 : 0.0; return true;
    case 2: *v = one ? 0.0 : x * (double)(n - 1) / (l - 1); return true;
    case 3: *v = x / s; return true;
    case 4: *v = (x + 0.5) / s; return true;
    case 5:
        if (m > 1) {
            *v = start * (double)(n - 1) + x * (end - start) * (double)(n - 1) / (double)(m - 1);
        } else {
            *v = 0.5 * (start + end) * (double)(n - 1);
        }
        return *v >= 0 && *v <= (double)(n - 1);
    default: *v = (x + 0.5) / s - 0.5; return true;
    }
}

__device__ __forceinline__ i64 clamp_index(i64 i, i64 n) { return i < 0 ? 0 : (i > n - 1 ? n - 1 : i); }

// resize_taps writes the input positions and weights that make output
// position x of one axis and returns their count (0: outside the input):
// resizeTaps in graph/ops_resize.go. mode: 0 nearest, 1 linear, 2 cubic;
// nm (nearest_mode): 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil.
__device__ int resize_taps(int mode, int ct, int nm, double A, int exclude, i64 x, i64 n, i64 m, double s,
                           double start, double end, i64* ti, double* tw)
{
    double v;
    if (!resize_source(ct, (double)x, n, m, s, start, end, &v)) {
        return 0;
    }
    if (mode == 0) {
        double i;
        switch (nm) {
        case 1: i = floor(v + 0.5); break;
        case 2: i = floor(v); break;
        case 3: i = ceil(v); break;
        default: i = ceil(v - 0.5); break;
        }
        ti[0] = clamp_index((i64)i, n);
        tw[0] = 1;
        return 1;
    }
    double x0 = floor(v);
    double r = v - x0;
    if (mode == 1) {
        ti[0] = clamp_index((i64)x0, n);
        tw[0] = 1 - r;
        ti[1] = clamp_index((i64)x0 + 1, n);
        tw[1] = r;
        return 2;
    }
    tw[0] = ((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A;
    tw[1] = ((A + 2) * r - (A + 3)) * r * r + 1;
    tw[2] = ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1;
    tw[3] = ((A * (2 - r) - 5 * A) * (2 - r) + 8 * A) * (2 - r) - 4 * A;
    double sum = 0;
    for (int k = 0; k < 4; k++) {
        i64 i = (i64)x0 - 1 + k;
        if (exclude && (i < 0 || i >= n)) {
            tw[k] = 0;
        }
        ti[k] = clamp_index(i, n);
        sum += tw[k];
    }
    if (exclude && sum != 0) {
        for (int k = 0; k < 4; k++) {
            tw[k] /= sum;
        }
    }
    return 4;
}

// interpolate: y (dims yd, rank r) from x (dims xd): each output element is the
// sum over the tensor product of its axes' taps (axis 0 outermost) of the
// weights' product (axis 0 first) times x, or extra when an axis puts it
// outside the crop box.
extern "C" __global__ void interpolate(i64 n, int r, D6(xd), D6(yd), F6(sc), F6(rs), F6(re), int mode, int ct, int nm,
                                       double A, int exclude, double extra, const void* x, int xdt, void* y, int ydt)
{
    A6(xd);
    A6(yd);
    AF6(sc);
    AF6(rs);
    AF6(re);
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 oi[MAXR], ti[MAXR][4];
        double tw[MAXR][4];
        int nt[MAXR];
        unravel_dims(o, yd, r, oi);
        bool inside = true;
        i64 combos = 1;
        for (int d = 0; d < r; d++) {
            nt[d] = resize_taps(mode, ct, nm, A, exclude, oi[d], xd[d], yd[d], sc[d], rs[d], re[d], ti[d], tw[d]);
            inside = inside && nt[d] > 0;
            combos *= nt[d];
        }
        if (!inside) {
            st<double>(y, ydt, o, extra);
            continue;
        }
        double s = 0;
        for (i64 c = 0; c < combos; c++) {
            i64 rem = c, pos = 0;
            int pick[MAXR];
            for (int d = r - 1; d >= 0; d--) {
                pick[d] = (int)(rem % nt[d]);
                rem /= nt[d];
            }
            double wgt = 1;
            for (int d = 0; d < r; d++) {
                wgt = wgt * tw[d][pick[d]];
                pos = pos * xd[d] + ti[d][pick[d]];
            }
            s += wgt * ld<double>(x, xdt, pos);
        }
        st<double>(y, ydt, o, s);
    }
}

// topk along the middle axis of [outer, dim, inner]: each element's place in
// the reference's stable sort (largest first with largest set) is the count of
// the elements before it: larger (smaller) ones, and equal ones at a lower
// index; a place below k writes the value and its index.
extern "C" __global__ void topk(i64 outer, i64 dim, i64 inner, i64 k, int largest, const void* x, int xdt, void* y,
                                int ydt, i64* yi)
{
    i64 n = outer * dim * inner;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 q = o % inner, i = (o / inner) % dim, p = o / (inner * dim);
        double xi = ld<double>(x, xdt, o);
        i64 place = 0;
        for (i64 j = 0; j < dim; j++) {
            double xj = ld<double>(x, xdt, (p * dim + j) * inner + q);
            bool before = largest ? xj > xi : xj < xi;
            bool tie = !(xj < xi) && !(xj > xi);
            if (before || (tie && j < i)) {
                place++;
            }
        }
        if (place < k) {
            i64 at = (p * k + place) * inner + q;
            move(y, ydt, at, x, xdt, o);
            yi[at] = i;
        }
    }
}

// lrn: x / (bias + alpha/size · Σ x² over channels c − ⌊(size−1)/2⌋ … c +
// ⌈(size−1)/2⌉ that exist)^beta over [., ch, inner].
extern "C" __global__ void lrn(i64 n, i64 ch, i64 inner, i64 size, double alpha, double beta, double bias, const void* x,
                               int xdt, void* y, int ydt)
{
    i64 lo = (size - 1) / 2, hi = size - 1 - (size - 1) / 2;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 c = o / inner % ch;
        i64 base = o - c * inner;
        double s = 0;
        for (i64 j = c - lo < 0 ? 0 : c - lo; j <= (c + hi < ch - 1 ? c + hi : ch - 1); j++) {
            double v = ld<double>(x, xdt, base + j * inner);
            s += v * v;
        }
        st<double>(y, ydt, o, ld<double>(x, xdt, o) / pow(bias + alpha / (double)size * s, beta));
    }
}

// det: one thread per m×m matrix, Gaussian elimination with partial pivoting
// in the matrix's copy in a (double scratch of x's size), as evalDet: the
// pivots' product, negated per row swap.
extern "C" __global__ void det(i64 batch, i64 m, const void* x, int xdt, double* scratch, void* y, int ydt)
{
    for (i64 b = blockIdx.x * (i64)blockDim.x + threadIdx.x; b < batch; b += (i64)gridDim.x * blockDim.x) {
        double* a = scratch + b * m * m;
        for (i64 i = 0; i < m * m; i++) {
            a[i] = ld<double>(x, xdt, b * m * m + i);
        }
        double d = 1;
        for (i64 c = 0; c < m; c++) {
            i64 piv = c;
            for (i64 r = c + 1; r < m; r++) {
                if (fabs(a[r * m + c]) > fabs(a[piv * m + c])) {
                    piv = r;
                }
            }
            if (a[piv * m + c] == 0) {
                d = 0;
                break;
            }
            if (piv != c) {
                for (i64 j = 0; j < m; j++) {
                    double t = a[c * m + j];
                    a[c * m + j] = a[piv * m + j];
                    a[piv * m + j] = t;
                }
                d = -d;
            }
            d *= a[c * m + c];
            for (i64 r = c + 1; r < m; r++) {
                double f = a[r * m + c] / a[c * m + c];
                for (i64 j = c; j < m; j++) {
                    a[r * m + j] -= f * a[c * m + j];
                }
            }
        }
        st<double>(y, ydt, b, d);
    }
}

// gs_reflect folds v into [lo, hi] as a mirror at each end would (reflect in
// graph/ops_gridsample.go).
__device__ double gs_reflect(double v, double lo, double hi)
{
    double r = hi - lo;
    if (r <= 0) {
        return lo;
    }
    if (v < lo) {
        double d = lo - v;
        double k = floor(d / r);
        return ((i64)k % 2 == 0) ? lo + (d - k * r) : hi - (d - k * r);
    }
    if (v > hi) {
        double d = v - hi;
        double k = floor(d / r);
        return ((i64)k % 2 == 0) ? hi - (d - k * r) : lo + (d - k * r);
    }
    return v;
}

// gs_pixel is x at integer (row, col) of the [h, w] plane at base, padded:
// pad 0 zeros, 1 border, 2 reflection within [xmin, xmax] × [ymin, ymax].
__device__ double gs_pixel(const void* x, int xdt, i64 base, i64 h, i64 w, int pad, double xmin, double xmax,
                           double ymin, double ymax, i64 row, i64 col)
{
    if (pad == 1) {
        row = clamp_index(row, h);
        col = clamp_index(col, w);
    } else if (pad == 2) {
        row = (i64)gs_reflect((double)row, ymin, ymax);
        col = (i64)gs_reflect((double)col, xmin, xmax);
    }
    if (row < 0 || row >= h || col < 0 || col >= w) {
        return 0;
    }
    return ld<double>(x, xdt, base + row * w + col);
}

// gs_cubic is the bicubic convolution weight (a = −0.75) of tap k (0..3) of a
// point t past the second pixel: cubicWeights.
__device__ __forceinline__ double gs_cubic(double t, int k)
{
    const double a = -0.75;
    double d = k == 0 ? t + 1 : (k == 1 ? t : (k == 2 ? 1 - t : 2 - t));
    if (k == 1 || k == 2) {
        return ((a + 2) * d - (a + 3)) * d * d + 1;
    }
    return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
}

// grid_sample: y [nb, ch, ho, wo] is x [nb, ch, h, w] at the point grid [nb, ho,
// wo, 2] names; mode 0 bilinear, 1 nearest, 2 bicubic; pad as gs_pixel.
extern "C" __global__ void grid_sample(i64 nb, i64 ch, i64 h, i64 w, i64 ho, i64 wo, int mode, int pad, int align,
                                       const void* x, int xdt, const void* grid, int gdt, void* y, int ydt)
{
    double xmin = align ? 0.0 : -0.5, xmax = align ? (double)(w - 1) : (double)w - 0.5;
    double ymin = align ? 0.0 : -0.5, ymax = align ? (double)(h - 1) : (double)h - 0.5;
    i64 n = nb * ch * ho * wo;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 j = o % wo, i = (o / wo) % ho, c = (o / (wo * ho)) % ch, b = o / (wo * ho * ch);
        i64 gp = ((b * ho + i) * wo + j) * 2;
        double gx = ld<double>(grid, gdt, gp), gy = ld<double>(grid, gdt, gp + 1);
        double px = align ? (gx + 1) / 2 * (double)(w - 1) : ((gx + 1) * (double)w - 1) / 2;
        double py = align ? (gy + 1) / 2 * (double)(h - 1) : ((gy + 1) * (double)h - 1) / 2;
        if (mode == 1) {
            px = rint(px);
            py = rint(py);
        }
        if (px < xmin || px > xmax || py < ymin || py > ymax) {
            if (pad == 1) {
                px = px < 0 ? 0.0 : (px > (double)(w - 1) ? (double)(w - 1) : px);
                py = py < 0 ? 0.0 : (py > (double)(h - 1) ? (double)(h - 1) : py);
            } else if (pad == 2) {
                px = gs_reflect(px, xmin, xmax);
                py = gs_reflect(py, ymin, ymax);
            }
        }
        i64 base = (b * ch + c) * h * w;
        double v = 0;
        if (mode == 1) {
            v = gs_pixel(x, xdt, base, h, w, pad, xmin, xmax, ymin, ymax, (i64)py, (i64)px);
        } else if (mode == 0) {
            double x0 = floor(px), y0 = floor(py);
            double fx = px - x0, fy = py - y0;
            i64 c0 = (i64)x0, r0 = (i64)y0;
            v = (1 - fy) * ((1 - fx) * gs_pixel(x, xdt, base, h, w, pad, xmin, xmax, ymin, ymax, r0, c0) +
                            fx * gs_pixel(x, xdt, base, h, w, pad, xmin, xmax, ymin, ymax, r0, c0 + 1)) +
                fy * ((1 - fx) * gs_pixel(x, xdt, base, h, w, pad, xmin, xmax, ymin, ymax, r0 + 1, c0) +
                      fx * gs_pixel(x, xdt, base, h, w, pad, xmin, xmax, ymin, ymax, r0 + 1, c0 + 1));
        } else {
            double x0 = floor(px), y0 = floor(py);
            for (int r = 0; r < 4; r++) {
                double row = 0;
                for (int q = 0; q < 4; q++) {
                    row += gs_cubic(px - x0, q) *
                           gs_pixel(x, xdt, base, h, w, pad, xmin, xmax, ymin, ymax, (i64)y0 - 1 + r, (i64)x0 - 1 + q);
                }
                v += gs_cubic(py - y0, r) * row;
            }
        }
        st<double>(y, ydt, o, v);
    }
}

// go_max is Go's math.Max without the signed zeros: NaN if either is.
__device__ __forceinline__ double go_max(double a, double b)
{
    if (a != a || b != b) {
        return a != a ? a : b;
    }
    return a > b ? a : b;
}

// roi_corners writes the four weighted corner values of the bilinear sample at
// (sy, sx) of an [h, w] plane: zeros outside [-1, h] × [-1, w] (roiBilinear).
__device__ void roi_corners(const void* x, int xdt, i64 plane, i64 h, i64 w, double sy, double sx, double* cv)
{
    cv[0] = cv[1] = cv[2] = cv[3] = 0;
    if (sy < -1 || sy > (double)h || sx < -1 || sx > (double)w) {
        return;
    }
    sy = go_max(sy, 0);
    sx = go_max(sx, 0);
    i64 y0 = (i64)sy, x0 = (i64)sx;
    i64 y1 = y0 + 1, x1 = x0 + 1;
    if (y0 >= h - 1) {
        y0 = y1 = h - 1;
        sy = (double)(h - 1);
    }
    if (x0 >= w - 1) {
        x0 = x1 = w - 1;
        sx = (double)(w - 1);
    }
    double ly = sy - (double)y0, lx = sx - (double)x0;
    double hy = 1 - ly, hx = 1 - lx;
    cv[0] = hy * hx * ld<double>(x, xdt, plane + y0 * w + x0);
    cv[1] = hy * lx * ld<double>(x, xdt, plane + y0 * w + x1);
    cv[2] = ly * hx * ld<double>(x, xdt, plane + y1 * w + x0);
    cv[3] = ly * lx * ld<double>(x, xdt, plane + y1 * w + x1);
}

// roi_align: y [nr, ch, oh, ow], each bin of ROI r (rois [nr, 4], image
// bidx[r] of x [nb, ch, h, w]) the average (or the largest corner, use_max) of
// its bilinear samples (evalRoiAlign). A batch index out of range or a region
// past max_samples per bin sets the flag and writes 0.
extern "C" __global__ void roi_align(i64 nr, i64 nb, i64 ch, i64 h, i64 w, i64 oh, i64 ow, i64 ratio, double scale,
                                     int half_pixel, int use_max, i64 max_samples, const void* x, int xdt,
                                     const void* rois, int rdt, const i64* bidx, void* y, int ydt, int* flag, int code)
{
    double offset = half_pixel ? 0.5 : 0.0;
    i64 n = nr * ch * oh * ow;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 pw = o % ow, ph = (o / ow) % oh, c = (o / (ow * oh)) % ch, r = o / (ow * oh * ch);
        i64 b = bidx[r];
        if (b < 0 || b >= nb) {
            set_flag(flag, code);
            st<double>(y, ydt, o, 0.0);
            continue;
        }
        double x1 = ld<double>(rois, rdt, r * 4) * scale - offset, y1 = ld<double>(rois, rdt, r * 4 + 1) * scale - offset;
        double x2 = ld<double>(rois, rdt, r * 4 + 2) * scale - offset, y2 = ld<double>(rois, rdt, r * 4 + 3) * scale - offset;
        double rw = x2 - x1, rh = y2 - y1;
        if (!half_pixel) {
            rw = go_max(rw, 1);
            rh = go_max(rh, 1);
        }
        double bh = rh / (double)oh, bw = rw / (double)ow;
        i64 gh = ratio, gw = ratio;
        if (ratio == 0) {
            double fh = ceil(rh / (double)oh), fw = ceil(rw / (double)ow);
            if (fh != fh || fw != fw || fh > (double)max_samples || fw > (double)max_samples) {
                set_flag(flag, code);
                st<double>(y, ydt, o, 0.0);
                continue;
            }
            gh = (i64)go_max(fh, 0);
            gw = (i64)go_max(fw, 0);
        }
        double count = (double)(gh * gw > 1 ? gh * gw : 1);
        i64 plane = (b * ch + c) * h * w;
        double acc = 0;
        bool first = true;
        for (i64 iy = 0; iy < gh; iy++) {
            double sy = y1 + (double)ph * bh + ((double)iy + 0.5) * bh / (double)gh;
            for (i64 ix = 0; ix < gw; ix++) {
                double sx = x1 + (double)pw * bw + ((double)ix + 0.5) * bw / (double)gw;
                double cv[4];
                roi_corners(x, xdt, plane, h, w, sy, sx, cv);
                if (use_max) {
                    double v = go_max(go_max(cv[0], cv[1]), go_max(cv[2], cv[3]));
                    if (first || v > acc) {
                        acc = v;
                    }
                    first = false;
                    continue;
                }
                acc += cv[0] + cv[1] + cv[2] + cv[3];
            }
        }
        if (!use_max) {
            acc /= count;
        }
        st<double>(y, ydt, o, acc);
    }
}

// einsum: y (dims od, rank nout) is the sum over the summed labels (dims sd,
// nsum of them, odometer order) of the product of the operands in order; each
// operand k reads at Σ out index · ok + Σ summed index · sk (a label repeated
// in one operand has its strides added: the diagonal). Up to four operands.
#define EIN_OPERAND(k) const void *x##k, int d##k, D6(o##k), D6(s##k)
extern "C" __global__ void einsum(i64 n, int nout, int nsum, int nops, D6(od), D6(sd), EIN_OPERAND(0), EIN_OPERAND(1),
                                  EIN_OPERAND(2), EIN_OPERAND(3), void* y, int ydt)
{
    A6(od);
    A6(sd);
    const void* xs[4] = {x0, x1, x2, x3};
    const int dts[4] = {d0, d1, d2, d3};
    const i64 os[4][MAXR] = {{o00, o01, o02, o03, o04, o05},
                             {o10, o11, o12, o13, o14, o15},
                             {o20, o21, o22, o23, o24, o25},
                             {o30, o31, o32, o33, o34, o35}};
    const i64 ss[4][MAXR] = {{s00, s01, s02, s03, s04, s05},
                             {s10, s11, s12, s13, s14, s15},
                             {s20, s21, s22, s23, s24, s25},
                             {s30, s31, s32, s33, s34, s35}};
    i64 sumN = prod_dims(sd, nsum);
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 oi[MAXR], si[MAXR], base[4];
        unravel_dims(o, od, nout, oi);
        for (int k = 0; k < nops; k++) {
            base[k] = 0;
            for (int d = 0; d < nout; d++) {
                base[k] += oi[d] * os[k][d];
            }
        }
        double s = 0;
        for (i64 q = 0; q < sumN; q++) {
            unravel_dims(q, sd, nsum, si);
            double prod = 1;
            for (int k = 0; k < nops; k++) {
                i64 pos = base[k];
                for (int d = 0; d < nsum; d++) {
                    pos += si[d] * ss[k][d];
                }
                prod *= ld<double>(xs[k], dts[k], pos);
            }
            s += prod;
        }
        st<double>(y, ydt, o, s);
    }
}

// tfidf: y [rows, width] from the int64 rows of x [rows, cols]: per output
// column, the occurrences of the pool n-grams that count in it, each n-gram
// of n ≥ min_n items read at a start and a gap of 1 to max_gap (a 1-gram at
// gap 1 only), as evalTfIdf counts them; then mode 0 (TF) the count, 1 (IDF)
// the column's weight where the count is positive, 2 (TFIDF) count × weight
// (weight null: each 1). table (int64): width + 1 starts of each column's
// n-grams, ngrams + 1 starts of each n-gram's items, then the items.
extern "C" __global__ void tfidf(i64 rows, i64 cols, i64 width, i64 ngrams, i64 min_n, i64 max_gap, int mode,
                                 const i64* x, const i64* table, const double* weight, void* y, int ydt)
{
    const i64* col_start = table;
    const i64* gram_start = table + width + 1;
    const i64* items = gram_start + ngrams + 1;
    i64 n = rows * width;
    for (i64 o = blockIdx.x * (i64)blockDim.x + threadIdx.x; o < n; o += (i64)gridDim.x * blockDim.x) {
        i64 r = o / width, col = o % width;
        const i64* row = x + r * cols;
        i64 count = 0;
        for (i64 g = col_start[col]; g < col_start[col + 1]; g++) {
            i64 len = gram_start[g + 1] - gram_start[g];
            const i64* it = items + gram_start[g];
            if (len < min_n) {
                continue;
            }
            for (i64 i = 0; i < cols; i++) {
                for (i64 gap = 1; gap <= max_gap; gap++) {
                    if ((len == 1 && gap > 1) || i + (len - 1) * gap >= cols) {
                        break;
                    }
                    bool match = true;
                    for (i64 j = 0; j < len && match; j++) {
                        match = row[i + j * gap] == it[j];
                    }
                    if (match) {
                        count++;
                    }
                }
            }
        }
        double wgt = weight != 0 ? weight[col] : 1.0;
        double v = (double)count;
        if (mode == 1) {
            v = count > 0 ? wgt : 0.0;
        } else if (mode == 2) {
            v = (double)count * wgt;
        }
        st<double>(y, ydt, o, v);
    }
}
