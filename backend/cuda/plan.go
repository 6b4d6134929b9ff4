package cuda

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/flashgraph/flashgraph/graph"
)

// The memory plan is pure Go over a *graph.Graph: it needs no GPU, so
// `flashgraph compile -plan` can print it anywhere, and the CUDA executor runs
// exactly the plan it prints.
//
// Every intermediate value and every per-node scratch buffer gets an offset in
// one device arena, allocated once at Compile: a run allocates nothing, so
// memory stays flat however many runs there are. A value is live from the node
// that writes it through the last node that reads it (graph outputs to the end
// of the run); buffers whose live ranges do not overlap share memory. Shape
// ops that do not move data (Reshape, Squeeze, Unsqueeze, Identity) are
// aliases: their output is their input's buffer, whose live range grows to
// cover the alias's uses.

// PlanOptions selects the lowering a plan describes.
type PlanOptions struct {
	// Compute is the storage type of float32 activations: Float32 (the zero
	// value) keeps every value in its graph dtype; BFloat16 is mixed precision:
	// float32 intermediates are stored (and multiplied) in bfloat16, while
	// params, consts, optimizer state, the loss and logsumexps stay float32.
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

// Plan is a static memory plan.
type Plan struct {
	// PeakBytes is the size of the activation arena: the device memory every
	// intermediate value and scratch buffer of a run occupies, as placed.
	PeakBytes int64
	// LiveBytes is the most bytes live at any one node: a lower bound on
	// PeakBytes that any placement must reach (equal for a perfect one).
	LiveBytes int64
	// PeakNode is the node at which LiveBytes is reached.
	PeakNode string
	// InitializerBytes and InputBytes are the params and consts, and the graph
	// inputs, each in their own buffers outside the arena.
	InitializerBytes, InputBytes int64
	// InPlace and InPlaceBytes count the update sources written over the
	// initializers they replace (no arena buffer, no copy after the run).
	InPlace      int
	InPlaceBytes int64
	// Tensors lists every arena buffer in the order their lives begin.
	Tensors []PlannedTensor
	// Largest lists the largest arena buffers, biggest first (at most 10).
	Largest []PlannedTensor

	compute  graph.DType
	composed bool // PlanOptions.ComposedAttention
	values   map[*graph.Value]*valuePlan
	scratch  [][]int // per node: indices into Tensors of its scratch buffers
}

// PlannedTensor is one buffer of the arena.
type PlannedTensor struct {
	Name  string      // the value's name, or "<node>/<purpose>" for scratch
	Node  string      // the node that writes it first
	Op    string      // that node's op
	DType graph.DType // the element type on the device
	Shape graph.Shape
	Bytes int64
	// Offset is the buffer's byte offset in the arena (256-byte aligned).
	Offset int64
	// First and Last are the node indices of its live range, inclusive; Last
	// is len(g.Nodes) for graph outputs (live until the run returns).
	First, Last int
	Scratch     bool
}

// placeKind says where a value's data lives.
type placeKind uint8

const (
	placeInput placeKind = iota // a buffer per graph input, filled by Run
	placeInit                   // a buffer per param or const, kept between runs
	placeArena                  // a range of the arena
	placeAlias                  // the buffer of another value (root): a view, or an update written in place
	// placeFolded is a Transpose of the last two axes read only by MatMuls:
	// it has no buffer; the MatMuls read its input (root) with cuBLAS's
	// transpose flag instead of a transposed copy. Autodiff writes every
	// weight gradient as MatMul(Transpose(x), dy), so this saves a copy of
	// each such activation per step.
	placeFolded
)

// valuePlan is the plan of one value.
type valuePlan struct {
	storage graph.DType
	kind    placeKind
	root    *graph.Value // placeAlias: the (non-alias) value whose buffer this is
	tensor  int          // placeArena: index into Plan.Tensors
}

// arenaAlign keeps every buffer aligned for vector loads and cuBLAS.
const arenaAlign = 256

// PlanMemory plans the float32 lowering of g (every value in its graph
// dtype) without updates.
func PlanMemory(g *graph.Graph) (*Plan, error) { return PlanMemoryWith(g, PlanOptions{}) }

// PlanMemoryWith plans g for the lowering opts describes.
//
// Where it costs no arena bytes, the plan keeps the inputs of each run of
// consecutive AdamW nodes live to the run's end, so that no output of the run
// lies over an input of it and the executor updates the run in one launch
// (adamw_multi.go). Where that would grow the arena (a recomputing step,
// whose peak is the optimizer's outputs), inputs die at their node as usual
// and the executor orders the run's launches around the reuse.
func PlanMemoryWith(g *graph.Graph, opts PlanOptions) (*Plan, error) {
	if g == nil {
		return nil, errors.New("memory plan: nil graph")
	}
	ends := adamwRunEnds(g)
	if ends == nil {
		return planMemory(g, opts, nil)
	}
	grouped, err := planMemory(g, opts, ends)
	if err != nil {
		return nil, err
	}
	plain, err := planMemory(g, opts, nil)
	if err != nil || plain.PeakBytes < grouped.PeakBytes {
		return plain, err
	}
	return grouped, nil
}

// planMemory plans g; an input of node i is read until node readUntil[i]
// (nil: until node i).
func planMemory(g *graph.Graph, opts PlanOptions, readUntil []int) (*Plan, error) {
	compute := opts.Compute
	if compute == graph.InvalidDType {
		compute = graph.Float32
	}
	if compute != graph.Float32 && compute != graph.BFloat16 {
		return nil, fmt.Errorf("memory plan: compute type %v (want float32 or bfloat16)", compute)
	}
	p := &Plan{compute: compute, composed: opts.ComposedAttention, values: map[*graph.Value]*valuePlan{}, scratch: make([][]int, len(g.Nodes))}
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
		p.values[v] = &valuePlan{storage: v.Type.DType, kind: placeInput}
		p.InputBytes += bytesOf(v.Type.DType, v.Type.Shape)
	}
	for _, v := range g.Initializers() {
		p.values[v] = &valuePlan{storage: v.Type.DType, kind: placeInit}
		p.InitializerBytes += bytesOf(v.Type.DType, v.Type.Shape)
	}
	// rootOf resolves aliases and folded transposes: the value whose
	// buffer v uses.
	rootOf := func(v *graph.Value) *graph.Value {
		if vp := p.values[v]; vp != nil && (vp.kind == placeAlias || vp.kind == placeFolded) {
			return vp.root
		}
		return v
	}
	uses := g.Uses()
	storage := func(v *graph.Value) graph.DType { return p.values[v].storage }

	for i, n := range g.Nodes {
		for _, in := range n.Inputs {
			if in != nil && p.values[in] == nil {
				return nil, fmt.Errorf("memory plan: node %s reads %s, which no earlier node, input or initializer defines", n.Name, in.Name)
			}
		}
		for k, out := range n.Outputs {
			vp := &valuePlan{storage: chooseStorage(n, k, compute, updateSrc[out], storage), kind: placeArena}
			if init := inPlace[out]; init != nil && vp.storage == storage(init) {
				vp.kind, vp.root = placeAlias, init
				p.InPlace++
				p.InPlaceBytes += bytesOf(vp.storage, out.Type.Shape)
			} else if foldableTranspose(n, uses[out]) && !updateSrc[out] && !g.IsOutput(out) {
				vp.kind, vp.root, vp.storage = placeFolded, rootOf(n.Inputs[0]), storage(n.Inputs[0])
			} else if aliasOps[n.Op] && !updateSrc[out] && n.Inputs[0] != nil && vp.storage == storage(n.Inputs[0]) &&
				out.Type.Shape.Numel() == n.Inputs[0].Type.Shape.Numel() {
				vp.kind, vp.root = placeAlias, rootOf(n.Inputs[0])
			} else {
				vp.tensor = len(p.Tensors)
				p.Tensors = append(p.Tensors, PlannedTensor{
					Name: out.Name, Node: n.Name, Op: n.Op, DType: vp.storage, Shape: out.Type.Shape.Clone(),
					Bytes: bytesOf(vp.storage, out.Type.Shape), First: i, Last: i,
				})
			}
			p.values[out] = vp
		}
		for _, s := range scratchFor(n, storage, opts) {
			p.scratch[i] = append(p.scratch[i], len(p.Tensors))
			p.Tensors = append(p.Tensors, PlannedTensor{
				Name: n.Name + "/" + s.what, Node: n.Name, Op: n.Op, DType: s.dt, Shape: s.shape.Clone(),
				Bytes: bytesOf(s.dt, s.shape), First: i, Last: i, Scratch: true,
			})
		}
		// Reads extend the live range of the buffer read (through aliases).
		until := i
		if readUntil != nil {
			until = readUntil[i]
		}
		for _, in := range n.Inputs {
			if in == nil {
				continue
			}
			if vp := p.values[rootOf(in)]; vp.kind == placeArena {
				p.Tensors[vp.tensor].Last = max(p.Tensors[vp.tensor].Last, until)
			}
		}
	}
	for _, v := range g.Outputs {
		vp := p.values[rootOf(v)]
		if vp == nil {
			return nil, fmt.Errorf("memory plan: graph output %s is not defined", v.Name)
		}
		if vp.kind == placeArena {
			p.Tensors[vp.tensor].Last = len(g.Nodes)
		}
	}
	p.place()
	p.measure(g)
	return p, nil
}

// aliasOps never move data: their output is their input's buffer.
var aliasOps = map[string]bool{"Reshape": true, "Squeeze": true, "Unsqueeze": true, "Identity": true}

// foldableTranspose reports whether n transposes the last two axes (and no
// others) and every reader of its output is a MatMul.
func foldableTranspose(n *graph.Node, users []*graph.Node) bool {
	if n.Op != "Transpose" || len(users) == 0 {
		return false
	}
	r := n.Inputs[0].Type.Shape.Rank()
	perm, err := graph.TransposePerm(n.Attrs, r)
	if err != nil || r < 2 || perm[r-2] != r-1 || perm[r-1] != r-2 {
		return false
	}
	for i := range r - 2 {
		if perm[i] != i {
			return false
		}
	}
	for _, u := range users {
		if u.Op != "MatMul" {
			return false
		}
	}
	return true
}

// chooseStorage picks the device element type of output k of n.
func chooseStorage(n *graph.Node, k int, compute graph.DType, updateSource bool, storage func(*graph.Value) graph.DType) graph.DType {
	v := n.Outputs[k]
	dt := v.Type.DType
	if compute != graph.BFloat16 || dt != graph.Float32 || updateSource || v.Type.Shape.Rank() == 0 {
		return dt
	}
	switch {
	case n.Op == "AdamW", n.Op == "SoftmaxCrossEntropyLoss", n.Op == "Cast":
		// Optimizer state, the loss and explicit casts to float32 are the
		// values mixed precision keeps in float32.
		return dt
	case n.Op == "FlashAttention" && k == 1:
		return dt // the logsumexp
	case aliasOps[n.Op] && n.Inputs[0] != nil:
		// A reshape of a float32 param stays an alias of it.
		return storage(n.Inputs[0])
	}
	return graph.BFloat16
}

// gemmType is the element type a GEMM producing storage type dt runs in
// (cuBLAS takes A, B and C in one type; float64 uses our own kernel).
func gemmType(dt graph.DType) graph.DType {
	switch dt {
	case graph.BFloat16, graph.Float16, graph.Float64:
		return dt
	}
	return graph.Float32
}

// place assigns arena offsets: largest buffers first, each into the
// best-fitting gap left by the buffers already placed whose live ranges
// overlap its own (the greedy-by-size heuristic, near optimal in practice).
func (p *Plan) place() {
	order := make([]int, len(p.Tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ta, tb := &p.Tensors[a], &p.Tensors[b]
		if c := cmp.Compare(tb.Bytes, ta.Bytes); c != 0 {
			return c
		}
		return cmp.Compare(ta.First, tb.First)
	})
	type span struct{ lo, hi int64 }
	var placed []int
	for _, i := range order {
		t := &p.Tensors[i]
		size := alignUp(t.Bytes)
		var busy []span
		for _, j := range placed {
			u := &p.Tensors[j]
			if u.First <= t.Last && t.First <= u.Last {
				busy = append(busy, span{u.Offset, u.Offset + alignUp(u.Bytes)})
			}
		}
		slices.SortFunc(busy, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
		best, bestGap := int64(-1), int64(-1)
		var at int64
		for _, s := range busy {
			if gap := s.lo - at; gap >= size && (bestGap < 0 || gap < bestGap) {
				best, bestGap = at, gap
			}
			at = max(at, s.hi)
		}
		if best < 0 {
			best = at
		}
		t.Offset = best
		p.PeakBytes = max(p.PeakBytes, best+size)
		placed = append(placed, i)
	}
}

// measure computes LiveBytes and the largest-buffer list.
func (p *Plan) measure(g *graph.Graph) {
	delta := make([]int64, len(g.Nodes)+2)
	for _, t := range p.Tensors {
		delta[t.First] += t.Bytes
		delta[t.Last+1] -= t.Bytes
	}
	var live int64
	for i := range len(g.Nodes) {
		live += delta[i]
		if live > p.LiveBytes {
			p.LiveBytes, p.PeakNode = live, g.Nodes[i].Name
		}
	}
	largest := slices.Clone(p.Tensors)
	slices.SortStableFunc(largest, func(a, b PlannedTensor) int { return cmp.Compare(b.Bytes, a.Bytes) })
	p.Largest = largest[:min(10, len(largest))]
}

func alignUp(n int64) int64 { return (n + arenaAlign - 1) / arenaAlign * arenaAlign }

// bytesOf is the device size of a tensor of dt and shape.
func bytesOf(dt graph.DType, s graph.Shape) int64 { return int64(s.Numel()) * int64(dt.Size()) }

// Report writes the plan for people: totals, then the top largest buffers
// with their live ranges (node indices).
func (p *Plan) Report(w io.Writer, top int) error {
	fmt.Fprintf(w, "activation arena %s (peak live %s at %s), initializers %s, inputs %s, compute %v\n",
		FormatBytes(p.PeakBytes), FormatBytes(p.LiveBytes), p.PeakNode, FormatBytes(p.InitializerBytes), FormatBytes(p.InputBytes), p.compute)
	if p.InPlace > 0 {
		fmt.Fprintf(w, "updates in place: %d outputs (%s) written over the initializers they replace\n", p.InPlace, FormatBytes(p.InPlaceBytes))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "bytes\t type\t live\t tensor\t op\t")
	list := p.Largest
	if top > len(list) {
		list = slices.Clone(p.Tensors)
		slices.SortStableFunc(list, func(a, b PlannedTensor) int { return cmp.Compare(b.Bytes, a.Bytes) })
	}
	for _, t := range list[:min(top, len(list))] {
		fmt.Fprintf(tw, "%s\t %v%v\t %d..%d\t %s\t %s\t\n", FormatBytes(t.Bytes), t.DType, t.Shape, t.First, t.Last, t.Name, t.Op)
	}
	return tw.Flush()
}

// FormatBytes writes a byte count with a binary unit (KiB, MiB, GiB).
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
