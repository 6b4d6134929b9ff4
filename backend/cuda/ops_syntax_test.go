package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"
)

// opsSyntaxPrelude lets a host C++ compiler parse ops.cu: the CUDA keywords
// defined away and the built-ins it calls declared, so that what is left is
// C++ whose every name must be declared before use and whose templates are
// instantiated by the entry points.
const opsSyntaxPrelude = `#include <cstddef>
#define __device__
#define __global__
#define __forceinline__
#define __restrict__
#define __shared__
#define __launch_bounds__(...)
struct uint3s { unsigned x, y, z; };
extern uint3s threadIdx, blockIdx, gridDim, blockDim;
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
float4 make_float4(float, float, float, float);
float __uint_as_float(unsigned);
unsigned __float_as_uint(float);
double __longlong_as_double(long long);
long long __double_as_longlong(double);
template <class T> T __shfl_xor_sync(unsigned, T, int);
template <class T> T __shfl_sync(unsigned, T, int);
void __syncthreads();
int __popc(unsigned);
int atomicCAS(int*, int, int);
unsigned atomicCAS(unsigned*, unsigned, unsigned);
unsigned long long atomicCAS(unsigned long long*, unsigned long long, unsigned long long);
unsigned atomicOr(unsigned*, unsigned);
float atomicAdd(float*, float);
double atomicAdd(double*, double);
#define asm(...) ((void)0)
#include <cmath>
int max(int, int);
int min(int, int);
`

// TestOpsHostSyntax parses ops.cu with the host's g++ (-fsyntax-only;
// skipped where there is none), so that a kernel calling an undeclared
// helper or mistyping one fails here, without NVRTC, rather than on the GPU.
// It checks the parse has teeth: ops.cu without norm_index must fail.
func TestOpsHostSyntax(t *testing.T) {
	gxx := cudatest.HostCXX86(t)
	dir := t.TempDir()
	parse := func(name, src string) (string, error) {
		path := filepath.Join(dir, name+".cpp")
		if err := os.WriteFile(path, []byte(opsSyntaxPrelude+"\n"+src), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(gxx, "-std=c++17", "-fsyntax-only", path).CombinedOutput()
		return string(out), err
	}
	src := opsSource(t)
	if out, err := parse("ops", src); err != nil {
		t.Fatalf("%s does not parse as C++ with the CUDA built-ins stubbed: %v\n%s", opsKernelFile, err, out)
	}
	def := "__device__ __forceinline__ i64 norm_index("
	i := strings.Index(src, def)
	if i < 0 {
		t.Fatalf("%s has no %q", opsKernelFile, def)
	}
	j := i + strings.Index(src[i:], "\n}\n") + 3
	out, err := parse("doctored", src[:i]+src[j:])
	if err == nil || !strings.Contains(out, "norm_index") {
		t.Errorf("%s without norm_index parsed (%v): the check would miss a missing helper\n%s", opsKernelFile, err, out)
	}
}
