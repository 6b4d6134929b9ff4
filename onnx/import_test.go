package onnx

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Hand-built ONNX models: each test states the ONNX semantics it checks and
// compares the CPU backend's result with a reference computed here in float64.

func vi(name string, dt onnxpb.DataType, dims ...int64) *onnxpb.ValueInfo {
	sh := &onnxpb.TensorShape{}
	for _, d := range dims {
		sh.Dim = append(sh.Dim, onnxpb.Dimension{Value: d, HasValue: true})
	}
	return &onnxpb.ValueInfo{Name: name, Type: &onnxpb.Type{Tensor: &onnxpb.TensorType{ElemType: dt, Shape: sh}}}
}

func nd(op string, in, out []string, attrs ...*onnxpb.Attribute) *onnxpb.Node {
	return &onnxpb.Node{OpType: op, Input: in, Output: out, Name: op + "_" + strings.Join(out, "_"), Attribute: attrs}
}

func aInt(name string, v int64) *onnxpb.Attribute {
	return &onnxpb.Attribute{Name: name, Type: onnxpb.AttrInt, I: v}
}

func aInts(name string, v ...int64) *onnxpb.Attribute {
	return &onnxpb.Attribute{Name: name, Type: onnxpb.AttrInts, Ints: v}
}

func aFloat(name string, v float32) *onnxpb.Attribute {
	return &onnxpb.Attribute{Name: name, Type: onnxpb.AttrFloat, F: v}
}

func aStr(name, v string) *onnxpb.Attribute {
	return &onnxpb.Attribute{Name: name, Type: onnxpb.AttrString, S: []byte(v)}
}

func aTensor(name string, t *onnxpb.Tensor) *onnxpb.Attribute {
	return &onnxpb.Attribute{Name: name, Type: onnxpb.AttrTensor, T: t}
}

// modelOf makes a model; outputs are declared without types (checked by the
// importer only where given).
func modelOf(opset int64, inputs []*onnxpb.ValueInfo, inits []*onnxpb.Tensor, outputs []string, nodes ...*onnxpb.Node) *onnxpb.Model {
	g := &onnxpb.Graph{Name: "t", Input: inputs, Initializer: inits, Node: nodes}
	for _, o := range outputs {
		g.Output = append(g.Output, &onnxpb.ValueInfo{Name: o})
	}
	return &onnxpb.Model{IRVersion: 8, OpsetImport: []onnxpb.OperatorSetID{{Version: opset}}, Graph: g}
}

// importAndRun imports through the wire format (so the codec is exercised too)
// and runs the graph on the CPU backend.
func importAndRun(t *testing.T, m *onnxpb.Model, feeds map[string]*graph.Tensor) (*graph.Graph, map[string]*graph.Tensor) {
	t.Helper()
	g, err := ImportBytes(onnxpb.Encode(m))
	if err != nil {
		t.Fatal(err)
	}
	return g, runGraph(t, g, feeds)
}

func randTensor(rng *rand.Rand, dt graph.DType, shape ...int) *graph.Tensor {
	x := graph.NewTensor(dt, graph.Shape(shape))
	for i := range x.Len() {
		x.Set(i, rng.NormFloat64())
	}
	return x
}

func closeTo(t *testing.T, what string, got *graph.Tensor, want []float64, shape graph.Shape, tol float64) {
	t.Helper()
	if !got.Shape.Equal(shape) {
		t.Fatalf("%s: shape %v, want %v", what, got.Shape, shape)
	}
	for i, w := range want {
		if d := math.Abs(got.At(i) - w); got.At(i) != w && !(d <= tol*(1+math.Abs(w))) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got.At(i), w)
		}
	}
}

// softmaxRef normalizes consecutive groups of n elements.
func softmaxRef(x []float64, n int) []float64 {
	out := make([]float64, len(x))
	for s := 0; s < len(x); s += n {
		mx := math.Inf(-1)
		for _, v := range x[s : s+n] {
			mx = max(mx, v)
		}
		sum := 0.0
		for i := s; i < s+n; i++ {
			out[i] = math.Exp(x[i] - mx)
			sum += out[i]
		}
		for i := s; i < s+n; i++ {
			out[i] /= sum
		}
	}
	return out
}

func data(x *graph.Tensor) []float64 {
	out := make([]float64, x.Len())
	for i := range out {
		out[i] = x.At(i)
	}
	return out
}

// Before opset 13, Softmax(axis=1) on [2,3,4] normalizes each batch row's 12
// values together; from 13 it normalizes along axis 1 alone.
func TestSoftmaxOpsetSemantics(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	x := randTensor(rng, graph.Float64, 2, 3, 4)
	feeds := map[string]*graph.Tensor{"x": x}
	for _, opset := range []int64{11, 13} {
		m := modelOf(opset, []*onnxpb.ValueInfo{vi("x", onnxpb.Double, 2, 3, 4)}, nil, []string{"y"},
			nd("Softmax", []string{"x"}, []string{"y"}, aInt("axis", 1)))
		g, out := importAndRun(t, m, feeds)
		var want []float64
		if opset == 11 {
			want = softmaxRef(data(x), 12)
			if ops := g.CountOps(); ops["Reshape"] != 2 || ops["Softmax"] != 1 {
				t.Fatalf("opset 11 graph: %v", ops)
			}
		} else {
			// Along axis 1: move it last, normalize, move back.
			xt := make([]float64, 24)
			for b := range 2 {
				for c := range 3 {
					for w := range 4 {
						xt[b*12+w*3+c] = x.At(b*12 + c*4 + w)
					}
				}
			}
			st := softmaxRef(xt, 3)
			want = make([]float64, 24)
			for b := range 2 {
				for c := range 3 {
					for w := range 4 {
						want[b*12+c*4+w] = st[b*12+w*3+c]
					}
				}
			}
		}
		closeTo(t, "softmax", out["y"], want, graph.Shape{2, 3, 4}, 1e-12)
	}
	// Default axis: 1 before 13, -1 from 13 (on a 2-D input both are the last).
	m := modelOf(12, []*onnxpb.ValueInfo{vi("x", onnxpb.Double, 2, 3, 4)}, nil, []string{"y"},
		nd("LogSoftmax", []string{"x"}, []string{"y"}))
	_, out := importAndRun(t, m, feeds)
	want := softmaxRef(data(x), 12)
	for i := range want {
		want[i] = math.Log(want[i])
	}
	closeTo(t, "logsoftmax opset 12 default axis", out["y"], want, graph.Shape{2, 3, 4}, 1e-12)
}

// ReduceSum takes axes as an input from opset 13, the other reductions from 18.
func TestReduceAxesForms(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 1))
	x := randTensor(rng, graph.Float64, 2, 3, 4)
	feeds := map[string]*graph.Tensor{"x": x}
	sum1 := make([]float64, 8) // over axis 1, keepdims 0 → [2,4]
	mean2 := make([]float64, 6)
	for b := range 2 {
		for c := range 3 {
			for w := range 4 {
				sum1[b*4+w] += x.At(b*12 + c*4 + w)
				mean2[b*3+c] += x.At(b*12+c*4+w) / 4
			}
		}
	}
	axes := onnxpb.NewInt64("axes", []int64{1}, []int64{1})
	axesLast := onnxpb.NewInt64("axes2", []int64{1}, []int64{-1})
	in := []*onnxpb.ValueInfo{vi("x", onnxpb.Double, 2, 3, 4)}
	cases := []struct {
		name  string
		m     *onnxpb.Model
		want  []float64
		shape graph.Shape
	}{
		{"ReduceSum 11 attr", modelOf(11, in, nil, []string{"y"}, nd("ReduceSum", []string{"x"}, []string{"y"}, aInts("axes", 1), aInt("keepdims", 0))), sum1, graph.Shape{2, 4}},
		{"ReduceSum 13 input", modelOf(13, in, []*onnxpb.Tensor{axes}, []string{"y"}, nd("ReduceSum", []string{"x", "axes"}, []string{"y"}, aInt("keepdims", 0))), sum1, graph.Shape{2, 4}},
		{"ReduceMean 17 attr", modelOf(17, in, nil, []string{"y"}, nd("ReduceMean", []string{"x"}, []string{"y"}, aInts("axes", -1))), mean2, graph.Shape{2, 3, 1}},
		{"ReduceMean 18 input", modelOf(18, in, []*onnxpb.Tensor{axesLast}, []string{"y"}, nd("ReduceMean", []string{"x", "axes2"}, []string{"y"})), mean2, graph.Shape{2, 3, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, out := importAndRun(t, c.m, feeds)
			closeTo(t, c.name, out["y"], c.want, c.shape, 1e-12)
		})
	}
	// Each form is refused in the other's opset: the attribute at 18, and an
	// axes input at 17 (where the op has one input).
	bad := modelOf(18, in, nil, []string{"y"}, nd("ReduceMean", []string{"x"}, []string{"y"}, aInts("axes", 1)))
	if _, err := ImportModel(bad, Options{}); err == nil || !strings.Contains(err.Error(), "axes") {
		t.Fatalf("axes attribute at opset 18: %v", err)
	}
}

// Squeeze/Unsqueeze take axes as an input from 13; Split's sizes move from
// attribute to input at 13 and gain num_outputs at 18 (last part smaller).
func TestAxesAndSplitForms(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 1))
	x := randTensor(rng, graph.Float64, 7, 2)
	feeds := map[string]*graph.Tensor{"x": x}
	in := []*onnxpb.ValueInfo{vi("x", onnxpb.Double, 7, 2)}
	rows := func(lo, hi int) []float64 { return data(x)[lo*2 : hi*2] }

	for _, opset := range []int64{11, 13} {
		var nodes []*onnxpb.Node
		var inits []*onnxpb.Tensor
		if opset < 13 {
			nodes = []*onnxpb.Node{
				nd("Unsqueeze", []string{"x"}, []string{"u"}, aInts("axes", 0, 3)),
				nd("Squeeze", []string{"u"}, []string{"y"}, aInts("axes", 0)),
			}
		} else {
			inits = []*onnxpb.Tensor{onnxpb.NewInt64("ax03", []int64{2}, []int64{0, 3}), onnxpb.NewInt64("ax0", []int64{1}, []int64{0})}
			nodes = []*onnxpb.Node{
				nd("Unsqueeze", []string{"x", "ax03"}, []string{"u"}),
				nd("Squeeze", []string{"u", "ax0"}, []string{"y"}),
			}
		}
		m := modelOf(opset, in, inits, []string{"u", "y"}, nodes...)
		_, out := importAndRun(t, m, feeds)
		closeTo(t, "unsqueeze", out["u"], data(x), graph.Shape{1, 7, 2, 1}, 0)
		closeTo(t, "squeeze", out["y"], data(x), graph.Shape{7, 2, 1}, 0)
	}

	split := []struct {
		name  string
		opset int64
		inits []*onnxpb.Tensor
		node  *onnxpb.Node
		parts [][2]int
	}{
		{"11 attr", 11, nil, nd("Split", []string{"x"}, []string{"a", "b"}, aInts("split", 2, 5)), [][2]int{{0, 2}, {2, 7}}},
		{"13 input", 13, []*onnxpb.Tensor{onnxpb.NewInt64("s", []int64{3}, []int64{1, 4, 2})}, nd("Split", []string{"x", "s"}, []string{"a", "b", "c"}), [][2]int{{0, 1}, {1, 5}, {5, 7}}},
		{"18 num_outputs", 18, nil, nd("Split", []string{"x"}, []string{"a", "b", "c"}, aInt("num_outputs", 3)), [][2]int{{0, 3}, {3, 6}, {6, 7}}},
	}
	for _, c := range split {
		t.Run("Split "+c.name, func(t *testing.T) {
			m := modelOf(c.opset, in, c.inits, c.node.Output, c.node)
			g, out := importAndRun(t, m, feeds)
			for i, p := range c.parts {
				closeTo(t, c.node.Output[i], out[c.node.Output[i]], rows(p[0], p[1]), graph.Shape{p[1] - p[0], 2}, 0)
			}
			if g.CountOps()["Slice"] != len(c.parts) {
				t.Fatalf("ops %v", g.CountOps())
			}
		})
	}
	// Before 18, equal parts must divide the axis.
	m := modelOf(13, in, nil, []string{"a", "b"}, nd("Split", []string{"x"}, []string{"a", "b"}))
	if _, err := ImportModel(m, Options{}); err == nil || !strings.Contains(err.Error(), "equal parts") {
		t.Fatalf("uneven split at 13: %v", err)
	}
}

// Slice: attributes before opset 10, inputs after; INT64_MAX "to the end" and
// negative steps.
func TestSliceForms(t *testing.T) {
	x := graph.NewTensor(graph.Float64, graph.Shape{4, 5})
	for i := range x.Len() {
		x.Set(i, float64(i))
	}
	feeds := map[string]*graph.Tensor{"x": x}
	in := []*onnxpb.ValueInfo{vi("x", onnxpb.Double, 4, 5)}
	// rows 1.. , columns reversed from the last down to index 1 exclusive.
	var want []float64
	for r := 1; r < 4; r++ {
		for c := 4; c > 1; c-- {
			want = append(want, float64(r*5+c))
		}
	}
	m10 := modelOf(10, in, []*onnxpb.Tensor{
		onnxpb.NewInt64("st", []int64{2}, []int64{1, -1}),
		onnxpb.NewInt64("en", []int64{2}, []int64{math.MaxInt64, 1}),
		onnxpb.NewInt64("ax", []int64{2}, []int64{0, 1}),
		onnxpb.NewInt64("sp", []int64{2}, []int64{1, -1}),
	}, []string{"y"}, nd("Slice", []string{"x", "st", "en", "ax", "sp"}, []string{"y"}))
	_, out := importAndRun(t, m10, feeds)
	closeTo(t, "slice 10", out["y"], want, graph.Shape{3, 3}, 0)

	var want9 []float64
	for r := 1; r < 4; r++ {
		for c := 0; c < 3; c++ {
			want9 = append(want9, float64(r*5+c))
		}
	}
	m9 := modelOf(9, in, nil, []string{"y"}, nd("Slice", []string{"x"}, []string{"y"},
		aInts("starts", 1, 0), aInts("ends", math.MaxInt64, -2)))
	_, out = importAndRun(t, m9, feeds)
	closeTo(t, "slice 9", out["y"], want9, graph.Shape{3, 3}, 0)
}

// The exporters' shape arithmetic folds away: Shape → Gather → Unsqueeze →
// Concat → Reshape leaves one Reshape with a constant shape; a mask built from
// ConstantOfShape, Range, Less and Where on constants becomes one constant.
func TestConstantFolding(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 1))
	x := randTensor(rng, graph.Float32, 2, 3, 4)
	scalar := func(name string, v int64) *onnxpb.Tensor { return onnxpb.NewInt64(name, nil, []int64{v}) }
	m := modelOf(13, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 3, 4)},
		[]*onnxpb.Tensor{scalar("zero", 0), onnxpb.NewInt64("axes0", []int64{1}, []int64{0}), onnxpb.NewInt64("minus1", []int64{1}, []int64{-1})},
		[]string{"y", "masked"},
		nd("Shape", []string{"x"}, []string{"shp"}),
		nd("Gather", []string{"shp", "zero"}, []string{"b"}, aInt("axis", 0)),
		nd("Unsqueeze", []string{"b", "axes0"}, []string{"b1"}),
		nd("Concat", []string{"b1", "minus1"}, []string{"target"}, aInt("axis", 0)),
		nd("Reshape", []string{"x", "target"}, []string{"y"}),
		// mask[i, j] = j > i ? -inf : 0 over [4, 4], built at "run time", then
		// rows 0..1 added to x as [2, 1, 4].
		nd("Constant", nil, []string{"n"}, aTensor("value", onnxpb.NewInt32("", nil, []int32{4}))),
		nd("Cast", []string{"n"}, []string{"n64"}, aInt("to", int64(onnxpb.Int64))),
		nd("Constant", nil, []string{"start"}, aInt("value_int", 0)),
		nd("Constant", nil, []string{"one"}, aInt("value_int", 1)),
		nd("Range", []string{"start", "n64", "one"}, []string{"r"}),
		nd("Unsqueeze", []string{"r", "minus1"}, []string{"col"}),
		nd("Less", []string{"col", "r"}, []string{"above"}),
		nd("Constant", nil, []string{"ninf"}, aFloat("value_float", float32(math.Inf(-1)))),
		nd("Constant", nil, []string{"sq"}, aInts("value_ints", 4, 4)),
		nd("ConstantOfShape", []string{"sq"}, []string{"zeros"}, aTensor("value", onnxpb.NewFloat32("", []int64{1}, []float32{0}))),
		nd("Where", []string{"above", "ninf", "zeros"}, []string{"mask"}),
		nd("Constant", nil, []string{"lo"}, aInts("value_ints", 0)),
		nd("Constant", nil, []string{"hi"}, aInts("value_ints", 2)),
		nd("Slice", []string{"mask", "lo", "hi"}, []string{"mask2"}),
		nd("Constant", nil, []string{"ax1"}, aInts("value_ints", 1)),
		nd("Unsqueeze", []string{"mask2", "ax1"}, []string{"mask3"}),
		nd("Add", []string{"x", "mask3"}, []string{"masked"}),
	)
	g, err := ImportBytes(onnxpb.Encode(m))
	if err != nil {
		t.Fatal(err)
	}
	ops := g.CountOps()
	if len(ops) != 2 || ops["Reshape"] != 1 || ops["Add"] != 1 {
		t.Fatalf("folded graph has ops %v, want one Reshape and one Add\n%s", ops, graph.Format(g))
	}
	out := runGraph(t, g, map[string]*graph.Tensor{"x": x})
	closeTo(t, "reshaped", out["y"], data(x), graph.Shape{2, 12}, 0)
	// masked = x + mask[2,4] broadcast over [2,3,4]: mask rows 0..1 of where(j > i).
	var want []float64
	for b := range 2 {
		for c := range 3 {
			for w := range 4 {
				v := x.At(b*12 + c*4 + w)
				if w > b {
					v = math.Inf(-1)
				}
				want = append(want, v)
			}
		}
	}
	closeTo(t, "masked", out["masked"], want, graph.Shape{2, 3, 4}, 0)
}

// LayerNormalization and Gelu become table ops with the same numbers.
func TestLayerNormAndGelu(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 1))
	x := randTensor(rng, graph.Float64, 2, 3, 4)
	scale := randTensor(rng, graph.Float64, 3, 4)
	bias := randTensor(rng, graph.Float64, 3, 4)
	toONNX := func(name string, t *graph.Tensor) *onnxpb.Tensor {
		return onnxpb.NewFloat64(name, []int64{int64(t.Shape[0]), int64(t.Shape[1])}, t.F64)
	}
	m := modelOf(20, []*onnxpb.ValueInfo{vi("x", onnxpb.Double, 2, 3, 4)},
		[]*onnxpb.Tensor{toONNX("scale", scale), toONNX("bias", bias)}, []string{"ln", "gelu", "gelu_tanh"},
		nd("LayerNormalization", []string{"x", "scale", "bias"}, []string{"ln"}, aInt("axis", 1), aFloat("epsilon", 1e-3), aInt("stash_type", int64(onnxpb.Double))),
		nd("Gelu", []string{"x"}, []string{"gelu"}),
		nd("Gelu", []string{"x"}, []string{"gelu_tanh"}, aStr("approximate", "tanh")),
	)
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
	var ln, ge, gt []float64
	for b := range 2 {
		row := data(x)[b*12 : b*12+12]
		mean, vr := 0.0, 0.0
		for _, v := range row {
			mean += v / 12
		}
		for _, v := range row {
			vr += (v - mean) * (v - mean) / 12
		}
		for i, v := range row {
			ln = append(ln, (v-mean)/math.Sqrt(vr+float64(float32(1e-3)))*scale.F64[i]+bias.F64[i])
		}
	}
	for _, v := range data(x) {
		ge = append(ge, 0.5*v*(1+math.Erf(v/math.Sqrt2)))
		gt = append(gt, 0.5*v*(1+math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v))))
	}
	closeTo(t, "layernorm", out["ln"], ln, graph.Shape{2, 3, 4}, 1e-12)
	closeTo(t, "gelu", out["gelu"], ge, graph.Shape{2, 3, 4}, 1e-12)
	closeTo(t, "gelu tanh", out["gelu_tanh"], gt, graph.Shape{2, 3, 4}, 1e-12)
}

// RMSNormalization (opset 23) becomes table ops with the spec's numbers,
// over the axes from axis on; a stash_type other than the input's is refused.
func TestRMSNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 1))
	x := randTensor(rng, graph.Float64, 2, 3, 4)
	scale := randTensor(rng, graph.Float64, 3, 4)
	in := []*onnxpb.ValueInfo{vi("x", onnxpb.Double, 2, 3, 4)}
	inits := []*onnxpb.Tensor{onnxpb.NewFloat64("scale", []int64{3, 4}, scale.F64), onnxpb.NewFloat64("scale_last", []int64{4}, scale.F64[:4])}
	m := modelOf(23, in, inits, []string{"rms", "rms_last"},
		nd("RMSNormalization", []string{"x", "scale"}, []string{"rms"}, aInt("axis", 1), aFloat("epsilon", 1e-3), aInt("stash_type", int64(onnxpb.Double))),
		nd("RMSNormalization", []string{"x", "scale_last"}, []string{"rms_last"}, aInt("stash_type", int64(onnxpb.Double))),
	)
	_, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
	// want normalizes rows of n values (eps is a float attribute: float32).
	want := func(n int, eps float64, sc []float64) []float64 {
		var y []float64
		for r := range len(data(x)) / n {
			row := data(x)[r*n : r*n+n]
			ms := 0.0
			for _, v := range row {
				ms += v * v / float64(n)
			}
			for i, v := range row {
				y = append(y, v/math.Sqrt(ms+float64(float32(eps)))*sc[i])
			}
		}
		return y
	}
	closeTo(t, "rmsnorm axis 1", out["rms"], want(12, 1e-3, scale.F64), graph.Shape{2, 3, 4}, 1e-12)
	closeTo(t, "rmsnorm last axis", out["rms_last"], want(4, 1e-5, scale.F64[:4]), graph.Shape{2, 3, 4}, 1e-12)

	bad := modelOf(23, in, inits, []string{"y"}, nd("RMSNormalization", []string{"x", "scale"}, []string{"y"}, aInt("axis", 1)))
	if _, err := ImportModel(bad, Options{}); err == nil || !strings.Contains(err.Error(), "stash_type") {
		t.Errorf("float stash_type on a double input: %v", err)
	}
	old := modelOf(22, in, inits, []string{"y"}, nd("RMSNormalization", []string{"x", "scale"}, []string{"y"}, aInt("stash_type", int64(onnxpb.Double))))
	if _, err := ImportModel(old, Options{}); err == nil || !strings.Contains(err.Error(), "does not exist before opset 23") {
		t.Errorf("RMSNormalization at opset 22: %v", err)
	}
}

// Opset-23 Attention (default scale 1/sqrt(head_dim), causal) becomes
// FlashAttention and computes softmax(scale·QKᵀ + mask)·V.
func TestAttentionImport(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 1))
	const B, H, S, D = 1, 2, 5, 4
	q, k, v := randTensor(rng, graph.Float64, B, H, S, D), randTensor(rng, graph.Float64, B, H, S, D), randTensor(rng, graph.Float64, B, H, S, D)
	in := []*onnxpb.ValueInfo{vi("q", onnxpb.Double, B, H, S, D), vi("k", onnxpb.Double, B, H, S, D), vi("v", onnxpb.Double, B, H, S, D)}
	m := modelOf(23, in, nil, []string{"y"}, nd("Attention", []string{"q", "k", "v"}, []string{"y"}, aInt("is_causal", 1)))
	g, out := importAndRun(t, m, map[string]*graph.Tensor{"q": q, "k": k, "v": v})
	if ops := g.CountOps(); ops["FlashAttention"] != 1 || len(ops) != 1 {
		t.Fatalf("ops %v", ops)
	}
	scale := float64(float32(1 / math.Sqrt(D)))
	var want []float64
	for h := range B * H {
		for i := range S {
			s := make([]float64, S)
			for j := range S {
				for d := range D {
					s[j] += q.F64[(h*S+i)*D+d] * k.F64[(h*S+j)*D+d]
				}
				s[j] *= scale
				if j > i {
					s[j] = math.Inf(-1)
				}
			}
			p := softmaxRef(s, S)
			for d := range D {
				o := 0.0
				for j := range S {
					o += p[j] * v.F64[(h*S+j)*D+d]
				}
				want = append(want, o)
			}
		}
	}
	closeTo(t, "attention", out["y"], want, graph.Shape{B, H, S, D}, 1e-12)

	// Grouped-query: 4 query heads on the 2 K/V heads of k and v, query
	// head h reading K/V head h/2 (ONNX repeats each K/V head in place), so
	// heads 0, 1 attend as above over head 0 and heads 2, 3 over head 1.
	qg := randTensor(rng, graph.Float64, B, 2*H, S, D)
	ing := []*onnxpb.ValueInfo{vi("q", onnxpb.Double, B, 2*H, S, D), vi("k", onnxpb.Double, B, H, S, D), vi("v", onnxpb.Double, B, H, S, D)}
	mg := modelOf(23, ing, nil, []string{"y"}, nd("Attention", []string{"q", "k", "v"}, []string{"y"}, aInt("is_causal", 1)))
	g, out = importAndRun(t, mg, map[string]*graph.Tensor{"q": qg, "k": k, "v": v})
	if fa := g.Nodes[0]; fa.Op != "FlashAttention" || !fa.Inputs[1].Type.Shape.Equal(graph.Shape{B, H, S, D}) {
		t.Fatalf("grouped-query Attention imported as %s reading K %v", fa.Op, fa.Inputs[1].Type.Shape)
	}
	want = want[:0]
	for h := range B * 2 * H {
		kh := h / 2
		for i := range S {
			s := make([]float64, S)
			for j := range S {
				for d := range D {
					s[j] += qg.F64[(h*S+i)*D+d] * k.F64[(kh*S+j)*D+d]
				}
				s[j] *= scale
				if j > i {
					s[j] = math.Inf(-1)
				}
			}
			p := softmaxRef(s, S)
			for d := range D {
				o := 0.0
				for j := range S {
					o += p[j] * v.F64[(kh*S+j)*D+d]
				}
				want = append(want, o)
			}
		}
	}
	closeTo(t, "grouped-query attention", out["y"], want, graph.Shape{B, 2 * H, S, D}, 1e-12)
	in3 := []*onnxpb.ValueInfo{vi("q", onnxpb.Double, B, 3, S, D), vi("k", onnxpb.Double, B, H, S, D), vi("v", onnxpb.Double, B, H, S, D)}
	if _, err := ImportModel(modelOf(23, in3, nil, []string{"y"}, nd("Attention", []string{"q", "k", "v"}, []string{"y"})), Options{}); err == nil || !strings.Contains(err.Error(), "3 query heads are not a multiple of 2 key heads") {
		t.Errorf("3 query heads on 2 K/V heads: %v", err)
	}

	// What FlashAttention cannot mean is refused, not approximated.
	for name, node := range map[string]*onnxpb.Node{
		"mask":    nd("Attention", []string{"q", "k", "v", "q"}, []string{"y"}),
		"softcap": nd("Attention", []string{"q", "k", "v"}, []string{"y"}, aFloat("softcap", 30)),
		"present": nd("Attention", []string{"q", "k", "v"}, []string{"y", "pk"}),
	} {
		outs := []string{"y"}
		if name == "present" {
			outs = append(outs, "pk")
		}
		_, err := ImportModel(modelOf(23, in, nil, outs, node), Options{})
		if err == nil || !strings.Contains(err.Error(), "Attention") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Refusals name the op, its opset and the node.
func TestRefusals(t *testing.T) {
	x := []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 2, 3)}
	cases := []struct {
		name string
		m    *onnxpb.Model
		want []string
	}{
		{"unknown op", modelOf(17, x, nil, []string{"y"}, nd("Bernoulli", []string{"x"}, []string{"y"})),
			[]string{`"Bernoulli_y"`, "Bernoulli", "opset 17", "not supported"}},
		{"unknown attribute", modelOf(17, x, nil, []string{"y"}, nd("Relu", []string{"x"}, []string{"y"}, aInt("alpha", 1))),
			[]string{"Relu", "alpha"}},
		{"runtime-only op", modelOf(17, x, nil, []string{"y"}, nd("Less", []string{"x", "x"}, []string{"y"})),
			[]string{"Less", "constant inputs"}},
		{"cast to uint64", modelOf(17, x, nil, []string{"y"}, nd("Cast", []string{"x"}, []string{"y"}, aInt("to", int64(onnxpb.Uint64)))),
			[]string{"Cast", "UINT64", "2^63"}},
		{"other domain", modelOf(17, x, nil, []string{"y"}, &onnxpb.Node{OpType: "Gelu", Domain: "com.microsoft", Input: []string{"x"}, Output: []string{"y"}}),
			[]string{"com.microsoft"}},
		{"op newer than the opset", modelOf(16, x, nil, []string{"y"}, nd("Gelu", []string{"x"}, []string{"y"})),
			[]string{"Gelu", "opset 16", "does not exist before opset 20"}},
		{"opset too new", modelOf(24, x, nil, []string{"y"}, nd("Relu", []string{"x"}, []string{"y"})), []string{"opset 24"}},
		{"opset too old", modelOf(0, x, nil, []string{"y"}, nd("Relu", []string{"x"}, []string{"y"})), []string{"opset 0"}},
		{"undefined input", modelOf(17, x, nil, []string{"y"}, nd("Relu", []string{"z"}, []string{"y"})), []string{`"z"`, "not defined"}},
		{"symbolic dim", modelOf(17, []*onnxpb.ValueInfo{{Name: "x", Type: &onnxpb.Type{Tensor: &onnxpb.TensorType{ElemType: onnxpb.Float,
			Shape: &onnxpb.TensorShape{Dim: []onnxpb.Dimension{{Param: "batch"}}}}}}}, nil, []string{"y"}, nd("Relu", []string{"x"}, []string{"y"})),
			[]string{"batch", "Options.Dims"}},
		{"value_info disagrees", func() *onnxpb.Model {
			m := modelOf(17, x, nil, []string{"y"}, nd("Relu", []string{"x"}, []string{"y"}))
			m.Graph.Output[0] = vi("y", onnxpb.Float, 3, 2)
			return m
		}(), []string{`"y"`, "declares dimension 0 = 3"}},
		{"layernorm stash_type differs", modelOf(17, x, []*onnxpb.Tensor{onnxpb.NewFloat32("s", []int64{3}, []float32{1, 1, 1})}, []string{"y", "mean"},
			nd("LayerNormalization", []string{"x", "s"}, []string{"y", "mean"}, aInt("stash_type", int64(onnxpb.Double)))), []string{"stash_type"}},
		{"dropout in training mode", modelOf(17, []*onnxpb.ValueInfo{x[0], vi("t", onnxpb.Bool)}, nil, []string{"y"},
			nd("Dropout", []string{"x", "", "t"}, []string{"y"})), []string{"training_mode", "t"}},
		{"reshape of runtime shape", modelOf(17, []*onnxpb.ValueInfo{x[0], vi("s", onnxpb.Int64, 1)}, nil, []string{"y"},
			nd("Reshape", []string{"x", "s"}, []string{"y"})), []string{"must be a constant"}},
		{"loss reduction unknown", modelOf(17, []*onnxpb.ValueInfo{x[0], vi("l", onnxpb.Int64, 2)}, nil, []string{"y"},
			nd("SoftmaxCrossEntropyLoss", []string{"x", "l"}, []string{"y"}, aInt("ignore_index", 1), aStr("reduction", "max"))), []string{`reduction "max"`}},
		{"function call", func() *onnxpb.Model {
			m := modelOf(17, x, nil, []string{"y"}, &onnxpb.Node{OpType: "MyFn", Domain: "local", Input: []string{"x"}, Output: []string{"y"}})
			m.Functions = [][]byte{{0x0a, 0x04, 'M', 'y', 'F', 'n'}}
			return m
		}(), []string{"MyFn", "local"}},
		{"legacy broadcast axis out of range", modelOf(6, []*onnxpb.ValueInfo{x[0], vi("b", onnxpb.Float, 3)}, nil, []string{"y"},
			nd("Add", []string{"x", "b"}, []string{"y"}, aInt("broadcast", 1), aInt("axis", 2))), []string{"broadcast axis 2"}},
		{"legacy reshape", modelOf(4, x, nil, []string{"y"}, nd("Reshape", []string{"x"}, []string{"y"}, aInts("shape", 3, 2))), []string{"opset < 5"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := ImportBytes(onnxpb.Encode(c.m))
			if err == nil {
				t.Fatalf("imported:\n%s", graph.Format(g))
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// Import from a file names the file in its refusals too, and so for a
	// file that holds no graph at all.
	dir := t.TempDir()
	for name, data := range map[string][]byte{"conv.onnx": onnxpb.Encode(cases[0].m), "empty.onnx": nil} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Import(path); err == nil || !strings.Contains(err.Error(), path+":") {
			t.Errorf("Import(%s): error %v does not name the file", name, err)
		}
	}
	// A symbolic dimension with its size given imports.
	m := cases[9].m
	g, err := ImportModel(m, Options{Dims: map[string]int{"batch": 5}})
	if err != nil || !g.Inputs[0].Type.Shape.Equal(graph.Shape{5}) {
		t.Fatalf("bound dim: %v", err)
	}
}

// Details of mapping: int32 constant indices (negative too), an int64 exponent,
// Identity as an alias, initializers listed among the inputs (IR < 4), the
// param/const split of a foreign model.
func TestImportDetails(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 1))
	x := randTensor(rng, graph.Float32, 4, 3)
	w := onnxpb.NewFloat32("w", []int64{3, 2}, []float32{1, 2, 3, 4, 5, 6})
	m := modelOf(17, []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 4, 3), vi("w", onnxpb.Float, 3, 2)},
		[]*onnxpb.Tensor{w, onnxpb.NewInt32("idx", []int64{2}, []int32{-1, 0}), onnxpb.NewInt64("two", nil, []int64{2}),
			onnxpb.NewFloat32("mask", []int64{2}, []float32{0, float32(math.Inf(-1))})},
		[]string{"y"},
		nd("Identity", []string{"w"}, []string{"w2"}),
		nd("Gather", []string{"x", "idx"}, []string{"g"}, aInt("axis", 0)),
		nd("Pow", []string{"g", "two"}, []string{"p"}),
		nd("MatMul", []string{"p", "w2"}, []string{"mm"}),
		nd("Add", []string{"mm", "mask"}, []string{"y"}),
	)
	g, out := importAndRun(t, m, map[string]*graph.Tensor{"x": x})
	if len(g.Inputs) != 1 || len(g.Params) != 1 || g.Params[0].Name != "w" || g.CountOps()["Identity"] != 0 {
		t.Fatalf("graph:\n%s", graph.Format(g))
	}
	for _, c := range g.Consts {
		if c.Name == "mask" {
			goto maskOK
		}
	}
	t.Fatalf("the -inf mask should be a const:\n%s", graph.Format(g))
maskOK:
	var want []float64
	wv, _ := w.Float32s()
	for _, r := range []int{3, 0} {
		for j := range 2 {
			s := float32(0)
			for k := range 3 {
				v := float32(x.At(r*3 + k))
				s += v * v * wv[k*2+j]
			}
			if j == 1 {
				s = float32(math.Inf(-1))
			}
			want = append(want, float64(s))
		}
	}
	closeTo(t, "y", out["y"], want, graph.Shape{2, 2}, 1e-6)
}

// Every op of the table can be imported: standard ones by a handler, ours by
// the op table itself. A new op added to the table without an importer fails here.
func TestEveryTableOpImports(t *testing.T) {
	for _, s := range graph.Ops() {
		switch s.Domain {
		case graph.DomainONNX:
			if handlers[s.Name] == nil {
				t.Errorf("standard op %s has no ONNX import handler", s.Name)
			}
		case graph.DomainFlashgraph, graph.DomainONNXTraining:
			// ourOp and trainingOp map attributes by the table; nothing to register.
		default:
			t.Errorf("op %s has domain %q, which export cannot name", s.Name, s.Domain)
		}
	}
}

// Every elementwise op of the table imports, and folds on constant operands
// to what its definition computes (rounded to float32): the op table is
// the one list, so a new activation needs no line here.
func TestEveryElementwiseOpFolds(t *testing.T) {
	// Ops with attributes fold at values other than their defaults (Mod's
	// floats need fmod=1); the node's attributes reach the definition.
	attrs := map[string][]*onnxpb.Attribute{
		"Mod": {aInt("fmod", 1)}, "LeakyRelu": {aFloat("alpha", 0.5)}, "Elu": {aFloat("alpha", 2)},
		"Selu": {aFloat("alpha", 2), aFloat("gamma", 3)}, "HardSigmoid": {aFloat("alpha", 0.25), aFloat("beta", 0.125)},
		"Shrink": {aFloat("bias", 0.25), aFloat("lambd", 1)}, "ThresholdedRelu": {aFloat("alpha", 1)},
		"Gelu": {aStr("approximate", "tanh")}, "Celu": {aFloat("alpha", 0.5)}, "IsInf": {aInt("detect_positive", 0)},
		"BitShift": {aStr("direction", "LEFT")},
	}
	for _, s := range graph.ExprOps() {
		if s.Domain != graph.DomainONNX {
			continue
		}
		xs := []float32{0.5, 1.25, 2} // in every op's domain (Log, Sqrt)
		switch s.Name {
		case "Asin", "Acos", "Atanh":
			xs = []float32{0.125, 0.25, 0.375}
		case "Acosh":
			xs = []float32{1.5, 2.25, 3}
		}
		if s.IntegerOnly() { // BitShift: UINT8 operands (3 << 6 = 192 still fits)
			xs = []float32{1, 2, 3}
		}
		var nodes []*onnxpb.Node
		var names []string
		for k := range s.Inputs {
			name := fmt.Sprintf("c%d", k)
			names = append(names, name)
			if s.Name == "Where" && k == 0 {
				nodes = append(nodes, nd("Constant", nil, []string{name}, aTensor("value", onnxpb.NewBool("", []int64{3}, []bool{true, false, true}))))
				continue
			}
			if s.Logical() {
				nodes = append(nodes, nd("Constant", nil, []string{name}, aTensor("value", onnxpb.NewBool("", []int64{3}, []bool{true, k == 0, k == 1}))))
				continue
			}
			v := make([]float32, len(xs))
			for i, x := range xs {
				v[i] = x * float32(k+1) // distinct operands
			}
			if s.IntegerOnly() {
				u := &onnxpb.Tensor{DataType: onnxpb.Uint8, Dims: []int64{3}}
				for _, x := range v {
					u.Int32Data = append(u.Int32Data, int32(x))
				}
				nodes = append(nodes, nd("Constant", nil, []string{name}, aTensor("value", u)))
				continue
			}
			nodes = append(nodes, nd("Constant", nil, []string{name}, aTensor("value", onnxpb.NewFloat32("", []int64{3}, v))))
		}
		// A comparison's bool result is cast back to float (Cast folds
		// too) so that every case ends in the same Add.
		nodes = append(nodes, nd(s.Name, names, []string{"r"}, attrs[s.Name]...),
			nd("Cast", []string{"r"}, []string{"f"}, aInt("to", int64(onnxpb.Float))),
			nd("Add", []string{"x", "f"}, []string{"y"}))
		m := modelOf(max(18, introduced[s.Name]), []*onnxpb.ValueInfo{vi("x", onnxpb.Float, 3)}, nil, []string{"y"}, nodes...)
		g, err := ImportBytes(onnxpb.Encode(m))
		if err != nil {
			t.Errorf("%s: %v", s.Name, err)
			continue
		}
		if ops := g.CountOps(); len(ops) != 1 || ops["Add"] != 1 {
			t.Errorf("%s on constants did not fold: ops %v", s.Name, ops)
			continue
		}
		zero := graph.NewTensor(graph.Float32, graph.Shape{3})
		out := runGraph(t, g, map[string]*graph.Tensor{"x": zero})
		var want []float64
		ga := graph.Attrs{}
		for _, a := range attrs[s.Name] {
			switch a.Type {
			case onnxpb.AttrFloat:
				ga[a.Name] = graph.Float(float64(a.F))
			case onnxpb.AttrInt:
				ga[a.Name] = graph.Int(a.I)
			case onnxpb.AttrString:
				ga[a.Name] = graph.Str(string(a.S))
			}
		}
		mf, err := s.MapFor(ga)
		if err != nil {
			t.Fatal(err)
		}
		for i := range xs {
			args := make([]float64, len(s.Inputs))
			for k := range args {
				args[k] = float64(xs[i] * float32(k+1))
				if s.Logical() {
					args[k] = float64(b2i(i == 0 || i == k+1))
				}
			}
			if s.Name == "Where" {
				args[0] = float64(1 - i%2)
			}
			want = append(want, float64(float32(mf.Float(args))))
		}
		closeTo(t, s.Name, out["y"], want, graph.Shape{3}, 0)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
