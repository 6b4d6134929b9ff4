package codegen

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"

	"github.com/flashgraph/flashgraph/graph"
)

// An op whose expression reads attributes is rendered at the node's
// values, baked into the C as literals: the defaults where the node has
// none, a string attribute's choice of form, and a body step's own values.
func TestExprCAttributes(t *testing.T) {
	for _, c := range []struct {
		op    string
		attrs graph.Attrs
		want  string
		not   string
	}{
		{"LeakyRelu", nil, "a0 * (float)0.01", ""},
		{"LeakyRelu", graph.Attrs{"alpha": graph.Float(0.25)}, "a0 * (float)0.25", "0.01"},
		{"Selu", graph.Attrs{"alpha": graph.Float(2), "gamma": graph.Float(3)}, "(float)3 * ", ""},
		{"HardSigmoid", graph.Attrs{"alpha": graph.Float(0.125), "beta": graph.Float(0.375)}, "(float)0.125 * a0) + (float)0.375", ""},
		{"Gelu", nil, "erff(", "tanhf("},
		{"Gelu", graph.Attrs{"approximate": graph.Str("tanh")}, "tanhf(", "erff("},
		{"Mod", graph.Attrs{"fmod": graph.Int(1)}, "fmodf(a0, a1)", "?"},
		{"Shrink", graph.Attrs{"bias": graph.Float(1.5), "lambd": graph.Float(2)}, "(float)-2 > a0", ""},
	} {
		args := []string{"a0", "a1"}
		got, err := OpExpr(c.op, c.attrs, "float", args)
		if err != nil {
			t.Errorf("%s %v: %v", c.op, c.attrs, err)
			continue
		}
		if !strings.Contains(got, c.want) || (c.not != "" && strings.Contains(got, c.not)) {
			t.Errorf("%s %v: %s; want %q in it and not %q", c.op, c.attrs, got, c.want, c.not)
		}
	}
	// A step's attributes reach its code; a node's reach its one-step program.
	sh := graph.Shape{16}
	f32 := Buffer{Addr: 0x2000, DType: graph.Float32, N: 16}
	p := &Elementwise{Shape: sh, Ins: []Operand{BroadcastOperand(f32, sh, sh)}, Outs: []int{0}, OutBufs: []Buffer{f32},
		Steps: []graph.FusedStep{{Op: "Elu", Attrs: graph.Attrs{"alpha": graph.Float(0.75)}, Args: []graph.FusedOperand{{Index: 0}}}}}
	k, err := p.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if src := k.Source; !strings.Contains(src, "(float)0.75 * ") {
		t.Errorf("Elu{alpha=0.75}: the literal is not in\n%s", src)
	}
	// Integer remainder raises the node's flag on a zero divisor.
	i64 := Buffer{Addr: 0x1000, DType: graph.Int64, N: 16}
	p = &Elementwise{Shape: sh, Ins: []Operand{BroadcastOperand(i64, sh, sh), BroadcastOperand(i64, sh, sh)}, Outs: []int{0}, OutBufs: []Buffer{i64},
		Steps: []graph.FusedStep{{Op: "Mod", Attrs: graph.Attrs{"fmod": graph.Int(0)}, Args: []graph.FusedOperand{{Index: 0}, {Index: 1}}}}}
	if k, err = p.Generate(); err != nil {
		t.Fatal(err)
	}
	if !k.UsesFlag || !strings.Contains(k.Source, "fg_imod(a0, a1, flag, code)") {
		t.Errorf("int64 Mod: usesFlag %v:\n%s", k.UsesFlag, k.Source)
	}
}

// ewSyntaxPrelude stubs what generated elementwise kernels use of CUDA, so
// that a host C++ compiler parses them; the math functions come from
// <cmath>, as NVRTC's math API provides them on the device.
const ewSyntaxPrelude = `#include <cmath>
using namespace std;
#define __device__
#define __global__
#define __forceinline__
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
struct uint3s { unsigned x, y, z; };
extern uint3s threadIdx, blockIdx, gridDim, blockDim;
int atomicCAS(int*, int, int);
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };
float __half2float(__half);
__half __float2half_rn(float);
float __bfloat162float(__nv_bfloat16);
__nv_bfloat16 __float2bfloat16_rn(float);
`

// TestEwKernelsHostSyntax parses the generated kernel of every op defined
// by an expression (at its default attributes), in float, double and, where
// the op has one, its integer form, with the host's g++ (-fsyntax-only;
// skipped where there is none): a primitive rendered as C that does not
// exist, or an unbalanced expression, fails here rather than in NVRTC.
func TestEwKernelsHostSyntax(t *testing.T) {
	gxx := cudatest.HostCXX(t)
	sh := graph.Shape{16}
	var unit strings.Builder
	for _, spec := range graph.ExprOps() {
		m, err := spec.MapFor(nil)
		if err != nil {
			t.Fatal(err)
		}
		dts := []graph.DType{graph.Float32, graph.Float64}
		if m.Int != nil {
			dts = append(dts, graph.Int64)
		}
		for _, dt := range dts {
			in := Buffer{Addr: 0x1000, DType: dt, N: 16}
			p := &Elementwise{Shape: sh, Outs: []int{0}, OutBufs: []Buffer{{Addr: 0x2000, DType: dt, N: 16}}}
			st := graph.FusedStep{Op: spec.Name, Attrs: graph.ExprStepAttrs(spec.Name, nil)}
			for i := range spec.Inputs {
				p.Ins = append(p.Ins, BroadcastOperand(in, sh, sh))
				st.Args = append(st.Args, graph.FusedOperand{Index: i})
			}
			p.Steps = []graph.FusedStep{st}
			k, err := p.Generate()
			if err != nil {
				t.Errorf("%s (%v): %v", spec.Name, dt, err)
				continue
			}
			src := k.Source
			// One unit: each kernel under a namespace of its own, the
			// CUDA headers it includes stubbed by the prelude.
			var body strings.Builder
			for _, line := range strings.Split(src, "\n") {
				if !strings.HasPrefix(line, "#include") {
					body.WriteString(line + "\n")
				}
			}
			unit.WriteString("namespace k_" + strings.ToLower(spec.Name) + "_" + dt.String() + " {\n" + body.String() + "}\n")
		}
	}
	path := filepath.Join(t.TempDir(), "ew.cpp")
	if err := os.WriteFile(path, []byte(ewSyntaxPrelude+unit.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gxx, "-std=c++17", "-fsyntax-only", path).CombinedOutput(); err != nil {
		t.Errorf("generated elementwise kernels do not parse as C++ with CUDA stubbed: %v\n%s", err, out)
	}
}
