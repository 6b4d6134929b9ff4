// racecheck_mbarrier.cu: does compute-sanitizer's racecheck take an mbarrier
// arrive / try_wait as ordering shared-memory accesses?
//   nvcc -gencode=arch=compute_90a,code=sm_90a -o mb racecheck_mbarrier.cu
//   compute-sanitizer --tool racecheck ./mb          # per-thread arrivals
//   compute-sanitizer --tool racecheck ./mb lane0    # lane 0 arrives for the warp
// On the H200 (CUDA 13.0): 0 hazards, then 3. The persistent forward of
// kernels/flash_sm90_fwd.cuh has every consumer thread arrive on its
// Q-release barrier for this reason (BENCHMARKS.md, Checks).
// Thread 0 (producer) writes a slot with st.shared, then arrives on `full`;
// warp 1 (consumer) waits on `full`, reads the slot, arrives on `empty`; the
// producer waits on `empty` before rewriting. Correct by construction.
#include <cstdio>
__device__ __forceinline__ unsigned su(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void arrive(unsigned b) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(b) : "memory"); }
__device__ __forceinline__ void waitp(unsigned b, unsigned par) {
  asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" :: "r"(b), "r"(par) : "memory");
}
// lane0: only lane 0 of the consumer warp arrives on `empty` (count 1),
// after a __syncwarp, as the persistent forward did.
__global__ void k(int* out, int rounds, int lane0) {
  __shared__ __align__(8) unsigned long long bars[2];
  __shared__ int slot;
  unsigned full = su(&bars[0]), empty = su(&bars[1]);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(full));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(empty), "r"(lane0 ? 1 : 32));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  int acc = 0;
  for (int r = 0; r < rounds; r++) {
    if (threadIdx.x == 0) {
      if (r > 0) waitp(empty, (r - 1) & 1);
      asm volatile("st.shared.b32 [%0], %1;" :: "r"(su(&slot)), "r"(r + 1) : "memory");
      arrive(full);
    } else if (threadIdx.x >= 32) {
      waitp(full, r & 1);
      int v;
      asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(su(&slot)) : "memory");
      acc += v;
      if (lane0) {
        __syncwarp();
        if (threadIdx.x == 32) arrive(empty);
      } else {
        arrive(empty);
      }
    }
  }
  if (threadIdx.x >= 32) out[threadIdx.x - 32] = acc;
}
int main(int argc, char** argv) {
  int* d; cudaMalloc(&d, 32 * sizeof(int));
  k<<<1, 64>>>(d, 4, argc > 1);
  int h[32]; cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  printf("mbar_race: consumer sum %d (want 10), %s\n", h[0], cudaGetErrorString(cudaGetLastError()));
  return h[0] == 10 ? 0 : 1;
}
