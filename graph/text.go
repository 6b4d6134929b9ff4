package graph

import (
	"bufio"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The canonical text format, one statement a line:
//
//	flashgraph 1
//	graph tiny
//	input tokens: int64[4,32]
//	param tok_emb: float32[256,64] = normal(seed=1, std=0.02)
//	const c_0: int64[2] = literal(128, 64)
//	node MatMul_3 = MatMul(x, w) -> MatMul_3: float32[128,64]
//	node fa = flashgraph.FlashAttention(q, k, v) {causal=1, scale=0.125} -> fa#0: float32[2,4,32,16], fa#1: float32[2,4,32]
//	output loss
//
// Names that are not plain identifiers are written as Go-quoted strings; an
// omitted optional input is "_". Attributes are sorted; numbers are written
// with the shortest digits that read back to the same bits. Parse(Format(g))
// gives g back, so the text (and its sha256) is the graph's identity.

const textHeader = "flashgraph 1"

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '_' || c == '.' || c == '/' || c == '#' || c == '-' || c == '+'
}

// validName reports whether s can name a value or node: any non-empty string
// without control characters or newlines (odd ones are quoted in the text).
func validName(s string) bool {
	if s == "" || s == "_" {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == '\uFFFD' {
			return false
		}
	}
	return true
}

func formatName(s string) string {
	plain := s != "" && s != "_" && !strings.HasPrefix(s, "-")
	for i := 0; i < len(s) && plain; i++ {
		plain = isNameByte(s[i])
	}
	if plain {
		return s
	}
	return strconv.Quote(s)
}

// formatNum writes integral values as ints, others with FormatFloat.
func formatNum(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1<<53 && !(v == 0 && math.Signbit(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return FormatFloat(v)
}

func formatInit(in *Init) string {
	var parts []string
	if in.Fn == "literal" {
		// A string is quoted as Go quotes it: escapes for quotes,
		// backslashes, control bytes and invalid UTF-8, so that any bytes
		// come back exactly and the line never breaks.
		for _, s := range in.Strings {
			parts = append(parts, strconv.Quote(s))
		}
		for _, v := range in.Data {
			parts = append(parts, formatNum(v))
		}
	} else {
		for _, k := range initArgs[in.Fn] {
			parts = append(parts, k+"="+formatNum(in.Args[k]))
		}
	}
	return in.Fn + "(" + strings.Join(parts, ", ") + ")"
}

// Format writes the canonical text of g.
func Format(g *Graph) string {
	var b strings.Builder
	b.WriteString(textHeader + "\n")
	b.WriteString("graph " + formatName(g.Name) + "\n")
	decl := func(kw string, v *Value) {
		b.WriteString(kw + " " + formatName(v.Name) + ": " + v.Type.String())
		if v.Init != nil {
			b.WriteString(" = " + formatInit(v.Init))
		}
		b.WriteByte('\n')
	}
	for _, v := range g.Inputs {
		decl("input", v)
	}
	for _, v := range g.Params {
		decl("param", v)
	}
	for _, v := range g.Consts {
		decl("const", v)
	}
	for _, n := range g.Nodes {
		op := n.Op
		if s := n.Spec(); s != nil {
			op = s.QualifiedName()
		}
		b.WriteString("node " + formatName(n.Name) + " = " + op + "(")
		for i, v := range n.Inputs {
			if i > 0 {
				b.WriteString(", ")
			}
			if v == nil {
				b.WriteString("_")
			} else {
				b.WriteString(formatName(v.Name))
			}
		}
		b.WriteString(")")
		if len(n.Attrs) > 0 {
			b.WriteString(" {")
			for i, k := range n.Attrs.Names() {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(k + "=" + n.Attrs[k].format())
			}
			b.WriteString("}")
		}
		b.WriteString(" ->")
		for i, o := range n.Outputs {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(" " + formatName(o.Name) + ": " + o.Type.String())
		}
		b.WriteByte('\n')
	}
	for _, o := range g.Outputs {
		b.WriteString("output " + formatName(o.Name) + "\n")
	}
	return b.String()
}

// ParseError locates a problem in graph text.
type ParseError struct {
	File string
	Line int
	Msg  string
}

func (e *ParseError) Error() string {
	if e.File != "" {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
}

// Parse reads the canonical text format. Every problem is an error naming
// the line; malformed input never panics.
func Parse(text string) (*Graph, error) { return ParseFile("", text) }

// ParseFile is Parse with a file name for error messages.
func ParseFile(file, text string) (*Graph, error) {
	p := &parser{file: file, vals: map[string]*Value{}, g: &Graph{}}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	seenHeader, seenName := false, false
	for sc.Scan() {
		p.line++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		toks, err := lex(line)
		if err != nil {
			return nil, p.errf("%v", err)
		}
		p.toks, p.pos = toks, 0
		kw := p.next()
		if !seenHeader {
			if line != textHeader {
				return nil, p.errf("not a flashgraph graph: want first line %q", textHeader)
			}
			seenHeader = true
			continue
		}
		switch kw.s {
		case "graph":
			if seenName {
				return nil, p.errf("second graph statement")
			}
			seenName = true
			// A graph may be unnamed (a text without a graph statement, or
			// NewBuilder("")); Format writes that name as "".
			if t := p.peek(); t.quoted && t.s == "" {
				p.next()
				break
			}
			name, err := p.name()
			if err != nil {
				return nil, err
			}
			p.g.Name = name
		case "input", "param", "const":
			err = p.leaf(kw.s)
		case "node":
			err = p.node()
		case "output":
			var name string
			if name, err = p.name(); err == nil {
				v, ok := p.vals[name]
				if !ok {
					return nil, p.errf("output %s is not defined", formatName(name))
				}
				p.g.Outputs = append(p.g.Outputs, v)
			}
		default:
			return nil, p.errf("unknown statement %q (want graph, input, param, const, node, output)", kw.s)
		}
		if err != nil {
			return nil, err
		}
		if p.pos < len(p.toks) {
			return nil, p.errf("unexpected %q at end of line", p.toks[p.pos].s)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, &ParseError{File: file, Line: p.line, Msg: err.Error()}
	}
	if !seenHeader {
		return nil, &ParseError{File: file, Line: 1, Msg: "empty file: want " + textHeader}
	}
	if err := Verify(p.g); err != nil {
		return nil, &ParseError{File: file, Line: p.line, Msg: err.Error()}
	}
	return p.g, nil
}

// describe names a token in an error; the empty token is the end of the line.
func (t token) describe() string {
	if t.s == "" && !t.quoted {
		return "end of line"
	}
	return strconv.Quote(t.s)
}

type token struct {
	s      string
	quoted bool // a string literal: a name, or a string attribute
	punct  bool
}

func lex(line string) ([]token, error) {
	var toks []token
	for i := 0; i < len(line); {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			i++
		case c == '-' && i+1 < len(line) && line[i+1] == '>':
			toks = append(toks, token{s: "->", punct: true})
			i += 2
		case strings.IndexByte("()[]{},=:", c) >= 0:
			toks = append(toks, token{s: string(c), punct: true})
			i++
		case c == '"':
			j := i + 1
			for j < len(line) && line[j] != '"' {
				if line[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(line) {
				return nil, fmt.Errorf("unterminated string")
			}
			s, err := strconv.Unquote(line[i : j+1])
			if err != nil {
				return nil, fmt.Errorf("bad string %s", line[i:j+1])
			}
			toks = append(toks, token{s: s, quoted: true})
			i = j + 1
		case isNameByte(c):
			j := i
			for j < len(line) && isNameByte(line[j]) && !(line[j] == '-' && j+1 < len(line) && line[j+1] == '>') {
				j++
			}
			toks = append(toks, token{s: line[i:j]})
			i = j
		default:
			return nil, fmt.Errorf("unexpected character %q", c)
		}
	}
	return toks, nil
}

type parser struct {
	file string
	line int
	toks []token
	pos  int
	g    *Graph
	vals map[string]*Value
	// initElems counts the elements the initializers declare: a recipe is a
	// few bytes of text for any number of elements, materialised later.
	initElems int
}

// MaxInitElements bounds the elements all initializers of a parsed graph may
// declare together: 2^34, 64 GiB as float32, beyond any model this project
// trains. A recipe such as normal(...) costs the same few bytes of text for
// any shape, so without this bound a one-line file could ask whoever compiles
// or runs it for terabytes (each tensor alone may declare up to 2^48).
const MaxInitElements = 1 << 34

func (p *parser) errf(format string, args ...any) error {
	return &ParseError{File: p.file, Line: p.line, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) next() token {
	if p.pos >= len(p.toks) {
		return token{}
	}
	t := p.toks[p.pos]
	p.pos++
	return t
}

func (p *parser) peek() token {
	if p.pos >= len(p.toks) {
		return token{}
	}
	return p.toks[p.pos]
}

func (p *parser) expect(s string) error {
	t := p.next()
	if !t.punct || t.s != s {
		if t.s == "" {
			return p.errf("want %q, got end of line", s)
		}
		return p.errf("want %q, got %q", s, t.s)
	}
	return nil
}

func (p *parser) name() (string, error) {
	t := p.next()
	if t.punct || t.s == "" {
		return "", p.errf("want a name, got %s", t.describe())
	}
	if !validName(t.s) {
		return "", p.errf("invalid name %q", t.s)
	}
	return t.s, nil
}

func (p *parser) word() (string, error) {
	t := p.next()
	if t.punct || t.quoted || t.s == "" {
		return "", p.errf("want a word, got %s", t.describe())
	}
	return t.s, nil
}

// number reads a float literal (FormatFloat's or formatNum's form).
func (p *parser) number() (float64, error) {
	w, err := p.word()
	if err != nil {
		return 0, err
	}
	v, err := ParseFloatLit(w)
	if err != nil {
		return 0, p.errf("%v", err)
	}
	return v, nil
}

// typ reads dtype[d,d,...].
func (p *parser) typ() (TensorType, error) {
	w, err := p.word()
	if err != nil {
		return TensorType{}, err
	}
	dt, err := ParseDType(w)
	if err != nil {
		return TensorType{}, p.errf("%v", err)
	}
	ints, err := p.intList()
	if err != nil {
		return TensorType{}, err
	}
	shape := Shape{}
	for _, d := range ints {
		if d < 0 || d > 1<<40 {
			return TensorType{}, p.errf("bad dimension %d", d)
		}
		shape = append(shape, int(d))
	}
	if err := shape.Check(); err != nil {
		return TensorType{}, p.errf("%v", err)
	}
	return TensorType{dt, shape}, nil
}

func (p *parser) intList() ([]int64, error) {
	if err := p.expect("["); err != nil {
		return nil, err
	}
	out := []int64{}
	err := p.list("]", func() error {
		w, err := p.word()
		if err != nil {
			return err
		}
		v, err := strconv.ParseInt(w, 10, 64)
		if err != nil {
			return p.errf("want an integer, got %q", w)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// list reads "item, item, ... closer" (the opener already read) and
// consumes the closer. At the end of a line it fails in expect or item, so
// it always terminates.
func (p *parser) list(closer string, item func() error) error {
	for i := 0; ; i++ {
		if t := p.peek(); t.punct && t.s == closer {
			p.next()
			return nil
		}
		if i > 0 {
			if err := p.expect(","); err != nil {
				return err
			}
		}
		if err := item(); err != nil {
			return err
		}
	}
}

func (p *parser) define(v *Value) error {
	if _, dup := p.vals[v.Name]; dup {
		return p.errf("value %s defined twice", formatName(v.Name))
	}
	p.vals[v.Name] = v
	return nil
}

func (p *parser) leaf(kw string) error {
	name, err := p.name()
	if err != nil {
		return err
	}
	if err := p.expect(":"); err != nil {
		return err
	}
	t, err := p.typ()
	if err != nil {
		return err
	}
	v := &Value{Name: name, Type: t}
	switch kw {
	case "input":
		v.Kind = Input
		p.g.Inputs = append(p.g.Inputs, v)
	case "param", "const":
		v.Kind = Param
		if kw == "const" {
			v.Kind = Const
		}
		if err := p.expect("="); err != nil {
			return err
		}
		in, err := p.init(t.DType)
		if err != nil {
			return err
		}
		if err := in.check(t); err != nil {
			return p.errf("%s %s: %v", kw, formatName(name), err)
		}
		// Shapes passed Check, so each count is at most 2^48: no overflow.
		if p.initElems += t.Shape.Numel(); p.initElems > MaxInitElements {
			return p.errf("%s %s: the initializers declare %d elements so far, over the limit of %d (graph.MaxInitElements)", kw, formatName(name), p.initElems, MaxInitElements)
		}
		v.Init = &in
		if kw == "param" {
			p.g.Params = append(p.g.Params, v)
		} else {
			p.g.Consts = append(p.g.Consts, v)
		}
	}
	return p.define(v)
}

func (p *parser) init(dt DType) (Init, error) {
	fn, err := p.word()
	if err != nil {
		return Init{}, err
	}
	if _, ok := initArgs[fn]; !ok {
		return Init{}, p.errf("unknown initializer %q", fn)
	}
	in := Init{Fn: fn}
	if err := p.expect("("); err != nil {
		return Init{}, err
	}
	err = p.list(")", func() error {
		if fn == "literal" && dt == String {
			t := p.next()
			if !t.quoted {
				return p.errf("a string literal holds quoted strings, got %s", t.describe())
			}
			in.Strings = append(in.Strings, t.s)
			return nil
		}
		if fn == "literal" {
			v, err := p.number()
			if err != nil {
				return err
			}
			in.Data = append(in.Data, v)
			return nil
		}
		w, err := p.word()
		if err != nil {
			return err
		}
		if err := p.expect("="); err != nil {
			return err
		}
		v, err := p.number()
		if err != nil {
			return err
		}
		if in.Args == nil {
			in.Args = map[string]float64{}
		}
		if _, dup := in.Args[w]; dup {
			return p.errf("argument %s given twice", w)
		}
		in.Args[w] = v
		return nil
	})
	if err != nil {
		return Init{}, err
	}
	switch {
	case fn == "literal" && dt == String && in.Strings == nil:
		in.Strings = []string{}
	case fn == "literal" && dt != String && in.Data == nil:
		in.Data = []float64{}
	}
	return in, nil
}

func (p *parser) node() error {
	name, err := p.name()
	if err != nil {
		return err
	}
	if err := p.expect("="); err != nil {
		return err
	}
	op, err := p.word()
	if err != nil {
		return err
	}
	if i := strings.LastIndexByte(op, '.'); i >= 0 {
		dom, bare := op[:i], op[i+1:]
		s, ok := LookupOp(bare)
		if !ok || s.Domain != dom {
			return p.errf("unknown op %q", op)
		}
		op = bare
	} else if s, ok := LookupOp(op); !ok || s.Domain != DomainONNX {
		return p.errf("unknown op %q", op)
	}
	if err := p.expect("("); err != nil {
		return err
	}
	var inputs []*Value
	err = p.list(")", func() error {
		t := p.next()
		if t.s == "_" && !t.quoted {
			inputs = append(inputs, nil)
			return nil
		}
		if t.punct || t.s == "" {
			return p.errf("want an input name, got %s", t.describe())
		}
		v, ok := p.vals[t.s]
		if !ok {
			return p.errf("node %s: input %s is not defined", formatName(name), formatName(t.s))
		}
		inputs = append(inputs, v)
		return nil
	})
	if err != nil {
		return err
	}
	attrs := Attrs{}
	if p.peek().punct && p.peek().s == "{" {
		p.next()
		spec, _ := LookupOp(op)
		err := p.list("}", func() error {
			k, err := p.word()
			if err != nil {
				return err
			}
			if err := p.expect("="); err != nil {
				return err
			}
			as := spec.attrSpec(k)
			if as == nil {
				return p.errf("%s has no attribute %q", op, k)
			}
			if _, dup := attrs[k]; dup {
				return p.errf("attribute %s given twice", k)
			}
			a, err := p.attr(as.Kind)
			if err != nil {
				return err
			}
			attrs[k] = a
			return nil
		})
		if err != nil {
			return err
		}
	}
	if err := p.expect("->"); err != nil {
		return err
	}
	n, err := NewNode(name, op, attrs, inputs...)
	if err != nil {
		return p.errf("%v", err)
	}
	for i := 0; p.pos < len(p.toks); i++ {
		if i > 0 {
			if err := p.expect(","); err != nil {
				return err
			}
		}
		oname, err := p.name()
		if err != nil {
			return err
		}
		if err := p.expect(":"); err != nil {
			return err
		}
		t, err := p.typ()
		if err != nil {
			return err
		}
		if i >= len(n.Outputs) {
			return p.errf("node %s: %s has %d outputs", formatName(name), op, len(n.Outputs))
		}
		if !t.Equal(n.Outputs[i].Type) {
			return p.errf("node %s: output %s declared %v, but %s gives %v", formatName(name), formatName(oname), t, op, n.Outputs[i].Type)
		}
		n.Outputs[i].Name = oname
		if err := p.define(n.Outputs[i]); err != nil {
			return err
		}
		if i == len(n.Outputs)-1 && p.pos < len(p.toks) {
			return p.errf("node %s: %s has %d outputs", formatName(name), op, len(n.Outputs))
		}
	}
	for _, o := range n.Outputs {
		if p.vals[o.Name] != o {
			return p.errf("node %s: %s has %d outputs, fewer declared", formatName(name), op, len(n.Outputs))
		}
	}
	p.g.Nodes = append(p.g.Nodes, n)
	return nil
}

func (p *parser) attr(kind AttrKind) (Attr, error) {
	switch kind {
	case AttrString:
		t := p.next()
		if !t.quoted {
			return Attr{}, p.errf("want a quoted string, got %q", t.s)
		}
		return Str(t.s), nil
	case AttrInt:
		w, err := p.word()
		if err != nil {
			return Attr{}, err
		}
		v, err := strconv.ParseInt(w, 10, 64)
		if err != nil {
			return Attr{}, p.errf("want an integer, got %q", w)
		}
		return Int(v), nil
	case AttrFloat:
		v, err := p.number()
		if err != nil {
			return Attr{}, err
		}
		return Float(v), nil
	case AttrInts:
		v, err := p.intList()
		if err != nil {
			return Attr{}, err
		}
		return Ints(v...), nil
	case AttrFloats:
		if err := p.expect("["); err != nil {
			return Attr{}, err
		}
		out := []float64{}
		err := p.list("]", func() error {
			v, err := p.number()
			out = append(out, v)
			return err
		})
		return Floats(out...), err
	case AttrStrings:
		if err := p.expect("["); err != nil {
			return Attr{}, err
		}
		out := []string{}
		err := p.list("]", func() error {
			t := p.next()
			if !t.quoted {
				return p.errf("want a quoted string, got %s", t.describe())
			}
			out = append(out, t.s)
			return nil
		})
		return Strs(out...), err
	}
	return Attr{}, p.errf("unsupported attribute kind")
}
