package backendtest

import (
	"fmt"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// String tensors: the ops that take them (Cast to and from strings,
// StringNormalizer) run on the CPU backend only; a backend without a
// device form for strings refuses the graph at Compile with
// backend.ErrUnsupported, and runCase skips the case there.

// expectText is a string output and the text it must hold.
type expectText struct {
	v    *graph.Value
	want *graph.Tensor
}

// expectEval makes v, a string output of node op(attrs, ins...), a graph
// output that must equal the op table's Eval on refs (the inputs' data),
// string for string.
func (c *ctx) expectEval(v *graph.Value, op string, attrs graph.Attrs, refs ...*graph.Tensor) {
	if c.b.Err() != nil {
		c.t.Fatalf("building the case graph: %v", c.b.Err())
	}
	out, err := graph.Eval(op, attrs, refs...)
	if err != nil {
		c.t.Fatalf("reference %s: %v", op, err)
	}
	c.wantText = append(c.wantText, expectText{v: v, want: out[0]})
}

// stringInput declares a string graph input fed with s.
func (c *ctx) stringInput(shape graph.Shape, s ...string) (*graph.Value, *graph.Tensor) {
	name := "text" + string(rune('a'+len(c.feeds)))
	v := c.b.Input(name, graph.String, shape...)
	t := &graph.Tensor{DType: graph.String, Shape: shape.Clone(), S: append([]string{}, s...)}
	c.feeds[name] = t
	return v, t
}

func compareText(t *testing.T, w expectText, got *graph.Tensor) {
	t.Helper()
	switch {
	case got == nil:
		t.Errorf("output %s missing", w.v.Name)
	case !got.Type().Equal(w.want.Type()):
		t.Errorf("%s: got a %v tensor, want %v", w.v.Name, got.Type(), w.want.Type())
	case got.Check() != nil:
		t.Errorf("%s: %v", w.v.Name, got.Check())
	default:
		for i := range got.S {
			if got.S[i] != w.want.S[i] {
				t.Errorf("%s[%d] = %q, want %q", w.v.Name, i, got.S[i], w.want.S[i])
			}
		}
	}
}

// stringCases are the cases of the ops that take strings.
func stringCases(add func(op, name string, fn func(c *ctx)), addDT func(op, name string, dts []graph.DType, fn func(c *ctx))) {
	toString := graph.Attrs{"to": graph.Str(graph.String.String())}
	// Every float type and int64 to text, special values included.
	add("Cast", "to_string", func(c *ctx) {
		x, _ := c.input(c.dt, withZeros, 3, 4)
		ref := c.feeds[x.Name].Clone()
		ref.Set(0, 1e30)
		ref.Set(1, -2.5e-7)
		c.feeds[x.Name] = ref
		c.expectEval(c.op("Cast", toString, x), "Cast", toString, ref)
	})
	addDT("Cast", "int64_to_string", onlyInt64, func(c *ctx) {
		x, _ := c.input(graph.Int64, ints(-1000, 1000), 5)
		c.feeds[x.Name].I64[0] = -1 << 62
		c.expectEval(c.op("Cast", toString, x), "Cast", toString, c.feeds[x.Name])
	})
	text := []string{"3.25", "-1e-5", "1E8", "INF", "+inf", "-INF", "NaN", "0.1"}
	add("Cast", "from_string", func(c *ctx) {
		x, xt := c.stringInput(graph.Shape{2, 4}, text...)
		to := graph.Attrs{"to": graph.Str(c.dt.String())}
		out, err := graph.Eval("Cast", to, xt)
		if err != nil {
			c.t.Fatal(err)
		}
		c.expect(c.op("Cast", to, x), fromTensor(out[0]))
	})
	addDT("Cast", "string_to_int64", onlyInt64, func(c *ctx) {
		x, xt := c.stringInput(graph.Shape{4}, "-9223372036854775808", "42", "100.5", "-3.9")
		to := graph.Attrs{"to": graph.Str(graph.Int64.String())}
		out, err := graph.Eval("Cast", to, xt)
		if err != nil {
			c.t.Fatal(err)
		}
		c.expect(c.op("Cast", to, x), fromTensor(out[0]))
	})
	words := []string{"Monday", "tuesday", "MONDAY", "Straße", "", "naïve\n\"q\""}
	for k, a := range []graph.Attrs{
		{"case_change_action": graph.Str("UPPER"), "stopwords": graph.Strs("monday")},
		{"case_change_action": graph.Str("LOWER"), "is_case_sensitive": graph.Int(1), "stopwords": graph.Strs("monday", "")},
		{},
		{"stopwords": graph.Strs(words...)},
	} {
		for _, shape := range []graph.Shape{{6}, {1, 6}} {
			addDT("StringNormalizer", fmt.Sprintf("attrs%d_%v", k, shape), []graph.DType{graph.String}, func(c *ctx) {
				x := c.b.Const("words", graph.String, shape, graph.LiteralStrings(words...))
				xt := &graph.Tensor{DType: graph.String, Shape: shape, S: words}
				c.expectEval(c.op("StringNormalizer", a, x), "StringNormalizer", a, xt)
			})
		}
	}
}
