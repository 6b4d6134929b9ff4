package graph

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// String tensors. Two rows take them: Cast (to and from numbers) and
// StringNormalizer; every other op refuses a string operand (OpSpec.Strings,
// inferTypes). Their meaning is plain Go over the host's []string, and the
// CPU backend runs it as it stands (a string has no device form).

func init() {
	register(&OpSpec{
		Name: "StringNormalizer", Doc: "X ([C] or [1, C] strings) without the stopwords, then lowercased, uppercased or unchanged",
		Inputs: []string{"X"}, Outputs: []string{"Y"}, Strings: true,
		Attrs: []AttrSpec{
			{Name: "case_change_action", Kind: AttrString, Default: Str("NONE"), Enum: []string{"NONE", "LOWER", "UPPER"}},
			{Name: "is_case_sensitive", Kind: AttrInt, Default: Int(0)},
			{Name: "locale", Kind: AttrString, Default: Str("")},
			{Name: "stopwords", Kind: AttrStrings, Default: Strs()},
		},
		Infer: inferStringNormalizer,
		Eval:  evalStringNormalizer,
	})
}

// castStringDTypes checks a Cast that involves strings: between strings and
// the float or int64 types. Bool has no spelling in the spec ("1"? "True"?),
// so a cast between bool and string is refused rather than guessed.
func castStringDTypes(from, to DType) error {
	if (from == String) != (to == String) && (from == Bool || to == Bool) {
		return fmt.Errorf("Cast between bool and string is not supported (the spec gives no spelling of a bool)")
	}
	return nil
}

// evalCast is Cast's meaning. Between numbers it is a copy rounded to the
// output's type (Tensor.Set: floats to int64 truncate toward zero, to bool
// x != 0). From numbers to strings it writes formatCastString; from strings
// it reads parseCastString.
func evalCast(in []*Tensor, a Attrs, out []*Tensor) error {
	x, y := in[0], out[0]
	switch {
	case x.DType == String && y.DType == String:
		copy(y.S, x.S)
	case y.DType == String:
		for i := range y.S {
			y.S[i] = formatCastElem(x, i)
		}
	case x.DType == String:
		for i, s := range x.S {
			if err := parseCastElem(y, i, s); err != nil {
				return err
			}
		}
	default:
		return evalCopy(in, a, out)
	}
	return nil
}

// formatCastElem writes element i of the numeric tensor x as ONNX's Cast
// to string does: an int64 in decimal; a float in plain notation (the spec:
// "plain floating-point representation (such as "314.15926)"), never an
// exponent, with the fewest significant digits that read back as the same
// value of x's type (float16 0.1 is "0.1", not its float32 digits); NaN,
// +Inf and -Inf as the spec's literals "NaN", "INF", "-INF", which Cast
// from string reads back.
func formatCastElem(x *Tensor, i int) string {
	if x.DType == Int64 {
		return strconv.FormatInt(x.I64[i], 10)
	}
	v := x.At(i)
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "INF"
	case math.IsInf(v, -1):
		return "-INF"
	}
	switch x.DType {
	case Float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case Float32:
		return strconv.FormatFloat(v, 'f', -1, 32)
	}
	// A narrow float (held as float32): the shortest decimal that rounds
	// back to it. Go formats shortest only for 32 and 64 bits, so try each
	// count of significant digits; float32's shortest (at most 9 digits)
	// always reads back, which bounds the loop.
	round := RoundF16
	if x.DType == BFloat16 {
		round = RoundBF16
	}
	for digits := 1; digits < 9; digits++ {
		d, err := strconv.ParseFloat(strconv.FormatFloat(v, 'e', digits-1, 64), 64)
		if err == nil && round(float32(d)) == float32(v) {
			return strconv.FormatFloat(d, 'f', -1, 64)
		}
	}
	return strconv.FormatFloat(v, 'f', -1, 32)
}

// parseCastElem reads s into element i of y as Cast from string does:
// plain or scientific notation ("3.14", "1e-5", "1E8"), and "INF", "+INF",
// "-INF" and "NaN" in any case. Float32 is read correctly rounded to
// float32 (not through float64, which could round twice). To int64, an
// integer literal is read exactly, and a fractional one truncates toward
// zero (the spec's "100.5" gives 100). Text that is no number (the spec
// leaves it undefined) is an error naming the element.
func parseCastElem(y *Tensor, i int, s string) error {
	if y.DType == Int64 {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			y.I64[i] = n
			return nil
		}
	}
	bits := 64
	if y.DType == Float32 {
		bits = 32
	}
	v, err := strconv.ParseFloat(s, bits)
	if err != nil && !isRangeErr(err) {
		return fmt.Errorf("element %d: %q is not a number", i, s)
	}
	if y.DType == Int64 && (math.IsNaN(v) || math.IsInf(v, 0)) {
		return fmt.Errorf("element %d: %q has no int64 value", i, s)
	}
	y.Set(i, v)
	return nil
}

// isRangeErr: ParseFloat's out-of-range result is ±Inf (or 0), as ONNX's
// reference casts give it.
func isRangeErr(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

func inferStringNormalizer(in []*TensorType, a Attrs, consts []*Tensor) ([]TensorType, error) {
	x := in[0]
	if x.DType != String {
		return nil, fmt.Errorf("X must be a string tensor, got %v", x.DType)
	}
	if err := stringNormalizerShape(x.Shape); err != nil {
		return nil, err
	}
	if err := checkLocale(a); err != nil {
		return nil, err
	}
	if consts[0] == nil {
		return nil, fmt.Errorf("X must be a constant: Y's length is how many elements are not stopwords, and shapes are static")
	}
	kept := len(normalizeStrings(consts[0].S, a))
	return []TensorType{{String, normalizedShape(x.Shape, kept)}}, nil
}

func stringNormalizerShape(s Shape) error {
	if !(s.Rank() == 1 || (s.Rank() == 2 && s[0] == 1)) {
		return fmt.Errorf("X must have shape [C] or [1, C], got %v", s)
	}
	return nil
}

// checkLocale admits the locale the implementation's case mapping is: Go's
// Unicode default mapping, which is en_US's. Another locale (Turkish
// dotted i) would need its own tables, so it is refused rather than
// ignored.
func checkLocale(a Attrs) error {
	switch l := a.String("locale", ""); l {
	case "", "en_US", "en_US.UTF-8", "C":
		return nil
	default:
		return fmt.Errorf("locale %q is not supported (the case mapping is Unicode's default, en_US)", l)
	}
}

// normalizedShape is Y's shape: X's with C' elements, where C' = 0 (every
// element a stopword) gives one empty string, [1] or [1, 1], as the spec
// says.
func normalizedShape(x Shape, kept int) Shape {
	kept = max(kept, 1)
	if x.Rank() == 2 {
		return Shape{1, kept}
	}
	return Shape{kept}
}

// normalizeStrings removes the stopwords (matched exactly, or by Unicode
// simple case folding when is_case_sensitive is 0), then changes the case
// of what is left with Unicode's one-to-one mappings (strings.ToUpper: "ß"
// stays "ß"; the spec names no special casing).
func normalizeStrings(x []string, a Attrs) []string {
	stop := a["stopwords"].Strs
	sensitive := a.Int("is_case_sensitive", 0) != 0
	isStop := func(s string) bool {
		return slices.ContainsFunc(stop, func(w string) bool {
			if sensitive {
				return w == s
			}
			return strings.EqualFold(w, s)
		})
	}
	var out []string
	for _, s := range x {
		if isStop(s) {
			continue
		}
		switch a.String("case_change_action", "NONE") {
		case "LOWER":
			s = strings.ToLower(s)
		case "UPPER":
			s = strings.ToUpper(s)
		}
		out = append(out, s)
	}
	return out
}

func evalStringNormalizer(in []*Tensor, a Attrs, out []*Tensor) error {
	if err := stringNormalizerShape(in[0].Shape); err != nil {
		return err
	}
	y := normalizeStrings(in[0].S, a)
	if want := max(len(y), 1); want != out[0].Len() {
		return fmt.Errorf("Y holds %d strings, its type %v says %d: X differs from the constant its shape was inferred from", want, out[0].Shape, out[0].Len())
	}
	out[0].S[0] = "" // every element a stopword: one empty string
	copy(out[0].S, y)
	return nil
}
