package onnx

import (
	"math"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// trainingModel is a model of one node of ONNX's training domain, which
// is the only domain it imports (as ONNX's own tests of these ops do).
func trainingModel(inputs []*onnxpb.ValueInfo, outputs []string, n *onnxpb.Node) *onnxpb.Model {
	n.Domain = graph.DomainONNXTraining
	m := modelOf(1, inputs, nil, outputs, n)
	m.OpsetImport = []onnxpb.OperatorSetID{{Domain: graph.DomainONNXTraining, Version: 1}}
	return m
}

// TestTrainingOpsImport: an Adagrad node of two tensors imports as the
// table's op, computes the pseudo code of the spec for each tensor, and
// our export writes it back in its domain.
func TestTrainingOpsImport(t *testing.T) {
	m := trainingModel([]*onnxpb.ValueInfo{vi("R", onnxpb.Float), vi("T", onnxpb.Int64),
		vi("X1", onnxpb.Float, 2), vi("X2", onnxpb.Float, 1), vi("G1", onnxpb.Float, 2), vi("G2", onnxpb.Float, 1),
		vi("H1", onnxpb.Float, 2), vi("H2", onnxpb.Float, 1)},
		[]string{"X1_new", "X2_new", "H1_new", "H2_new"},
		nd("Adagrad", []string{"R", "T", "X1", "X2", "G1", "G2", "H1", "H2"}, []string{"X1_new", "X2_new", "H1_new", "H2_new"},
			aFloat("decay_factor", 0.5), aFloat("epsilon", 0.25)))
	f := func(v ...float32) *graph.Tensor {
		return &graph.Tensor{DType: graph.Float32, Shape: graph.Shape{len(v)}, F32: v}
	}
	feeds := map[string]*graph.Tensor{
		"R":  {DType: graph.Float32, Shape: graph.Shape{}, F32: []float32{0.5}},
		"T":  {DType: graph.Int64, Shape: graph.Shape{}, I64: []int64{2}},
		"X1": f(1, 2), "X2": f(3), "G1": f(1, -3), "G2": f(2), "H1": f(0, 7), "H2": f(0),
	}
	g, out := importAndRun(t, m, feeds)
	// r = 0.5/(1 + 2·0.5) = 0.25; H' = H + G²; X' = X − r·G/(√H' + 0.25).
	want := map[string][]float64{
		"X1_new": {1 - 0.25/(1+0.25), 2 + 0.75/(4+0.25)}, "H1_new": {1, 16},
		"X2_new": {3 - 0.5/(2+0.25)}, "H2_new": {4},
	}
	for name, w := range want {
		for i, v := range w {
			if got := out[name].At(i); math.Abs(got-v) > 1e-6 {
				t.Errorf("%s[%d] = %v, want %v", name, i, got, v)
			}
		}
	}
	if n := g.CountOps()["Adagrad"]; n != 1 {
		t.Errorf("%d Adagrad nodes, want 1", n)
	}
	back := roundTrip(t, g)
	if v, ok := back.Opset(graph.DomainONNXTraining); !ok || v != 1 {
		t.Errorf("export imports the training domain at %d (%v), want 1", v, ok)
	}
}

func TestTrainingOpsRefused(t *testing.T) {
	x := []*onnxpb.ValueInfo{vi("R", onnxpb.Float), vi("T", onnxpb.Int64), vi("X", onnxpb.Float, 2), vi("G", onnxpb.Float, 2), vi("V", onnxpb.Float, 2)}
	noDomain := trainingModel(x, []string{"Y"}, nd("Momentum", []string{"R", "T", "X", "G", "V"}, []string{"Y", "W"}))
	noDomain.OpsetImport = []onnxpb.OperatorSetID{{Version: 13}}
	for _, c := range []struct {
		name string
		m    *onnxpb.Model
		want string
	}{
		{"mode", trainingModel(x, []string{"Y"}, nd("Momentum", []string{"R", "T", "X", "G", "V"}, []string{"Y", "W"},
			aFloat("alpha", 0.9), aFloat("beta", 0.1), aFloat("norm_coefficient", 0), aStr("mode", "heavy"))), "neither standard nor nesterov"},
		{"T narrow", trainingModel([]*onnxpb.ValueInfo{vi("R", onnxpb.Float), vi("T", onnxpb.Int32), vi("X", onnxpb.Float, 2), vi("G", onnxpb.Float, 2), vi("H", onnxpb.Float, 2)},
			[]string{"Y"}, nd("Adagrad", []string{"R", "T", "X", "G", "H"}, []string{"Y", "W"})), "input 1 is INT32"},
		{"domain not imported", noDomain, `does not import the "ai.onnx.preview.training" domain`},
		{"unknown attribute", trainingModel(x, []string{"Y"}, nd("Adagrad", []string{"R", "T", "X", "G", "V"}, []string{"Y", "W"}, aFloat("lr", 1))), "lr"},
		{"gradient without xs", trainingModel(x, []string{"Y"}, nd("Gradient", []string{"X"}, []string{"Y"})), "xs is required"},
		{"gradient at other values", gradientModel([]string{"X", "R"}, aStrs("xs", "X", "G"), aStr("y", "s")), "the gradient at other values is not supported"},
		{"gradient of a non-scalar", gradientModel([]string{"X", "G"}, aStrs("xs", "X", "G"), aStr("y", "p")), "must be a float scalar"},
		{"other training op", trainingModel(x, []string{"Y"}, nd("GraphCall", []string{"X"}, []string{"Y"})), "op is not supported"},
		{"default domain used but not imported", func() *onnxpb.Model {
			m := trainingModel(x, []string{"Y"}, nd("Momentum", []string{"R", "T", "X", "G", "V"}, []string{"Y", "W"}))
			m.Graph.Node = append(m.Graph.Node, nd("Relu", []string{"Y"}, []string{"Z"}))
			return m
		}(), "imports no default-domain opset"},
	} {
		_, err := ImportBytes(onnxpb.Encode(c.m))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

func aStrs(name string, v ...string) *onnxpb.Attribute {
	a := &onnxpb.Attribute{Name: name, Type: onnxpb.AttrStrings}
	for _, s := range v {
		a.Strings = append(a.Strings, []byte(s))
	}
	return a
}

// gradientModel: p = Tanh(X)·G, s = ReduceSum(p) (X, G of shape [2]),
// then a Gradient node with the given inputs and attributes, outputs
// ds_dX and ds_dG.
func gradientModel(inputs []string, attrs ...*onnxpb.Attribute) *onnxpb.Model {
	m := modelOf(13, []*onnxpb.ValueInfo{vi("X", onnxpb.Float, 2), vi("G", onnxpb.Float, 2), vi("R", onnxpb.Float, 2)}, nil,
		[]string{"s", "ds_dX", "ds_dG"},
		nd("Tanh", []string{"X"}, []string{"t"}),
		nd("Mul", []string{"t", "G"}, []string{"p"}),
		nd("ReduceSum", []string{"p"}, []string{"s"}, aInt("keepdims", 0)))
	g := nd("Gradient", inputs, []string{"ds_dX", "ds_dG"}, attrs...)
	g.Domain = graph.DomainONNXTraining
	m.Graph.Node = append(m.Graph.Node, g)
	m.OpsetImport = append(m.OpsetImport, onnxpb.OperatorSetID{Domain: graph.DomainONNXTraining, Version: 1})
	return m
}

// TestGradientImport: a Gradient node whose inputs are the tensors of xs
// gives dy/dx at the values the graph computes: for s = Σ tanh(X)·G,
// ds/dX = (1 − tanh²X)·G and ds/dG = tanh X.
func TestGradientImport(t *testing.T) {
	xv, gv := []float32{0.5, -1.25}, []float32{2, 3}
	_, out := importAndRun(t, gradientModel([]string{"X", "G"}, aStrs("xs", "X", "G"), aStr("y", "s")), map[string]*graph.Tensor{
		"X": {DType: graph.Float32, Shape: graph.Shape{2}, F32: xv},
		"G": {DType: graph.Float32, Shape: graph.Shape{2}, F32: gv},
		"R": {DType: graph.Float32, Shape: graph.Shape{2}, F32: []float32{0, 0}},
	})
	for i := range xv {
		th := math.Tanh(float64(xv[i]))
		if got, want := out["ds_dX"].At(i), (1-th*th)*float64(gv[i]); math.Abs(got-want) > 1e-6 {
			t.Errorf("ds_dX[%d] = %v, want %v", i, got, want)
		}
		if got, want := out["ds_dG"].At(i), th; math.Abs(got-want) > 1e-6 {
			t.Errorf("ds_dG[%d] = %v, want %v", i, got, want)
		}
	}
	if got, want := out["s"].At(0), math.Tanh(0.5)*2+math.Tanh(-1.25)*3; math.Abs(got-want) > 1e-6 {
		t.Errorf("s = %v, want %v", got, want)
	}
}
