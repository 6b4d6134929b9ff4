package graph

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// AttrKind is the type of a node attribute.
type AttrKind uint8

// Attribute kinds (the subset of ONNX's attribute types that our ops use).
const (
	AttrInt AttrKind = iota + 1
	AttrFloat
	AttrString
	AttrInts
	AttrFloats
	AttrStrings
)

var attrKindNames = map[AttrKind]string{AttrInt: "int", AttrFloat: "float", AttrString: "string", AttrInts: "ints", AttrFloats: "floats", AttrStrings: "strings"}

func (k AttrKind) String() string { return attrKindNames[k] }

// Attr is one attribute value; Kind says which field holds it.
type Attr struct {
	Kind   AttrKind
	I      int64
	F      float64
	S      string
	Ints   []int64
	Floats []float64
	Strs   []string
}

// Int, Float, Str, Ints and Floats make attributes.
func Int(v int64) Attr         { return Attr{Kind: AttrInt, I: v} }
func Float(v float64) Attr     { return Attr{Kind: AttrFloat, F: v} }
func Str(v string) Attr        { return Attr{Kind: AttrString, S: v} }
func Ints(v ...int64) Attr     { return Attr{Kind: AttrInts, Ints: slices.Clone(v)} }
func Floats(v ...float64) Attr { return Attr{Kind: AttrFloats, Floats: slices.Clone(v)} }

// Strs makes a list-of-strings attribute (never nil, so that an empty list
// and a formatted-then-parsed one are the same value).
func Strs(v ...string) Attr { return Attr{Kind: AttrStrings, Strs: append([]string{}, v...)} }

// Equal reports whether two attributes hold the same value (NaN equals NaN).
func (a Attr) Equal(b Attr) bool {
	if a.Kind != b.Kind {
		return false
	}
	feq := func(x, y float64) bool { return x == y || (math.IsNaN(x) && math.IsNaN(y)) }
	switch a.Kind {
	case AttrInt:
		return a.I == b.I
	case AttrFloat:
		return feq(a.F, b.F)
	case AttrString:
		return a.S == b.S
	case AttrInts:
		return slices.Equal(a.Ints, b.Ints)
	case AttrFloats:
		return slices.EqualFunc(a.Floats, b.Floats, feq)
	case AttrStrings:
		return slices.Equal(a.Strs, b.Strs)
	}
	return false
}

// Attrs maps attribute names to values.
type Attrs map[string]Attr

// Clone returns a deep copy.
func (a Attrs) Clone() Attrs {
	c := make(Attrs, len(a))
	for k, v := range a {
		v.Ints = slices.Clone(v.Ints)
		v.Floats = slices.Clone(v.Floats)
		v.Strs = slices.Clone(v.Strs)
		c[k] = v
	}
	return c
}

// Names returns the attribute names sorted, the canonical order.
func (a Attrs) Names() []string {
	names := make([]string, 0, len(a))
	for k := range a {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// Int returns an int attribute, or def when absent.
func (a Attrs) Int(name string, def int64) int64 {
	if v, ok := a[name]; ok && v.Kind == AttrInt {
		return v.I
	}
	return def
}

// Float returns a float attribute, or def when absent.
func (a Attrs) Float(name string, def float64) float64 {
	if v, ok := a[name]; ok && v.Kind == AttrFloat {
		return v.F
	}
	return def
}

// String returns a string attribute, or def when absent.
func (a Attrs) String(name string, def string) string {
	if v, ok := a[name]; ok && v.Kind == AttrString {
		return v.S
	}
	return def
}

// IntList returns an ints attribute, or nil when absent.
func (a Attrs) IntList(name string) []int64 {
	if v, ok := a[name]; ok && v.Kind == AttrInts {
		return v.Ints
	}
	return nil
}

// FormatFloat writes a float so that ParseFloatLit reads back the same bits:
// shortest round-trip digits, always with a '.', 'e', "inf" or "nan" so that
// it is never mistaken for an int.
func FormatFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
}

// ParseFloatLit is the inverse of FormatFloat (it also accepts plain ints).
func ParseFloatLit(s string) (float64, error) {
	switch s {
	case "nan":
		return math.NaN(), nil
	case "inf", "+inf":
		return math.Inf(1), nil
	case "-inf":
		return math.Inf(-1), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("bad number %q", s)
	}
	return f, nil
}

// format writes the attribute value in the text format.
func (a Attr) format() string {
	switch a.Kind {
	case AttrInt:
		return strconv.FormatInt(a.I, 10)
	case AttrFloat:
		return FormatFloat(a.F)
	case AttrString:
		return strconv.Quote(a.S)
	case AttrInts:
		parts := make([]string, len(a.Ints))
		for i, v := range a.Ints {
			parts[i] = strconv.FormatInt(v, 10)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case AttrFloats:
		parts := make([]string, len(a.Floats))
		for i, v := range a.Floats {
			parts[i] = FormatFloat(v)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case AttrStrings:
		parts := make([]string, len(a.Strs))
		for i, v := range a.Strs {
			parts[i] = strconv.Quote(v)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	return "?"
}
