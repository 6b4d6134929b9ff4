// Small utility kernels: a buffer fill and an axpy. Only the runtime's tests use
// them (NVRTC compilation, the cubin cache, launches, shared memory); the backend's
// kernels are in ops.cu and flash_attention.cu, and it poisons buffers with a
// memset of all-ones bytes (NaN in every float type), not with fill_f32.

extern "C" __global__ void fill_f32(float* __restrict__ out, long long n, float value)
{
    // Grid-stride loop: any grid size covers any n.
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = value;
    }
}

// y[i] = a * x[i] + y[i]
extern "C" __global__ void axpy_f32(float* __restrict__ y, const float* __restrict__ x,
                                    float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}
