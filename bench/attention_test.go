package bench

import (
	"math"
	"slices"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cuda"
	"github.com/flashgraph/flashgraph/graph"
)

// The composed benchmark graph must split into forward attention, the
// untimed loss, and the attention backward, with the ops the unfused
// training graph runs in each part.
func TestUnfusedAttentionGraphRanges(t *testing.T) {
	for _, causal := range []bool{false, true} {
		sh := AttnShape{B: 2, H: 3, S: 8, D: 4, Causal: causal}
		g, grads, err := UnfusedAttentionGraph(sh)
		if err != nil {
			t.Fatal(err)
		}
		fwdEnd, bwdStart, err := attnRanges(g.Nodes)
		if err != nil {
			t.Fatal(err)
		}
		ops := func(lo, hi int) []string {
			var out []string
			for _, n := range g.Nodes[lo:hi] {
				out = append(out, n.Op)
			}
			return out
		}
		fwd := []string{"Transpose", "MatMul", "Mul", "Softmax", "MatMul"}
		if causal {
			fwd = []string{"Transpose", "MatMul", "Mul", "Add", "Softmax", "MatMul"}
		}
		if got := ops(0, fwdEnd); !slices.Equal(got, fwd) {
			t.Errorf("causal=%v: forward ops %v, want %v", causal, got, fwd)
		}
		bwd := ops(bwdStart, len(g.Nodes))
		if !slices.Contains(bwd, "SoftmaxGrad") || slices.Contains(bwd, "ReduceSum") || slices.Contains(bwd, "Expand") {
			t.Errorf("causal=%v: backward ops %v", causal, bwd)
		}
		if n := countOp(bwd, "MatMul"); n != 4 {
			t.Errorf("causal=%v: backward has %d MatMuls, want 4 (dV, dP, dQ, dKᵀ)", causal, n)
		}
		for _, name := range []string{"q", "k", "v"} {
			v := g.Value(grads[name])
			if v == nil || !v.Type.Equal(graph.TensorType{DType: graph.BFloat16, Shape: graph.Shape{2, 3, 8, 4}}) {
				t.Errorf("gradient of %s: %v", name, v)
			}
		}
		// The plan holds at least the S×S probabilities: the memory the
		// fused kernels avoid.
		p, err := cuda.PlanMemoryWith(g, cuda.PlanOptions{Compute: graph.BFloat16})
		if err != nil {
			t.Fatal(err)
		}
		if p.PeakBytes < int64(2*3*8*8*2) || p.InputBytes != int64(4*sh.Elems()*2) {
			t.Errorf("plan arena %d, inputs %d", p.PeakBytes, p.InputBytes)
		}
	}
}

func countOp(ops []string, op string) int {
	n := 0
	for _, o := range ops {
		if o == op {
			n++
		}
	}
	return n
}

func TestAttnRangesRejectsOtherGraphs(t *testing.T) {
	n := func(name string) *graph.Node { return &graph.Node{Name: name} }
	for _, nodes := range [][]*graph.Node{
		{n("MatMul_0"), n("grad/MatMul_0/MatMul_0")},                              // no loss
		{n("loss/Mul_0"), n("grad/x/MatMul_0")},                                   // no forward
		{n("MatMul_0"), n("loss/Mul_0"), n("grad/loss/Mul_0/Mul_0")},              // no backward
		{n("MatMul_0"), n("loss/Mul_0"), n("grad/MatMul_0/MatMul_0"), n("Add_9")}, // stray node
	} {
		if _, _, err := attnRanges(nodes); err == nil {
			t.Errorf("attnRanges accepted %v", nodes)
		}
	}
}

func TestBenchHelpers(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median odd = %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median even = %v", m)
	}
	one, two := cuda.BF16FromFloat32(1), cuda.BF16FromFloat32(2)
	d, r := maxAbsDiff([]uint16{one, two}, []uint16{two, two})
	if d != 1 || r != 2 {
		t.Errorf("maxAbsDiff = %v, %v", d, r)
	}
	nan := cuda.BF16FromFloat32(float32(math.NaN()))
	if d, _ := maxAbsDiff([]uint16{nan}, []uint16{one}); !math.IsInf(d, 1) {
		t.Errorf("a NaN (unwritten) element must make the error +Inf, got %v", d)
	}
	a, b := randomBF16(3<<19, 7), randomBF16(3<<19, 7)
	if !slices.Equal(a, b) {
		t.Error("randomBF16 is not a function of its seed")
	}
	var sum, sq float64
	for _, h := range a {
		x := float64(cuda.BF16ToFloat32(h))
		sum += x
		sq += x * x
	}
	mean, std := sum/float64(len(a)), math.Sqrt(sq/float64(len(a)))
	if math.Abs(mean) > 0.01 || math.Abs(std-1) > 0.01 {
		t.Errorf("randomBF16: mean %v std %v, want standard normal", mean, std)
	}
}
