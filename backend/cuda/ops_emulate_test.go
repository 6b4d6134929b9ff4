package cuda

// The kernels of ops_spatial.go and ops_misc.go run on the CPU: ops.cu is C++
// once the CUDA keywords are defined away (as TestOpsHostSyntax parses it),
// and a grid-stride loop launched as one block of one thread visits every
// element. The launches the lowerings build without a device are replayed by
// a host program over a memory image holding the graph's inputs, and every
// output must equal the CPU backend's bit for bit: the kernels do the
// reference's double arithmetic in the reference's order (LRN's power aside:
// see ulps). This checks the
// kernels' index math and arguments without a GPU; NVRTC and the device's
// math library are left to TestOpsKernelsCompile and TestConformance.

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda/internal/cudatest"

	"github.com/flashgraph/flashgraph/backend"
	"github.com/flashgraph/flashgraph/backend/cpu"
	"github.com/flashgraph/flashgraph/graph"
)

// emulationHost defines the CUDA built-ins the prelude declares, for one
// thread of one block, and P, a pointer into the memory image that converts
// to any pointer parameter.
const emulationHost = `
#include <cstring>
#include <cstdio>
#include <cstdlib>
uint3s threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, gridDim = {1, 1, 1}, blockDim = {1, 1, 1};
float4 make_float4(float a, float b, float c, float d) { float4 v = {a, b, c, d}; return v; }
float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
double __longlong_as_double(long long v) { double d; memcpy(&d, &v, 8); return d; }
long long __double_as_longlong(double d) { long long v; memcpy(&v, &d, 8); return v; }
template <class T> T __shfl_xor_sync(unsigned, T v, int) { return v; }
template <class T> T __shfl_sync(unsigned, T v, int) { return v; }
void __syncthreads() {}
int __popc(unsigned v) { return __builtin_popcount(v); }
int atomicCAS(int* a, int c, int v) { int o = *a; if (o == c) *a = v; return o; }
unsigned atomicCAS(unsigned* a, unsigned c, unsigned v) { unsigned o = *a; if (o == c) *a = v; return o; }
unsigned long long atomicCAS(unsigned long long* a, unsigned long long c, unsigned long long v) { unsigned long long o = *a; if (o == c) *a = v; return o; }
unsigned atomicOr(unsigned* a, unsigned v) { unsigned o = *a; *a |= v; return o; }
float atomicAdd(float* a, float v) { float o = *a; *a += v; return o; }
double atomicAdd(double* a, double v) { double o = *a; *a += v; return o; }
int max(int a, int b) { return a > b ? a : b; }
int min(int a, int b) { return a < b ? a : b; }
struct P {
    char* p;
    template <class T> operator T*() const { return (T*)p; }
};
`

// emulationCase is one node of the emulation graph.
type emulationCase struct {
	op     string
	attrs  graph.Attrs
	inputs [][]int // float inputs' shapes
	outs   int
}

func emulationCases() []emulationCase {
	var cs []emulationCase
	add := func(op string, attrs graph.Attrs, outs int, inputs ...[]int) {
		cs = append(cs, emulationCase{op, attrs, inputs, outs})
	}
	s := func(d ...int) []int { return d }
	add("Conv", graph.Attrs{"pads": graph.Ints(1, 1, 1, 1)}, 1, s(1, 2, 5, 5), s(3, 2, 3, 3), s(3))
	add("Conv", graph.Attrs{"strides": graph.Ints(2, 2), "dilations": graph.Ints(2, 1)}, 1, s(2, 1, 7, 6), s(2, 1, 2, 2))
	add("Conv", graph.Attrs{"group": graph.Int(2), "pads": graph.Ints(0, 2)}, 1, s(1, 4, 9), s(6, 2, 3), s(6))
	add("Conv", graph.Attrs{}, 1, s(1, 1, 3, 4, 4), s(1, 1, 2, 2, 2))
	add("ConvTranspose", graph.Attrs{"strides": graph.Ints(2, 2), "pads": graph.Ints(1, 0, 0, 1)}, 1, s(1, 2, 3, 4), s(2, 3, 3, 3), s(3))
	add("ConvTranspose", graph.Attrs{"group": graph.Int(2), "strides": graph.Ints(3), "output_padding": graph.Ints(1), "dilations": graph.Ints(2)}, 1, s(2, 4, 5), s(4, 1, 2))
	add("ConvTranspose", graph.Attrs{"strides": graph.Ints(2, 1, 2), "pads": graph.Ints(0, 1, 1, 1, 0, 0)}, 1, s(1, 2, 2, 3, 2), s(2, 2, 3, 2, 3))
	for _, op := range []string{"MaxPool", "AveragePool"} {
		for _, a := range []graph.Attrs{
			{"kernel_shape": graph.Ints(3, 3), "pads": graph.Ints(1, 1, 1, 1), "count_include_pad": graph.Int(1)},
			{"kernel_shape": graph.Ints(3, 3), "pads": graph.Ints(1, 1, 1, 1)},
			{"kernel_shape": graph.Ints(3, 2), "strides": graph.Ints(2, 2), "ceil_mode": graph.Int(1)},
			{"kernel_shape": graph.Ints(2), "dilations": graph.Ints(2), "pads": graph.Ints(1, 0)},
			{"kernel_shape": graph.Ints(2, 3), "strides": graph.Ints(2, 1), "pads": graph.Ints(1, 1, 0, 1), "storage_order": graph.Int(1)},
		} {
			x := s(2, 2, 5, 4)
			if len(a.IntList("kernel_shape")) == 1 {
				x = s(1, 3, 8)
			}
			attrs := graph.Attrs{}
			for k, v := range a {
				if (op == "MaxPool" && k == "count_include_pad") || (op == "AveragePool" && k == "storage_order") {
					continue
				}
				attrs[k] = v
			}
			outs := 1
			if op == "MaxPool" {
				outs = 2
			}
			add(op, attrs, outs, x)
		}
	}
	for _, a := range []graph.Attrs{
		{"sizes": graph.Ints(1, 2, 7, 9), "scales": graph.Floats(1, 1, 7.0/3, 9.0/4)},
		{"sizes": graph.Ints(2, 3, 2), "scales": graph.Floats(1, 0.5, 0.4), "coordinate_transformation_mode": graph.Str("asymmetric"), "nearest_mode": graph.Str("floor")},
		{"sizes": graph.Ints(2, 3, 2), "scales": graph.Floats(1, 0.5, 0.4), "coordinate_transformation_mode": graph.Str("tf_half_pixel_for_nn"), "nearest_mode": graph.Str("ceil")},
		{"sizes": graph.Ints(1, 1, 7, 3), "scales": graph.Floats(1, 1, 1.75, 0.75), "mode": graph.Str("linear"), "coordinate_transformation_mode": graph.Str("align_corners")},
		{"sizes": graph.Ints(1, 1, 7, 1), "scales": graph.Floats(1, 1, 1.75, 0.25), "mode": graph.Str("linear"), "coordinate_transformation_mode": graph.Str("pytorch_half_pixel")},
		{"sizes": graph.Ints(1, 1, 8, 3), "scales": graph.Floats(1, 1, 1.6, 0.75), "mode": graph.Str("cubic"), "exclude_outside": graph.Int(1), "cubic_coeff_a": graph.Float(-0.5)},
		{"sizes": graph.Ints(1, 1, 8, 3), "scales": graph.Floats(1, 1, 1.6, 0.75), "mode": graph.Str("cubic"), "nearest_mode": graph.Str("round_prefer_ceil")},
		{"sizes": graph.Ints(1, 1, 3, 3), "scales": graph.Floats(1, 1, 0.75, 0.75), "mode": graph.Str("linear"), "coordinate_transformation_mode": graph.Str("tf_crop_and_resize"),
			"roi": graph.Floats(0, 0, 0.4, -0.2, 1, 1, 1.3, 0.7), "extrapolation_value": graph.Float(10)},
	} {
		x := s(1, 1, 4, 4)
		switch sz := a.IntList("sizes"); {
		case len(sz) == 3:
			x = s(2, 6, 5)
		case sz[1] == 2:
			x = s(1, 2, 3, 4)
		case sz[2] == 8:
			x = s(1, 1, 5, 4)
		}
		add("Interpolate", a, 1, x)
	}
	for _, mode := range []string{"bilinear", "nearest", "bicubic"} {
		for _, pad := range []string{"zeros", "border", "reflection"} {
			for _, align := range []int64{0, 1} {
				add("GridSample", graph.Attrs{"mode": graph.Str(mode), "padding_mode": graph.Str(pad), "align_corners": graph.Int(align)}, 1, s(2, 2, 4, 5), s(2, 3, 4, 2))
			}
		}
	}
	for _, a := range []graph.Attrs{
		{"output_height": graph.Int(3), "output_width": graph.Int(2), "spatial_scale": graph.Float(0.5)},
		{"mode": graph.Str("max"), "output_height": graph.Int(2), "output_width": graph.Int(2), "sampling_ratio": graph.Int(2)},
		{"coordinate_transformation_mode": graph.Str("output_half_pixel"), "output_height": graph.Int(2), "output_width": graph.Int(3)},
	} {
		add("RoiAlign", a, 1, s(2, 3, 6, 7), s(4, 4))
	}
	add("LRN", graph.Attrs{"size": graph.Int(3)}, 1, s(2, 5, 3, 2))
	add("LRN", graph.Attrs{"size": graph.Int(2), "alpha": graph.Float(0.02), "beta": graph.Float(0.5), "bias": graph.Float(2)}, 1, s(1, 4, 6))
	add("Det", nil, 1, s(2, 2))
	add("Det", nil, 1, s(3, 4, 4))
	add("Det", nil, 1, s(2, 1, 3, 3))
	for _, e := range []struct {
		eq     string
		shapes [][]int
	}{
		{"ij,jk->ik", [][]int{{3, 4}, {4, 5}}},
		{"...ii->...i", [][]int{{2, 3, 3}}},
		{"kji", [][]int{{2, 3, 4}}},
		{"i,i,ij", [][]int{{4}, {4}, {4, 2}}},
		{"bij,bjk->bik", [][]int{{2, 2, 3}, {2, 3, 2}}},
		{"ii", [][]int{{3, 3}}},
	} {
		add("Einsum", graph.Attrs{"equation": graph.Str(e.eq)}, 1, e.shapes...)
	}
	for _, a := range []graph.Attrs{
		{"axis": graph.Int(1), "largest": graph.Int(1)},
		{"axis": graph.Int(0), "largest": graph.Int(0)},
		{"axis": graph.Int(-1), "largest": graph.Int(1)},
	} {
		add("TopK", a, 2, s(3, 6, 5))
	}
	return cs
}

// emulationGraph builds every case as a node of one graph, with random
// feeds: values on a coarse grid (ties for MaxPool and TopK), rois around
// the image, batch indices in range.
func emulationGraph(t *testing.T, dt graph.DType) (*graph.Graph, map[string]*graph.Tensor) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	b := graph.NewBuilder("emulation")
	feeds := map[string]*graph.Tensor{}
	var outs []*graph.Value
	for i, c := range emulationCases() {
		var ins []*graph.Value
		for j, s := range c.inputs {
			name := fmt.Sprintf("n%d_in%d", i, j)
			v := b.Input(name, dt, s...)
			tn := graph.NewTensor(dt, graph.Shape(s))
			for k := range tn.Len() {
				x := math.Round(rng.NormFloat64()*8) / 4 // ties
				switch {
				case c.op == "RoiAlign" && j == 1:
					x = 8*rng.Float64() - 1
				case c.op == "GridSample" && j == 1:
					x = 1.3 * (2*rng.Float64() - 1)
				case c.op != "MaxPool" && c.op != "TopK":
					x = rng.NormFloat64()
				}
				tn.Set(k, x)
			}
			feeds[name] = tn
			ins = append(ins, v)
		}
		switch c.op {
		case "RoiAlign":
			name := fmt.Sprintf("n%d_batch", i)
			ins = append(ins, b.Input(name, graph.Int64, 4))
			tn := graph.NewTensor(graph.Int64, graph.Shape{4})
			copy(tn.I64, []int64{0, 1, 1, 0})
			feeds[name] = tn
		case "TopK":
			ins = append(ins, b.Ints(3))
		}
		if c.outs > 1 {
			outs = append(outs, b.OpN(c.op, c.attrs, ins...)...)
		} else {
			outs = append(outs, b.Op(c.op, c.attrs, ins...))
		}
	}
	// MaxPool copies int64 maxima exactly (one past 2^53 here).
	xi := b.Input("maxpool_int64", graph.Int64, 1, 3, 4, 4)
	ti := graph.NewTensor(graph.Int64, graph.Shape{1, 3, 4, 4})
	for k := range ti.I64 {
		ti.I64[k] = rng.Int64N(2001) - 1000
	}
	ti.I64[5] = 1<<53 + 1
	feeds["maxpool_int64"] = ti
	outs = append(outs, b.Op("MaxPool", graph.Attrs{"kernel_shape": graph.Ints(2, 2), "strides": graph.Ints(2, 2)}, xi))
	// TfIdfVectorizer: each mode, X of rank 1, no weights, longer grams only.
	tfidf := []graph.Attrs{tfidfAttrs("TF"), tfidfAttrs("IDF"), tfidfAttrs("TFIDF"), tfidfAttrs("TFIDF"), tfidfAttrs("TFIDF")}
	delete(tfidf[3], "weights")
	tfidf[4]["min_gram_length"], tfidf[4]["max_skip_count"] = graph.Int(2), graph.Int(0)
	for i, a := range tfidf {
		name := fmt.Sprintf("tfidf%d", i)
		shape := graph.Shape{3, 9}
		if i == 3 {
			shape = graph.Shape{11}
		}
		tx := graph.NewTensor(graph.Int64, shape)
		for k := range tx.I64 {
			tx.I64[k] = rng.Int64N(4)
		}
		feeds[name] = tx
		outs = append(outs, b.Op("TfIdfVectorizer", a, b.Input(name, graph.Int64, shape...)))
	}
	b.Output(outs...)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g, feeds
}

type emulatedLaunch struct {
	entry string
	args  []any
}

// TestSpatialKernelsEmulated: see the top of the file.
func TestSpatialKernelsEmulated(t *testing.T) {
	gxx := cudatest.HostCXX86(t)
	if testing.Short() {
		t.Skip("compiles ops.cu with g++ (-short)")
	}
	for _, dt := range []graph.DType{graph.Float64, graph.Float32, graph.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) { emulate(t, gxx, dt) })
	}
}

func emulate(t *testing.T, gxx string, dt graph.DType) {
	g, feeds := emulationGraph(t, dt)
	exe, err := cpu.New().Compile(g, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := exe.Run(feeds)
	if err != nil {
		t.Fatal(err)
	}
	exe.Close()

	var launches []emulatedLaunch
	// Uploaded tables go at 2^40 on, laid out after the arena below.
	const tablesFrom = DevicePtr(1 << 40)
	var tables []byte
	hooks := renderHooks{
		launched: func(entry string, args []any) {
			launches = append(launches, emulatedLaunch{entry, append([]any(nil), args...)})
		},
		uploaded: func(data []byte) DevicePtr {
			at := tablesFrom.Offset(len(tables))
			tables = append(tables, data...)
			tables = append(tables, make([]byte, (256-len(data)%256)%256)...)
			return at
		},
	}
	lines, bufs := renderKernelsWith(t, g, PlanOptions{}, hooks)
	for _, l := range lines {
		if strings.Contains(l, "needs a device") {
			t.Fatal(l)
		}
	}
	if len(launches) != len(g.Nodes) {
		t.Fatalf("%d launches for %d nodes", len(launches), len(g.Nodes))
	}
	// The image: the flag at 0, then the arena and the inputs from offset
	// 256 (renderKernels puts the flag at 2^32, the arena at 2^33).
	const flagAt, arenaAt = DevicePtr(1 << 32), DevicePtr(1 << 33)
	tablesAt := -1
	offset := func(p DevicePtr) (int, bool) {
		switch {
		case p == flagAt:
			return 0, true
		case p >= tablesFrom && tablesAt >= 0:
			return tablesAt + int(p-tablesFrom), true
		case p >= arenaAt && p < tablesFrom:
			return 256 + int(p-arenaAt), true
		}
		return 0, false
	}
	size := 256
	for _, buf := range bufs {
		if o, ok := offset(buf.ptr); ok {
			size = max(size, o+buf.bytes())
		}
	}
	tablesAt = (size + 255) &^ 255
	size = tablesAt + len(tables)
	image := make([]byte, size)
	copy(image[tablesAt:], tables)
	for name, tn := range feeds {
		var v *graph.Value
		for _, in := range g.Inputs {
			if in.Name == name {
				v = in
			}
		}
		o, ok := offset(bufs[v].ptr)
		if !ok {
			t.Fatalf("input %s at %#x", name, bufs[v].ptr)
		}
		for i := range tn.Len() {
			switch tn.DType {
			case graph.Float32:
				binary.LittleEndian.PutUint32(image[o+4*i:], math.Float32bits(tn.F32[i]))
			case graph.BFloat16: // F32 holds values already rounded to bfloat16
				binary.LittleEndian.PutUint16(image[o+2*i:], uint16(math.Float32bits(tn.F32[i])>>16))
			case graph.Float64:
				binary.LittleEndian.PutUint64(image[o+8*i:], math.Float64bits(tn.F64[i]))
			case graph.Int64:
				binary.LittleEndian.PutUint64(image[o+8*i:], uint64(tn.I64[i]))
			}
		}
	}

	var src strings.Builder
	src.WriteString(opsSyntaxPrelude + "\n" + opsSource(t) + emulationHost)
	src.WriteString(`int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    char* mem = (char*)calloc(1, ` + strconv.Itoa(size) + `);
    if (f == 0 || fread(mem, 1, ` + strconv.Itoa(size) + `, f) != ` + strconv.Itoa(size) + `) return 2;
    fclose(f);
`)
	for _, l := range launches {
		var args []string
		for _, a := range l.args {
			args = append(args, cArg(t, a, offset))
		}
		fmt.Fprintf(&src, "    %s(%s);\n", l.entry, strings.Join(args, ", "))
	}
	src.WriteString(`    f = fopen(argv[2], "wb");
    if (f == 0 || fwrite(mem, 1, ` + strconv.Itoa(size) + `, f) != ` + strconv.Itoa(size) + `) return 3;
    fclose(f);
    return 0;
}
`)
	dir := t.TempDir()
	cpp, bin := filepath.Join(dir, "emulate.cpp"), filepath.Join(dir, "emulate")
	if err := os.WriteFile(cpp, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gxx, "-std=c++17", "-O0", "-ffp-contract=off", "-w", "-o", bin, cpp).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	in, out := filepath.Join(dir, "in.bin"), filepath.Join(dir, "out.bin")
	if err := os.WriteFile(in, image, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command(bin, in, out).CombinedOutput(); err != nil {
		t.Fatalf("the emulation: %v\n%s", err, msg)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if flag := binary.LittleEndian.Uint32(got); flag != 0 {
		t.Errorf("the kernels set the error flag: code %d (node %s)", flag, g.Nodes[flag-1].Name)
	}
	compared := 0
	defer func() {
		if compared != len(g.Outputs) {
			t.Errorf("compared %d outputs of %d", compared, len(g.Outputs))
		}
	}()
	for i, n := range g.Nodes {
		for _, v := range n.Outputs {
			w := want[v.Name]
			if w == nil {
				continue // not a graph output (the int64 MaxPool's Indices)
			}
			compared++
			o, _ := offset(bufs[v].ptr)
			bad := 0
			for k := range w.Len() {
				var gv float64
				switch w.DType {
				case graph.Float32:
					gv = float64(math.Float32frombits(binary.LittleEndian.Uint32(got[o+4*k:])))
				case graph.BFloat16:
					gv = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(got[o+2*k:])) << 16))
				case graph.Float64:
					gv = math.Float64frombits(binary.LittleEndian.Uint64(got[o+8*k:]))
				case graph.Int64:
					gv = float64(int64(binary.LittleEndian.Uint64(got[o+8*k:])))
				}
				wv := w.At(k)
				if gv != wv && !(math.IsNaN(gv) && math.IsNaN(wv)) && !(n.Op == "LRN" && ulps(gv, wv) <= 4) {
					if bad++; bad <= 3 {
						t.Errorf("node %d %s %v, output %s[%d]: kernel %v, reference %v", i, n.Op, n.Attrs, v.Name, k, gv, wv)
					}
				}
			}
		}
	}
}

// ulps is how many float64 steps apart a and b are (same sign). LRN's
// power is the one result the host's C library computes differently from Go
// (math.Pow is not correctly rounded; glibc's pow is): a few ulps.
func ulps(a, b float64) int64 {
	if (a < 0) != (b < 0) {
		return math.MaxInt64
	}
	d := int64(math.Float64bits(math.Abs(a))) - int64(math.Float64bits(math.Abs(b)))
	if d < 0 {
		d = -d
	}
	return d
}

// cArg writes a launch argument as a C++ expression of its parameter's type.
func cArg(t *testing.T, a any, offset func(DevicePtr) (int, bool)) string {
	switch v := a.(type) {
	case DevicePtr:
		if v == 0 {
			return "P{0}"
		}
		o, ok := offset(v)
		if !ok {
			t.Fatalf("pointer %#x outside the image", v)
		}
		return fmt.Sprintf("P{mem + %d}", o)
	case int64:
		return fmt.Sprintf("(i64)%dLL", v)
	case int32:
		return fmt.Sprintf("(int)%d", v)
	case uint32:
		return fmt.Sprintf("(unsigned)%du", v)
	case uint64:
		return fmt.Sprintf("(u64)%dull", v)
	case float64:
		return cFloat(v, "double")
	case float32:
		return cFloat(float64(v), "float")
	}
	t.Fatalf("argument of type %T", a)
	return ""
}

func cFloat(v float64, typ string) string {
	switch {
	case math.IsNaN(v):
		return "(" + typ + ")__builtin_nan(\"\")"
	case math.IsInf(v, 1):
		return "(" + typ + ")__builtin_inf()"
	case math.IsInf(v, -1):
		return "(" + typ + ")-__builtin_inf()"
	}
	return "(" + typ + ")" + strconv.FormatFloat(v, 'x', -1, 64)
}
