package attention

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"

	"github.com/flashgraph/flashgraph/kernels"
)

// hostSyntaxPrelude lets a host C++ compiler parse the sm90 units: the CUDA
// keywords and built-ins they use, declared or defined away (asm(...)
// statements defined away; asm volatile(...) left to the parser, which does
// not check their constraints). What is left is C++ whose every name must be declared before
// it is used, templates instantiated by the entry points: a unit that lacks
// a device function, constant or type of the headers fails to parse.
const hostSyntaxPrelude = `#include <cstddef>
#define __device__
#define __global__
#define __forceinline__
#define __restrict__
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
struct uint3s { unsigned x, y, z; };
extern uint3s threadIdx, blockIdx, gridDim, blockDim;
float __int_as_float(int);
int __float_as_int(float);
unsigned __float_as_uint(float);
float __uint_as_float(unsigned);
unsigned long long __cvta_generic_to_shared(const void*);
template <class T> T __shfl_sync(unsigned, T, int);
template <class T> T __shfl_xor_sync(unsigned, T, int);
void __syncthreads();
void __syncwarp(unsigned = 0xffffffffu);
float fmaxf(float, float);
float fminf(float, float);
float __logf(float);
float logf(float);
float log2f(float);
float __fmul_rn(float, float);
float exp2f(float);
int atomicAdd(int*, int);
float atomicAdd(float*, float);
void __threadfence();
int max(int, int);
int min(int, int);
extern "C" void* memcpy(void*, const void*, unsigned long);
#define asm(...) ((void)0)
#define volatile
float fmaf(float, float, float);
void __trap();
#define __shared__
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
int atomicExch(int*, int);
unsigned atomicExch(unsigned*, unsigned);
`

// TestFlashSM90HostSyntax parses each sm90 compile unit, as NVRTC gets it,
// with the host's g++ (-fsyntax-only; skipped where there is none), so that
// a unit missing a definition its kernels use fails here, on a machine
// without NVRTC, rather than on the GPU. It also checks that the parse has
// teeth: the forward unit without tile_masked's definition must fail.
func TestFlashSM90HostSyntax(t *testing.T) {
	gxx := cudatest.HostCXX86(t)
	dir := t.TempDir()
	parse := func(name, src string) (string, error) {
		path := filepath.Join(dir, strings.ReplaceAll(name, "/", "_")+".cpp")
		if err := os.WriteFile(path, []byte(hostSyntaxPrelude+"\n"+src), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(gxx, "-std=c++17", "-fsyntax-only", path).CombinedOutput()
		return string(out), err
	}
	srcs := flashSM90Sources(t)
	for _, f := range flashSM90Files {
		if out, err := parse(f, srcs[f]); err != nil {
			t.Errorf("%s does not parse as C++ with the CUDA built-ins stubbed: %v\n%s", f, err, out)
		}
	}
	fwd := srcs[flashSM90FwdFile]
	def := "__device__ __forceinline__ bool tile_masked("
	i := strings.Index(fwd, def)
	if i < 0 {
		t.Fatalf("%s has no %q", flashSM90FwdFile, def)
	}
	j := i + strings.Index(fwd[i:], "\n}\n") + 3
	out, err := parse("doctored", fwd[:i]+fwd[j:])
	if err == nil || !strings.Contains(out, "tile_masked") {
		t.Errorf("%s without tile_masked parsed (%v): the check would miss a definition a split left out\n%s", flashSM90FwdFile, err, out)
	}
}

// hostSyntaxFA2Prelude adds to hostSyntaxPrelude what flash_attention.cu
// takes from cuda_bf16.h and cuda_fp16.h (whose includes are dropped) and
// the CUDA built-ins only it uses.
const hostSyntaxFA2Prelude = `struct __nv_bfloat16 { unsigned short x; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
struct __half { unsigned short x; };
struct __half2 { __half x, y; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
float __bfloat162float(__nv_bfloat16);
__nv_bfloat16 __float2bfloat16_rn(float);
__nv_bfloat162 __floats2bfloat162_rn(float, float);
float2 __bfloat1622float2(__nv_bfloat162);
float __half2float(__half);
__half __float2half_rn(float);
__half2 __floats2half2_rn(float, float);
float2 __half22float2(__half2);
float expf(float);
float2 make_float2(float, float);
uint2 make_uint2(unsigned, unsigned);
float4 make_float4(float, float, float, float);
float __expf(float);
float fabsf(float);
float2 atomicAdd(float2*, float2);
unsigned atomicAdd(unsigned*, unsigned);
int __ffs(int);
template <class T> T __ldcg(const T*);
`

// hostFA2Source is the host's g++ and kernels/flash_attention.cu without its
// CUDA headers, which hostSyntaxPrelude and hostSyntaxFA2Prelude stand in
// for; the test is skipped where there is no x86-64 g++.
func hostFA2Source(t *testing.T) (gxx, src string) {
	t.Helper()
	gxx = cudatest.HostCXX86(t)
	src, err := kernels.Source("flash_attention.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, inc := range []string{"#include <cuda_bf16.h>", "#include <cuda_fp16.h>"} {
		if !strings.Contains(src, inc) {
			t.Fatalf("flash_attention.cu no longer has %q: update the prelude", inc)
		}
		src = strings.Replace(src, inc, "", 1)
	}
	return gxx, src
}

// TestFlashAttentionHostSyntax parses kernels/flash_attention.cu (FA2's
// forward and backward, the generic, decode and conversion kernels) with the
// host's g++ as TestFlashSM90HostSyntax parses the sm90 units: a call whose
// arguments do not match its device function (a parameter added to one and
// not the other) or a name used and never declared fails here, without
// NVRTC. The parse has teeth: without load_tile's definition it fails.
func TestFlashAttentionHostSyntax(t *testing.T) {
	gxx, src := hostFA2Source(t)
	dir := t.TempDir()
	parse := func(name, src string) (string, error) {
		path := filepath.Join(dir, name+".cpp")
		if err := os.WriteFile(path, []byte(hostSyntaxPrelude+hostSyntaxFA2Prelude+"\n"+src), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(gxx, "-std=c++17", "-fsyntax-only", path).CombinedOutput()
		return string(out), err
	}
	if out, err := parse("flash_attention", src); err != nil {
		t.Errorf("flash_attention.cu does not parse as C++ with the CUDA built-ins stubbed: %v\n%s", err, out)
	}
	def := "__device__ __forceinline__ void load_tile("
	i := strings.Index(src, def)
	if i < 0 {
		t.Fatalf("flash_attention.cu has no %q", def)
	}
	j := i + strings.Index(src[i:], "\n}\n") + 3
	if out, err := parse("doctored", src[:i]+src[j:]); err == nil || !strings.Contains(out, "load_tile") {
		t.Errorf("flash_attention.cu without load_tile parsed (%v): the check has no teeth\n%s", err, out)
	}
}
