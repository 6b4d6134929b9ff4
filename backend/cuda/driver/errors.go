package driver

import (
	"fmt"
	"strings"
	"unsafe"
)

// Error is a failed CUDA driver, NVRTC or cuBLAS call. Its message names the call
// and the library's own name and description of the status, e.g.
//
//	cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)
type Error struct {
	Call string // the C entry point, e.g. "cuLaunchKernel"
	Code int    // the raw status (CUresult, nvrtcResult or cublasStatus_t)
	Name string // the status's name, e.g. "CUDA_ERROR_INVALID_VALUE"
	Desc string // a description where the library gives one
	Log  string // the NVRTC compile log, when there is one
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Call)
	b.WriteString(": ")
	if e.Name != "" {
		b.WriteString(e.Name)
	} else {
		fmt.Fprintf(&b, "status %d", e.Code)
	}
	if e.Desc != "" && e.Desc != e.Name {
		fmt.Fprintf(&b, " (%s)", e.Desc)
	}
	if e.Log != "" {
		b.WriteString("\n")
		b.WriteString(strings.TrimRight(e.Log, "\x00\n "))
	}
	return b.String()
}

// cudaError turns a CUresult into an *Error, asking the driver for the name and
// description. It runs on any thread: cuGetErrorName needs no context.
func (api *driverAPI) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Code: int(r)}
	var p *byte
	if api.cuGetErrorName != 0 && ccall(api.cuGetErrorName, uintptr(r), uintptr(unsafe.Pointer(&p))) == 0 {
		e.Name = goString(p)
	}
	p = nil
	if api.cuGetErrorString != 0 && ccall(api.cuGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&p))) == 0 {
		e.Desc = goString(p)
	}
	if e.Name == "" {
		e.Name = fmt.Sprintf("CUresult %d", r)
	}
	return e
}

// cublasStatusNames covers every status of cublas_api.h, for libraries that lack
// cublasGetStatusName.
var cublasStatusNames = map[int32]string{
	0:  "CUBLAS_STATUS_SUCCESS",
	1:  "CUBLAS_STATUS_NOT_INITIALIZED",
	3:  "CUBLAS_STATUS_ALLOC_FAILED",
	7:  "CUBLAS_STATUS_INVALID_VALUE",
	8:  "CUBLAS_STATUS_ARCH_MISMATCH",
	11: "CUBLAS_STATUS_MAPPING_ERROR",
	13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR",
	15: "CUBLAS_STATUS_NOT_SUPPORTED",
	16: "CUBLAS_STATUS_LICENSE_ERROR",
}
