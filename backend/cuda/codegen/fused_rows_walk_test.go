package codegen

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"

	"github.com/flashgraph/flashgraph/graph"
)

// Bodies with element steps after the reduction (an RMSNorm forward's
// normalisation, a norm backward's dx) are walked twice per row.
const (
	normForwardBody  = "Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3);Reciprocal(t4);Mul(t0,t5);Mul(t6,i3)"
	normBackwardBody = "Mul(i0,i1);Mul(t0,i2);ReduceSum(t1);Mul(i3,i3);Mul(t3,i3);Mul(t2,t4);Div(t5,i4);Mul(t0,i3);Mul(i2,t6);Sub(t7,t8)"
)

// walkRows builds the row kernel of body over inputs of the given shapes
// and dtype, outputs outs.
func walkRows(t *testing.T, body string, dt graph.DType, outs []int64, ins ...graph.Shape) *Rows {
	t.Helper()
	n := &graph.Node{Name: "norm", Op: "FusedElementwise", Attrs: graph.Attrs{"body": graph.Str(body),
		"outputs": graph.Ints(outs...), "axes": graph.Ints(-1)}}
	var in []graph.TensorType
	for i, s := range ins {
		tt := graph.TensorType{DType: dt, Shape: s}
		in = append(in, tt)
		n.Inputs = append(n.Inputs, &graph.Value{Name: fmt.Sprintf("x%d", i), Type: tt})
	}
	steps, err := graph.ParseFusedBody(body, len(ins))
	if err != nil {
		t.Fatal(err)
	}
	types, err := graph.FusedTypes(steps, in, n.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	bufs := func(k int) Buffer { return Buffer{Addr: uint64(0x10000 * (k + 1)), DType: dt} }
	p, err := NewRows(n, steps, types, bufs, func(k int) Buffer { return bufs(8 + k) })
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The norm forward's kernel walks each row twice: the first walk sums the
// squares and writes the residual sum, the row steps give rstd (written by
// one lane), the second walk recomputes the residual sum from the inputs and
// writes the normalised, scaled row. A step that reads a row value outside
// the second walk, or one the body would need a third walk for, is refused.
func TestRowsWalkTwiceSource(t *testing.T) {
	p := walkRows(t, normForwardBody, graph.BFloat16, []int64{0, 5, 7}, graph.Shape{4, 64, 256}, graph.Shape{4, 64, 256}, graph.Shape{}, graph.Shape{256})
	k, err := p.Generate()
	if err != nil {
		t.Fatal(err)
	}
	src := k.Source
	if k.Vec != 8 || k.Lanes != 32 {
		t.Errorf("vector %d, %d lanes; want 8, 32", k.Vec, k.Lanes)
	}
	walks := strings.Split(src, "for (int it = 0;")
	if len(walks) != 3 {
		t.Fatalf("%d walks over the row, want 2\n%s", len(walks)-1, src)
	}
	shuffles := strings.Index(walks[1], "__shfl_xor_sync")
	if shuffles < 0 {
		t.Fatalf("no shuffles after the first walk\n%s", src)
	}
	first, rowSteps, second := walks[1][:shuffles], walks[1][shuffles:], walks[2]
	for _, c := range []struct {
		part, name, want string
		has              bool
	}{
		{first, "first walk", "a += (float)t1;", true},
		{first, "first walk", "out0 + q + col", true},
		{first, "first walk", "t6 =", false},
		{first, "first walk", "in3", false},
		{first, "first walk", "out2", false},
		{rowSteps, "row steps", "if (row < 256ull) {", true},
		{rowSteps, "row steps", "if (lane == 0) {\n                out1[row] = __float2bfloat16_rn((float)(t5));\n            }", true},
		{second, "second walk", "const float t0 = (float)__bfloat162float(__float2bfloat16_rn((float)(a0 + a1)));", true},
		{second, "second walk", "t6 = (float)__bfloat162float(__float2bfloat16_rn((float)(t0 * t5)))", true},
		{second, "second walk", "*reinterpret_cast<const uint4*>(in3 + e3 + col)", true},
		{second, "second walk", "*reinterpret_cast<uint4*>(out2 + q + col) = *reinterpret_cast<const uint4*>(w2);", true},
		{second, "second walk", "t1 =", false},
		{second, "second walk", "out0", false},
		{second, "second walk", "a +=", false},
	} {
		if strings.Contains(c.part, c.want) != c.has {
			t.Errorf("%s: contains %q is %v, want %v\n%s", c.name, c.want, !c.has, c.has, src)
		}
	}
	// The bfloat16 kernel parses as C++ with the CUDA names stubbed.
	if gxx, err := exec.LookPath("g++"); err == nil && runtime.GOARCH == "amd64" {
		var sb strings.Builder
		sb.WriteString(rowsHost + bf16Host)
		for _, line := range strings.Split(src, "\n") {
			if !strings.HasPrefix(line, "#include") {
				sb.WriteString(line + "\n")
			}
		}
		path := filepath.Join(t.TempDir(), "norm.cpp")
		if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(gxx, "-std=c++20", "-fsyntax-only", path).CombinedOutput(); err != nil {
			t.Errorf("the bfloat16 norm kernel does not parse: %v\n%s\n%s", err, out, src)
		}
	}
	// A body without late steps keeps one walk and the one-lane row block.
	p = walkRows(t, "Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3);Reciprocal(t4)", graph.BFloat16, []int64{0, 5}, graph.Shape{4, 64, 256}, graph.Shape{4, 64, 256}, graph.Shape{})
	if k, err = p.Generate(); err != nil {
		t.Fatal(err)
	}
	if strings.Count(k.Source, "for (int it = 0;") != 1 || !strings.Contains(k.Source, "if (row < 256ull && lane == 0) {") {
		t.Errorf("a body without late steps changed:\n%s", k.Source)
	}
}

// rowsHost runs a generated row kernel on the host: CUDA's keywords defined
// away, each warp's 32 lanes as threads that meet in the shuffles, the warps
// one after another (a row kernel's warps never talk to each other).
const rowsHost = `#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <barrier>
#include <vector>
#define __global__
#define __device__
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
struct dim { unsigned x, y, z; };
thread_local dim threadIdx, blockIdx;
dim gridDim, blockDim;
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
static std::barrier<>* warpBarrier;
static double shuffled[32];
template <class T> T __shfl_xor_sync(unsigned, T v, int o, int width) {
    unsigned lane = threadIdx.x % 32;
    shuffled[lane] = v;
    warpBarrier->arrive_and_wait();
    T r = (T)shuffled[(lane ^ o) % 32];
    warpBarrier->arrive_and_wait();
    if (o >= width) return v;
    return r;
}
`

// bf16Host declares the bfloat16 type and conversions the kernels use.
const bf16Host = `struct __nv_bfloat16 { unsigned short x; };
float __bfloat162float(__nv_bfloat16);
__nv_bfloat16 __float2bfloat16_rn(float);
`

// TestRowsWalkTwiceEmulated runs the norm forward and backward kernels over
// rows that vectors, lane segments and the grid-stride loop split in
// different ways, and checks every output against the norm computed in
// float64 here (the lanes sum in their own order: a relative 1e-5).
func TestRowsWalkTwiceEmulated(t *testing.T) {
	gxx := cudatest.HostCXX86(t)
	dir := t.TempDir()
	for _, c := range []struct {
		rows, cols int
		vec, lanes int
	}{
		{5, 4, 4, 1}, {37, 64, 4, 16}, {11, 200, 4, 32}, {9, 37, 1, 32},
	} {
		R, C := c.rows, c.cols
		val := func(i, k int) float64 { return float64((i*7+k*5)%29)/13 - 1.03 }
		x, res, w, dy, rstdIn := make([]float32, R*C), make([]float32, R*C), make([]float32, C), make([]float32, R*C), make([]float32, R)
		for i := range x {
			x[i], res[i], dy[i] = float32(val(i, 0)), float32(val(i, 1)), float32(val(i, 2))
		}
		for i := range w {
			w[i] = float32(val(i, 3))
		}
		for i := range rstdIn {
			rstdIn[i] = float32(0.5 + val(i, 4)/4)
		}
		const eps = 1e-5
		// Forward: h, rstd, y; backward: dx.
		h, rstd, y, dx := make([]float64, R*C), make([]float64, R), make([]float64, R*C), make([]float64, R*C)
		for r := range R {
			ss, s := 0.0, 0.0
			for j := range C {
				i := r*C + j
				h[i] = float64(x[i]) + float64(res[i])
				ss += h[i] * h[i]
				s += float64(dy[i]) * float64(w[j]) * float64(x[i])
			}
			rstd[r] = 1 / math.Sqrt(ss/float64(C)+eps)
			rs := float64(rstdIn[r])
			for j := range C {
				i := r*C + j
				y[i] = h[i] * rstd[r] * float64(w[j])
				g := float64(dy[i]) * float64(w[j])
				dx[i] = g*rs - float64(x[i])*(s*rs*rs*rs/float64(C))
			}
		}
		shape, row := graph.Shape{R, C}, graph.Shape{R, 1}
		for _, k := range []struct {
			name string
			p    *Rows
			ins  [][]float32
			want [][]float64
		}{
			{"forward", walkRows(t, normForwardBody, graph.Float32, []int64{0, 5, 7}, shape, shape, graph.Shape{}, graph.Shape{C}),
				[][]float32{x, res, {eps}, w}, [][]float64{h, rstd, y}},
			{"backward", walkRows(t, normBackwardBody, graph.Float32, []int64{9}, shape, graph.Shape{C}, shape, row, graph.Shape{}),
				[][]float32{dy, w, x, rstdIn, {float32(C)}}, [][]float64{dx}},
		} {
			name := fmt.Sprintf("%s %dx%d", k.name, R, C)
			kern, err := k.p.Generate()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if kern.Vec != c.vec || kern.Lanes != c.lanes {
				t.Errorf("%s: vector %d, %d lanes; want %d, %d", name, kern.Vec, kern.Lanes, c.vec, c.lanes)
			}
			got := runRowsOnHost(t, gxx, dir, kern, k.ins, k.want)
			for o, want := range k.want {
				for i, wv := range want {
					if g := got[o][i]; math.Abs(g-wv) > 1e-5*math.Max(1, math.Abs(wv)) || math.IsNaN(g) {
						t.Fatalf("%s: output %d[%d] = %v, want %v", name, o, i, g, wv)
					}
				}
			}
		}
	}
}

// TestRowsWalkTwiceThroughAView runs a q-head norm emulated: the heads of
// a [B,S,H,D] projection read through a Transpose view in both walks (the
// second walk loads the view again for x·rstd·w).
func TestRowsWalkTwiceThroughAView(t *testing.T) {
	gxx := cudatest.HostCXX86(t)
	const B, S, H, D = 2, 3, 5, 16
	x, w := make([]float32, B*S*H*D), make([]float32, D)
	for i := range x {
		x[i] = float32((i*7)%29)/13 - 1.03
	}
	for i := range w {
		w[i] = float32((i*5)%11)/7 - 0.6
	}
	const eps = 1e-5
	rstd, y := make([]float64, B*H*S), make([]float64, B*H*S*D)
	for b := range B {
		for h := range H {
			for s := range S {
				r := (b*H+h)*S + s
				at := func(d int) float64 { return float64(x[((b*S+s)*H+h)*D+d]) }
				ss := 0.0
				for d := range D {
					ss += at(d) * at(d)
				}
				rstd[r] = 1 / math.Sqrt(ss/D+eps)
				for d := range D {
					y[r*D+d] = at(d) * rstd[r] * float64(w[d])
				}
			}
		}
	}
	p := walkRows(t, "Transpose<0,2,1,3>(i0);Mul(t0,t0);ReduceMean(t1);Add(t2,i1);Sqrt(t3);Reciprocal(t4);Mul(t0,t5);Mul(t6,i2)",
		graph.Float32, []int64{5, 7}, graph.Shape{B, S, H, D}, graph.Shape{}, graph.Shape{D})
	k, err := p.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if k.Vec != 4 || k.Lanes != 4 || strings.Count(k.Source, "in3 + e3 + col") != 2 {
		t.Errorf("vector %d, %d lanes, want 4 and 4 and the view loaded in both walks\n%s", k.Vec, k.Lanes, k.Source)
	}
	got := runRowsOnHost(t, gxx, t.TempDir(), k, [][]float32{x, {eps}, w, x}, [][]float64{rstd, y})
	for o, want := range [][]float64{rstd, y} {
		for i, wv := range want {
			if g := got[o][i]; math.Abs(g-wv) > 1e-5*math.Max(1, math.Abs(wv)) || math.IsNaN(g) {
				t.Fatalf("output %d[%d] = %v, want %v", o, i, g, wv)
			}
		}
	}
}

// runRowsOnHost compiles kernel k with rowsHost and runs it over one block
// (the grid-stride loop takes the rest of the rows) on float32 inputs ins,
// returning its outputs (sized as want's).
func runRowsOnHost(t *testing.T, gxx, dir string, k Kernel, ins [][]float32, want [][]float64) [][]float64 {
	t.Helper()
	var sb strings.Builder
	sb.WriteString(rowsHost)
	for _, line := range strings.Split(k.Source, "\n") {
		if !strings.HasPrefix(line, "#include") {
			sb.WriteString(strings.Replace(line, `extern "C" `, "", 1) + "\n")
		}
	}
	var args []string
	for i, in := range ins {
		vals := make([]string, len(in))
		for j, v := range in {
			vals[j] = strconv.FormatFloat(float64(v), 'e', -1, 32) + "f"
		}
		fmt.Fprintf(&sb, "alignas(16) float in_%d[] = {%s};\n", i, strings.Join(vals, ","))
		args = append(args, fmt.Sprintf("in_%d", i))
	}
	for o, w := range want {
		fmt.Fprintf(&sb, "alignas(16) float out_%d[%d];\n", o, len(w))
		args = append(args, fmt.Sprintf("out_%d", o))
	}
	fmt.Fprintf(&sb, `int main() {
    gridDim = {1, 1, 1}; blockDim = {256, 1, 1};
    std::barrier<> bar(32);
    warpBarrier = &bar;
    for (unsigned w = 0; w < 8; w++) {
        std::vector<std::thread> lanes;
        for (unsigned l = 0; l < 32; l++) {
            lanes.emplace_back([=] { threadIdx = {w * 32 + l, 0, 0}; blockIdx = {0, 0, 0}; %s(%s); });
        }
        for (auto& th : lanes) th.join();
    }
`, k.Entry, strings.Join(args, ", "))
	for o, w := range want {
		fmt.Fprintf(&sb, "    for (int i = 0; i < %d; i++) printf(\"%%d %%a\\n\", %d, (double)out_%d[i]);\n", len(w), o, o)
	}
	sb.WriteString("    return 0;\n}\n")
	src := filepath.Join(dir, "rows.cpp")
	bin := filepath.Join(dir, "rows")
	if err := os.WriteFile(src, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gxx, "-std=c++20", "-O1", "-pthread", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s\n%s", err, out, sb.String())
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("the host run failed: %v", err)
	}
	got := make([][]float64, len(want))
	for o, w := range want {
		got[o] = make([]float64, len(w))
		for i := range got[o] {
			got[o][i] = math.NaN()
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("bad line %q", line)
		}
		o, _ := strconv.Atoi(f[0])
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Fatalf("bad value %q", f[1])
		}
		for i := range got[o] {
			if math.IsNaN(got[o][i]) {
				got[o][i] = v
				break
			}
		}
	}
	return got
}

// normBackwardWholeBody is an attention or MLP norm's whole backward, as
// fuse_elementwise groups it: dy = i0+i1, dy·w, dy·x̂ (an output: the weight
// gradient's column sum reads it), dy·w·rstd, the row sum of dy·w·x, its
// scaling c, and dx = up + dy·w·rstd + c·x (the second walk recomputes
// dy·w·rstd from the inputs).
const normBackwardWholeBody = "Add(i0,i1);Mul(t0,i2);Mul(t0,i3);Mul(t1,i4);Mul(t1,i5);ReduceSum(t4);Mul(i4,i4);Mul(t6,i4);Mul(t5,t7);Div(t8,i6);Add(i7,t3);Mul(t9,i5);Add(t10,t11)"

// TestRowsNormBackwardOneKernel: the whole norm backward is one row kernel
// that writes dy·x̂ in the first walk and dx in the second, its bfloat16
// source parses as C++, and the float32 kernel run on the host gives both
// outputs computed in float64 here, over rows split in different ways.
func TestRowsNormBackwardOneKernel(t *testing.T) {
	full, row := func(r, c int) graph.Shape { return graph.Shape{r, c} }, func(r int) graph.Shape { return graph.Shape{r, 1} }
	p := walkRows(t, normBackwardWholeBody, graph.BFloat16, []int64{2, 12},
		full(256, 512), full(256, 512), graph.Shape{512}, full(256, 512), row(256), full(256, 512), graph.Shape{}, full(256, 512))
	k, err := p.Generate()
	if err != nil {
		t.Fatal(err)
	}
	walks := strings.Split(k.Source, "for (int it = 0;")
	if len(walks) != 3 {
		t.Fatalf("%d walks over the row, want 2\n%s", len(walks)-1, k.Source)
	}
	first, second := walks[1][:strings.Index(walks[1], "__shfl_xor_sync")], walks[2]
	for _, c := range []struct {
		part, name, want string
		has              bool
	}{
		{first, "first walk", "out0 + q + col", true},
		{first, "first walk", "a += (float)t4;", true},
		{first, "first walk", "in7", false},
		{first, "first walk", "out1", false},
		{second, "second walk", "out1 + q + col", true},
		{second, "second walk", "in7 + e7 + col", true},
		{second, "second walk", "t3 =", true},
		{second, "second walk", "out0", false},
		{second, "second walk", "in3", false},
		{second, "second walk", "a +=", false},
	} {
		if strings.Contains(c.part, c.want) != c.has {
			t.Errorf("%s: contains %q is %v, want %v\n%s", c.name, c.want, !c.has, c.has, k.Source)
		}
	}
	gxx := cudatest.HostCXX86(t)
	var sb strings.Builder
	sb.WriteString(rowsHost + bf16Host)
	for _, line := range strings.Split(k.Source, "\n") {
		if !strings.HasPrefix(line, "#include") {
			sb.WriteString(line + "\n")
		}
	}
	path := filepath.Join(t.TempDir(), "normback.cpp")
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gxx, "-std=c++20", "-fsyntax-only", path).CombinedOutput(); err != nil {
		t.Errorf("the bfloat16 norm backward kernel does not parse: %v\n%s\n%s", err, out, k.Source)
	}
	dir := t.TempDir()
	for _, c := range []struct{ rows, cols, vec, lanes int }{{5, 4, 4, 1}, {37, 64, 4, 16}, {11, 200, 4, 32}, {9, 37, 1, 32}} {
		R, C := c.rows, c.cols
		val := func(i, k int) float32 { return float32((i*7+k*5)%29)/13 - 1.03 }
		d0, d1, w, xhat, rstd, x, up := make([]float32, R*C), make([]float32, R*C), make([]float32, C), make([]float32, R*C), make([]float32, R), make([]float32, R*C), make([]float32, R*C)
		for i := range d0 {
			d0[i], d1[i], xhat[i], x[i], up[i] = val(i, 0), val(i, 1), val(i, 2), val(i, 3), val(i, 4)
		}
		for i := range w {
			w[i] = val(i, 5)
		}
		for i := range rstd {
			rstd[i] = 0.5 + val(i, 6)/4
		}
		gx, dx := make([]float64, R*C), make([]float64, R*C)
		for r := range R {
			rs, s := float64(rstd[r]), 0.0
			for j := range C {
				i := r*C + j
				dy := float64(d0[i]) + float64(d1[i])
				gx[i] = dy * float64(xhat[i])
				s += dy * float64(w[j]) * float64(x[i])
			}
			cr := s * rs * rs * rs / -float64(C)
			for j := range C {
				i := r*C + j
				dy := float64(d0[i]) + float64(d1[i])
				dx[i] = float64(up[i]) + dy*float64(w[j])*rs + cr*float64(x[i])
			}
		}
		p := walkRows(t, normBackwardWholeBody, graph.Float32, []int64{2, 12},
			full(R, C), full(R, C), graph.Shape{C}, full(R, C), row(R), full(R, C), graph.Shape{}, full(R, C))
		kern, err := p.Generate()
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("%dx%d", R, C)
		if kern.Vec != c.vec || kern.Lanes != c.lanes {
			t.Errorf("%s: vector %d, %d lanes; want %d, %d", name, kern.Vec, kern.Lanes, c.vec, c.lanes)
		}
		want := [][]float64{gx, dx}
		got := runRowsOnHost(t, gxx, dir, kern, [][]float32{d0, d1, w, xhat, rstd, x, {-float32(C)}, up}, want)
		for o := range want {
			for i, wv := range want[o] {
				if g := got[o][i]; math.Abs(g-wv) > 1e-5*math.Max(1, math.Abs(wv)) || math.IsNaN(g) {
					t.Fatalf("%s: output %d[%d] = %v, want %v", name, o, i, g, wv)
				}
			}
		}
	}
}
