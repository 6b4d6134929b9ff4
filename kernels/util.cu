// Small utility kernels: buffer fills and an axpy. The runtime tests launch them,
// and the backend uses fill_f32 to initialise and poison buffers.

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
