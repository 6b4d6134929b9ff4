package bench

import (
	"math"
	"slices"
	"strings"
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

// A grouped shape: K/V of H_kv heads, H/H_kv query heads per K/V head;
// KVHeads 0 is multi-head attention; an H_kv that does not divide H is
// refused, and the composed graph (MHA only) refuses a grouped shape.
func TestAttnShapeGrouped(t *testing.T) {
	mha := AttnShape{B: 2, H: 32, S: 2048, D: 128, Causal: true}
	if mha.KV() != 32 || mha.Grouped() || mha.Group() != 1 || mha.KVElems() != mha.Elems() || mha.Check() != nil {
		t.Errorf("MHA: KV %d grouped %v group %d KV elems %d, check %v", mha.KV(), mha.Grouped(), mha.Group(), mha.KVElems(), mha.Check())
	}
	same := mha
	same.KVHeads = 32
	if same.Grouped() || same.Group() != 1 {
		t.Errorf("H_kv = H must be multi-head attention: %v", same)
	}
	gqa := mha
	gqa.KVHeads = 8
	if !gqa.Grouped() || gqa.Group() != 4 || gqa.KVElems() != 2*8*2048*128 || gqa.Elems() != 2*32*2048*128 || gqa.Check() != nil {
		t.Errorf("GQA: group %d KV elems %d elems %d check %v", gqa.Group(), gqa.KVElems(), gqa.Elems(), gqa.Check())
	}
	if s := gqa.String(); s != "B=2 H=32 H_kv=8 S=2048 D=128 causal=true" {
		t.Errorf("String() = %q", s)
	}
	if s := mha.String(); s != "B=2 H=32 S=2048 D=128 causal=true" {
		t.Errorf("MHA String() = %q (it must not change)", s)
	}
	mqa := mha
	mqa.KVHeads = 1
	if mqa.Group() != 32 || mqa.KVElems() != 2*2048*128 {
		t.Errorf("MQA: group %d KV elems %d", mqa.Group(), mqa.KVElems())
	}
	for _, kv := range []int{3, -1, 64} {
		bad := mha
		bad.KVHeads = kv
		if err := bad.Check(); err == nil {
			t.Errorf("H_kv %d accepted for H 32", kv)
		}
	}
	if _, _, err := UnfusedAttentionGraph(AttnShape{B: 1, H: 4, KVHeads: 2, S: 8, D: 4}); err == nil || !strings.Contains(err.Error(), "multi-head") {
		t.Errorf("the composed graph took a grouped shape: %v", err)
	}
}
