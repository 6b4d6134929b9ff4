package graph

import (
	"math"
	"strings"
	"testing"
)

// String constants and string attributes survive Format then Parse byte for
// byte: quotes, backslashes, newlines and other control bytes, non-ASCII,
// invalid UTF-8, the empty string, and an empty tensor.
func TestStringConstTextRoundTrip(t *testing.T) {
	awkward := []string{`say "hi"`, `back\slash`, "two\nlines\r\t", "naïve Straße 日本", "\xff\xfe not utf-8", "", "\x00nul", "emoji 😀", `\"`, "-> ( ) [ ] { } , = :"}
	b := NewBuilder("strings")
	w := b.Const("w", String, Shape{2, 5}, LiteralStrings(awkward...))
	e := b.Const("empty", String, Shape{0, 3}, LiteralStrings())
	words := b.Const("words", String, Shape{1, 5}, LiteralStrings(awkward[3:8]...))
	n := b.Op("StringNormalizer", Attrs{"stopwords": Strs(awkward[:4]...), "case_change_action": Str("LOWER")}, words)
	num := b.Op("Cast", Attrs{"to": Str("string")}, b.Op("Cast", Attrs{"to": Str("float32")}, b.Const("num", String, Shape{2}, LiteralStrings("1.5", "-INF"))))
	b.Output(w)
	b.Output(e)
	b.Output(num)
	b.Output(n)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	text := Format(g)
	for _, line := range strings.Split(text, "\n") {
		if strings.ContainsAny(line, "\r\x00") {
			t.Errorf("a control byte reached the text unescaped: %q", line)
		}
	}
	g2, err := Parse(text)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, text)
	}
	if got := Format(g2); got != text {
		t.Fatalf("round trip differs:\n%s\nvs\n%s", got, text)
	}
	var got *Value
	for _, c := range g2.Consts {
		if c.Name == "w" {
			got = c
		}
	}
	if got == nil || got.Type.DType != String {
		t.Fatalf("const w lost or retyped: %v", got)
	}
	m, err := got.Init.Materialize(got.Type)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range awkward {
		if m.S[i] != s {
			t.Errorf("element %d: %q, want %q", i, m.S[i], s)
		}
	}
	var stop []string
	for _, nd := range g2.Nodes {
		if nd.Op == "StringNormalizer" {
			stop = nd.Attrs["stopwords"].Strs
		}
	}
	for i, s := range awkward[:4] {
		if stop[i] != s {
			t.Errorf("stopword %d: %q, want %q", i, stop[i], s)
		}
	}
	// DOT draws the graph (the stopwords in the node's label, escaped as
	// any label text is).
	dot, err := WriteDOT(g2)
	if err != nil {
		t.Fatalf("DOT: %v", err)
	}
	if !strings.Contains(dot, "StringNormalizer") {
		t.Errorf("DOT lacks the StringNormalizer node:\n%s", dot)
	}
}

// Text that is not a string literal, or a literal of the wrong kind, is an
// error naming the problem.
func TestStringConstParseErrors(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`const s: string[2] = literal("a", 1)`, "quoted strings"},
		{`const s: string[2] = literal("a")`, "literal has 1 strings"},
		{`const s: string[1] = zeros()`, "must be a literal"},
		{`const s: float32[1] = literal("a")`, `got "a"`},
		{`const s: string[1] = literal("a\q")`, "bad string"},
	} {
		_, err := Parse(textHeader + "\ngraph g\n" + c.line + "\noutput s\n")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.line, err, c.want)
		}
	}
}

func strTensor(shape Shape, s ...string) *Tensor {
	return &Tensor{DType: String, Shape: shape, S: s}
}

// Cast to strings: plain notation with the fewest digits that read back as
// the same value of the source type; the spec's literals for NaN and the
// infinities; int64 in decimal. Values worked out by hand.
func TestCastToStringKnownValues(t *testing.T) {
	f32 := NewTensor(Float32, Shape{8})
	copy(f32.F32, []float32{0.9767611, 0.1, 1e20, -2.5e-7, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), -0.0})
	f32.F32[7] = float32(math.Copysign(0, -1))
	check := func(in *Tensor, want ...string) {
		t.Helper()
		out, err := Eval("Cast", Attrs{"to": Str("string")}, in)
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			if out[0].S[i] != w {
				t.Errorf("%v element %d: %q, want %q", in.DType, i, out[0].S[i], w)
			}
		}
	}
	check(f32, "0.9767611", "0.1", "100000000000000000000", "-0.00000025", "NaN", "INF", "-INF", "-0")
	f64 := &Tensor{DType: Float64, Shape: Shape{2}, F64: []float64{0.1, 1.0 / 3}}
	check(f64, "0.1", "0.3333333333333333")
	i64 := &Tensor{DType: Int64, Shape: Shape{2}, I64: []int64{math.MinInt64, 42}}
	check(i64, "-9223372036854775808", "42")
	// Narrow floats: their own shortest digits. float16 0.1 is
	// 0.0999755859375 (float32 digits "0.099975586"), and "0.1" reads
	// back as it; 65504, float16's largest, is "65500" (float16 steps by
	// 32 there, so 65500 rounds to 65504); bfloat16 0.1 is
	// 0.10009765625; bfloat16 3.140625 needs "3.14"; 1e-7 in float16 is
	// the subnormal 1.1920928955078125e-07, whose shortest is "0.0000001".
	h := NewTensor(Float16, Shape{3})
	for i, v := range []float64{0.1, 65504, 1e-7} {
		h.Set(i, v)
	}
	check(h, "0.1", "65500", "0.0000001")
	bf := NewTensor(BFloat16, Shape{2})
	bf.Set(0, 0.1)
	bf.Set(1, 3.140625)
	check(bf, "0.1", "3.14")
}

// Cast from strings: plain and scientific notation and the special
// literals in any case; float32 read correctly rounded; int64 exact, a
// fraction truncated; text that is no number refused, naming the element.
func TestCastFromStringKnownValues(t *testing.T) {
	in := strTensor(Shape{8}, "3.25", "-1e-5", "1E8", "INF", "+inf", "-INF", "nan", "0.1")
	out, err := Eval("Cast", Attrs{"to": Str("float32")}, in)
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{3.25, -1e-5, 1e8, float32(math.Inf(1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0.1}
	for i, w := range want {
		if g := out[0].F32[i]; g != w && !(g != g && w != w) {
			t.Errorf("element %d: %v, want %v", i, g, w)
		}
	}
	// 1.00000005960464477539 is a float32 tie-break case: read through
	// float64 first it would round twice.
	out, err = Eval("Cast", Attrs{"to": Str("float32")}, strTensor(Shape{1}, "1.000000059604644775390625000001"))
	if err != nil {
		t.Fatal(err)
	}
	if g := out[0].F32[0]; g != math.Nextafter32(1, 2) {
		t.Errorf("correctly rounded float32: %v, want %v", g, math.Nextafter32(1, 2))
	}
	out, err = Eval("Cast", Attrs{"to": Str("int64")}, strTensor(Shape{3}, "9223372036854775807", "100.5", "-3.9"))
	if err != nil {
		t.Fatal(err)
	}
	if g := out[0].I64; g[0] != math.MaxInt64 || g[1] != 100 || g[2] != -3 {
		t.Errorf("int64: %v, want [MaxInt64 100 -3]", g)
	}
	for _, c := range []struct {
		to, s, want string
	}{
		{"float32", "Hello World!", `element 0: "Hello World!" is not a number`},
		{"float64", "", `element 0: "" is not a number`},
		{"int64", "NaN", `element 0: "NaN" has no int64 value`},
	} {
		if _, err := Eval("Cast", Attrs{"to": Str(c.to)}, strTensor(Shape{1}, c.s)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Cast %q to %s: %v, want %q", c.s, c.to, err, c.want)
		}
	}
	// Bool has no spelling: refused both ways.
	if _, err := Eval("Cast", Attrs{"to": Str("bool")}, strTensor(Shape{1}, "1")); err == nil || !strings.Contains(err.Error(), "bool and string") {
		t.Errorf("string to bool: %v", err)
	}
	if _, err := Eval("Cast", Attrs{"to": Str("string")}, &Tensor{DType: Bool, Shape: Shape{1}, B: []bool{true}}); err == nil {
		t.Error("bool to string was not refused")
	}
}

// StringNormalizer, values from the spec's description: stopwords removed
// (by case folding unless is_case_sensitive), then the case changed, one
// letter for one (ß stays ß: no special casing); all removed gives one
// empty string of shape [1] or [1, 1].
func TestStringNormalizerKnownValues(t *testing.T) {
	x := []string{"Monday", "tuesday", "MONDAY", "Straße", "wednesday"}
	for _, c := range []struct {
		attrs Attrs
		shape Shape
		want  []string
		out   Shape
	}{
		{Attrs{"stopwords": Strs("monday")}, Shape{5}, []string{"tuesday", "Straße", "wednesday"}, Shape{3}},
		{Attrs{"stopwords": Strs("monday"), "is_case_sensitive": Int(1)}, Shape{1, 5}, []string{"Monday", "tuesday", "MONDAY", "Straße", "wednesday"}, Shape{1, 5}},
		{Attrs{"stopwords": Strs("Monday"), "is_case_sensitive": Int(1), "case_change_action": Str("UPPER")}, Shape{5}, []string{"TUESDAY", "MONDAY", "STRAßE", "WEDNESDAY"}, Shape{4}},
		{Attrs{"case_change_action": Str("LOWER")}, Shape{1, 5}, []string{"monday", "tuesday", "monday", "straße", "wednesday"}, Shape{1, 5}},
		{Attrs{"stopwords": Strs(x...)}, Shape{5}, []string{""}, Shape{1}},
		{Attrs{"stopwords": Strs("MONDAY", "TUESDAY", "STRASSE", "STRAßE", "WEDNESDAY")}, Shape{1, 5}, []string{""}, Shape{1, 1}},
	} {
		out, err := Eval("StringNormalizer", c.attrs, strTensor(c.shape, x...))
		if err != nil {
			t.Fatalf("%v: %v", c.attrs, err)
		}
		if !out[0].Shape.Equal(c.out) {
			t.Errorf("%v: shape %v, want %v", c.attrs, out[0].Shape, c.out)
			continue
		}
		for i, w := range c.want {
			if out[0].S[i] != w {
				t.Errorf("%v: element %d %q, want %q", c.attrs, i, out[0].S[i], w)
			}
		}
	}
	for _, c := range []struct {
		attrs Attrs
		in    *Tensor
		want  string
	}{
		{nil, strTensor(Shape{2, 2}, "a", "b", "c", "d"), "shape [C] or [1, C]"},
		{Attrs{"locale": Str("tr_TR")}, strTensor(Shape{1}, "i"), `locale "tr_TR" is not supported`},
		{Attrs{"case_change_action": Str("TITLE")}, strTensor(Shape{1}, "i"), "want one of"},
		{nil, &Tensor{DType: Float32, Shape: Shape{1}, F32: []float32{1}}, "X must be a string tensor"},
	} {
		if _, err := Eval("StringNormalizer", c.attrs, c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v on %v: %v, want %q", c.attrs, c.in.Type(), err, c.want)
		}
	}
	// X must be known when the node is built: its output's length follows
	// its data.
	b := NewBuilder("n")
	b.Op("StringNormalizer", nil, b.Input("x", String, 3))
	if _, err := b.Build(); err == nil || !strings.Contains(err.Error(), "X must be a constant") {
		t.Errorf("StringNormalizer of an input: %v", err)
	}
}

// Every op but the string ops refuses a string operand, when a node is
// built and when it is evaluated, and no other op makes a string output.
func TestOtherOpsRefuseStrings(t *testing.T) {
	s := strTensor(Shape{2}, "1", "2")
	for _, op := range []string{"Identity", "Add", "Relu", "Reshape", "Sqrt", "Equal", "ReduceSum", "Gather"} {
		spec, _ := LookupOp(op)
		lo, _ := spec.Arity()
		in := make([]*Tensor, max(lo, 1))
		for i := range in {
			in[i] = s
		}
		_, err := Eval(op, nil, in...)
		if err == nil || !strings.Contains(err.Error(), "is a string tensor; "+op+" does not take strings") {
			t.Errorf("Eval %s on strings: %v", op, err)
		}
	}
	b := NewBuilder("r")
	x := b.Input("x", String, 2)
	b.Op("Neg", nil, x)
	if _, err := b.Build(); err == nil || !strings.Contains(err.Error(), "Neg does not take strings") {
		t.Errorf("building Neg of a string: %v", err)
	}
	// A param may not be a string (it is trained as numbers).
	b = NewBuilder("p")
	b.Output(b.Op("Cast", Attrs{"to": Str("float32")}, b.Param("w", String, Shape{1}, LiteralStrings("1"))))
	if _, err := b.Build(); err == nil || !strings.Contains(err.Error(), "param w is a string tensor") {
		t.Errorf("a string param: %v", err)
	}
	// A graph input may be a string; Verify accepts it.
	b = NewBuilder("ok")
	b.Output(b.Op("Cast", Attrs{"to": Str("float64")}, b.Input("x", String, 2)))
	if _, err := b.Build(); err != nil {
		t.Errorf("Cast of a string input: %v", err)
	}
}

// Binding a string input makes a string literal; a number does not bind to
// it, nor a string to a number.
func TestBindString(t *testing.T) {
	b := NewBuilder("bind")
	x := b.Input("x", String, 2)
	b.Output(b.Op("StringNormalizer", nil, x))
	if _, err := b.Build(); err == nil {
		t.Fatal("StringNormalizer of an unbound input was accepted")
	}
	b = NewBuilder("bind")
	x = b.Input("x", String, 2)
	b.Output(b.Op("Cast", Attrs{"to": Str("float32")}, x))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	bound, err := Bind(g, "x", strTensor(Shape{2}, "a\"b", "1"))
	if err != nil {
		t.Fatal(err)
	}
	if c := bound.Consts[0]; c.Init.Strings[0] != "a\"b" {
		t.Errorf("bound literal %q", c.Init.Strings)
	}
	if _, err := Bind(g, "x", &Tensor{DType: Float32, Shape: Shape{2}, F32: []float32{1, 2}}); err == nil || !strings.Contains(err.Error(), "strings bind only to strings") {
		t.Errorf("binding numbers to a string input: %v", err)
	}
}

// Text written by Cast reads back as the same value of the same type, for
// every float type over random magnitudes (the "fewest digits" promise),
// and the text never has an exponent.
func TestCastStringRoundTrip(t *testing.T) {
	for _, dt := range []DType{Float32, Float64, Float16, BFloat16} {
		x := NewTensor(dt, Shape{400})
		seed := uint64(1)
		for i := range x.Len() {
			seed = seed*6364136223846793005 + 1442695040888963407
			m := float64(seed>>11) / (1 << 53)
			e := float64(int(seed%40) - 20)
			v := (m + 0.01) * math.Pow(10, e)
			if seed&1 == 1 {
				v = -v
			}
			x.Set(i, v)
		}
		s, err := Eval("Cast", Attrs{"to": Str("string")}, x)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Eval("Cast", Attrs{"to": Str(dt.String())}, s[0])
		if err != nil {
			t.Fatal(err)
		}
		for i := range x.Len() {
			if strings.ContainsAny(s[0].S[i], "eE") {
				t.Errorf("%v: %q has an exponent", dt, s[0].S[i])
			}
			if back[0].At(i) != x.At(i) {
				t.Errorf("%v: %v wrote %q, read back %v", dt, x.At(i), s[0].S[i], back[0].At(i))
			}
		}
	}
}
