package graph

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Domains. ONNX ops live in the default domain; ours in DomainFlashgraph.
const (
	DomainONNX       = ""
	DomainFlashgraph = "flashgraph"
)

// AttrSpec declares one attribute of an op.
type AttrSpec struct {
	Name     string
	Kind     AttrKind
	Required bool
	Default  Attr // filled into nodes when absent (canonical form)
	// Enum, for a string attribute an expression reads (ExprAttr), lists
	// its values: the expression sees a value's index. A node with another
	// value is refused.
	Enum []string
}

// OpSpec is one row of the op table: everything the verifier, the text
// format, DOT, the matcher and the backends need to know about an op.
type OpSpec struct {
	Name   string
	Domain string
	Doc    string   // one line: what the op means
	Inputs []string // input names; a "?" suffix marks optional, a "..." suffix variadic (last only)
	// Outputs names the outputs; a "?" suffix marks an output that may be
	// left unused (it is still always produced).
	Outputs []string
	Attrs   []AttrSpec
	// Infer returns the output types from the inputs' types and the attrs
	// (defaults already filled in). in[i] is nil for an omitted optional input.
	// consts gives the data of constant inputs (shape operands etc.), nil otherwise.
	Infer func(in []*TensorType, attrs Attrs, consts []*Tensor) ([]TensorType, error)
	// Strings: the op takes string operands (its Infer and Eval handle
	// them). Every other op is refused a string operand before its Infer
	// runs (inferTypes), so no float code ever reads text.
	Strings bool
	// Eval is the op's meaning as executable float64 reference code (eval.go):
	// the one definition the conformance suite checks backends against and
	// constant folding runs. Elementwise ops give Expr instead: it is
	// compiled into Map, which Eval applies at every broadcast position.
	Eval EvalFunc
	// Map is the scalar function of an elementwise op (nil for others,
	// and for an op whose expression reads attributes: MapFor gives a
	// node's).
	Map *MapFunc
	// Expr, for an elementwise op, is its one definition (expr.go):
	// register compiles it into Map, backends generate code from it and
	// autodiff differentiates it.
	Expr *Expr
	// exprAttrs: Expr reads attributes, so each node computes Expr bound
	// to its own values (ExprFor, MapFor).
	exprAttrs bool
	// logical: bool operands and result; the expression is arithmetic on
	// 0/1 that means something else (And is a product of bools), so MatchOp
	// never names the op, nothing differentiates it and bodies leave it out.
	logical bool
	// boolResult: a float function with a bool result (IsNaN), kept out of
	// bodies as comparisons are.
	boolResult bool
	// integerOnly: int64 operands and result (BitShift); the expression's
	// arithmetic is exact integer work with no derivative to take.
	integerOnly bool
	// noMatch keeps MatchOp from naming the op for a subexpression: a
	// logical op, or one whose operands do not broadcast both ways
	// (PRelu's slope broadcasts to X only).
	noMatch bool
	bound   sync.Map // attribute key -> *boundExpr

	// Planning facts: what a memory planner may assume of a node of the op
	// without knowing the op (backend/cuda/planfacts.go reads them).
	//
	// View: output 0 is input 0's elements in the same order under another
	// shape, so it may share input 0's buffer.
	View bool
	// InPlace[k] is the input whose new value output k is (an optimizer's
	// param and moments), computed element by element: output k may be
	// written over that input's buffer where nothing reads the old value
	// afterwards. -1, or k past the slice: none.
	InPlace []int
	// KeepDType lists the outputs a mixed-precision lowering stores in their
	// graph dtype, never narrowed: optimizer state, a loss, softmax
	// statistics, an explicit cast's result.
	KeepDType []int
	// Permutation, for an op whose output is input 0 with its axes permuted,
	// gives the permutation of a node's input of rank r.
	Permutation func(attrs Attrs, rank int) ([]int, error)
}

// InPlaceInput is the input output k may be written over (InPlace), or -1.
func (s *OpSpec) InPlaceInput(k int) int {
	if k < len(s.InPlace) {
		return s.InPlace[k]
	}
	return -1
}

// KeepsDType reports whether output k stays in its graph dtype under mixed
// precision (KeepDType). Every output of a variadic last output counts as
// that output.
func (s *OpSpec) KeepsDType(k int) bool {
	if n := len(s.Outputs); n > 0 && k >= n-1 && strings.HasSuffix(s.Outputs[n-1], "...") {
		k = n - 1
	}
	return slices.Contains(s.KeepDType, k)
}

var ops = map[string]*OpSpec{}

// register adds an op to the table; op family files call it from init.
func register(s *OpSpec) {
	if _, dup := ops[s.Name]; dup {
		panic("graph: op registered twice: " + s.Name) // programming error at init, not input
	}
	if s.Expr != nil {
		if s.Map != nil {
			panic("graph: op has both Expr and Map: " + s.Name) // programming error at init, not input
		}
		if n := s.Expr.NumVars(); n > len(s.Inputs) {
			panic("graph: expression of " + s.Name + " reads more operands than the op has") // programming error at init
		}
		for _, name := range s.Expr.Attrs() {
			as := s.attrSpec(name)
			if as == nil || as.Default.Kind == 0 || (as.Kind == AttrString) != (as.Enum != nil) {
				panic("graph: expression of " + s.Name + " reads attribute " + name + ", which needs a declaration with a default (and Enum for a string)") // programming error at init
			}
			s.exprAttrs = true
		}
		if s.exprAttrs {
			s.Eval = evalExprAttrs(s)
		} else {
			s.Map = &MapFunc{Float: s.Expr.CompileFloat(), Int: s.Expr.CompileInt()}
		}
		if fusible(s) {
			FusibleElementwise[s.Name] = true
		}
	}
	if s.Map != nil {
		s.Eval = evalMap(s.Map)
	}
	if s.Eval == nil {
		panic("graph: op has no Eval: " + s.Name) // programming error at init, not input
	}
	for _, i := range s.InPlace {
		if i >= len(s.Inputs) || len(s.InPlace) > len(s.Outputs) {
			panic("graph: op's InPlace is out of range: " + s.Name) // programming error at init, not input
		}
	}
	for _, k := range s.KeepDType {
		if k < 0 || k >= len(s.Outputs) {
			panic("graph: op's KeepDType is out of range: " + s.Name) // programming error at init, not input
		}
	}
	ops[s.Name] = s
}

// boundExpr is an op's expression at one node's attribute values.
type boundExpr struct {
	expr *Expr
	m    *MapFunc
	err  error
}

// Logical reports whether the op is a logical one (And, Or, Xor, Not):
// defined by an expression over bool operands, not differentiated.
func (s *OpSpec) Logical() bool { return s.logical }

// IntegerOnly reports whether the op is defined on int64 operands alone
// (BitShift): it has no gradient.
func (s *OpSpec) IntegerOnly() bool { return s.integerOnly }

// HasExprAttrs reports whether the op's expression reads attributes: its
// nodes compute ExprFor(attrs), not Expr.
func (s *OpSpec) HasExprAttrs() bool { return s.exprAttrs }

// ExprFor is the op's expression at a node's attributes: Expr with every
// attribute it reads replaced by the node's value (its default when
// absent), folded (Expr.Bind). An op whose expression reads no attribute
// gets Expr itself. It is what every backend computes for the node.
func (s *OpSpec) ExprFor(attrs Attrs) (*Expr, error) {
	b := s.bind(attrs)
	return b.expr, b.err
}

// MapFor is the scalar function of a node of the op with attributes attrs
// (Map for an op whose expression reads none).
func (s *OpSpec) MapFor(attrs Attrs) (*MapFunc, error) {
	b := s.bind(attrs)
	return b.m, b.err
}

func (s *OpSpec) bind(attrs Attrs) *boundExpr {
	if s.Expr == nil {
		return &boundExpr{err: fmt.Errorf("%s has no expression", s.Name)}
	}
	if !s.exprAttrs {
		return &boundExpr{expr: s.Expr, m: s.Map}
	}
	values, key, err := s.ExprAttrValues(attrs)
	if err != nil {
		return &boundExpr{err: err}
	}
	if b, ok := s.bound.Load(key); ok {
		return b.(*boundExpr)
	}
	e, err := s.Expr.Bind(values)
	b := &boundExpr{expr: e, err: err}
	if err == nil {
		b.m = &MapFunc{Float: e.CompileFloat(), Int: e.CompileInt()}
	}
	s.bound.Store(key, b)
	return b
}

// ExprAttrValues are the numbers the op's expression reads for a node with
// attributes attrs (defaults where absent; a string as its index in Enum),
// and a key that is equal for equal values.
func (s *OpSpec) ExprAttrValues(attrs Attrs) (map[string]float64, string, error) {
	values := map[string]float64{}
	var key strings.Builder
	for _, name := range s.Expr.Attrs() {
		as := s.attrSpec(name)
		a, ok := attrs[name]
		if !ok {
			a = as.Default
		}
		var v float64
		switch {
		case a.Kind == AttrFloat:
			v = a.F
		case a.Kind == AttrInt:
			v = float64(a.I)
		case a.Kind == AttrString && as.Enum != nil:
			i := slices.Index(as.Enum, a.S)
			if i < 0 {
				return nil, "", fmt.Errorf("%s attribute %s is %q, want one of %q", s.Name, name, a.S, as.Enum)
			}
			v = float64(i)
		default:
			return nil, "", fmt.Errorf("%s attribute %s is %v, want %v", s.Name, name, a.Kind, as.Kind)
		}
		values[name] = v
		key.WriteString(name + "=" + strconv.FormatFloat(v, 'g', -1, 64) + ";")
	}
	return values, key.String(), nil
}

// evalExprAttrs is the Eval of an op whose expression reads attributes: the
// node's MapFor at every broadcast position.
func evalExprAttrs(s *OpSpec) EvalFunc {
	return func(in []*Tensor, attrs Attrs, out []*Tensor) error {
		m, err := s.MapFor(attrs)
		if err != nil {
			return err
		}
		return evalMap(m)(in, attrs, out)
	}
}

// LookupOp returns the op table entry for an op type.
func LookupOp(name string) (*OpSpec, bool) {
	s, ok := ops[name]
	return s, ok
}

// Ops returns the whole op table sorted by name.
func Ops() []*OpSpec {
	out := make([]*OpSpec, 0, len(ops))
	for _, s := range ops {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *OpSpec) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// QualifiedName is the op's name with its domain, as the text format writes it.
func (s *OpSpec) QualifiedName() string {
	if s.Domain == DomainONNX {
		return s.Name
	}
	return s.Domain + "." + s.Name
}

// Arity returns the minimum and maximum input counts (max -1: variadic).
func (s *OpSpec) Arity() (minIn, maxIn int) {
	for _, in := range s.Inputs {
		switch {
		case strings.HasSuffix(in, "..."):
			return minIn + 1, -1
		case strings.HasSuffix(in, "?"):
			maxIn++
		default:
			minIn++
			maxIn++
		}
	}
	return minIn, maxIn
}

// attrSpec finds an attribute declaration.
func (s *OpSpec) attrSpec(name string) *AttrSpec {
	for i := range s.Attrs {
		if s.Attrs[i].Name == name {
			return &s.Attrs[i]
		}
	}
	return nil
}

// normalizeAttrs checks attrs against the spec and fills defaults, giving the
// canonical attribute set of a node.
func (s *OpSpec) normalizeAttrs(attrs Attrs) (Attrs, error) {
	out := Attrs{}
	for name, a := range attrs {
		as := s.attrSpec(name)
		if as == nil {
			return nil, fmt.Errorf("%s has no attribute %q", s.Name, name)
		}
		if a.Kind == AttrInt && as.Kind == AttrFloat { // an int literal for a float attr
			a = Float(float64(a.I))
		}
		if a.Kind == AttrInts && as.Kind == AttrFloats {
			f := make([]float64, len(a.Ints))
			for i, v := range a.Ints {
				f[i] = float64(v)
			}
			a = Floats(f...)
		}
		if a.Kind != as.Kind {
			return nil, fmt.Errorf("%s attribute %s is %v, want %v", s.Name, name, a.Kind, as.Kind)
		}
		if as.Enum != nil && !slices.Contains(as.Enum, a.S) {
			return nil, fmt.Errorf("%s attribute %s is %q, want one of %q", s.Name, name, a.S, as.Enum)
		}
		out[name] = a
	}
	for _, as := range s.Attrs {
		if _, ok := out[as.Name]; ok {
			continue
		}
		if as.Required {
			return nil, fmt.Errorf("%s needs attribute %s", s.Name, as.Name)
		}
		if as.Default.Kind != 0 {
			out[as.Name] = as.Default
		}
	}
	return out, nil
}

// InferNode checks a node's inputs and attributes against the table and
// returns its output types. consts may be nil.
func InferNode(op string, inputs []*Value, attrs Attrs) (Attrs, []TensorType, error) {
	s, ok := ops[op]
	if !ok {
		return nil, nil, fmt.Errorf("unknown op %q", op)
	}
	lo, hi := s.Arity()
	if err := checkArity(op, lo, hi, len(inputs)); err != nil {
		return nil, nil, err
	}
	na, err := s.normalizeAttrs(attrs)
	if err != nil {
		return nil, nil, err
	}
	in := make([]*TensorType, len(inputs))
	consts := make([]*Tensor, len(inputs))
	for i, v := range inputs {
		if v == nil {
			// Required inputs, and every element of a variadic list, must be present.
			if i < lo || (hi < 0 && i >= len(s.Inputs)-1) {
				return nil, nil, fmt.Errorf("%s input %d (%s) is required", op, i, s.inputName(i))
			}
			continue
		}
		t := v.Type
		in[i] = &t
		if v.Kind == Const && v.Init != nil && v.Type.Shape.Numel() <= 64 {
			if d, err := v.Init.Materialize(v.Type); err == nil {
				consts[i] = d
			}
		}
	}
	// Pad omitted trailing optional inputs with nil so Infer can index every
	// declared input.
	for hi > len(in) {
		in = append(in, nil)
		consts = append(consts, nil)
	}
	outs, err := s.inferTypes(in, na, consts)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	// Inference multiplies and copies dims it was given (Reshape, Expand,
	// Tile); a product past MaxElements would wrap around silently.
	for i, t := range outs {
		if err := t.Shape.Check(); err != nil {
			return nil, nil, fmt.Errorf("%s output %d: %w", op, i, err)
		}
	}
	return na, outs, nil
}

// inferTypes is s.Infer behind the one check every op shares: a string
// operand is refused unless the row takes strings.
func (s *OpSpec) inferTypes(in []*TensorType, attrs Attrs, consts []*Tensor) ([]TensorType, error) {
	if !s.Strings {
		for i, t := range in {
			if t != nil && t.DType == String {
				return nil, fmt.Errorf("input %d (%s) is a string tensor; %s does not take strings", i, s.inputName(i), s.Name)
			}
		}
	}
	outs, err := s.Infer(in, attrs, consts)
	if err != nil {
		return nil, err
	}
	if !s.Strings {
		for i, t := range outs {
			if t.DType == String {
				return nil, fmt.Errorf("output %d would be a string tensor; %s does not make strings", i, s.Name)
			}
		}
	}
	return outs, nil
}

func (s *OpSpec) inputName(i int) string {
	if i < len(s.Inputs) {
		return strings.TrimRight(s.Inputs[i], "?.")
	}
	return strings.TrimRight(s.Inputs[len(s.Inputs)-1], "?.")
}
