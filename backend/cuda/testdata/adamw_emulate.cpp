// adamw_emulate.cpp runs ops.cu's AdamW kernels on the host, one thread at a
// time, to check adamw_multi_f32 against adamw_f32 bit for bit without a GPU
// (TestAdamWMultiHostEmulation). The CUDA built-ins are defined for a serial
// run: a block's threads run in order, thread 0 first, so what thread 0
// writes to shared memory before __syncthreads (the bias corrections) is
// there when the others read it; __shared__ is static, one copy for all.
// CUDA's float overloads of sqrt, exp and log are declared too: without them
// the host would compute adamw_impl<float>'s sqrt(vh) + eps in double.
// Prints "ok" and exits 0 when every output agrees.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __launch_bounds__(...)
struct uint3s {
    unsigned x, y, z;
};
uint3s threadIdx, blockIdx, gridDim, blockDim;
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
double __longlong_as_double(long long u)
{
    double f;
    memcpy(&f, &u, 8);
    return f;
}
long long __double_as_longlong(double f)
{
    long long u;
    memcpy(&u, &f, 8);
    return u;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int) { return v; }
template <class T> T __shfl_sync(unsigned, T v, int) { return v; }
void __syncthreads() {}
int __popc(unsigned x) { return __builtin_popcount(x); }
template <class T> T atomicCAS(T* p, T cmp, T val)
{
    T old = *p;
    if (old == cmp) {
        *p = val;
    }
    return old;
}
unsigned atomicOr(unsigned* p, unsigned v)
{
    unsigned old = *p;
    *p |= v;
    return old;
}
template <class T> T atomicAdd(T* p, T v)
{
    T old = *p;
    *p += v;
    return old;
}
#define asm(...) ((void)0) // only f16 conversions use it; the checks here use float32 and bfloat16
int max(int a, int b) { return a > b ? a : b; }
int min(int a, int b) { return a < b ? a : b; }
float sqrt(float x) { return sqrtf(x); }
float exp(float x) { return expf(x); }
float log(float x) { return logf(x); }

#include "ops.cu"

// aligned16 is a 16-byte aligned buffer of bytes, kept alive by the run.
static std::vector<std::vector<char>> keep;
static char* aligned16(size_t bytes)
{
    keep.emplace_back(bytes + 32);
    uintptr_t a = ((uintptr_t)keep.back().data() + 15) & ~(uintptr_t)15;
    return (char*)a;
}

// A segment: n elements, its float32 buffers `off` elements past 16-byte
// alignment and its gradient `goff`, updated in place or into fresh outputs.
struct segcase {
    int n, off, goff;
    bool inplace;
};

// run lays out the segments, runs adamw_multi_f32 over every thread of its
// grid and adamw_f32 over copies of the inputs, and counts the outputs whose
// bits differ. At a step below 1 every output must be as it was and the flag
// set.
static int run(int gdt, float stepv)
{
    const i64 per = (i64)ADAMW_MULTI_BLOCK * 4 * ADAMW_MULTI_GROUPS;
    const int P = (int)per;
    const std::vector<segcase> cases = {
        {1, 0, 0, false},       {3, 1, 1, false},        {64, 0, 0, true},           {768, 2, 2, false},
        {4097, 0, 0, false},    {4096, 0, 0, true},      {5, 3, 3, false},           {3 * P + 6, 0, 0, false},
        {2 * P, 0, 0, true},    {P + 4, 1, 1, false},    {9000, 0, 2, false},        {P - 1, 0, 0, false},
        {2 * P + 1020, 0, 1, false}, {P + 8, 0, 2, false}, {P + 3, 0, 0, true},
    };
    const int gsz = gdt == DT_F32 ? 4 : 2;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0, 1);
    std::vector<adamw_seg> table;
    std::vector<std::vector<float>> p0, m0, v0, g0;
    i64 blocks = 0;
    for (const segcase& c : cases) {
        const int n = c.n;
        float* p = (float*)aligned16(4 * n + 16) + c.off;
        float* m = (float*)aligned16(4 * n + 16) + c.off;
        float* v = (float*)aligned16(4 * n + 16) + c.off;
        char* g = aligned16(gsz * n + 16) + gsz * c.goff;
        std::vector<float> ps(n), ms(n), vs(n), gs(n);
        for (int i = 0; i < n; i++) {
            ps[i] = p[i] = nd(rng) * 0.5f;
            ms[i] = m[i] = nd(rng) * 0.1f;
            vs[i] = v[i] = std::fabs(nd(rng)) * 0.01f;
            const float gv = nd(rng);
            if (gdt == DT_F32) {
                ((float*)g)[i] = gs[i] = gv;
            } else {
                ((u16*)g)[i] = f2bf(gv);
                gs[i] = bf2f(f2bf(gv));
            }
        }
        float *po = p, *mo = m, *vo = v;
        if (!c.inplace) {
            po = (float*)aligned16(4 * n + 16) + c.off;
            mo = (float*)aligned16(4 * n + 16);
            vo = (float*)aligned16(4 * n + 16) + c.off;
            for (int i = 0; i < n; i++) {
                po[i] = mo[i] = vo[i] = NAN;
            }
        }
        bool vec = (uintptr_t)g % (4 * gsz) == 0;
        for (const float* b : {p, m, v, po, mo, vo}) {
            vec = vec && (uintptr_t)b % 16 == 0;
        }
        table.push_back(adamw_seg{p, g, m, v, po, mo, vo, n, blocks, (table.size() % 2) * 0.1, vec ? 1 : 0});
        blocks += (n + per - 1) / per;
        p0.push_back(ps), m0.push_back(ms), v0.push_back(vs), g0.push_back(gs);
    }
    float lr = 3e-3f, step = stepv;
    // The per-node kernel over copies, as one thread of a grid-stride loop.
    std::vector<std::vector<float>> want;
    for (size_t k = 0; k < cases.size(); k++) {
        const int n = cases[k].n;
        std::vector<float> p = p0[k], m = m0[k], v = v0[k], out(3 * n);
        std::vector<u16> g16(n);
        for (int i = 0; i < n; i++) {
            g16[i] = f2bf(g0[k][i]);
        }
        const void* g = gdt == DT_F32 ? (const void*)g0[k].data() : (const void*)g16.data();
        int flag = 0;
        blockIdx.x = threadIdx.x = 0, blockDim.x = gridDim.x = 1;
        adamw_f32(n, p.data(), DT_F32, g, gdt, m.data(), DT_F32, v.data(), DT_F32, &lr, DT_F32, &step, DT_F32,
                  out.data(), DT_F32, out.data() + n, DT_F32, out.data() + 2 * n, DT_F32, 0.9, 0.95, 1e-8,
                  table[k].wd, &flag, 8);
        if (stepv < 1) {
            for (int i = 0; i < n; i++) { // nothing written
                out[i] = cases[k].inplace ? p0[k][i] : NAN;
                out[n + i] = cases[k].inplace ? m0[k][i] : NAN;
                out[2 * n + i] = cases[k].inplace ? v0[k][i] : NAN;
            }
        }
        want.push_back(out);
    }
    int flag = 0;
    blockDim.x = ADAMW_MULTI_BLOCK, gridDim.x = (unsigned)blocks;
    for (i64 b = 0; b < blocks; b++) {
        blockIdx.x = (unsigned)b;
        for (unsigned t = 0; t < ADAMW_MULTI_BLOCK; t++) {
            threadIdx.x = t;
            adamw_multi_f32(table.data(), (int)table.size(), gdt, &lr, DT_F32, &step, DT_F32, 0.9, 0.95, 1e-8, &flag, 7);
        }
    }
    int bad = 0;
    for (size_t k = 0; k < cases.size(); k++) {
        const adamw_seg& s = table[k];
        for (int i = 0; i < cases[k].n; i++) {
            const float got[3] = {s.po[i], s.mo[i], s.vo[i]};
            for (int j = 0; j < 3; j++) {
                const float w = want[k][j * cases[k].n + i];
                if (__float_as_uint(got[j]) != __float_as_uint(w) && bad++ < 5) {
                    printf("gradient type %d, step %g: segment %zu (n=%d, vec=%lld) output %d element %d: %a, adamw_f32 %a\n",
                           gdt, stepv, k, cases[k].n, s.vec, j, i, got[j], w);
                }
            }
        }
    }
    if ((stepv >= 1) != (flag == 0)) {
        printf("gradient type %d, step %g: flag %d\n", gdt, stepv, flag);
        bad++;
    }
    return bad;
}

int main()
{
    int bad = 0;
    for (int gdt : {DT_F32, DT_BF16}) {
        for (float step : {5.0f, 0.0f}) {
            bad += run(gdt, step);
        }
    }
    if (bad != 0) {
        printf("%d outputs differ\n", bad);
        return 1;
    }
    printf("ok\n");
    return 0;
}
