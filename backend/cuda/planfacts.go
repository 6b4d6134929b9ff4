package cuda

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
)

// Planning facts: everything the memory plan (plan.go) must know about a
// graph's ops, worked out once per graph before any buffer is placed. They
// come from the op table's planning columns (graph.OpSpec: View, InPlace,
// KeepDType, Permutation) and from the CUDA lowering's: the scratch each
// lowering takes (lowering.scratch in ops.go) and the columns of
// loweringPlans below. The planner knows no op: it assigns buffers from
// these facts, the values' lifetimes and their sizes. `flashgraph compile
// -plan -explain` prints them (Plan.ReportFacts).

// PlanOptions selects the lowering a plan describes.
type PlanOptions struct {
	// Compute is the storage type of float32 activations: Float32 (the zero
	// value) keeps every value in its graph dtype; BFloat16 is mixed precision:
	// float32 intermediates are stored (and multiplied) in bfloat16, while
	// params, consts, optimizer state, the loss and logsumexps stay float32
	// (the op table's KeepDType).
	Compute graph.DType
	// ComposedAttention lowers FlashAttention(Grad) to the composed path
	// (cuBLAS, softmax kernel, cuBLAS; [BH, Sq, Sk] scores in scratch) even
	// where the fused kernels apply: for comparisons and tests.
	ComposedAttention bool
	// Updates is backend.Options.Updates. An update source keeps its graph
	// dtype and either lies on the initializer it replaces (written in place,
	// see inplace.go) or has a buffer of its own, so copying it over its
	// initializer after a run is a plain copy.
	Updates map[string]string
	// CopyUpdates gives every update source a buffer of its own, copied after
	// each run, instead of writing it in place where that is safe.
	CopyUpdates bool
}

// loweringPlan is what the memory plan must know of how an op's CUDA
// lowering uses memory, beyond its scratch buffers (lowering.scratch).
type loweringPlan struct {
	// transposed lists the inputs the lowering can read with their last two
	// axes swapped, through cuBLAS's transpose flag (lowerMatMul): a
	// permutation that swaps the last two axes and is read only at such
	// inputs gets no buffer (placeFolded). Autodiff writes every weight
	// gradient as MatMul(Transpose(x), dy), so this saves a copy of each such
	// activation per step.
	transposed []int
	// guarded: the kernels write nothing once an earlier kernel has set the
	// error flag (or the node's own input is invalid), so a node of the op
	// may write its updates in place without a failed run touching the
	// weights (inplace.go).
	guarded bool
	// grouped: the executor launches a run of consecutive nodes of the op
	// together (adamw_multi.go), reading every input of the run before it
	// writes: the plan keeps a run's inputs live to its last node where that
	// costs no arena, so that the run is one launch.
	grouped bool
}

// loweringPlans are the planning columns of the lowering table (ops.go's
// lowerings), by op; an op not listed has none of them. A test checks that
// each is an op with a lowering.
var loweringPlans = map[string]loweringPlan{
	"MatMul": {transposed: []int{0, 1}},
	"AdamW":  {guarded: true, grouped: true},
}

// planFacts are a graph's planning facts.
type planFacts struct {
	compute graph.DType
	opts    PlanOptions
	// values gives every value its storage type and its place: its own
	// buffer (input, initializer or arena) or the buffer of another value
	// (root). Arena values get their tensor from the planner.
	values map[*graph.Value]*valuePlan
	// scratch lists, per node, the scratch buffers its lowering takes.
	scratch [][]scratchReq
	// readUntil, when not nil, is the node until which the inputs of each
	// node are best kept live (grouped launches); the planner keeps that
	// where it costs no arena.
	readUntil []int
	// tally counts the facts for the report.
	tally factTally
}

// factTally counts, per fact, the values or nodes it applies to, by op.
type factTally struct {
	narrowed, kept, views, folded, inPlace, scratch, grouped map[string]int
	keptScalar, keptUpdate                                   int
	scratchBytes, inPlaceBytes                               int64
	groups                                                   int
}

// planFactsOf works out g's planning facts for the lowering opts describes.
func planFactsOf(g *graph.Graph, opts PlanOptions) (*planFacts, error) {
	compute := opts.Compute
	if compute == graph.InvalidDType {
		compute = graph.Float32
	}
	if compute != graph.Float32 && compute != graph.BFloat16 {
		return nil, fmt.Errorf("memory plan: compute type %v (want float32 or bfloat16)", compute)
	}
	f := &planFacts{compute: compute, opts: opts, values: map[*graph.Value]*valuePlan{}, scratch: make([][]scratchReq, len(g.Nodes))}
	t := &f.tally
	for _, m := range []*map[string]int{&t.narrowed, &t.kept, &t.views, &t.folded, &t.inPlace, &t.scratch, &t.grouped} {
		*m = map[string]int{}
	}
	outputs := map[string]*graph.Value{}
	for _, v := range g.Outputs {
		outputs[v.Name] = v
	}
	updateSrc := map[*graph.Value]bool{}
	for from := range opts.Updates {
		v, ok := outputs[from]
		if !ok {
			return nil, fmt.Errorf("memory plan: update source %s is not a graph output", from)
		}
		updateSrc[v] = true
	}
	var inPlace map[*graph.Value]*graph.Value
	if !opts.CopyUpdates {
		inPlace = inPlaceUpdates(g, opts.Updates)
	}
	for _, v := range g.Inputs {
		f.values[v] = &valuePlan{storage: v.Type.DType, kind: placeInput}
	}
	for _, v := range g.Initializers() {
		f.values[v] = &valuePlan{storage: v.Type.DType, kind: placeInit}
	}
	// rootOf resolves views, folds and in-place outputs: the value whose
	// buffer v uses.
	rootOf := func(v *graph.Value) *graph.Value {
		if vp := f.values[v]; vp != nil && (vp.kind == placeAlias || vp.kind == placeFolded) {
			return vp.root
		}
		return v
	}
	storage := func(v *graph.Value) graph.DType { return f.values[v].storage }
	uses := g.Uses()
	for i, n := range g.Nodes {
		for _, in := range n.Inputs {
			if in != nil && f.values[in] == nil {
				return nil, fmt.Errorf("memory plan: node %s reads %s, which no earlier node, input or initializer defines", n.Name, in.Name)
			}
		}
		spec, ok := graph.LookupOp(n.Op)
		if !ok {
			spec = &graph.OpSpec{Name: n.Op} // no facts; the executor reports the op
		}
		for k, out := range n.Outputs {
			vp := &valuePlan{storage: f.chooseStorage(spec, n, k, updateSrc[out], storage), kind: placeArena}
			var in0 *graph.Value
			if len(n.Inputs) > 0 {
				in0 = n.Inputs[0]
			}
			switch init := inPlace[out]; {
			case init != nil && vp.storage == storage(init):
				vp.kind, vp.root, vp.inPlace = placeAlias, init, true
				t.inPlace[n.Op]++
				t.inPlaceBytes += bytesOf(vp.storage, out.Type.Shape)
			case k == 0 && !updateSrc[out] && !g.IsOutput(out) && foldsIntoReaders(spec, n, uses[out]):
				vp.kind, vp.root, vp.storage = placeFolded, rootOf(in0), storage(in0)
				t.folded[n.Op]++
			case k == 0 && spec.View && !updateSrc[out] && in0 != nil && vp.storage == storage(in0) &&
				out.Type.Shape.Numel() == in0.Type.Shape.Numel():
				vp.kind, vp.root = placeAlias, rootOf(in0)
				t.views[n.Op]++
			}
			if vp.storage != out.Type.DType {
				t.narrowed[n.Op]++
			}
			f.values[out] = vp
		}
		f.scratch[i] = scratchFor(n, storage, opts)
		for _, s := range f.scratch[i] {
			t.scratch[n.Op]++
			t.scratchBytes += bytesOf(s.dt, s.shape)
		}
	}
	for _, v := range g.Outputs {
		if f.values[v] == nil {
			return nil, fmt.Errorf("memory plan: graph output %s is not defined", v.Name)
		}
	}
	f.readUntil = groupReadEnds(g)
	for i, n := range g.Nodes {
		// A run's nodes read until its last; the last reads until itself.
		if f.readUntil == nil || f.readUntil[i] == i && (i == 0 || f.readUntil[i-1] != i) {
			continue
		}
		t.grouped[n.Op]++
		if i == 0 || f.readUntil[i-1] != f.readUntil[i] {
			t.groups++
		}
	}
	return f, nil
}

// chooseStorage picks the device element type of output k of n: under mixed
// precision a float32 tensor is stored in bfloat16 unless it is a scalar,
// an update source (copied over a float32 initializer), an output the op
// table keeps in its dtype, or a view (which keeps its input's type).
func (f *planFacts) chooseStorage(spec *graph.OpSpec, n *graph.Node, k int, updateSource bool, storage func(*graph.Value) graph.DType) graph.DType {
	v := n.Outputs[k]
	dt := v.Type.DType
	if f.compute != graph.BFloat16 || dt != graph.Float32 {
		return dt
	}
	switch {
	case v.Type.Shape.Rank() == 0:
		f.tally.keptScalar++
		return dt
	case updateSource:
		f.tally.keptUpdate++
		return dt
	case spec.KeepsDType(k):
		f.tally.kept[n.Op]++
		return dt
	case spec.View && k == 0 && len(n.Inputs) > 0 && n.Inputs[0] != nil:
		// A view of a float32 param stays a view of it.
		return storage(n.Inputs[0])
	}
	return graph.BFloat16
}

// foldsIntoReaders reports whether output 0 of n is its input 0 with the
// last two axes swapped (and no others), read only at inputs whose
// lowering reads them transposed (loweringPlan.transposed).
func foldsIntoReaders(spec *graph.OpSpec, n *graph.Node, users []*graph.Node) bool {
	if spec.Permutation == nil || len(users) == 0 || len(n.Inputs) == 0 || n.Inputs[0] == nil {
		return false
	}
	r := n.Inputs[0].Type.Shape.Rank()
	perm, err := spec.Permutation(n.Attrs, r)
	if err != nil || r < 2 || perm[r-2] != r-1 || perm[r-1] != r-2 {
		return false
	}
	for i := range r - 2 {
		if perm[i] != i {
			return false
		}
	}
	out := n.Outputs[0]
	for _, u := range users {
		for j, in := range u.Inputs {
			if in == out && !slices.Contains(loweringPlans[u.Op].transposed, j) {
				return false
			}
		}
	}
	return true
}

// groupReadEnds gives, for each node, the last node index until which its
// inputs are read when the executor launches runs of consecutive nodes of a
// grouped op together (loweringPlan.grouped): its own index, or the last
// node of the run it is in. Nil when g has no run of two such nodes.
func groupReadEnds(g *graph.Graph) []int {
	ends := make([]int, len(g.Nodes))
	runs := false
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		ends[i] = i
		op := g.Nodes[i].Op
		if loweringPlans[op].grouped && i+1 < len(g.Nodes) && g.Nodes[i+1].Op == op {
			ends[i] = ends[i+1]
			runs = true
		}
	}
	if !runs {
		return nil
	}
	return ends
}

// ReportFacts writes, for people, the planning facts the plan was made
// from: what each fact applied to, by op, and where the fact comes from.
func (p *Plan) ReportFacts(w io.Writer) error {
	f := p.facts
	if f == nil {
		return nil
	}
	t := &f.tally
	fmt.Fprintf(w, "planning facts (compute %v):\n", f.compute)
	if f.compute == graph.Float32 {
		fmt.Fprintln(w, "  storage: every value in its graph dtype")
	} else {
		fmt.Fprintf(w, "  storage: %d values stored in %v (%s); float32 kept for %s (op table KeepDType), %d scalars, %d update sources\n",
			sum(t.narrowed), f.compute, byOp(t.narrowed), byOp(t.kept), t.keptScalar, t.keptUpdate)
	}
	fmt.Fprintf(w, "  views: %d values share their input's buffer (op table View): %s\n", sum(t.views), byOp(t.views))
	fmt.Fprintf(w, "  folded: %d values have no buffer, their readers read the input transposed (op table Permutation, lowering transposed inputs): %s\n",
		sum(t.folded), byOp(t.folded))
	fmt.Fprintf(w, "  in place: %d update outputs (%s) lie on the initializers they replace (op table InPlace, guarded lowering): %s\n",
		sum(t.inPlace), FormatBytes(t.inPlaceBytes), byOp(t.inPlace))
	fmt.Fprintf(w, "  scratch: %d buffers (%s in all) the lowerings take (lowering scratch): %s\n", sum(t.scratch), FormatBytes(t.scratchBytes), byOp(t.scratch))
	if t.groups == 0 {
		fmt.Fprintln(w, "  grouped launches (lowering): none")
		return nil
	}
	kept := "kept: it costs no arena"
	if !p.readsExtended {
		kept = "not kept: it would grow the arena"
	}
	fmt.Fprintf(w, "  grouped launches (lowering): %s nodes in %d run(s); their inputs live to the run's end %s (arena %s, %s the other way)\n",
		byOp(t.grouped), t.groups, kept, FormatBytes(p.PeakBytes), FormatBytes(p.otherPeak))
	return nil
}

func sum(m map[string]int) int {
	n := 0
	for _, c := range m {
		n += c
	}
	return n
}

// byOp lists counts by op, largest first: "405 AdamW, 24 Reshape".
func byOp(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	ops := make([]string, 0, len(m))
	for op := range m {
		ops = append(ops, op)
	}
	slices.SortFunc(ops, func(a, b string) int {
		if c := cmp.Compare(m[b], m[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(ops))
	for i, op := range ops {
		parts[i] = fmt.Sprintf("%d %s", m[op], op)
	}
	return strings.Join(parts, ", ")
}
