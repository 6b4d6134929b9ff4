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
		{"gradient", trainingModel(x, []string{"Y"}, nd("Gradient", []string{"X"}, []string{"Y"})), "op is not supported"},
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
