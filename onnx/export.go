package onnx

import (
	"fmt"
	"math"
	"os"
	"strconv"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Opsets Export writes: 18 (our Reduce ops take axes as an input, as ONNX's do
// from 18), 23 when a FlashAttention is written as the standard Attention op.
const (
	exportOpset          = 18
	exportAttentionOpset = 23
	exportIRVersion      = 10 // node and tensor metadata_props need IR 10
	ourOpsetVersion      = 1
)

// Export converts g into an ONNX model. Standard ops keep their ONNX names;
// FlashAttention becomes opset-23 Attention (is_causal, scale) when its
// logsumexp output is unused and its inputs are 4-D, and stays in the
// "flashgraph" domain otherwise, like our other ops.
func Export(g *graph.Graph) (*onnxpb.Model, error) { return ExportWith(g, ExportOptions{}) }

// ExportWith is Export with options (export_opset.go).
func ExportWith(g *graph.Graph, opts ExportOptions) (*onnxpb.Model, error) {
	if err := graph.Verify(g); err != nil {
		return nil, fmt.Errorf("onnx: export: %w", err)
	}
	if err := opts.check(g); err != nil {
		return nil, err
	}
	if err := refuseStrings(g); err != nil {
		return nil, err
	}
	uses := g.Uses()
	ex := &exporter{g: g, uses: uses, opts: opts}
	og := &onnxpb.Graph{Name: g.Name}
	if og.Name == "" {
		og.Name = "graph" // onnx.checker requires a graph name
	}
	in, out := ex.boundaries()
	for _, v := range g.Inputs {
		og.Input = append(og.Input, ex.declaredInfo(v))
	}
	og.Node = append(og.Node, in...)
	for _, v := range g.Initializers() {
		t, err := initializer(v, ex.name(v))
		if err != nil {
			return nil, fmt.Errorf("onnx: export %s %s: %w", v.Kind, v.Name, err)
		}
		og.Initializer = append(og.Initializer, t)
	}
	for _, n := range g.Nodes {
		pn, err := ex.node(n)
		if err != nil {
			return nil, fmt.Errorf("onnx: export node %s (%s): %w", n.Name, n.Op, err)
		}
		og.Node = append(og.Node, pn)
		for _, o := range n.Outputs {
			if ex.written[o] {
				og.ValueInfo = append(og.ValueInfo, valueInfo(o, ex.name(o)))
			}
		}
	}
	og.Node = append(og.Node, out...)
	for _, v := range g.Outputs {
		og.Output = append(og.Output, ex.declaredInfo(v))
	}
	// Graph outputs are described by og.Output; value_info is for the rest.
	outs := map[string]bool{}
	for _, v := range g.Outputs {
		outs[v.Name] = true
	}
	vi := og.ValueInfo[:0]
	for _, v := range og.ValueInfo {
		if !outs[v.Name] {
			vi = append(vi, v)
		}
	}
	og.ValueInfo = vi

	opset := int64(exportOpset)
	if ex.attention {
		opset = exportAttentionOpset
	}
	// An op ONNX added later than that (Gelu) raises it.
	for _, n := range g.Nodes {
		if s, ok := graph.LookupOp(n.Op); ok && s.Domain == graph.DomainONNX {
			opset = max(opset, introduced[n.Op])
		}
	}
	if opts.Opset != 0 {
		opset = int64(opts.Opset)
		og.Initializer = usedInitializers(og)
	}
	m := &onnxpb.Model{
		IRVersion: exportIRVersion, ProducerName: Producer, ProducerVersion: "1",
		OpsetImport: []onnxpb.OperatorSetID{{Domain: "", Version: opset}},
		Graph:       og,
	}
	if ex.ours {
		m.OpsetImport = append(m.OpsetImport, onnxpb.OperatorSetID{Domain: graph.DomainFlashgraph, Version: ourOpsetVersion})
	}
	if ex.training {
		// The domain's only opset, which our rows follow (graph/ops_training.go).
		m.OpsetImport = append(m.OpsetImport, onnxpb.OperatorSetID{Domain: graph.DomainONNXTraining, Version: 1})
	}
	return m, nil
}

// ExportBytes serializes Export's model.
func ExportBytes(g *graph.Graph) ([]byte, error) {
	m, err := Export(g)
	if err != nil {
		return nil, err
	}
	return onnxpb.Encode(m), nil
}

// ExportFile writes g as an .onnx file.
func ExportFile(g *graph.Graph, path string) error {
	b, err := ExportBytes(g)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

type exporter struct {
	g         *graph.Graph
	uses      map[*graph.Value][]*graph.Node
	written   map[*graph.Value]bool // node outputs that appear in the model
	attention bool                  // an Attention op was written
	ours      bool                  // a node of our domain was written
	training  bool                  // a node of ONNX's training domain was written
	opts      ExportOptions
	// renamed are the int64 values behind graph inputs and outputs declared
	// with a narrow integer type (Graph.ElemTypes), by their name inside the
	// model; a boundary Cast converts between the two.
	renamed map[*graph.Value]string
}

// metaBoundary marks the Cast nodes Export writes at a graph input or output
// declared with a narrow integer type (Graph.ElemTypes): "input" (the
// declared type to INT64) or "output" (INT64 to it). Importing our own
// export drops them and records the declared type again.
const metaBoundary = "flashgraph.boundary"

// name is v's name in the model.
func (ex *exporter) name(v *graph.Value) string {
	if n, ok := ex.renamed[v]; ok {
		return n
	}
	return v.Name
}

// declared is the narrow integer type a graph input or output is declared
// with, Undefined for none.
func (ex *exporter) declared(v *graph.Value) onnxpb.DataType {
	if v.Type.DType != graph.Int64 {
		return onnxpb.Undefined
	}
	dt, _ := narrowOf(ex.g.ElemTypes[v.Name])
	return dt
}

// declaredInfo is the value_info of a graph input or output, with its
// declared element type.
func (ex *exporter) declaredInfo(v *graph.Value) *onnxpb.ValueInfo {
	vi := valueInfo(v, v.Name)
	if dt := ex.declared(v); dt != onnxpb.Undefined {
		vi.Type.Tensor.ElemType = dt
	}
	return vi
}

// boundaries names the int64 values behind the graph inputs and outputs
// declared with a narrow integer type and returns the Cast nodes between
// them: the inputs' (to go first) and the outputs' (to go last). An input
// that is itself an output needs none.
func (ex *exporter) boundaries() (in, out []*onnxpb.Node) {
	if len(ex.g.ElemTypes) == 0 {
		return nil, nil
	}
	nm := graph.NewNamer(ex.g)
	ex.renamed = map[*graph.Value]string{}
	cast := func(v *graph.Value, from, to string, dt onnxpb.DataType, kind string) *onnxpb.Node {
		return &onnxpb.Node{
			Name: nm.Fresh(v.Name + "/" + kind), OpType: "Cast", Input: []string{from}, Output: []string{to},
			Attribute:     []*onnxpb.Attribute{{Name: "to", Type: onnxpb.AttrInt, I: int64(dt)}},
			MetadataProps: []onnxpb.StringEntry{{Key: metaBoundary, Value: kind}},
		}
	}
	for _, v := range ex.g.Inputs {
		if ex.declared(v) != onnxpb.Undefined && len(ex.uses[v]) > 0 {
			ex.renamed[v] = nm.Fresh(v.Name + "_int64")
			in = append(in, cast(v, v.Name, ex.renamed[v], onnxpb.Int64, "input"))
		}
	}
	for _, v := range ex.g.Outputs {
		dt := ex.declared(v)
		if dt == onnxpb.Undefined || v.Kind == graph.Input {
			continue
		}
		if _, done := ex.renamed[v]; done {
			continue // listed twice
		}
		ex.renamed[v] = nm.Fresh(v.Name + "_int64")
		out = append(out, cast(v, ex.renamed[v], v.Name, dt, "output"))
	}
	return in, out
}

func valueInfo(v *graph.Value, name string) *onnxpb.ValueInfo {
	sh := &onnxpb.TensorShape{}
	for _, d := range v.Type.Shape {
		sh.Dim = append(sh.Dim, onnxpb.Dimension{Value: int64(d), HasValue: true})
	}
	return &onnxpb.ValueInfo{Name: name, Type: &onnxpb.Type{Tensor: &onnxpb.TensorType{ElemType: onnxType(v.Type.DType), Shape: sh}}}
}

func initializer(v *graph.Value, name string) (*onnxpb.Tensor, error) {
	data, err := v.Init.Materialize(v.Type)
	if err != nil {
		return nil, err
	}
	t, err := tensorProto(name, data)
	if err != nil {
		return nil, err
	}
	kind := "const"
	if v.Kind == graph.Param {
		kind = "param"
	}
	t.MetadataProps = []onnxpb.StringEntry{{Key: metaKind, Value: kind}}
	if needsRecipe(*v.Init, data) {
		t.MetadataProps = append(t.MetadataProps, onnxpb.StringEntry{Key: metaInit, Value: formatRecipe(*v.Init)})
	}
	return t, nil
}

// used reports whether a value is read by a node or is a graph output.
func (ex *exporter) used(v *graph.Value) bool { return len(ex.uses[v]) > 0 || ex.g.IsOutput(v) }

func (ex *exporter) node(n *graph.Node) (*onnxpb.Node, error) {
	spec := n.Spec()
	if spec == nil {
		return nil, fmt.Errorf("unknown op")
	}
	if ex.written == nil {
		ex.written = map[*graph.Value]bool{}
	}
	pn := &onnxpb.Node{Name: n.Name, OpType: n.Op, Domain: spec.Domain}
	for _, v := range n.Inputs {
		name := ""
		if v != nil {
			name = ex.name(v)
		}
		pn.Input = append(pn.Input, name)
	}
	outs := n.Outputs
	attrs := n.Attrs
	if n.Op == "FlashAttention" && len(outs) == 2 && !ex.used(outs[1]) && n.Inputs[0].Type.Shape.Rank() == 4 {
		// The standard op has our meaning (upper-left causal mask, scale) and no
		// logsumexp output; the name of that unused value rides along in metadata.
		pn.OpType, pn.Domain = "Attention", ""
		attrs = graph.Attrs{"is_causal": n.Attrs["causal"], "scale": n.Attrs["scale"]}
		pn.MetadataProps = append(pn.MetadataProps, onnxpb.StringEntry{Key: metaLSE, Value: outs[1].Name})
		outs = outs[:1]
		ex.attention = true
	}
	switch pn.Domain {
	case graph.DomainFlashgraph:
		ex.ours = true
	case graph.DomainONNXTraining:
		ex.training = true
	}
	for _, o := range outs {
		pn.Output = append(pn.Output, ex.name(o))
		ex.written[o] = true
	}
	if ex.opts.Opset != 0 && ex.opts.Opset < 18 {
		var err error
		if attrs, err = ex.axesAsAttribute(n, pn, attrs); err != nil {
			return nil, err
		}
	}
	for _, name := range attrs.Names() {
		a, exact, err := attribute(n.Op, name, attrs[name])
		if err != nil {
			return nil, err
		}
		pn.Attribute = append(pn.Attribute, a)
		pn.MetadataProps = append(pn.MetadataProps, exact...)
	}
	return pn, nil
}

// attribute converts one attribute. ONNX floats are float32; a float64 value
// that float32 rounds is also written exactly in metadata.
func attribute(op, name string, a graph.Attr) (*onnxpb.Attribute, []onnxpb.StringEntry, error) {
	pa := &onnxpb.Attribute{Name: name}
	var exact []onnxpb.StringEntry
	keep := func(key string, v float64) {
		if f := float64(float32(v)); math.Float64bits(f) != math.Float64bits(v) && !math.IsNaN(v) {
			exact = append(exact, onnxpb.StringEntry{Key: key, Value: graph.FormatFloat(v)})
		}
	}
	switch a.Kind {
	case graph.AttrInt:
		pa.Type, pa.I = onnxpb.AttrInt, a.I
	case graph.AttrFloat:
		pa.Type, pa.F = onnxpb.AttrFloat, float32(a.F)
		keep(metaAttr+name, a.F)
	case graph.AttrString:
		if op == "Cast" && name == "to" {
			dt, err := graph.ParseDType(a.S)
			if err != nil {
				return nil, nil, err
			}
			pa.Type, pa.I = onnxpb.AttrInt, int64(onnxType(dt))
			break
		}
		pa.Type, pa.S = onnxpb.AttrString, []byte(a.S)
	case graph.AttrInts:
		pa.Type, pa.Ints = onnxpb.AttrInts, append([]int64{}, a.Ints...)
	case graph.AttrFloats:
		pa.Type = onnxpb.AttrFloats
		for i, v := range a.Floats {
			pa.Floats = append(pa.Floats, float32(v))
			keep(metaAttr+name+"."+strconv.Itoa(i), v)
		}
	default:
		return nil, nil, fmt.Errorf("attribute %s has kind %v", name, a.Kind)
	}
	return pa, exact, nil
}
