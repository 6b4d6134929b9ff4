// Package driver is flashgraph's CUDA runtime: bindings to the CUDA driver API,
// NVRTC and cuBLAS made with purego (no cgo), device memory, kernel compilation
// with an on-disk cubin cache, kernel launches, events and batched GEMM.
//
// The package builds, vets and unit-tests with CGO_ENABLED=0 on machines without a
// GPU. The libraries are opened at run time (libcuda.so.1, libnvrtc.so.13 or .12,
// libcublas.so.13 or .12); when one is missing, [Available] and [Open] return an
// error that says which, and nothing panics.
//
// # Threading
//
// A CUDA context is current on one OS thread only; a call from another thread fails
// with CUDA_ERROR_INVALID_CONTEXT (201). A [Device] therefore owns one goroutine,
// locked to its OS thread, and every driver and cuBLAS call of that device runs
// there (see Device.do). All methods of Device are safe for concurrent use; the work
// they enqueue is ordered on the device's single stream, so a Memset, a Launch and a
// CopyToHost issued one after the other from one goroutine happen in that order on
// the GPU.
//
// # Kernels
//
// Kernels are CUDA C++ compiled by NVRTC at run time for the device's own
// architecture (sm_90a on an H200). Entry points must be declared extern "C" so that
// [Module.Function] finds them by their plain name. Arguments are passed by value
// from Go as DevicePtr, int32, uint32, int64, uint64, float32 or float64, matching
// the kernel's parameter types exactly (no implicit conversions happen).
//
// # Memory
//
// Every cuMemAlloc of a Device (Alloc, the cuBLAS workspace, the sm90 schedule)
// is counted until it is freed: [Device.AllocatedBytes] and
// [Device.PeakAllocatedBytes] give the bytes live and their peak since
// [Device.ResetPeakAllocated], which is what a benchmark reports as the memory
// a step took. cuMemGetInfo ([Device.MemInfo]) counts every process on the GPU,
// so it answers "will this fit" rather than "what did we take".
package driver
