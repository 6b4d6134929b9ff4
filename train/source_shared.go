package train

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

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
		if p == nil {
			continue
		}
		readers, first, ok := sharedUniform(p, uses)
		if !ok {
			continue
		}
		notes = append(notes, fmt.Sprintf("param %s %v (every element %s) is read by %d nodes and trains as one shared param; if the exporter merged equal initializers (torch.onnx: an eval-mode TorchScript export, or the dynamo exporter's optimizer), -untie gives each reading node its own copy, as the PyTorch model had (or export with training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False; dynamo: optimize=False)",
			name, p.Type.Shape, strconv.FormatFloat(first, 'g', -1, 64), len(readers)))
	}
	return notes
}

// sharedUniform reports whether p looks like initializers an exporter
// merged by value: a float param of more than one element, every element
// one value, read by more than one node. It returns the reading nodes, in
// graph order, and the value.
func sharedUniform(p *graph.Value, uses map[*graph.Value][]*graph.Node) ([]*graph.Node, float64, bool) {
	if p.Init == nil || !p.Type.DType.IsFloat() || p.Type.Shape.Numel() < 2 {
		return nil, 0, false
	}
	readers := slices.Compact(slices.Clone(uses[p]))
	if len(readers) < 2 {
		return nil, 0, false
	}
	first, uniform := uniformValue(*p.Init)
	if !uniform {
		return nil, 0, false
	}
	return readers, first, true
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

// UntieShared gives every node that reads a shared uniform param
// (sharedUniform) a param of its own:
// the first reader keeps the param, the k-th gets a copy named NAME.k (k
// from 1, skipping names the graph has). It is train -untie: undoing an
// exporter's merging of equal initializers, so that each layer's norm gain
// and bias train apart as they did in PyTorch. The same graph file untied
// again gives the same names, so a checkpoint's weights fit the export. g
// is changed in place; the notes say what was untied, one line a param.
func UntieShared(g *graph.Graph) []string {
	uses := g.Uses()
	taken := g.Values()
	var notes []string
	for _, p := range slices.Clone(g.Params) {
		readers, first, ok := sharedUniform(p, uses)
		if !ok {
			continue
		}
		names := []string{p.Name}
		k := 1
		for _, n := range readers[1:] {
			name := fmt.Sprintf("%s.%d", p.Name, k)
			for taken[name] != nil {
				k++
				name = fmt.Sprintf("%s.%d", p.Name, k)
			}
			k++
			init := *p.Init
			c := &graph.Value{Name: name, Type: p.Type, Kind: graph.Param, Init: &init}
			taken[name] = c
			g.Params = append(g.Params, c)
			for i, in := range n.Inputs {
				if in == p {
					n.Inputs[i] = c
				}
			}
			names = append(names, name)
		}
		notes = append(notes, fmt.Sprintf("untied %s %v (every element %s): one param for each of its %d reading nodes, %s",
			p.Name, p.Type.Shape, strconv.FormatFloat(first, 'g', -1, 64), len(readers), strings.Join(names, ", ")))
	}
	return notes
}

// RetieTransposed undoes an exporter's constant folding of a tied weight:
// GPT-2's lm_head reads the token embedding transposed, and an exporter
// that folds Transpose(initializer) (the torch.onnx dynamo exporter's
// optimizer does) writes the transposed table as a second initializer, so
// the two would train apart. A float param of two dims that is, element for
// element, the transpose of an earlier one (or a copy of it) becomes a
// Transpose of that param (or the param itself), and its readers train the
// one table, as the PyTorch model did. Params whose elements are all one
// value are left alone: equal zeros or ones say nothing of a tie (UntieShared
// is about those). It is train -retie; g is changed in place; the notes say
// what was tied, one line each.
func RetieTransposed(g *graph.Graph) []string {
	var tables []*graph.Value // candidates: literal float matrices, not uniform
	for _, p := range g.Params {
		if p.Init == nil || p.Init.Fn != "literal" || !p.Type.DType.IsFloat() || len(p.Type.Shape) != 2 {
			continue
		}
		if _, uniform := uniformValue(*p.Init); uniform || len(p.Init.Data) != p.Type.Shape.Numel() {
			continue
		}
		tables = append(tables, p)
	}
	var notes []string
	var nodes []*graph.Node
	gone := map[*graph.Value]*graph.Value{} // a copy → its table
	tied := map[*graph.Value]bool{}
	for j, b := range tables {
		for _, a := range tables[:j] {
			if tied[a] || a.Type.DType != b.Type.DType {
				continue
			}
			switch {
			case a.Type.Shape.Equal(b.Type.Shape) && slices.Equal(a.Init.Data, b.Init.Data):
				gone[b] = a
				notes = append(notes, fmt.Sprintf("retied %s %v: a copy of %s, read as %s", b.Name, b.Type.Shape, a.Name, a.Name))
			case a.Type.Shape[0] == b.Type.Shape[1] && a.Type.Shape[1] == b.Type.Shape[0] && isTranspose(a.Init.Data, b.Init.Data, a.Type.Shape[0], a.Type.Shape[1]):
				n := &graph.Node{Name: "retie/" + b.Name, Op: "Transpose", Inputs: []*graph.Value{a}, Outputs: []*graph.Value{b},
					Attrs: graph.Attrs{"perm": graph.Ints(1, 0)}}
				b.Kind, b.Init, b.Producer = graph.Intermediate, nil, n
				nodes = append(nodes, n)
				notes = append(notes, fmt.Sprintf("retied %s %v: the transpose of %s, read as Transpose(%s)", b.Name, b.Type.Shape, a.Name, a.Name))
			default:
				continue
			}
			tied[b] = true
			break
		}
	}
	if len(notes) == 0 {
		return nil
	}
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if a, ok := gone[in]; ok {
				n.Inputs[i] = a
			}
		}
	}
	for i, o := range g.Outputs {
		if a, ok := gone[o]; ok {
			g.Outputs[i] = a
		}
	}
	g.Params = slices.DeleteFunc(g.Params, func(p *graph.Value) bool { return tied[p] })
	g.Nodes = append(nodes, g.Nodes...)
	return notes
}

// isTranspose reports whether b ([c, r]) is the transpose of a ([r, c]).
func isTranspose(a, b []float64, r, c int) bool {
	for i := range r {
		for j := range c {
			if a[i*c+j] != b[j*r+i] {
				return false
			}
		}
	}
	return true
}
