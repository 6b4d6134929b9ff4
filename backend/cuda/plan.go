package cuda

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/internal/units"
)

// The memory plan is pure Go over a *graph.Graph: it needs no GPU, so
// `flashgraph compile -plan` can print it anywhere, and the CUDA executor runs
// exactly the plan it prints.
//
// Every intermediate value and every per-node scratch buffer gets an offset in
// one device arena, allocated once at Compile: a run allocates nothing, so
// memory stays flat however many runs there are. A value is live from the node
// that writes it through the last node that reads it (graph outputs to the end
// of the run); buffers whose live ranges do not overlap share memory.
//
// The planner knows no op. What it must know of them comes as planning facts
// (planfacts.go), worked out once before it runs: each value's storage type,
// which values use another's buffer (views, in-place updates, folded
// layouts: reads of such a value extend its root's live range), each node's
// scratch, and how long grouped launches read their inputs. From those, the
// values' lifetimes and their sizes, it assigns the buffers.

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
	facts    *planFacts
	// readsExtended says whether the plan keeps inputs live until the
	// facts' readUntil; otherPeak is the arena the other choice takes.
	readsExtended bool
	otherPeak     int64
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
	// placeFolded has no buffer and no kernel of its own: it is its root's
	// data in another layout, and the lowering of each of its readers reads
	// the root's buffer in that layout (planfacts.go, foldsIntoReaders).
	placeFolded
)

// valuePlan is the plan of one value.
type valuePlan struct {
	storage graph.DType
	kind    placeKind
	root    *graph.Value // placeAlias, placeFolded: the value whose buffer this is
	tensor  int          // placeArena: index into Plan.Tensors
	inPlace bool         // placeAlias: an update written over its root, the initializer it replaces
}

// arenaAlign keeps every buffer aligned for vector loads and cuBLAS.
const arenaAlign = 256

// PlanMemory plans the float32 lowering of g (every value in its graph
// dtype) without updates.
func PlanMemory(g *graph.Graph) (*Plan, error) { return PlanMemoryWith(g, PlanOptions{}) }

// PlanMemoryWith plans g for the lowering opts describes: it works out the
// planning facts, then assigns the buffers.
//
// Where the facts ask for inputs to stay live past their last read
// (readUntil: a grouped launch reads all of a run's inputs before it writes
// any output), the plan keeps them live if that costs no arena bytes, and
// otherwise lets them die at their last read (the executor then orders the
// run's launches around the reuse): it places both ways and keeps the
// smaller arena.
func PlanMemoryWith(g *graph.Graph, opts PlanOptions) (*Plan, error) {
	if g == nil {
		return nil, errors.New("memory plan: nil graph")
	}
	if err := CheckDTypes(g); err != nil {
		return nil, err
	}
	f, err := planFactsOf(g, opts)
	if err != nil {
		return nil, err
	}
	if f.readUntil == nil {
		return assignBuffers(g, f, nil), nil
	}
	extended := assignBuffers(g, f, f.readUntil)
	plain := assignBuffers(g, f, nil)
	if plain.PeakBytes < extended.PeakBytes {
		plain.otherPeak = extended.PeakBytes
		return plain, nil
	}
	extended.readsExtended, extended.otherPeak = true, plain.PeakBytes
	return extended, nil
}

// assignBuffers places g's buffers from its planning facts; an input of
// node i is read until node readUntil[i] (nil: until node i).
func assignBuffers(g *graph.Graph, f *planFacts, readUntil []int) *Plan {
	p := &Plan{compute: f.compute, composed: f.opts.ComposedAttention, values: make(map[*graph.Value]*valuePlan, len(f.values)),
		scratch: make([][]int, len(g.Nodes)), facts: f}
	for _, v := range g.Inputs {
		p.values[v] = f.value(v)
		p.InputBytes += bytesOf(v.Type.DType, v.Type.Shape)
	}
	for _, v := range g.Initializers() {
		p.values[v] = f.value(v)
		p.InitializerBytes += bytesOf(v.Type.DType, v.Type.Shape)
	}
	// rootOf: the value whose buffer v uses.
	rootOf := func(v *graph.Value) *graph.Value {
		if vp := p.values[v]; vp.kind == placeAlias || vp.kind == placeFolded {
			return vp.root
		}
		return v
	}
	for i, n := range g.Nodes {
		for _, out := range n.Outputs {
			vp := f.value(out)
			switch {
			case vp.inPlace:
				p.InPlace++
				p.InPlaceBytes += bytesOf(vp.storage, out.Type.Shape)
			case vp.kind == placeArena:
				vp.tensor = len(p.Tensors)
				p.Tensors = append(p.Tensors, PlannedTensor{
					Name: out.Name, Node: n.Name, Op: n.Op, DType: vp.storage, Shape: out.Type.Shape.Clone(),
					Bytes: bytesOf(vp.storage, out.Type.Shape), First: i, Last: i,
				})
			}
			p.values[out] = vp
		}
		for _, s := range f.scratch[i] {
			p.scratch[i] = append(p.scratch[i], len(p.Tensors))
			p.Tensors = append(p.Tensors, PlannedTensor{
				Name: n.Name + "/" + s.what, Node: n.Name, Op: n.Op, DType: s.dt, Shape: s.shape.Clone(),
				Bytes: bytesOf(s.dt, s.shape), First: i, Last: i, Scratch: true,
			})
		}
		// Reads extend the live range of the buffer read (through roots).
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
		if vp := p.values[rootOf(v)]; vp.kind == placeArena {
			p.Tensors[vp.tensor].Last = len(g.Nodes)
		}
	}
	p.place()
	p.measure(g)
	return p
}

// value is a copy of v's facts for one plan to fill in.
func (f *planFacts) value(v *graph.Value) *valuePlan {
	vp := *f.values[v]
	return &vp
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

// FormatBytes writes a byte count with a binary unit (KiB, MiB, GiB), the
// way plans and the reports quoting them print sizes: "64.0 KiB",
// "695.64 MiB", "3.92 GiB".
func FormatBytes(n int64) string { return units.Bytes(n, 1, 2, 2) }
