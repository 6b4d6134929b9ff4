// Package onnx imports ONNX models into flashgraph graphs and exports graphs
// as ONNX models.
//
// Import maps each ONNX node onto our op table, honouring the opset the model
// imports where an op's meaning changed between versions (Softmax's axis before
// opset 13, axes as attribute or input, Split's forms, ...). Our shapes are
// static, so everything an exporter computes from shapes (Shape → Gather →
// Unsqueeze → Concat → Reshape chains, masks built with ConstantOfShape, Range,
// Trilu, ...) is evaluated at import and becomes a constant. A few standard ops
// outside our table are rewritten into table ops with the same meaning
// (LayerNormalization, RMSNormalization, Gelu, Split, Attention →
// FlashAttention). Anything else is refused with the op, its opset and the
// node's name: never approximated.
//
// Export writes a model that onnx.checker accepts and ONNX Runtime runs; what
// ONNX cannot say exactly (float64 attribute values, initializer recipes, param
// versus const) travels in metadata_props so that importing our own export gives
// back the same graph, byte for byte in the canonical text.
package onnx

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// Options adjust an import.
type Options struct {
	// Dims gives sizes to symbolic input dimensions (dim_param), which our static
	// shapes need: {"batch": 2, "seq": 8}.
	Dims map[string]int
	// Name overrides the graph's name (default: the ONNX graph's name).
	Name string
	// MaxFoldElems bounds the elements constant folding may create in this
	// import; 0 means max(FoldFloor, FoldPerByte × the model's size in bytes).
	// See limits.go.
	MaxFoldElems int
	// Bind gives values to graph inputs, which then become constants before
	// anything is folded: a model whose shape, axes or k inputs are known at
	// compile time specialises to them (as a shape profile does), and the bound
	// inputs are no longer inputs of the graph. A value's element type and shape
	// must be the ones the model declares for the input. Import reports an input
	// it needs bound with a *BindError.
	Bind map[string]*onnxpb.Tensor
	// Sequences gives each graph input of sequence type its elements'
	// shapes: the input becomes one tensor input per element, named
	// SequenceElem(name, i), of the element type the model declares and the
	// shape given (which must agree with the declared element shape). See
	// boundary.go. Import reports a sequence input it needs with a
	// *SequenceError.
	Sequences map[string][]graph.Shape
	// Absent names the graph inputs of optional type that hold no value;
	// every other optional input holds one (a tensor input of its name, or a
	// sequence as above).
	Absent map[string]bool
	// FoldMemory, when positive, is the memory in bytes constant folding may
	// take: it caps the element limit (at FoldBytesPerElem bytes each), so
	// that a fold too large for the machine is refused before it allocates.
	FoldMemory int64

	size int // the serialized model's size in bytes, when known
}

// MaxOpset is the newest default-domain opset whose semantics this importer knows.
const MaxOpset = 23

// MinOpset is the oldest. Opsets before 7 spelled some forms differently:
// legacyForms (ops_conform.go) reads the broadcast and axis attributes of
// binary ops and refuses the forms that meant something else (Reshape's
// shape as an attribute, ...); the rest mean what they mean later.
const MinOpset = 1

// Producer is written as producer_name by Export; a model carrying it is imported
// faithfully (no folding or aliasing), so that export followed by import gives
// back the graph exactly.
const Producer = "flashgraph"

// Metadata keys of our own annotations.
const (
	metaKind = "flashgraph.kind"  // initializer: "param" or "const"
	metaInit = "flashgraph.init"  // initializer: its recipe, when the data alone loses it
	metaAttr = "flashgraph.attr." // node: prefix of exact float64 attribute values
	metaLSE  = "flashgraph.lse"   // node: name of FlashAttention's logsumexp, exported as Attention
)

// Import reads an .onnx file (and any external data next to it) into a graph.
func Import(path string) (*graph.Graph, error) { return ImportWith(path, Options{}) }

// ImportWith is Import with options.
func ImportWith(path string, opts Options) (*graph.Graph, error) {
	m, err := onnxpb.Load(path)
	if err != nil {
		return nil, fmt.Errorf("onnx: %w", err)
	}
	if st, err := os.Stat(path); err == nil {
		// The file plus its initializers' data, so that data kept in external
		// files counts (inline data counts twice: the budget errs generous).
		opts.size = int(st.Size()) + modelSize(m)
	}
	if opts.Name == "" && m.Graph != nil && m.Graph.Name == "" {
		opts.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	g, err := ImportModel(m, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return g, nil
}

// ImportBytes decodes and imports a serialized model. Tensors stored in external
// files are refused: without a path there is no directory to resolve them in.
func ImportBytes(b []byte) (*graph.Graph, error) { return ImportBytesWith(b, Options{}) }

// ImportBytesWith is ImportBytes with options.
func ImportBytesWith(b []byte, opts Options) (*graph.Graph, error) {
	m, err := onnxpb.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("onnx: %w", err)
	}
	opts.size = len(b)
	return ImportModel(m, opts)
}

// ImportModel converts a decoded model.
func ImportModel(m *onnxpb.Model, opts Options) (*graph.Graph, error) {
	im, err := newImporter(m, opts)
	if err != nil {
		return nil, err
	}
	g, err := im.run()
	if err != nil {
		return nil, err
	}
	return g, nil
}

// entry is what an ONNX value name stands for while importing: a graph value
// (input, initializer or node output), a constant known at import time, or both.
type entry struct {
	name string       // the ONNX name
	v    *graph.Value // nil until a node needs it as a graph value
	c    *cval        // known data, nil for runtime values and params
	seq  int          // ordering of initializers in the graph (see finish)
	// odt is the ONNX element type of a runtime value of a narrow integer
	// type, which the graph holds as Int64 (Undefined otherwise).
	odt onnxpb.DataType
	// list, when isList, is a sequence value: its tensors, known as a
	// list at import time (ops_sequence.go); v and c are nil.
	list   []*entry
	isList bool
	// opt, when isOpt, is an optional value: the entry it holds (a tensor
	// or a sequence), nil when it holds none (boundary.go, ops_optional.go).
	opt   *entry
	isOpt bool
}

// nonTensor reports whether e is a sequence or an optional, which only the
// ops that handle them read.
func (e *entry) nonTensor() bool { return e != nil && (e.isList || e.isOpt) }

// typ is the entry's type in ONNX terms.
func (e *entry) typ() (onnxpb.DataType, graph.Shape) {
	if e.c != nil {
		return e.c.dt, e.c.shape
	}
	if e.odt != onnxpb.Undefined {
		return e.odt, e.v.Type.Shape
	}
	return onnxType(e.v.Type.DType), e.v.Type.Shape
}

type importer struct {
	m        *onnxpb.Model
	opts     Options
	opset    int64 // default domain
	ourOpset int64 // flashgraph domain, 0 if not imported
	faithful bool  // our own export: map 1:1, fold nothing
	env      map[string]*entry
	vinfo    map[string]*onnxpb.ValueInfo
	values   *graph.Namer // value names
	nodes    *graph.Namer // node names (a namespace of their own)
	g        *graph.Graph
	inits    []*entry // initializers and constants that may become graph values
	nextSeq  int
	consumed map[string]bool // ONNX names read by a node or listed as graph outputs
	fold     *foldBudget     // what constant folding may still create

	// trainingOpset is the ai.onnx.preview.training domain's, 0 if not
	// imported.
	trainingOpset int64
}

func newImporter(m *onnxpb.Model, opts Options) (*importer, error) {
	if m.Graph == nil {
		return nil, errors.New("onnx: model has no graph")
	}
	size := opts.size
	if size == 0 {
		size = modelSize(m)
	}
	im := &importer{
		m: m, opts: opts, env: map[string]*entry{}, vinfo: map[string]*onnxpb.ValueInfo{},
		values: graph.NewNamer(nil), nodes: graph.NewNamer(nil),
		faithful: m.ProducerName == Producer,
		fold:     newFoldBudget(opts, size),
	}
	var ok bool
	if im.opset, ok = m.Opset(""); !ok {
		switch {
		case len(m.OpsetImport) == 0 && m.IRVersion < 3:
			// IR versions before 3 had no opset_import and meant opset 1.
			im.opset = 1
		case len(m.OpsetImport) > 0 && !usesDomain(m.Graph, ""):
			// A model whose nodes are all of other domains need not import
			// the default one (ONNX's tests of the training ops import only
			// theirs); im.opset stays 0, which no node reads.
		default:
			return nil, errors.New("onnx: model imports no default-domain opset")
		}
	}
	if ok && (im.opset < MinOpset || im.opset > MaxOpset) {
		return nil, fmt.Errorf("onnx: default-domain opset %d is not supported (supported: %d to %d)", im.opset, MinOpset, MaxOpset)
	}
	im.ourOpset, _ = m.Opset(graph.DomainFlashgraph)
	im.trainingOpset, _ = m.Opset(graph.DomainONNXTraining)
	name := m.Graph.Name
	if opts.Name != "" {
		name = opts.Name
	}
	if name == "" {
		name = "onnx"
	}
	im.g = &graph.Graph{Name: name}
	return im, nil
}

func (im *importer) run() (*graph.Graph, error) {
	og := im.m.Graph
	for _, v := range og.ValueInfo {
		im.vinfo[v.Name] = v
	}
	for _, v := range og.Output {
		im.vinfo[v.Name] = v
	}
	im.consumed = map[string]bool{}
	// Reserve every ONNX value name first, so that names we invent never
	// take one; the names of subgraphs (an If's branches, inlined when the
	// condition is known) count too, as do the values their nodes read.
	for _, v := range og.Input {
		im.values.Reserve(v.Name)
	}
	var scan func(g *onnxpb.Graph, top bool)
	scan = func(g *onnxpb.Graph, top bool) {
		for _, o := range g.Output {
			im.consumed[o.Name] = true
		}
		for _, t := range g.Initializer {
			im.values.Reserve(t.Name)
		}
		for _, n := range g.Node {
			for _, in := range n.Input {
				im.consumed[in] = true
			}
			for _, o := range n.Output {
				if o != "" {
					im.values.Reserve(o)
				}
			}
			if n.Name != "" && im.faithful && top {
				im.nodes.Reserve(n.Name)
			}
			for _, a := range n.Attribute {
				if a.G != nil {
					scan(a.G, false)
				}
				for _, sg := range a.Graphs {
					scan(sg, false)
				}
			}
		}
	}
	scan(og, true)
	if err := im.initializers(); err != nil {
		return nil, err
	}
	if err := im.inputs(); err != nil {
		return nil, err
	}
	for _, n := range og.Node {
		if err := im.node(n); err != nil {
			return nil, err
		}
	}
	return im.finish()
}

// initializers turns each initializer into a param or a const.
func (im *importer) initializers() error {
	for i, t := range im.m.Graph.Initializer {
		if t.Name == "" {
			return fmt.Errorf("onnx: initializer %d has no name", i)
		}
		if _, dup := im.env[t.Name]; dup {
			return fmt.Errorf("onnx: initializer %q defined twice", t.Name)
		}
		if t.DataType == onnxpb.String {
			v, err := stringConst(t.Name, t)
			if err != nil {
				return fmt.Errorf("onnx: initializer: %w", err)
			}
			e := &entry{name: t.Name, seq: i, v: v}
			im.env[t.Name] = e
			im.inits = append(im.inits, e)
			continue
		}
		c, err := cvalFromTensor(t)
		if err != nil {
			return fmt.Errorf("onnx: initializer: %w", err)
		}
		im.fold.known(c)
		e := &entry{name: t.Name, seq: i}
		kind, recipe := meta(t.MetadataProps, metaKind), meta(t.MetadataProps, metaInit)
		param := kind == "param" || (kind == "" && looksTrainable(c))
		if param || im.faithful {
			// Our own exports say which initializers are params; and in a faithful
			// import every initializer is a graph value even if nothing reads it.
			v, err := im.initValue(t.Name, c, param, recipe)
			if err != nil {
				return fmt.Errorf("onnx: initializer %q: %w", t.Name, err)
			}
			e.v = v
		}
		if !param {
			e.c = c
		}
		im.env[t.Name] = e
		im.inits = append(im.inits, e)
	}
	im.nextSeq = len(im.m.Graph.Initializer)
	return nil
}

// looksTrainable decides, for a model that does not say, whether a float
// initializer is a weight (param) or a fixed constant. Weights are finite
// tensors of moderate magnitude; masks hold infinities or "very large
// negative" stand-ins for them (-1e4 in fp16-era code, -1e9, or the dtype's
// lowest value, as the dynamo exporter writes), and scalars are
// hyper-parameters (eps, scale).
func looksTrainable(c *cval) bool {
	if !c.isFloat() || c.n() <= 1 {
		return false
	}
	for _, v := range c.f {
		if math.IsInf(v, 0) || math.IsNaN(v) || math.Abs(v) >= maskMagnitude {
			return false
		}
	}
	return true
}

// maskMagnitude: no trained weight comes near it, every additive mask does.
const maskMagnitude = 1e4

// initValue makes the graph value of an initializer. A recipe from our own
// export is used when it reproduces the stored data exactly; otherwise the data
// becomes a literal.
func (im *importer) initValue(name string, c *cval, param bool, recipe string) (*graph.Value, error) {
	dt, data, err := c.literal()
	if err != nil {
		return nil, err
	}
	typ := graph.TensorType{DType: dt, Shape: c.shape.Clone()}
	init := graph.Literal(data...)
	if recipe != "" {
		if r, err := parseRecipe(recipe); err == nil && recipeMatches(r, typ, c) {
			init = r
		}
	}
	kind := graph.Const
	if param {
		kind = graph.Param
	}
	return &graph.Value{Name: name, Type: typ, Kind: kind, Init: &init}, nil
}

// recipeMatches reports whether the recipe materializes exactly the stored data.
func recipeMatches(r graph.Init, typ graph.TensorType, c *cval) bool {
	t, err := r.Materialize(typ)
	if err != nil || t.Len() != c.n() {
		return false
	}
	for k := range t.Len() {
		if math.Float64bits(t.At(k)) != math.Float64bits(c.at(k)) {
			return false
		}
	}
	return true
}

func meta(props []onnxpb.StringEntry, key string) string {
	for _, p := range props {
		if p.Key == key {
			return p.Value
		}
	}
	return ""
}

// inputs declares the graph inputs that are not initializers; a bound one
// becomes a constant.
func (im *importer) inputs() error {
	declared := map[string]bool{}
	kind := map[string]*onnxpb.Type{}
	for _, vi := range im.m.Graph.Input {
		declared[vi.Name] = true
		kind[vi.Name] = vi.Type
	}
	for name := range im.opts.Bind {
		if !declared[name] {
			return fmt.Errorf("onnx: bound value %q is not a graph input", name)
		}
	}
	for name := range im.opts.Sequences {
		if !declared[name] {
			return fmt.Errorf("onnx: sequence input %q (Options.Sequences) is not a graph input", name)
		}
		if t := kind[name]; !t.IsSequence() && !(t.IsOptional() && t.Elem.IsSequence()) {
			return fmt.Errorf("onnx: graph input %q (Options.Sequences) is a %s, not a sequence", name, t.TypeKind())
		}
	}
	for name := range im.opts.Absent {
		if !declared[name] {
			return fmt.Errorf("onnx: absent optional %q (Options.Absent) is not a graph input", name)
		}
		if t := kind[name]; !t.IsOptional() {
			return fmt.Errorf("onnx: graph input %q (Options.Absent) is a %s, not an optional", name, t.TypeKind())
		}
	}
	for _, vi := range im.m.Graph.Input {
		if _, isInit := im.env[vi.Name]; isInit {
			// IR < 4 lists initializers among the inputs: they are defaults the
			// caller may override. Our graphs are static, so they stay initializers.
			continue
		}
		if vi.Type.IsSequence() || vi.Type.IsOptional() {
			if _, ok := im.opts.Bind[vi.Name]; ok {
				return fmt.Errorf("onnx: graph input %q is a %s, which cannot be bound to a tensor", vi.Name, vi.Type.TypeKind())
			}
			e, err := im.boundaryInput(vi.Name, vi.Type)
			if err != nil {
				var se *SequenceError
				if errors.As(err, &se) {
					return err
				}
				return fmt.Errorf("onnx: graph input %q: %w", vi.Name, err)
			}
			im.env[vi.Name] = e
			continue
		}
		if t, ok := im.opts.Bind[vi.Name]; ok && t != nil && t.DataType == onnxpb.String {
			v, err := im.boundString(vi, t)
			if err != nil {
				return fmt.Errorf("onnx: graph input %q: %w", vi.Name, err)
			}
			im.env[vi.Name] = im.addInit(&entry{name: vi.Name, v: v})
			continue
		}
		if t, ok := im.opts.Bind[vi.Name]; ok {
			c, err := im.boundValue(vi, t)
			if err != nil {
				return fmt.Errorf("onnx: graph input %q: %w", vi.Name, err)
			}
			im.env[vi.Name] = im.addInit(&entry{name: vi.Name, c: c})
			continue
		}
		typ, err := im.staticType(vi)
		if err != nil {
			return fmt.Errorf("onnx: graph input %q: %w", vi.Name, err)
		}
		v := &graph.Value{Name: vi.Name, Type: typ, Kind: graph.Input}
		im.g.Inputs = append(im.g.Inputs, v)
		e := &entry{name: vi.Name, v: v}
		if dt := vi.Type.Tensor.ElemType; isNarrowInt(dt) {
			e.odt = dt
			im.declare(vi.Name, dt)
		}
		im.env[vi.Name] = e
	}
	return nil
}

// boundValue reads the value bound to a graph input and checks it against the
// input's declared element type and shape (a symbolic dimension takes the
// value's size unless Options.Dims gives it one).
func (im *importer) boundValue(vi *onnxpb.ValueInfo, t *onnxpb.Tensor) (*cval, error) {
	if t == nil {
		return nil, errors.New("bound to nil")
	}
	c, err := cvalFromTensor(t)
	if err != nil {
		return nil, fmt.Errorf("bound value: %w", err)
	}
	if vi.Type == nil || vi.Type.Tensor == nil {
		return nil, fmt.Errorf("type is %s; only tensors can be bound", vi.Type.TypeKind())
	}
	tt := vi.Type.Tensor
	if tt.ElemType != c.dt {
		return nil, fmt.Errorf("bound value has element type %v, the model declares %v", c.dt, tt.ElemType)
	}
	if tt.Shape != nil {
		if len(tt.Shape.Dim) != len(c.shape) {
			return nil, fmt.Errorf("bound value has shape %v, the model declares rank %d", c.shape, len(tt.Shape.Dim))
		}
		for i, d := range tt.Shape.Dim {
			want, known := int(d.Value), d.HasValue
			if !known && d.Param != "" {
				want, known = im.opts.Dims[d.Param]
			}
			if known && want != c.shape[i] {
				return nil, fmt.Errorf("bound value has shape %v, the model declares dimension %d = %d", c.shape, i, want)
			}
		}
	}
	im.fold.known(c)
	return c, nil
}

// boundString is a STRING graph input bound to t: a graph const, with the
// type the model declares (element type, rank and known dimensions).
func (im *importer) boundString(vi *onnxpb.ValueInfo, t *onnxpb.Tensor) (*graph.Value, error) {
	if vi.Type == nil || vi.Type.Tensor == nil || vi.Type.Tensor.ElemType != onnxpb.String {
		return nil, fmt.Errorf("bound value has element type STRING, the model declares %s", vi.Type.TypeKind())
	}
	v, err := stringConst(vi.Name, t)
	if err != nil {
		return nil, fmt.Errorf("bound value: %w", err)
	}
	if s := vi.Type.Tensor.Shape; s != nil {
		if len(s.Dim) != v.Type.Shape.Rank() {
			return nil, fmt.Errorf("bound value has shape %v, the model declares rank %d", v.Type.Shape, len(s.Dim))
		}
		for i, d := range s.Dim {
			if d.HasValue && int(d.Value) != v.Type.Shape[i] {
				return nil, fmt.Errorf("bound value has shape %v, the model declares dimension %d = %d", v.Type.Shape, i, d.Value)
			}
		}
	}
	return v, nil
}

// BindError is the error of an import that needs the value of a graph input
// (a shape, axes, k) that the caller may give in Options.Bind.
type BindError struct {
	Input string // the graph input whose value is needed
	err   error
}

func (e *BindError) Error() string { return e.err.Error() }
func (e *BindError) Unwrap() error { return e.err }

// staticType reads a ValueInfo's type; every dimension must be known (or bound
// through Options.Dims).
func (im *importer) staticType(vi *onnxpb.ValueInfo) (graph.TensorType, error) {
	if vi.Type == nil || vi.Type.Tensor == nil {
		return graph.TensorType{}, fmt.Errorf("type is %s; only tensors are supported", vi.Type.TypeKind())
	}
	tt := vi.Type.Tensor
	dt, ok := graphDType(tt.ElemType)
	if !ok {
		return graph.TensorType{}, fmt.Errorf("element type %v is not supported (float32, float64, float16, bfloat16, int64, bool; int8 to int32 and uint8 to uint32 as int64)", tt.ElemType)
	}
	if tt.Shape == nil {
		return graph.TensorType{}, errors.New("rank is unknown; flashgraph needs static shapes")
	}
	shape := make(graph.Shape, len(tt.Shape.Dim))
	for i, d := range tt.Shape.Dim {
		switch {
		case d.HasValue:
			if d.Value < 0 || d.Value > math.MaxInt32 {
				return graph.TensorType{}, fmt.Errorf("dimension %d has bad size %d", i, d.Value)
			}
			shape[i] = int(d.Value)
		case d.Param != "":
			size, ok := im.opts.Dims[d.Param]
			if !ok {
				return graph.TensorType{}, fmt.Errorf("dimension %d is symbolic (%q); give its size in Options.Dims", i, d.Param)
			}
			shape[i] = size
		default:
			return graph.TensorType{}, fmt.Errorf("dimension %d is unknown; flashgraph needs static shapes", i)
		}
	}
	if err := shape.Check(); err != nil {
		// Size and Shape fold from it: an element count that overflows must not.
		return graph.TensorType{}, err
	}
	return graph.TensorType{DType: dt, Shape: shape}, nil
}

// declare records the narrow integer type of a graph input or output.
func (im *importer) declare(name string, dt onnxpb.DataType) {
	if im.g.ElemTypes == nil {
		im.g.ElemTypes = map[string]string{}
	}
	im.g.ElemTypes[name] = narrowName(dt)
}

// checkInfo compares a value's type with what the model declares for it.
func (im *importer) checkInfo(name string, dt onnxpb.DataType, shape graph.Shape) error {
	vi, ok := im.vinfo[name]
	if !ok || vi.Type == nil || vi.Type.Tensor == nil {
		return nil
	}
	tt := vi.Type.Tensor
	if tt.ElemType != onnxpb.Undefined && tt.ElemType != dt {
		return fmt.Errorf("value %q: the model declares element type %v, the op gives %v", name, tt.ElemType, dt)
	}
	if tt.Shape == nil {
		return nil
	}
	if len(tt.Shape.Dim) != len(shape) {
		return fmt.Errorf("value %q: the model declares rank %d, the op gives shape %v", name, len(tt.Shape.Dim), shape)
	}
	for i, d := range tt.Shape.Dim {
		want, known := int(d.Value), d.HasValue
		if !known && d.Param != "" {
			want, known = im.opts.Dims[d.Param]
		}
		if known && want != shape[i] {
			return fmt.Errorf("value %q: the model declares dimension %d = %d, the op gives shape %v", name, i, want, shape)
		}
	}
	return nil
}

// val returns the graph value of an entry, making a const for a folded one.
func (im *importer) val(e *entry) (*graph.Value, error) {
	if e.v != nil {
		return e.v, nil
	}
	if e.isList {
		return nil, fmt.Errorf("%q is a sequence, which is not a graph value (sequences live between the sequence ops)", e.name)
	}
	if e.isOpt {
		return nil, fmt.Errorf("%q is an optional, which is not a graph value (OptionalGetElement reads one)", e.name)
	}
	v, err := im.initValue(e.name, e.c, false, "")
	if err != nil {
		return nil, fmt.Errorf("constant %q: %w", e.name, err)
	}
	e.v = v
	return v, nil
}

// constant makes a new constant entry (operands our ops need that ONNX passed
// as attributes, scalars of decompositions); name is a prefix for a fresh name.
func (im *importer) constant(name string, c *cval) *entry {
	return im.addInit(&entry{name: im.values.Fresh(name), c: c})
}

// addInit appends e to the initializers, numbered in import order (its
// seq), and returns it.
func (im *importer) addInit(e *entry) *entry {
	e.seq = im.nextSeq
	im.nextSeq++
	im.inits = append(im.inits, e)
	return e
}

func (im *importer) node(n *onnxpb.Node) (err error) {
	// Shape inference in the op table runs on shapes that come from the file; a
	// bug there must surface as an error naming the node, not crash the caller.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("onnx: node %q (%s): internal error: %v", n.Name, n.OpType, r)
		}
	}()
	ctx := &opCtx{im: im, n: n, attrs: map[string]*onnxpb.Attribute{}, used: map[string]bool{}}
	for _, a := range n.Attribute {
		if _, dup := ctx.attrs[a.Name]; dup {
			return ctx.errf("attribute %q given twice", a.Name)
		}
		if a.RefAttrName != "" {
			return ctx.errf("attribute %q refers to a function attribute; functions are not supported", a.Name)
		}
		ctx.attrs[a.Name] = a
	}
	switch n.Domain {
	case "", "ai.onnx":
		ctx.ver = im.opset
	case graph.DomainFlashgraph:
		if im.ourOpset == 0 {
			return ctx.errf("the model does not import the %q domain", n.Domain)
		}
		ctx.ver = im.ourOpset
	case graph.DomainONNXTraining:
		if im.trainingOpset == 0 {
			return ctx.errf("the model does not import the %q domain", n.Domain)
		}
		ctx.ver = im.trainingOpset
	default:
		return ctx.errf("domain %q is not supported", n.Domain)
	}
	if len(n.Output) == 0 {
		return ctx.errf("has no outputs")
	}
	if n.Overload != "" {
		return ctx.errf("calls a model-local function overload; functions are not supported")
	}
	for _, name := range n.Input {
		if name == "" {
			ctx.in = append(ctx.in, nil)
			continue
		}
		e, ok := im.env[name]
		if !ok {
			return ctx.errf("input %q is not defined before this node (nodes must be in topological order)", name)
		}
		ctx.in = append(ctx.in, e)
	}
	for _, o := range n.Output {
		if _, dup := im.env[o]; dup && o != "" {
			return ctx.errf("output %q is defined twice", o)
		}
	}
	if err := ctx.legacyForms(); err != nil {
		return err
	}
	if err := ctx.checkFoldInputs(); err != nil {
		return err
	}
	ctx.out = make([]*entry, len(n.Output))
	if err := ctx.dispatch(); err != nil {
		var be *BindError
		if !errors.As(err, &be) {
			if in := ctx.unboundInput(); in != "" && strings.Contains(err.Error(), "must be a constant") {
				err = &BindError{Input: in, err: fmt.Errorf("%w (input %q may be bound with Options.Bind)", err, in)}
			}
		}
		if errors.Is(err, errTooBig) {
			// An op that can only be folded, with no budget left to fold it.
			return ctx.errf("%v", im.fold.exceeded(err))
		}
		return err
	}
	for _, e := range ctx.out {
		if e != nil && e.c != nil {
			if err := im.fold.add(e.c); err != nil {
				return ctx.errf("%v", err)
			}
		}
	}
	for i, o := range n.Output {
		e := ctx.out[i]
		if o == "" {
			continue
		}
		if e == nil {
			if ctx.outputUsed(i) {
				return ctx.errf("output %d (%q) is not supported", i, o)
			}
			continue
		}
		if !e.nonTensor() { // a sequence's or optional's value_info is not a tensor's
			dt, shape := e.typ()
			if err := im.checkInfo(o, dt, shape); err != nil {
				return ctx.errf("%v", err)
			}
		}
		im.env[o] = e
	}
	return nil
}

// finish collects the initializers the graph uses, sets the outputs and verifies.
func (im *importer) finish() (*graph.Graph, error) {
	for _, vi := range im.m.Graph.Output {
		e, ok := im.env[vi.Name]
		if !ok {
			return nil, fmt.Errorf("onnx: graph output %q is not produced by any node", vi.Name)
		}
		if e.nonTensor() || vi.Type.IsSequence() || vi.Type.IsOptional() {
			if err := im.boundaryOutput(vi.Name, e, vi.Type); err != nil {
				return nil, fmt.Errorf("onnx: graph output %q: %w", vi.Name, err)
			}
			continue
		}
		if e.v != nil && e.v.Name != vi.Name && e.v.Kind == graph.Intermediate {
			return nil, fmt.Errorf("onnx: graph output %q aliases %q", vi.Name, e.v.Name)
		}
		v, err := im.val(e)
		if err != nil {
			return nil, fmt.Errorf("onnx: graph output %q: %w", vi.Name, err)
		}
		dt, shape := e.typ()
		if err := im.checkInfo(vi.Name, dt, shape); err != nil {
			return nil, fmt.Errorf("onnx: graph output: %w", err)
		}
		if isNarrowInt(dt) {
			if prev, ok := im.g.ElemTypes[vi.Name]; ok && prev != narrowName(dt) {
				return nil, fmt.Errorf("onnx: graph output %q is the input of type %s, declared %v", vi.Name, prev, dt)
			}
			im.declare(vi.Name, dt)
		}
		im.g.Outputs = append(im.g.Outputs, v)
	}
	if len(im.g.Outputs) == 0 && len(im.m.Graph.Output) > 0 {
		// Every output is an empty sequence or an absent optional, which
		// map onto no tensors: there is nothing to compute.
		return nil, errors.New("onnx: the graph has no tensor outputs: every output is an empty sequence or an absent optional")
	}
	used := map[*graph.Value]bool{}
	for _, n := range im.g.Nodes {
		for _, v := range n.Inputs {
			used[v] = true
		}
	}
	for _, v := range im.g.Outputs {
		used[v] = true
	}
	im.constParams()
	order := slices.Clone(im.inits)
	slices.SortStableFunc(order, func(a, b *entry) int { return a.seq - b.seq })
	seen := map[*graph.Value]bool{}
	for _, e := range order {
		v := e.v
		if v == nil || seen[v] || (!used[v] && !im.faithful) {
			continue
		}
		seen[v] = true
		switch v.Kind {
		case graph.Param:
			im.g.Params = append(im.g.Params, v)
		case graph.Const:
			im.g.Consts = append(im.g.Consts, v)
		}
	}
	if err := graph.Verify(im.g); err != nil {
		return nil, fmt.Errorf("onnx: imported graph does not verify: %w", err)
	}
	return im.g, nil
}

// opCtx is one ONNX node being imported.
type opCtx struct {
	im    *importer
	n     *onnxpb.Node
	ver   int64 // the opset version of the node's domain
	in    []*entry
	out   []*entry
	attrs map[string]*onnxpb.Attribute
	used  map[string]bool
	name  string // the graph node name given to the node that produces the outputs
	// outNames, when set, names the outputs of the emitted node instead of the
	// ONNX node's outputs (ops whose outputs do not line up with ours).
	outNames []string
}

func (c *opCtx) errf(format string, args ...any) error {
	dom := c.n.Domain
	if dom == "" {
		dom = "ai.onnx"
	}
	return fmt.Errorf("onnx: node %q (%s, %s opset %d): %s", c.n.Name, c.n.OpType, dom, c.ver, fmt.Sprintf(format, args...))
}

func (c *opCtx) has(name string) bool { return c.attrs[name] != nil }

func (c *opCtx) attr(name string, want onnxpb.AttributeType) (*onnxpb.Attribute, error) {
	a := c.attrs[name]
	if a == nil {
		return nil, nil
	}
	c.used[name] = true
	if a.Type != want {
		return nil, c.errf("attribute %s is %v, want %v", name, a.Type, want)
	}
	return a, nil
}

func (c *opCtx) attrInt(name string, def int64) (int64, error) {
	a, err := c.attr(name, onnxpb.AttrInt)
	if a == nil || err != nil {
		return def, err
	}
	return a.I, nil
}

func (c *opCtx) attrInts(name string) ([]int64, bool, error) {
	a, err := c.attr(name, onnxpb.AttrInts)
	if a == nil || err != nil {
		return nil, false, err
	}
	return a.Ints, true, nil
}

// attrFloat reads a float attribute; our export stores the exact float64 beside
// the float32 ONNX keeps, and it is used when it agrees with the float32.
func (c *opCtx) attrFloat(name string, def float64) (float64, error) {
	a, err := c.attr(name, onnxpb.AttrFloat)
	if a == nil || err != nil {
		return def, err
	}
	if s := meta(c.n.MetadataProps, metaAttr+name); s != "" {
		if v, err := graph.ParseFloatLit(s); err == nil && (float32(v) == a.F || (v != v && a.F != a.F)) {
			return v, nil
		}
	}
	return float64(a.F), nil
}

func (c *opCtx) attrString(name, def string) (string, error) {
	a, err := c.attr(name, onnxpb.AttrString)
	if a == nil || err != nil {
		return def, err
	}
	return string(a.S), nil
}

// checkAttrs refuses attributes the handler did not read: an attribute we do not
// understand may change the op's meaning.
func (c *opCtx) checkAttrs() error {
	var extra []string
	for name := range c.attrs {
		if !c.used[name] {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		return c.errf("attribute(s) %s not supported", strings.Join(extra, ", "))
	}
	return nil
}

// input returns input i, nil when absent.
func (c *opCtx) input(i int) *entry {
	if i < len(c.in) {
		return c.in[i]
	}
	return nil
}

// need is value for an input the op requires: an omitted one (an empty
// name, or too few inputs) is an error naming the node, not a nil value.
func (c *opCtx) need(i int) (*graph.Value, error) {
	v, err := c.value(i)
	if err == nil && v == nil {
		return nil, c.errf("input %d is required but omitted", i)
	}
	return v, err
}

// value returns input i, or nil for an omitted optional input.
func (c *opCtx) value(i int) (*graph.Value, error) {
	e := c.input(i)
	if e == nil {
		return nil, nil
	}
	v, err := c.im.val(e)
	if err != nil {
		return nil, c.errf("%v", err)
	}
	return v, nil
}

// constInput returns the known data of input i, which must be a constant.
func (c *opCtx) constInput(i int, what string) (*cval, error) {
	e := c.input(i)
	if e == nil {
		return nil, nil
	}
	if e.c == nil {
		err := c.errf("%s (input %d, %q) must be a constant: flashgraph shapes are static", what, i, e.name)
		if in := sourceInput(e); in != "" {
			err = &BindError{Input: in, err: fmt.Errorf("%w; bind %q with Options.Bind", err, in)}
		}
		return nil, err
	}
	return e.c, nil
}

// sourceInput names the graph input a runtime operand is computed from
// ("" for none): the operand itself, or the first graph input reached
// through the nodes that compute it (a size input cast to float, then
// given to Range). Binding it may make the operand a constant, which
// folding then carries to the node that needs it.
func sourceInput(e *entry) string {
	if e == nil || e.c != nil || e.v == nil {
		return ""
	}
	seen := map[*graph.Value]bool{}
	var walk func(v *graph.Value) string
	walk = func(v *graph.Value) string {
		if v == nil || seen[v] {
			return ""
		}
		seen[v] = true
		if v.Kind == graph.Input {
			return v.Name
		}
		if v.Producer == nil {
			return ""
		}
		for _, in := range v.Producer.Inputs {
			if name := walk(in); name != "" {
				return name
			}
		}
		return ""
	}
	return walk(e.v)
}

// unboundInput names an input of the node that is a graph input of an integer
// type with no known value ("" if none): what a node that needs constant
// operands may ask the caller to bind.
func (c *opCtx) unboundInput() string {
	for _, e := range c.in {
		if e != nil && e.c == nil && e.v != nil && e.v.Kind == graph.Input && e.v.Type.DType == graph.Int64 {
			return e.name
		}
	}
	return ""
}

// allConst reports whether every given input is known at import time.
func (c *opCtx) allConst() bool {
	for _, e := range c.in {
		if e != nil && e.c == nil {
			return false
		}
	}
	return true
}

// nodeName gives the graph node its ONNX name when that is free, else a fresh one.
func (c *opCtx) nodeName() string {
	if c.name != "" {
		return c.name
	}
	switch {
	case c.im.faithful && c.n.Name != "":
		c.name = c.n.Name // reserved up front
	case c.n.Name != "" && c.im.nodes.Reserve(c.n.Name):
		c.name = c.n.Name
	default:
		c.name = c.im.nodes.Fresh(c.n.OpType)
	}
	return c.name
}

// emit adds the node that produces this ONNX node's outputs; its output values
// take the ONNX output names (outputs left unnamed get node#i names).
func (c *opCtx) emit(op string, attrs graph.Attrs, inputs ...*graph.Value) ([]*graph.Value, error) {
	names := c.outNames
	if names == nil {
		names = c.n.Output
	}
	name := c.nodeName()
	nd, err := graph.NewNode(name, op, attrs, inputs...)
	if err != nil {
		return nil, c.errf("%v", err)
	}
	for i, v := range nd.Outputs {
		onnxName := i < len(c.n.Output) && i < len(names) && names[i] == c.n.Output[i] && names[i] != ""
		switch {
		case onnxName:
			v.Name = names[i] // reserved up front
		case i < len(names) && names[i] != "" && c.im.values.Reserve(names[i]):
			v.Name = names[i]
		case c.im.values.Reserve(v.Name):
		default:
			v.Name = c.im.values.Fresh(name + "_out" + strconv.Itoa(i))
		}
		if onnxName {
			c.out[i] = &entry{name: v.Name, v: v}
		}
	}
	c.im.g.Nodes = append(c.im.g.Nodes, nd)
	return nd.Outputs, nil
}

// emitOutput adds a node that produces ONNX output i alone (Split's slices).
func (c *opCtx) emitOutput(i int, op string, attrs graph.Attrs, inputs ...*graph.Value) error {
	name := c.name
	if name == "" {
		name = c.nodeName()
	} else {
		name = c.im.nodes.Fresh(c.nodeBase() + "_" + strconv.Itoa(i))
	}
	nd, err := graph.NewNode(name, op, attrs, inputs...)
	if err != nil {
		return c.errf("%v", err)
	}
	nd.Outputs[0].Name = c.n.Output[i]
	c.out[i] = &entry{name: c.n.Output[i], v: nd.Outputs[0]}
	c.im.g.Nodes = append(c.im.g.Nodes, nd)
	return nil
}

// sub adds an intermediate node of a rewrite (one ONNX node becoming several of
// ours), named after the ONNX node.
func (c *opCtx) sub(op string, attrs graph.Attrs, inputs ...*graph.Value) (*graph.Value, error) {
	base := c.n.Name
	if base == "" {
		base = c.n.OpType
	}
	name := c.im.nodes.Fresh(base + "/" + op)
	nd, err := graph.NewNode(name, op, attrs, inputs...)
	if err != nil {
		return nil, c.errf("%v", err)
	}
	for _, v := range nd.Outputs {
		v.Name = c.im.values.Fresh(name)
	}
	c.im.g.Nodes = append(c.im.g.Nodes, nd)
	return nd.Outputs[0], nil
}

// ints makes a 1-D int64 constant operand.
func (c *opCtx) ints(what string, vals []int64) (*graph.Value, error) {
	cv := &cval{dt: onnxpb.Int64, shape: graph.Shape{len(vals)}, i: slices.Clone(vals)}
	return c.im.val(c.im.constant(c.nodeBase()+"/"+what, cv))
}

// emitReshape writes the node's output: y reshaped to shape.
func (c *opCtx) emitReshape(y *graph.Value, shape []int64) error {
	sv, err := c.ints("shape", shape)
	if err != nil {
		return err
	}
	_, err = c.emit("Reshape", nil, y, sv)
	return err
}

// scalar makes a rank-0 constant of our dtype dt.
func (c *opCtx) scalar(what string, dt graph.DType, v float64) (*graph.Value, error) {
	cv := newCval(onnxType(dt), graph.Shape{})
	cv.set(0, v)
	return c.im.val(c.im.constant(c.nodeBase()+"/"+what, cv))
}

func (c *opCtx) nodeBase() string {
	if c.n.Name != "" {
		return c.n.Name
	}
	return c.n.OpType
}

// outputUsed reports whether ONNX output i is named and read by a node or the
// graph outputs.
func (c *opCtx) outputUsed(i int) bool {
	return i < len(c.n.Output) && c.n.Output[i] != "" && c.im.consumed[c.n.Output[i]]
}

// usesDomain reports whether a node of g, or of a graph in one of its
// nodes' attributes, is of the domain ("" and "ai.onnx" are one).
func usesDomain(g *onnxpb.Graph, domain string) bool {
	if g == nil {
		return false
	}
	for _, n := range g.Node {
		d := n.Domain
		if d == "ai.onnx" {
			d = ""
		}
		if d == domain {
			return true
		}
		for _, a := range n.Attribute {
			if usesDomain(a.G, domain) {
				return true
			}
			for _, sg := range a.Graphs {
				if usesDomain(sg, domain) {
					return true
				}
			}
		}
	}
	return false
}
