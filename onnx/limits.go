package onnx

import (
	"fmt"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/internal/units"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Import cost is bounded by the input. Everything the importer holds in memory
// comes either from the file (initializers and Constant nodes, whose size the
// decoder already ties to the bytes read) or from constant folding, which can
// turn a few bytes into millions of elements: a ConstantOfShape of [2048, 2048]
// is twenty bytes of shape and four million elements, and a chain of Adds on it
// repeats that once per node. So folding draws on a budget of elements per
// import that grows with the size of the model: a small file gets a small,
// fixed floor; a large one (real weights, real masks) gets room in proportion.
// A fold that would overrun the budget is not attempted: an op flashgraph can
// run is left to run time instead, and an op it can only fold (ConstantOfShape,
// Range) is refused with the node's name and the limit. Options.MaxFoldElems
// raises the limit for a model that needs more.

const (
	// FoldFloor is the folding budget of any model, however small: 2^20
	// elements (8 MiB as float64), a 1024×1024 causal mask.
	FoldFloor = 1 << 20
	// FoldPerByte is the budget added per byte of model; exporters fold masks
	// and position tables that are small next to the weights of the same model.
	FoldPerByte = 8
	// FoldBytesPerElem is what one folded element costs until it is a graph
	// constant: a float64 or int64 while folding, again in the literal
	// recipe the graph keeps, and its tensor when materialised.
	FoldBytesPerElem = 24
)

// foldBudget counts the elements constant folding creates in one import.
type foldBudget struct {
	limit  int
	why    string // how limit was chosen, for errors
	raise  string // how to raise it, for errors
	used   int
	counts map[any]bool // backing arrays already counted (folds that only reshape share them)
}

// newFoldBudget sets the budget for a model of size bytes, or opts' explicit limit.
func newFoldBudget(opts Options, size int) *foldBudget {
	b := &foldBudget{counts: map[any]bool{}}
	b.raise = "raise Options.MaxFoldElems to import this model"
	if opts.MaxFoldElems > 0 {
		b.limit, b.why = opts.MaxFoldElems, "Options.MaxFoldElems"
	} else {
		b.limit = max(FoldFloor, FoldPerByte*size)
		b.why = fmt.Sprintf("the default for a %d-byte model: max(%d, %d per byte)", size, FoldFloor, FoldPerByte)
	}
	if opts.FoldMemory > 0 && opts.FoldMemory/FoldBytesPerElem < int64(b.limit) {
		b.limit = int(opts.FoldMemory / FoldBytesPerElem)
		b.why = fmt.Sprintf("the %s of memory available for folding, at %d bytes per folded element", formatBytes(opts.FoldMemory), FoldBytesPerElem)
		b.raise = "this model folds more constants than fit in memory"
	}
	return b
}

// left is how many elements a fold may still create.
func (b *foldBudget) left() int { return max(b.limit-b.used, 0) }

// key identifies c's backing array; nil for an empty tensor.
func (c *cval) key() any {
	switch {
	case len(c.f) > 0:
		return &c.f[0]
	case len(c.i) > 0:
		return &c.i[0]
	}
	return nil
}

// known records data that came from the file (initializers), which later folds
// may pass through without creating anything.
func (b *foldBudget) known(c *cval) {
	if k := c.key(); k != nil {
		b.counts[k] = true
	}
}

// add charges a folded result to the budget; data shared with an earlier
// value costs nothing.
func (b *foldBudget) add(c *cval) error {
	k := c.key()
	if k == nil || b.counts[k] {
		return nil
	}
	b.counts[k] = true
	b.used += c.n()
	if b.used > b.limit {
		return fmt.Errorf("constant folding has created %d elements, over the limit of %d (%s); %s", b.used, b.limit, b.why, b.raise)
	}
	return nil
}

// exceeded is the error for a fold refused before it ran; err says what
// the fold would have made.
func (b *foldBudget) exceeded(err error) error {
	what := ""
	if _, detail, ok := strings.Cut(err.Error(), errTooBig.Error()+": "); ok {
		what = " (" + detail + ")"
	}
	return fmt.Errorf("constant folding would create more%s than the %d elements left of its limit of %d (%s); refused before allocating; %s", what, b.left(), b.limit, b.why, b.raise)
}

// formatBytes writes a byte count with a binary unit, two digits after the
// point in every unit up to TiB ("1.50 KiB", "357.63 GiB").
func formatBytes(n int64) string { return units.Bytes(n, 2, 2, 2, 2) }

// foldViews are folds that only relabel their input's data (they share it).
var foldViews = map[string]bool{"Identity": true, "Reshape": true, "Squeeze": true, "Unsqueeze": true}

// fold evaluates a folder within the budget. Folds that can grow their input
// (broadcasts, ConstantOfShape, Range, Expand, Gather, Concat) check their
// result's shape against foldCap before computing it; every other fold makes
// at most as many elements as it reads, so it is refused up front when its
// inputs alone are more than the budget has left.
func (c *opCtx) fold(f folder, in []*cval) ([]*cval, error) {
	if !foldViews[c.n.OpType] {
		n := 0
		for _, v := range in {
			if v != nil {
				n += v.n()
			}
		}
		if n > c.foldCap() {
			return nil, tooBig(fmt.Sprintf("its inputs hold %d elements", n))
		}
	}
	return f(c, in)
}

// foldCap is the most elements the fold being evaluated may create.
func (c *opCtx) foldCap() int { return c.im.fold.left() }

// foldTooBig reports whether a fold result of shape s is over the budget (or
// over any tensor's size, whose element count would overflow).
func (c *opCtx) foldTooBig(s graph.Shape) bool {
	return s.Check() != nil || s.Numel() > c.foldCap()
}

// modelSize estimates a decoded model's size in bytes when the serialized
// form is not at hand: the tensor data it carries (which dominates any real
// model) and a little for each node.
func modelSize(m *onnxpb.Model) int {
	if m.Graph == nil {
		return 0
	}
	size := 0
	for _, t := range m.Graph.Initializer {
		size += len(t.RawData) + 4*len(t.FloatData) + 4*len(t.Int32Data) + 8*len(t.Int64Data) +
			8*len(t.DoubleData) + 8*len(t.Uint64Data)
	}
	return size + 64*len(m.Graph.Node)
}

// foldMinInputs is how many leading inputs a foldable op must have present
// (ONNX's required inputs) before its folder may read them; ops not listed
// need one. An omitted required input is refused here with the node's name,
// whichever way the op is then imported.
var foldMinInputs = map[string]int{
	"Constant": 0,
	"Add":      2, "Sub": 2, "Mul": 2, "Div": 2, "Pow": 2,
	"Equal": 2, "Less": 2, "Greater": 2, "LessOrEqual": 2, "GreaterOrEqual": 2,
	"Gather": 2, "Reshape": 2, "Expand": 2,
	"Where": 3, "Range": 3,
	"Max": 1, "Min": 1, // variadic in ONNX: one input is enough
}

// checkFoldInputs refuses a default-domain op that has a folder but lacks an
// input the folder reads unconditionally.
func (c *opCtx) checkFoldInputs() error {
	if c.n.Domain != "" && c.n.Domain != "ai.onnx" {
		return nil
	}
	if _, ok := folders[c.n.OpType]; !ok {
		return nil
	}
	need, ok := foldMinInputs[c.n.OpType]
	if !ok {
		need = 1
		// An op the table defines by an expression reads every operand.
		if s, ok := graph.LookupOp(c.n.OpType); ok && s.Expr != nil {
			need = len(s.Inputs)
		}
	}
	for i := range need {
		if c.input(i) == nil {
			return c.errf("input %d is required but omitted", i)
		}
	}
	return nil
}

// initBytes is the memory exporting initializer v takes: its data computed
// from its recipe (a host tensor: 4 bytes an element for the float types
// narrower than float64, 8 for float64 and int64, 1 for bool), then as an
// ONNX tensor and again in the serialized model (DType.Size each).
func initBytes(v *graph.Value) int64 {
	host := int64(8)
	switch v.Type.DType {
	case graph.Float32, graph.BFloat16, graph.Float16:
		host = 4
	case graph.Bool:
		host = 1
	}
	return int64(v.Type.Shape.Numel()) * (host + 2*int64(v.Type.DType.Size()))
}

// exportNeed is the memory exporting g's initializers takes, and the
// largest of them.
func exportNeed(g *graph.Graph) (int64, *graph.Value) {
	var total int64
	var big *graph.Value
	for _, v := range g.Initializers() {
		n := initBytes(v)
		total += n
		if big == nil || n > initBytes(big) {
			big = v
		}
	}
	return total, big
}
