// Package cuda is flashgraph's CUDA backend: the executor that lowers a
// graph to kernel launches and cuBLAS calls on one device, with a static
// memory plan, replayed as a CUDA graph, and the attention launchers.
//
// The device itself (bindings to the CUDA driver API, NVRTC, cuBLAS and
// NCCL made with purego, memory, compilation, launches) is package
// [github.com/flashgraph/flashgraph/backend/cuda/driver]; its types keep
// their names here (Device, DevicePtr, Open, Available, Upload, ...), so a
// caller needs only this package. Like the driver, the package builds,
// vets and unit-tests on machines without a GPU.
package cuda
