package graph

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// FusedElementwise is a chain or tree of elementwise ops run as one node:
// backends that generate code compute every output element in registers
// without writing the intermediates. Its meaning is its body, a small
// program of op-table ops:
//
//	body    = "Mul(i0,i1);Sigmoid(i0);Mul(t0,t1)"
//	outputs = [2]
//
// Each ';'-separated step applies one op to operands that are node inputs
// (iK) or earlier steps (tK), with the op's own broadcasting and types, as
// if it were a node of its own; the node's outputs are the listed steps, in
// order. A backend without code generation runs the body op by op (the CPU
// backend does), so a fused graph means exactly what the unfused one did.
//
// A body may hold one reduction step (FusibleReduce: ReduceSum, ReduceMean)
// over the axes of the node's `axes` attribute (keepdims from `keepdims`,
// default 1), so that a row reduction, the elementwise chain that feeds it
// and the elementwise work on its result run as one kernel:
//
//	body    = "Add(i0,i1);Mul(t0,t0);ReduceMean(t1);Add(t2,i2);Sqrt(t3);Reciprocal(t4)"
//	axes    = [-1]
//	outputs = [0,4,5]
//
// Steps before the reduction have the shape it reduces, steps after it the
// reduced shape; each step still follows its op's own rules.
//
// Index steps (FusibleIndex) move values between positions instead of
// computing them: Slice<axis,start,end>(x) is x[start:end] along axis, and
// Concat<axis>(a,b,...) joins along axis, the ONNX ops with those operands.
// They let a kernel read a rotate-half (RoPE) or its gradient through
// index arithmetic instead of materialised slices and concatenations:
//
//	body = "Slice<3,32,64>(i0);Neg(t0);Slice<3,0,32>(i0);Concat<3>(t1,t2);Mul(t3,i1)"
//
// Transpose<p0,p1,...>(x) permutes x's axes by the permutation p (one
// parameter per axis, ONNX Transpose's perm): a kernel reads a transposed
// input, or writes a transposed result, through permuted coordinates instead
// of a copy. A head split (Transpose<0,2,1,3> of [B,S,H,D] to [B,H,S,D])
// keeps the last axis, so each row a row kernel walks stays contiguous and
// only where it starts moves:
//
//	body = "Transpose<0,2,1,3>(i0);Mul(t0,t0);ReduceMean(t1)"

// FusibleElementwise are the ops a body may use: those defined by an
// expression (Expr), so a step is fully written as Op(operands), or
// Op{name=value,...}(operands) for an op whose expression reads attributes
// (the step's own values, FusedStep.Attrs). register fills it; comparisons,
// predicates (IsNaN) and logical ops stay out (their bool result is a mask,
// built once and read as a node of its own).
var FusibleElementwise = map[string]bool{}

// fusible reports whether register lists s in FusibleElementwise.
func fusible(s *OpSpec) bool {
	return s.Expr != nil && !s.logical && !s.boolResult && s.Expr.Prim != PrimGreater && s.Expr.Prim != PrimEqual
}

// ExprStepAttrs are the attributes a body step of op carries: those its
// expression reads (OpSpec.ExprFor), from attrs or their defaults; nil for
// an op whose expression reads none.
func ExprStepAttrs(op string, attrs Attrs) Attrs {
	s, ok := ops[op]
	if !ok || !s.exprAttrs {
		return nil
	}
	out := Attrs{}
	for _, name := range s.Expr.Attrs() {
		if a, ok := attrs[name]; ok {
			out[name] = a
		} else {
			out[name] = s.attrSpec(name).Default
		}
	}
	return out
}

// formatStepAttrs writes a step's attributes as {name=value,...}, names
// sorted, floats in the shortest form that reads back exactly: one text per
// set of values.
func formatStepAttrs(sb *strings.Builder, a Attrs) {
	sb.WriteByte('{')
	for j, name := range a.Names() {
		if j > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(name + "=")
		switch v := a[name]; v.Kind {
		case AttrFloat:
			sb.WriteString(strconv.FormatFloat(v.F, 'g', -1, 64))
		case AttrInt:
			sb.WriteString(strconv.FormatInt(v.I, 10))
		case AttrString:
			sb.WriteString(v.S)
		}
	}
	sb.WriteByte('}')
}

// parseStepAttrs reads the {...} of a step of op: every attribute op's
// expression reads, in canonical form (formatStepAttrs writes it back
// byte for byte).
func parseStepAttrs(op, text string) (Attrs, error) {
	s, ok := ops[op]
	if !ok || !s.exprAttrs {
		return nil, fmt.Errorf("%s takes no {...} attributes", op)
	}
	out := Attrs{}
	for _, f := range strings.Split(text, ",") {
		name, val, ok := strings.Cut(f, "=")
		as := s.attrSpec(name)
		if !ok || as == nil || !slices.Contains(s.Expr.Attrs(), name) {
			return nil, fmt.Errorf("attribute %q: want name=value for an attribute of %s's expression", f, op)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("attribute %s given twice", name)
		}
		switch as.Kind {
		case AttrFloat:
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return nil, fmt.Errorf("attribute %s: %q is not a number", name, val)
			}
			out[name] = Float(v)
		case AttrInt:
			v, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("attribute %s: %q is not an integer", name, val)
			}
			out[name] = Int(v)
		case AttrString:
			if !slices.Contains(as.Enum, val) {
				return nil, fmt.Errorf("attribute %s: %q is not one of %q", name, val, as.Enum)
			}
			out[name] = Str(val)
		}
	}
	if len(out) != len(s.Expr.Attrs()) {
		return nil, fmt.Errorf("%s's step gives %d of its %d attributes", op, len(out), len(s.Expr.Attrs()))
	}
	var sb strings.Builder
	formatStepAttrs(&sb, out)
	if sb.String() != "{"+text+"}" {
		return nil, fmt.Errorf("attributes {%s} are not in canonical form %s", text, sb.String())
	}
	return out, nil
}

// FusibleIndex are the index steps a body may use, with how many integer
// parameters each writes in <...>: Slice<axis,start,end>, Concat<axis>, and
// Transpose<perm...> (anyIndexParams: one per axis of its operand, which
// its op's inference checks).
var FusibleIndex = map[string]int{"Slice": 3, "Concat": 1, "Transpose": anyIndexParams}

// anyIndexParams: an index step that takes one or more parameters.
const anyIndexParams = -1

// FusibleReduce are the reductions a body may end a chain with (one per
// body); the node's axes and keepdims attributes are the step's.
var FusibleReduce = map[string]bool{"ReduceSum": true, "ReduceMean": true}

// FusedOperand is one operand of a body step: input Index of the node, or
// the result of step Index.
type FusedOperand struct {
	Step  bool
	Index int
}

func (o FusedOperand) String() string {
	if o.Step {
		return "t" + strconv.Itoa(o.Index)
	}
	return "i" + strconv.Itoa(o.Index)
}

// FusedStep is one step of a body. Params are an index step's <...>
// integers (nil for the others); Attrs an elementwise step's attributes
// that its op's expression reads, written {name=value,...} after the op
// (LeakyRelu{alpha=0.2}(i0)); nil for an op whose expression reads none.
type FusedStep struct {
	Op     string
	Params []int64
	Attrs  Attrs
	Args   []FusedOperand
}

// FormatFusedBody writes steps in the body syntax ParseFusedBody reads.
func FormatFusedBody(steps []FusedStep) string {
	var sb strings.Builder
	for k, s := range steps {
		if k > 0 {
			sb.WriteByte(';')
		}
		sb.WriteString(s.Op)
		if s.Params != nil {
			sb.WriteByte('<')
			for j, v := range s.Params {
				if j > 0 {
					sb.WriteByte(',')
				}
				sb.WriteString(strconv.FormatInt(v, 10))
			}
			sb.WriteByte('>')
		}
		if s.Attrs != nil {
			formatStepAttrs(&sb, s.Attrs)
		}
		sb.WriteByte('(')
		for j, a := range s.Args {
			if j > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(a.String())
		}
		sb.WriteByte(')')
	}
	return sb.String()
}

// ParseFusedBody reads a body over nIn node inputs, checking every step's op
// and operands (a step may only read inputs and earlier steps).
func ParseFusedBody(body string, nIn int) ([]FusedStep, error) {
	if body == "" {
		return nil, fmt.Errorf("empty body")
	}
	var steps []FusedStep
	reductions := 0
	for k, text := range strings.Split(body, ";") {
		open := strings.IndexByte(text, '(')
		if open <= 0 || !strings.HasSuffix(text, ")") {
			return nil, fmt.Errorf("step %d %q: want Op(operands)", k, text)
		}
		op := text[:open]
		var attrText *string
		if lb := strings.IndexByte(op, '{'); lb >= 0 {
			if !strings.HasSuffix(op, "}") {
				return nil, fmt.Errorf("step %d %q: want Op{name=value,...}(operands)", k, text)
			}
			t := op[lb+1 : len(op)-1]
			attrText = &t
			op = op[:lb]
		}
		var params []int64
		if lt := strings.IndexByte(op, '<'); lt >= 0 {
			if !strings.HasSuffix(op, ">") {
				return nil, fmt.Errorf("step %d %q: want Op<integers>(operands)", k, text)
			}
			for _, f := range strings.Split(op[lt+1:len(op)-1], ",") {
				v, err := strconv.ParseInt(f, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("step %d %q: parameter %q is not an integer", k, text, f)
				}
				params = append(params, v)
			}
			op = op[:lt]
		}
		if want, ok := FusibleIndex[op]; ok {
			if want == anyIndexParams && len(params) == 0 {
				return nil, fmt.Errorf("step %d: %s takes its parameters in <...>", k, op)
			}
			if want != anyIndexParams && len(params) != want {
				return nil, fmt.Errorf("step %d: %s takes %d parameters in <...>, got %d", k, op, want, len(params))
			}
		} else if params != nil {
			return nil, fmt.Errorf("step %d: %s takes no <...> parameters", k, op)
		}
		if _, ok := FusibleIndex[op]; ok {
			// an index step
		} else if FusibleReduce[op] {
			if reductions++; reductions > 1 {
				return nil, fmt.Errorf("step %d: a body holds at most one reduction", k)
			}
		} else if !FusibleElementwise[op] {
			return nil, fmt.Errorf("step %d: op %q cannot be fused (fusible: elementwise ops with a numeric result, and one ReduceSum or ReduceMean)", k, op)
		}
		s := FusedStep{Op: op, Params: params}
		if spec := ops[op]; spec != nil && spec.exprAttrs != (attrText != nil) {
			if attrText == nil {
				return nil, fmt.Errorf("step %d: %s takes its attributes in {...}", k, op)
			}
			return nil, fmt.Errorf("step %d: %s takes no {...} attributes", k, op)
		}
		if attrText != nil {
			a, err := parseStepAttrs(op, *attrText)
			if err != nil {
				return nil, fmt.Errorf("step %d: %w", k, err)
			}
			s.Attrs = a
		}
		for _, a := range strings.Split(text[open+1:len(text)-1], ",") {
			if len(a) < 2 || (a[0] != 'i' && a[0] != 't') {
				return nil, fmt.Errorf("step %d: operand %q: want iN (input) or tN (step)", k, a)
			}
			n, err := strconv.Atoi(a[1:])
			if err != nil || n < 0 || strconv.Itoa(n) != a[1:] {
				return nil, fmt.Errorf("step %d: operand %q: bad index", k, a)
			}
			o := FusedOperand{Step: a[0] == 't', Index: n}
			if o.Step && n >= k {
				return nil, fmt.Errorf("step %d: operand %s is not an earlier step", k, a)
			}
			if !o.Step && n >= nIn {
				return nil, fmt.Errorf("step %d: operand %s: the node has %d inputs", k, a, nIn)
			}
			s.Args = append(s.Args, o)
		}
		lo, hi := ops[op].Arity()
		switch {
		case FusibleReduce[op]:
			lo, hi = 1, 1 // the axes come from the node's attributes
		case op == "Slice":
			lo, hi = 1, 1 // starts, ends and axis are the parameters
		}
		if len(s.Args) < lo || (hi >= 0 && len(s.Args) > hi) {
			return nil, fmt.Errorf("step %d: %s takes %d operands, got %d", k, op, lo, len(s.Args))
		}
		steps = append(steps, s)
	}
	return steps, nil
}

// FusedReduceOperands are what a body's reduction step passes its op besides
// the reduced value: the axes as the op's constant input, and the attributes
// (keepdims), both from the fused node's attributes.
func FusedReduceOperands(attrs Attrs) (*Tensor, Attrs, error) {
	a, ok := attrs["axes"]
	if !ok || len(a.Ints) == 0 {
		return nil, nil, fmt.Errorf("a body with a reduction needs the axes attribute")
	}
	axes := NewTensor(Int64, Shape{len(a.Ints)})
	copy(axes.I64, a.Ints)
	return axes, Attrs{"keepdims": Int(attrs.Int("keepdims", 1))}, nil
}

// FusedStepOperands are what step s passes its op besides its operands:
// constant inputs appended after them (a reduction's axes; a Slice's
// starts, ends and axes) and the op's attributes (keepdims from the node's
// attributes; a Concat's axis; a Transpose's perm).
func FusedStepOperands(s FusedStep, nodeAttrs Attrs) ([]*Tensor, Attrs, error) {
	ints := func(v ...int64) *Tensor {
		t := NewTensor(Int64, Shape{len(v)})
		copy(t.I64, v)
		return t
	}
	switch {
	case FusibleReduce[s.Op]:
		axes, ra, err := FusedReduceOperands(nodeAttrs)
		if err != nil {
			return nil, nil, err
		}
		return []*Tensor{axes}, ra, nil
	case s.Op == "Slice":
		return []*Tensor{ints(s.Params[1]), ints(s.Params[2]), ints(s.Params[0])}, Attrs{}, nil
	case s.Op == "Concat":
		return nil, Attrs{"axis": Int(s.Params[0])}, nil
	case s.Op == "Transpose":
		return nil, Attrs{"perm": Ints(s.Params...)}, nil
	case s.Attrs != nil:
		return nil, s.Attrs, nil
	}
	return nil, Attrs{}, nil
}

// FusedTypes returns the type of every step of a body over inputs of types
// in, each inferred by its op's table row; attrs are the fused node's (a
// reduction step takes its axes and keepdims from them).
func FusedTypes(steps []FusedStep, in []TensorType, attrs Attrs) ([]TensorType, error) {
	types := make([]TensorType, len(steps))
	for k, s := range steps {
		args := make([]*TensorType, len(s.Args))
		for j, a := range s.Args {
			if a.Step {
				args[j] = &types[a.Index]
			} else {
				args[j] = &in[a.Index]
			}
		}
		consts := make([]*Tensor, len(args))
		extra, stepAttrs, err := FusedStepOperands(s, attrs)
		if err != nil {
			return nil, fmt.Errorf("step %d (%s): %w", k, s.Op, err)
		}
		for _, e := range extra {
			at := e.Type()
			args = append(args, &at)
			consts = append(consts, e)
		}
		outs, err := ops[s.Op].inferTypes(args, stepAttrs, consts)
		if err != nil {
			return nil, fmt.Errorf("step %d (%s): %w", k, s.Op, err)
		}
		types[k] = outs[0]
	}
	return types, nil
}

// fusedInferCache keeps parsed bodies: Verify infers every node again and a
// training graph has hundreds of fused nodes sharing a few bodies.
var fusedInferCache sync.Map // body + "\x00" + nIn -> []FusedStep

// FusedBody parses n's body (cached).
func FusedBody(body string, nIn int) ([]FusedStep, error) {
	key := body + "\x00" + strconv.Itoa(nIn)
	if s, ok := fusedInferCache.Load(key); ok {
		return s.([]FusedStep), nil
	}
	steps, err := ParseFusedBody(body, nIn)
	if err != nil {
		return nil, err
	}
	fusedInferCache.Store(key, steps)
	return steps, nil
}

func init() {
	register(&OpSpec{
		Name: "FusedElementwise", Domain: DomainFlashgraph,
		Doc:    "the listed steps of an elementwise body (Op(operands);... over inputs iK and steps tK; index steps Slice<axis,start,end>, Concat<axis>, Transpose<perm...>; at most one ReduceSum/ReduceMean step over the axes attribute), computed in one pass",
		Inputs: []string{"X..."}, Outputs: []string{"Y..."},
		Attrs: []AttrSpec{
			{Name: "body", Kind: AttrString, Required: true},
			{Name: "outputs", Kind: AttrInts, Required: true},
			{Name: "axes", Kind: AttrInts},
			{Name: "keepdims", Kind: AttrInt}, // absent: 1, as for ReduceSum
		},
		Eval: evalFused,
		Infer: func(in []*TensorType, attrs Attrs, _ []*Tensor) ([]TensorType, error) {
			steps, err := FusedBody(attrs["body"].S, len(in))
			if err != nil {
				return nil, fmt.Errorf("body: %w", err)
			}
			it := make([]TensorType, len(in))
			for i, t := range in {
				if t == nil {
					return nil, fmt.Errorf("input %d is omitted", i)
				}
				it[i] = *t
			}
			types, err := FusedTypes(steps, it, attrs)
			if err != nil {
				return nil, fmt.Errorf("body: %w", err)
			}
			outIdx := attrs["outputs"].Ints
			if len(outIdx) == 0 {
				return nil, fmt.Errorf("outputs lists no step")
			}
			res := make([]TensorType, len(outIdx))
			for k, o := range outIdx {
				if o < 0 || int(o) >= len(steps) {
					return nil, fmt.Errorf("outputs[%d] = %d: the body has %d steps", k, o, len(steps))
				}
				res[k] = types[o]
			}
			return res, nil
		},
	})
}

// evalFused is the body's meaning: each step evaluated by its own op's
// reference (rounded to the step's dtype, as a node's value is), the listed
// steps copied out.
func evalFused(in []*Tensor, attrs Attrs, out []*Tensor) error {
	steps, err := FusedBody(attrs["body"].S, len(in))
	if err != nil {
		return err
	}
	res := make([]*Tensor, len(steps))
	for k, s := range steps {
		args := make([]*Tensor, len(s.Args))
		for j, a := range s.Args {
			if a.Step {
				args[j] = res[a.Index]
			} else {
				args[j] = in[a.Index]
			}
		}
		extra, stepAttrs, err := FusedStepOperands(s, attrs)
		if err != nil {
			return err
		}
		r, err := Eval(s.Op, stepAttrs, append(args, extra...)...)
		if err != nil {
			return fmt.Errorf("step %d (%s): %w", k, s.Op, err)
		}
		res[k] = r[0]
	}
	for k, o := range attrs["outputs"].Ints {
		if o < 0 || int(o) >= len(res) || k >= len(out) {
			return fmt.Errorf("outputs[%d] = %d: the body has %d steps", k, o, len(res))
		}
		for i := range out[k].Len() {
			out[k].Set(i, res[o].At(i))
		}
	}
	return nil
}
