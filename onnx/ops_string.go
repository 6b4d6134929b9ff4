package onnx

import (
	"fmt"
	"slices"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// String tensors. A string initializer, or a string graph input bound with
// Options.Bind, becomes a graph const (graph.LiteralStrings) at once: it is
// never a cval, so nothing folds text through the numeric folders, and the
// op table refuses it as an operand of any op but Cast and
// StringNormalizer (graph.OpSpec.Strings).

func init() {
	handlers["StringNormalizer"] = importStringNormalizer
	introduced["StringNormalizer"] = 10
}

// stringConst is the graph const of a STRING TensorProto.
func stringConst(name string, t *onnxpb.Tensor) (*graph.Value, error) {
	ht, err := hostTensor(t)
	if err != nil {
		return nil, err
	}
	init := graph.LiteralStrings(ht.S...)
	return &graph.Value{Name: name, Type: ht.Type(), Kind: graph.Const, Init: &init}, nil
}

// stringsOf reads a STRING TensorProto's elements: string_data, one entry
// per element (ONNX keeps strings out of raw_data).
func stringsOf(t *onnxpb.Tensor, shape graph.Shape) ([]string, error) {
	if len(t.RawData) > 0 {
		return nil, fmt.Errorf("tensor %q: a STRING tensor keeps its data in string_data, not raw_data", t.Name)
	}
	if len(t.StringData) != shape.Numel() {
		return nil, fmt.Errorf("tensor %q: %d strings for shape %v", t.Name, len(t.StringData), shape)
	}
	s := make([]string, len(t.StringData))
	for i, b := range t.StringData {
		s[i] = string(b)
	}
	return s, nil
}

// importStringNormalizer maps StringNormalizer onto the table's row. The
// row needs X's data (its output's length is how many elements are not
// stopwords): X must be a constant, and a graph input it comes from is
// named in a BindError so that binding it specialises the model.
func importStringNormalizer(c *opCtx) error {
	e := c.input(0)
	if e != nil && (e.v == nil || e.v.Kind != graph.Const) {
		err := c.errf("X (input 0, %q) must be a constant: the output's length follows its data, and flashgraph shapes are static", e.name)
		if in := sourceInput(e); in != "" {
			return &BindError{Input: in, err: fmt.Errorf("%w; bind %q with Options.Bind", err, in)}
		}
		return err
	}
	return importTableAttrs(c)
}

// refuseStrings refuses to export a graph with a string value: the
// exporter writes numeric tensors only (its initializers, recipes and
// boundaries), so a string graph is refused whole, naming the value,
// rather than written in part.
func refuseStrings(g *graph.Graph) error {
	vals := slices.Concat(g.Inputs, g.Initializers())
	for _, n := range g.Nodes {
		vals = append(vals, n.Outputs...)
	}
	for _, v := range vals {
		if v.Type.DType == graph.String {
			return fmt.Errorf("onnx: export: value %q is a string tensor; export does not write strings", v.Name)
		}
	}
	return nil
}
