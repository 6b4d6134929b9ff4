package train

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/flashgraph/flashgraph/graph"
)

// sharedUniformNotes warns of params that look merged by an exporter: a
// trained param of more than one element, every element the same value (a
// norm gain's ones, a bias's zeros), read by more than one node. An
// eval-mode torch.onnx export (constant folding on) merges initializers of
// equal value, so every LayerNorm gain of a freshly initialised model
// becomes one initializer; trained here it is one param, shared, where the
// PyTorch model had one per layer. The file cannot say which uses were once
// separate params, so this is a note, not an error: a model may share a
// param on purpose.
func sharedUniformNotes(g *graph.Graph, params []string) []string {
	uses := g.Uses()
	vals := g.Values()
	var notes []string
	for _, name := range params {
		p := vals[name]
		if p == nil || p.Init == nil || p.Type.Shape.Numel() < 2 {
			continue
		}
		readers := len(slices.Compact(slices.Clone(uses[p])))
		if readers < 2 {
			continue
		}
		first, uniform := uniformValue(*p.Init)
		if !uniform {
			continue
		}
		notes = append(notes, fmt.Sprintf("param %s %v (every element %s) is read by %d nodes and trains as one shared param; if the file is an eval-mode torch.onnx export, the exporter merged equal initializers (export with training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False to keep them apart)",
			name, p.Type.Shape, strconv.FormatFloat(first, 'g', -1, 64), readers))
	}
	return notes
}

// uniformValue reports whether an init recipe gives every element one value,
// and which.
func uniformValue(in graph.Init) (float64, bool) {
	switch in.Fn {
	case "zeros":
		return 0, true
	case "ones":
		return 1, true
	case "fill":
		return in.Args["value"], true
	case "literal":
		if len(in.Data) == 0 {
			return 0, false
		}
		for _, x := range in.Data[1:] {
			if x != in.Data[0] {
				return 0, false
			}
		}
		return in.Data[0], true
	}
	return 0, false
}
