package passes

import (
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// fusedBodies returns the bodies of g's FusedElementwise nodes and how many
// nodes of each op g has.
func fusedBodies(g *graph.Graph) ([]string, map[string]int) {
	var bodies []string
	ops := map[string]int{}
	for _, n := range g.Nodes {
		ops[n.Op]++
		if n.Op == "FusedElementwise" {
			bodies = append(bodies, n.Attrs["body"].S)
		}
	}
	return bodies, ops
}

// rowFeeds fills every input of g with distinct values (none zero, so a
// reciprocal square root stays finite).
func rowFeeds(g *graph.Graph) map[string]*graph.Tensor {
	feeds := map[string]*graph.Tensor{}
	for i, in := range g.Inputs {
		f := graph.NewTensor(in.Type.DType, in.Type.Shape)
		for j := range f.Len() {
			f.Set(j, float64((j*7+i*5)%29)/13-1.03)
		}
		feeds[in.Name] = f
	}
	return feeds
}

// An RMSNorm forward (residual add, statistics, normalisation and scale)
// and its backward (the row sum and dx's combination of it with the row's
// elements) each become one body: the element steps after the reduction
// read the row values and the element values before it. The CPU gives the
// unfused graph's bits.
func TestFuseElementwiseNormsWalkRowsTwice(t *testing.T) {
	b := graph.NewBuilder("norms")
	const D = 16
	x := b.Input("x", graph.Float32, 3, 5, D)
	res := b.Input("res", graph.Float32, 3, 5, D)
	w := b.Input("w", graph.Float32, D)
	dy := b.Input("dy", graph.Float32, 3, 5, D)
	rstdIn := b.Input("rstd", graph.Float32, 3, 5, 1)
	// Forward.
	h := b.Add(x, res)
	rstd := b.Op("Reciprocal", nil, b.Sqrt(b.Add(b.ReduceMean(b.Mul(h, h), true, -1), b.Scalar(graph.Float32, 1e-5))))
	y := b.Mul(b.Mul(h, rstd), w)
	// Backward, with the saved rstd as an input.
	g := b.Mul(dy, w)
	s := b.ReduceSum(b.Mul(g, x), true, -1)
	r3 := b.Mul(b.Mul(rstdIn, rstdIn), rstdIn)
	c := b.Div(b.Mul(s, r3), b.Scalar(graph.Float32, D))
	dx := b.Sub(b.Mul(g, rstdIn), b.Mul(x, c))
	b.Output(h, rstd, y, dx)
	gr, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	log := &Log{}
	fused, err := (FuseElementwise{}).Run(gr, log)
	if err != nil {
		t.Fatal(err)
	}
	bodies, ops := fusedBodies(fused)
	want := []string{
		"Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3);Reciprocal(t4);Mul(t0,t5);Mul(t6,i3)",
		"Mul(i0,i1);Mul(t0,i2);ReduceSum(t1);Mul(i3,i3);Mul(t3,i3);Mul(t2,t4);Div(t5,i4);Mul(t0,i3);Mul(i2,t6);Sub(t7,t8)",
	}
	if strings.Join(bodies, " | ") != strings.Join(want, " | ") {
		t.Errorf("bodies\n%q\nwant\n%q", bodies, want)
	}
	if len(fused.Nodes) != 2 || ops["FusedElementwise"] != 2 {
		t.Errorf("ops after fusion: %v, want two FusedElementwise nodes", ops)
	}
	if !strings.Contains(log.String(), "8 ops (Add Mul ReduceMean Add Sqrt Reciprocal Mul Mul) over [3,5,16] reduced to [3,5,1]") {
		t.Errorf("the log does not describe the forward's group:\n%s", log)
	}
	feeds := rowFeeds(gr)
	sameOutputs(t, "norms", fzCPU(t, fused, feeds), fzCPU(t, gr, feeds))
}

// The second walk keeps the other limits: after a reduction that drops the
// reduced axis (its values would broadcast against another axis) no element
// op joins, nor one whose shape is larger than the reduced operand's.
func TestFuseElementwiseRowWalkLimits(t *testing.T) {
	b := graph.NewBuilder("walk limits")
	x := b.Input("x", graph.Float32, 8, 8)
	v := b.Input("v", graph.Float32, 2, 4, 8)
	big := b.Input("big", graph.Float32, 3, 2, 4, 8)
	sq := b.Mul(x, x)
	s := b.Sqrt(b.ReduceMean(sq, false, -1)) // [8]: keepdims 0
	y := b.Mul(b.Op("Exp", nil, sq), s)      // [8,8] times [8] along the columns
	sq2 := b.Mul(v, v)
	n2 := b.Neg(b.ReduceSum(sq2, true, -1)) // [2,4,1]
	z := b.Mul(n2, big)                     // [3,2,4,8]
	b.Output(y, z)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	fused, err := (FuseElementwise{}).Run(g, nil)
	if err != nil {
		t.Fatal(err)
	}
	bodies, ops := fusedBodies(fused)
	want := []string{"Mul(i0,i0);ReduceMean(t0);Sqrt(t1)", "Exp(i0);Mul(t0,i1)", "Mul(i0,i0);ReduceSum(t0);Neg(t1)"}
	if strings.Join(bodies, " | ") != strings.Join(want, " | ") || ops["Mul"] != 1 {
		t.Errorf("bodies %q (ops %v), want %q and a Mul", bodies, ops, want)
	}
	feeds := rowFeeds(g)
	sameOutputs(t, "walk limits", fzCPU(t, fused, feeds), fzCPU(t, g, feeds))
}

// In the tiny training step every norm is one body forward (the statistics
// and the normalisation). Backward, the final norm's body takes all of dx
// (the embedding gradient's GEMM reads it), and so does each attention and
// MLP norm's: the body that makes dy·w and dy·x̂ stays open past the weight
// gradient's column ReduceSum of dy·x̂ (run after it) and takes in the row
// sum and dx. A q/k head norm's row sum keeps its x·c terms out (row_walk
// refused): its dy comes from RoPE's index chain and its dx is written
// transposed, which only bodies without a reduction do (defer_reader
// refused), so they only feed the body that sums dx's terms, which computes
// them itself. The step stays bit-identical (the whole step is compared in
// TestFuseElementwiseKeepsTheStepBitExact).
func TestFuseElementwiseStepNormsInOneBody(t *testing.T) {
	ts := tinyTrainStep(t, graph.Float32)
	log := &Log{}
	fused, err := (FuseElementwise{}).Run(ts.Graph, log)
	if err != nil {
		t.Fatal(err)
	}
	forward, backward, alone := 0, 0, 0
	for _, n := range fused.Nodes {
		if _, ok := n.Attrs["axes"]; !ok || n.Op != "FusedElementwise" {
			continue
		}
		steps, err := graph.FusedBody(n.Attrs["body"].S, len(n.Inputs))
		if err != nil {
			t.Fatal(err)
		}
		red, walked := -1, false
		for k, s := range steps {
			if graph.FusibleReduce[s.Op] {
				red = k
			}
		}
		// An element step after the reduction has the reduced operand's
		// shape.
		inTypes := make([]graph.TensorType, len(n.Inputs))
		for i, v := range n.Inputs {
			inTypes[i] = v.Type
		}
		types, err := graph.FusedTypes(steps, inTypes, n.Attrs)
		if err != nil {
			t.Fatal(err)
		}
		full := inTypes[steps[red].Args[0].Index].Shape
		if steps[red].Args[0].Step {
			full = types[steps[red].Args[0].Index].Shape
		}
		for k := red + 1; k < len(steps); k++ {
			walked = walked || types[k].Shape.Equal(full)
		}
		switch {
		case steps[red].Op == "ReduceMean" && walked:
			forward++
		case steps[red].Op == "ReduceSum" && walked:
			backward++
		case steps[red].Op == "ReduceSum":
			alone++
		default:
			t.Errorf("%s: no element step after the reduction: %s", n.Name, n.Attrs["body"].S)
		}
	}
	// Two layers of four norms (attention, MLP, q heads, k heads) and the
	// final norm.
	if forward != 9 || backward != 5 || alone != 4 {
		t.Errorf("%d forward and %d backward norm bodies with a second walk, %d without; want 9, 5 and 4", forward, backward, alone)
	}
	if n := strings.Count(log.String(), "refused row_walk"); n != 4 {
		t.Errorf("row_walk refused %d times, want 4:\n%s", n, log)
	}
	if n := strings.Count(log.String(), "refused defer_reader"); n != 4 {
		t.Errorf("defer_reader refused %d times, want 4 (the q/k norms' weight gradients):\n%s", n, log)
	}
	if c := countOp(fused, "FusedElementwise"); c != 34 {
		t.Errorf("%d FusedElementwise nodes, want 34 (42 with each attention and MLP norm backward in three bodies, 52 with each norm's normalisation and the final norm's dx bodies of their own)", c)
	}
	// The final norm's dy·x̂, made before dy·w from the same dy, joins the
	// body too: no op is left alone.
	if c := countOp(fused, "Mul"); c != 0 {
		t.Errorf("%d Mul nodes left unfused, want none", c)
	}
	// Each column ReduceSum of an attention or MLP norm's dy·x̂ runs right
	// after the body that writes it, its Reshape after it.
	for i, n := range fused.Nodes {
		if n.Op != "ReduceSum" || !strings.Contains(n.Name, "_norm/") || strings.Contains(n.Name, "final_norm") {
			continue
		}
		if i == 0 || fused.Nodes[i-1].Op != "FusedElementwise" || i+1 == len(fused.Nodes) || fused.Nodes[i+1].Op != "Reshape" {
			t.Errorf("%s is not between its norm body and its Reshape", n.Name)
		}
	}
}

func countOp(g *graph.Graph, op string) int {
	c := 0
	for _, n := range g.Nodes {
		if n.Op == op {
			c++
		}
	}
	return c
}

// normBackward builds an attention or MLP norm's backward as autodiff does:
// dy (two GEMMs' gradients summed) times w and times x̂, the weight
// gradient a column ReduceSum of dy·x̂ and its Reshape, the row sum of
// dy·w·x scaled by the saved rstd, and dx summed with the residual's
// gradient up. With readDW, an elementwise op reads the weight gradient
// before the row sum.
func normBackward(t *testing.T, readDW bool) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("norm backward")
	const D = 16
	d0 := b.Input("d0", graph.Float32, 3, 5, D)
	d1 := b.Input("d1", graph.Float32, 3, 5, D)
	w := b.Input("w", graph.Float32, D)
	xhat := b.Input("xhat", graph.Float32, 3, 5, D)
	x := b.Input("x", graph.Float32, 3, 5, D)
	rstd := b.Input("rstd", graph.Float32, 3, 5, 1)
	up := b.Input("up", graph.Float32, 3, 5, D)
	dy := b.Add(d0, d1)
	g := b.Mul(dy, w)
	dw := b.Reshape(b.ReduceSum(b.Mul(dy, xhat), true, 0, 1), D)
	if readDW {
		dw = b.Neg(dw)
	}
	gr := b.Mul(g, rstd)
	s := b.ReduceSum(b.Mul(g, x), true, -1)
	c := b.Div(b.Mul(s, b.Mul(b.Mul(rstd, rstd), rstd)), b.Scalar(graph.Float32, -D))
	dx := b.Add(b.Add(up, gr), b.Mul(c, x))
	b.Output(dw, dx)
	out, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A norm backward is one body: the body that makes dy·w and dy·x̂ stays
// open past the weight gradient's column ReduceSum of dy·x̂ (and its
// Reshape), which run right after it, and takes in the row sum and dx's
// steps after it. An elementwise op that reads the weight gradient closes
// the body there instead (it must run before that op), and the backward is
// three bodies as without the deferral: dy·w and dy·x̂; the row sum and its
// scaling (row_walk refused: its x·c only feeds dx's sum); dx's sum.
// The CPU gives the unfused graph's bits either way.
func TestFuseElementwiseNormBackwardDefersTheColumnSum(t *testing.T) {
	for _, c := range []struct {
		readDW bool
		bodies []string
		order  string
	}{
		{false, []string{"Add(i0,i1);Mul(t0,i2);Mul(t0,i3);Mul(t1,i4);Mul(t1,i5);ReduceSum(t4);Mul(i4,i4);Mul(t6,i4);Mul(t5,t7);Div(t8,i6);Add(i7,t3);Mul(t9,i5);Add(t10,t11)"},
			"FusedElementwise ReduceSum Reshape"},
		{true, []string{"Add(i0,i1);Mul(t0,i2);Mul(t0,i3)", "Mul(i0,i1);ReduceSum(t0);Mul(i2,i2);Mul(t2,i2);Mul(t1,t3);Div(t4,i3)", "Mul(i0,i1);Add(i2,t0);Mul(i3,i4);Add(t1,t2)"},
			"FusedElementwise ReduceSum Reshape Neg FusedElementwise FusedElementwise"},
	} {
		g := normBackward(t, c.readDW)
		log := &Log{}
		fused, err := (FuseElementwise{}).Run(g, log)
		if err != nil {
			t.Fatal(err)
		}
		bodies, _ := fusedBodies(fused)
		if strings.Join(bodies, " | ") != strings.Join(c.bodies, " | ") {
			t.Errorf("readDW %v: bodies\n%q\nwant\n%q", c.readDW, bodies, c.bodies)
		}
		var order []string
		for _, n := range fused.Nodes {
			order = append(order, n.Op)
		}
		if got := strings.Join(order, " "); got != c.order {
			t.Errorf("readDW %v: nodes %s, want %s\n%s", c.readDW, got, c.order, log)
		}
		feeds := rowFeeds(g)
		sameOutputs(t, "norm backward", fzCPU(t, fused, feeds), fzCPU(t, g, feeds))
	}
}

// The final norm's backward makes dy·x̂ before dy·w, both from one dy (the
// loss GEMM's gradient): dy·x̂, which only the deferred column sum reads,
// joins the open body that makes dy·w (they share dy) instead of being a
// kernel of its own, and that body goes on to take in the row sum and dx.
func TestFuseElementwiseNormBackwardSiblingJoins(t *testing.T) {
	b := graph.NewBuilder("final norm backward")
	const D = 16
	dy := b.Input("dy", graph.Float32, 3, 5, D)
	w := b.Input("w", graph.Float32, D)
	xhat := b.Input("xhat", graph.Float32, 3, 5, D)
	x := b.Input("x", graph.Float32, 3, 5, D)
	rstd := b.Input("rstd", graph.Float32, 3, 5, 1)
	g := b.Mul(dy, w)
	dw := b.Reshape(b.ReduceSum(b.Mul(dy, xhat), true, 0, 1), D)
	s := b.ReduceSum(b.Mul(g, x), true, -1)
	c := b.Div(b.Mul(s, rstd), b.Scalar(graph.Float32, -D))
	dx := b.Add(b.Mul(g, rstd), b.Mul(c, x))
	b.Output(dw, dx)
	gr, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	fused, err := (FuseElementwise{}).Run(gr, nil)
	if err != nil {
		t.Fatal(err)
	}
	bodies, _ := fusedBodies(fused)
	want := "Mul(i0,i1);Mul(i0,i2);Mul(t0,i3);ReduceSum(t2);Mul(t3,i4);Div(t4,i5);Mul(t0,i4);Mul(t5,i3);Add(t6,t7)"
	if len(bodies) != 1 || bodies[0] != want {
		t.Errorf("bodies %q, want [%q]", bodies, want)
	}
	var order []string
	for _, n := range fused.Nodes {
		order = append(order, n.Op)
	}
	if got := strings.Join(order, " "); got != "FusedElementwise ReduceSum Reshape" {
		t.Errorf("nodes %s, want FusedElementwise ReduceSum Reshape", got)
	}
	feeds := rowFeeds(gr)
	sameOutputs(t, "final norm backward", fzCPU(t, fused, feeds), fzCPU(t, gr, feeds))
}
