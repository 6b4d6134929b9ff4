package onnx

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// ExportOptions adjust an export.
type ExportOptions struct {
	// Opset is the default-domain opset to declare: 0 declares the oldest
	// one the graph needs (18, or 23 when an attention is written as the
	// standard Attention op). 17 writes what opsets 13 to 17 say
	// (ReduceMean and ReduceMax take their axes as an attribute) so that
	// older runtimes load the model; a graph with a fused attention has no
	// opset-17 form (Attention came in 23) and is refused: export the
	// attention decomposed, i.e. the graph unfused.
	Opset int
	// MaxBytes, when positive, is the memory the export may take: a graph
	// whose initializers' data (computed from their recipes, converted to
	// ONNX tensors and serialized) needs more is refused before anything is
	// computed, naming its largest initializer (exportNeed).
	MaxBytes int64
}

// Lowest and highest opsets ExportOptions.Opset may ask for.
const (
	MinExportOpset = 17
	MaxExportOpset = exportAttentionOpset
)

func (o ExportOptions) check(g *graph.Graph) error {
	if o.MaxBytes > 0 {
		if need, big := exportNeed(g); need > o.MaxBytes {
			return fmt.Errorf("onnx: export: the initializers' data takes about %s to write (the largest, %s %s, %v: %s), more than the %s the export may take; refused before allocating",
				formatBytes(need), big.Kind, big.Name, big.Type, formatBytes(initBytes(big)), formatBytes(o.MaxBytes))
		}
	}
	if o.Opset == 0 {
		return nil
	}
	if o.Opset < MinExportOpset || o.Opset > MaxExportOpset {
		return fmt.Errorf("onnx: export: opset %d: want %d to %d", o.Opset, MinExportOpset, MaxExportOpset)
	}
	for _, n := range g.Nodes {
		if s, ok := graph.LookupOp(n.Op); !ok || s.Domain != graph.DomainONNX {
			continue
		}
		if v := introduced[n.Op]; int64(o.Opset) < v {
			return fmt.Errorf("onnx: export: opset %d has no %s op (ONNX added it in opset %d): node %s", o.Opset, n.Op, v, n.Name)
		}
	}
	if o.Opset < exportAttentionOpset {
		for _, n := range g.Nodes {
			if n.Op == "FlashAttention" {
				return fmt.Errorf("onnx: export: opset %d has no Attention op (ONNX added it in opset %d), and node %s is a fused attention: export the graph unfused to write the attention decomposed", o.Opset, exportAttentionOpset, n.Name)
			}
		}
	}
	return nil
}

// axesBefore18 are the reductions whose axes were an attribute before
// opset 18 (ReduceSum's became an input at 13 already).
var axesBefore18 = map[string]bool{"ReduceMean": true, "ReduceMax": true}

// axesAsAttribute writes a reduction's axes input as the attribute of
// opsets before 18.
func (ex *exporter) axesAsAttribute(n *graph.Node, pn *onnxpb.Node, attrs graph.Attrs) (graph.Attrs, error) {
	if !axesBefore18[n.Op] {
		return attrs, nil
	}
	attrs = attrs.Clone()
	noop := attrs.Int("noop_with_empty_axes", 0) != 0
	delete(attrs, "noop_with_empty_axes")
	if len(n.Inputs) < 2 || n.Inputs[1] == nil {
		if noop {
			return nil, fmt.Errorf("noop_with_empty_axes has no form before opset 18")
		}
		return attrs, nil
	}
	ax := n.Inputs[1]
	if ax.Kind != graph.Const || ax.Init == nil {
		return nil, fmt.Errorf("axes %s is computed at run time; before opset 18 they must be constant", ax.Name)
	}
	t, err := ax.Init.Materialize(ax.Type)
	if err != nil {
		return nil, fmt.Errorf("axes %s: %w", ax.Name, err)
	}
	axes := make([]int64, t.Len())
	for i := range axes {
		axes[i] = int64(t.At(i))
	}
	attrs["axes"] = graph.Ints(axes...)
	pn.Input = pn.Input[:1]
	return attrs, nil
}

// usedInitializers drops the initializers no node reads and no output
// names (axes constants that became attributes).
func usedInitializers(og *onnxpb.Graph) []*onnxpb.Tensor {
	used := map[string]bool{}
	for _, n := range og.Node {
		for _, in := range n.Input {
			used[in] = true
		}
	}
	for _, o := range og.Output {
		used[o.Name] = true
	}
	var out []*onnxpb.Tensor
	for _, t := range og.Initializer {
		if used[t.Name] {
			out = append(out, t)
		}
	}
	return out
}

// ExportBytesWith serializes ExportWith's model.
func ExportBytesWith(g *graph.Graph, opts ExportOptions) ([]byte, error) {
	m, err := ExportWith(g, opts)
	if err != nil {
		return nil, err
	}
	return onnxpb.Encode(m), nil
}
