package passes

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/autodiff"
	"github.com/flashgraph/flashgraph/graph"
)

// Ops whose expressions read attributes fuse, each step carrying its node's
// values in the body ({name=value}, byte-stable), and the fused graph
// computes bit for bit what the unfused one did, forward and backward; a
// body step without them, or with them out of canonical form, is refused.
func TestFuseElementwiseCarriesAttributes(t *testing.T) {
	for _, dt := range []graph.DType{graph.Float32, graph.Float64} {
		b := graph.NewBuilder("acts")
		x := b.Input("x", dt, 4, 33)
		y := b.Input("y", dt, 33)
		h := b.Op("LeakyRelu", graph.Attrs{"alpha": graph.Float(0.3)}, x)
		h = b.Op("Mul", nil, h, y)
		h = b.Op("Selu", graph.Attrs{"alpha": graph.Float(1.5), "gamma": graph.Float(0.1)}, h)
		g := b.Op("Gelu", graph.Attrs{"approximate": graph.Str("tanh")}, x)
		g = b.Op("HardSigmoid", nil, g)
		h = b.Op("Add", nil, h, g)
		h = b.Op("Elu", nil, h)
		b.Output(b.Op("ReduceSum", graph.Attrs{"keepdims": graph.Int(0)}, h))
		fwd, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		bwd, _, err := autodiff.Gradients(fwd, fwd.Outputs[0].Name, []string{"x", "y"})
		if err != nil {
			t.Fatal(err)
		}
		for _, src := range []*graph.Graph{fwd, bwd} {
			fused, err := (FuseElementwise{}).Run(src, &Log{})
			if err != nil {
				t.Fatal(err)
			}
			if err := graph.Verify(fused); err != nil {
				t.Fatal(err)
			}
			text := graph.Format(fused)
			for _, want := range []string{"LeakyRelu{alpha=0.3}(", "Selu{alpha=1.5,gamma=0.1}(", "Gelu{approximate=tanh}(", "HardSigmoid{alpha=0.2,beta=0.5}(", "Elu{alpha=1}("} {
				if src == fwd && !strings.Contains(text, want) {
					t.Errorf("%v: no step %s in the fused graph:\n%s", dt, want, text)
				}
			}
			back, err := graph.Parse(text)
			if err != nil {
				t.Fatal(err)
			}
			if graph.Format(back) != text {
				t.Fatalf("%v: Parse(Format(fused)) differs from fused", dt)
			}
			rng := rand.New(rand.NewPCG(1, uint64(dt)))
			feeds := map[string]*graph.Tensor{}
			for _, in := range src.Inputs {
				v := graph.NewTensor(in.Type.DType, in.Type.Shape)
				for i := range v.Len() {
					v.Set(i, 3*rng.NormFloat64())
				}
				feeds[in.Name] = v
			}
			sameOutputs(t, dt.String()+" attributes", fzCPU(t, fused, feeds), fzCPU(t, src, feeds))
		}
	}
	for _, c := range []struct{ body, why string }{
		{"LeakyRelu(i0)", "takes its attributes in {...}"},
		{"Exp{alpha=1}(i0)", "takes no {...} attributes"},
		{"LeakyRelu{alpha=0.30}(i0)", "canonical form"},
		{"Selu{gamma=1,alpha=2}(i0)", "canonical form"},
		{"Selu{alpha=2}(i0)", "gives 1 of its 2 attributes"},
		{"LeakyRelu{beta=1}(i0)", "want name=value"},
		{"LeakyRelu{alpha=x}(i0)", "is not a number"},
		{"Gelu{approximate=erf}(i0)", "is not one of"},
		{"IsInf{detect_negative=1,detect_positive=1}(i0)", "cannot be fused"},
		{"And(i0,i0)", "cannot be fused"},
	} {
		_, err := graph.ParseFusedBody(c.body, 1)
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("body %s: error %v, want one saying %q", c.body, err, c.why)
		}
	}
}
