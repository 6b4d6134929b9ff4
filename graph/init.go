package graph

import (
	"fmt"
	"math"
	"slices"
)

// Init says how an initializer's data is made. Keeping the recipe rather than
// the numbers keeps the text format small and still exact: Materialize gives
// the same bits on every machine. Imported weights use "literal".
type Init struct {
	Fn   string             // zeros, ones, fill, normal, causal_mask, rope_cos, rope_sin, literal
	Args map[string]float64 // named numeric arguments (fill: value; normal: std, seed; rope: theta)
	Data []float64          // literal values, row-major
	// Strings are a string literal's values, row-major (Fn "literal"; the
	// one recipe a String value may have, and only a String value's).
	Strings []string
}

// Init constructors.
func Zeros() Init         { return Init{Fn: "zeros"} }
func Ones() Init          { return Init{Fn: "ones"} }
func Fill(v float64) Init { return Init{Fn: "fill", Args: map[string]float64{"value": v}} }
func Normal(std float64, seed int) Init {
	return Init{Fn: "normal", Args: map[string]float64{"std": std, "seed": float64(seed)}}
}
func CausalMask() Init { return Init{Fn: "causal_mask"} }
func RopeCos(theta float64) Init {
	return Init{Fn: "rope_cos", Args: map[string]float64{"theta": theta}}
}
func RopeSin(theta float64) Init {
	return Init{Fn: "rope_sin", Args: map[string]float64{"theta": theta}}
}
func Literal(values ...float64) Init { return Init{Fn: "literal", Data: slices.Clone(values)} }

// LiteralStrings is the recipe of a String constant.
func LiteralStrings(values ...string) Init {
	return Init{Fn: "literal", Strings: append([]string{}, values...)}
}

func LiteralInts(values ...int64) Init {
	d := make([]float64, len(values))
	for i, v := range values {
		d[i] = float64(v)
	}
	return Init{Fn: "literal", Data: d}
}

var initArgs = map[string][]string{
	"zeros": nil, "ones": nil, "fill": {"value"}, "normal": {"seed", "std"},
	"causal_mask": nil, "rope_cos": {"theta"}, "rope_sin": {"theta"}, "literal": nil,
}

// Equal reports whether two recipes are identical.
func (in Init) Equal(o Init) bool {
	if in.Fn != o.Fn || len(in.Args) != len(o.Args) || len(in.Data) != len(o.Data) || !slices.Equal(in.Strings, o.Strings) {
		return false
	}
	for k, v := range in.Args {
		if w, ok := o.Args[k]; !ok || math.Float64bits(v) != math.Float64bits(w) {
			return false
		}
	}
	for i := range in.Data {
		if math.Float64bits(in.Data[i]) != math.Float64bits(o.Data[i]) {
			return false
		}
	}
	return true
}

// check validates a recipe against the value's type.
func (in Init) check(t TensorType) error {
	if err := t.Shape.Check(); err != nil {
		return err
	}
	want, ok := initArgs[in.Fn]
	if !ok {
		return fmt.Errorf("unknown initializer %q", in.Fn)
	}
	for _, k := range want {
		if _, ok := in.Args[k]; !ok {
			return fmt.Errorf("initializer %s needs argument %s", in.Fn, k)
		}
	}
	if len(in.Args) != len(want) {
		return fmt.Errorf("initializer %s takes arguments %v", in.Fn, want)
	}
	switch {
	case t.DType == String && in.Fn != "literal":
		return fmt.Errorf("a string value's initializer must be a literal, got %s", in.Fn)
	case t.DType == String && len(in.Data) > 0:
		return fmt.Errorf("string literal holds numbers")
	case t.DType == String && len(in.Strings) != t.Shape.Numel():
		return fmt.Errorf("literal has %d strings, type %v needs %d", len(in.Strings), t, t.Shape.Numel())
	case t.DType == String:
		return nil
	case len(in.Strings) > 0:
		return fmt.Errorf("a %v literal holds strings", t.DType)
	}
	switch in.Fn {
	case "literal":
		if len(in.Data) != t.Shape.Numel() {
			return fmt.Errorf("literal has %d values, type %v needs %d", len(in.Data), t, t.Shape.Numel())
		}
		if t.DType == Int64 {
			for i, v := range in.Data {
				if v != math.Trunc(v) {
					return fmt.Errorf("int64 literal value %d (%s) is not an integer", i, FormatFloat(v))
				}
			}
		}
	case "causal_mask", "rope_cos", "rope_sin":
		if t.Shape.Rank() != 2 {
			return fmt.Errorf("%s needs a rank-2 shape, got %v", in.Fn, t.Shape)
		}
	case "normal":
		if !t.DType.IsFloat() {
			return fmt.Errorf("normal initializer needs a float type, got %v", t.DType)
		}
	}
	return nil
}

// Materialize computes the data of an initializer of type t. A type too
// large for the host (the IR allows 2^48 elements) is an error, not a panic.
func (in Init) Materialize(t TensorType) (_ *Tensor, err error) {
	if err := in.check(t); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s initializer of type %v: %v", in.Fn, t, r)
		}
	}()
	out := NewTensor(t.DType, t.Shape)
	switch in.Fn {
	case "zeros":
	case "ones":
		out.Fill(1)
	case "fill":
		out.Fill(in.Args["value"])
	case "literal":
		for i, v := range in.Data {
			out.Set(i, v)
		}
		copy(out.S, in.Strings)
	case "normal":
		// PCG plus Box-Muller written out (init_normal.go): the bits must
		// never change with the Go release, since checkpoints and goldens
		// depend on them.
		fillNormal(out, uint64(in.Args["seed"]), in.Args["std"])
	case "causal_mask":
		rows, cols := t.Shape[0], t.Shape[1]
		for i := range rows {
			for j := range cols {
				if j > i {
					out.Set(i*cols+j, math.Inf(-1))
				}
			}
		}
	case "rope_cos", "rope_sin":
		// [positions, head_dim]; rotate-half layout: column i and i+D/2 share frequency i.
		pos, d := t.Shape[0], t.Shape[1]
		if d%2 != 0 {
			return nil, fmt.Errorf("%s needs an even head dim, got %d", in.Fn, d)
		}
		theta := in.Args["theta"]
		for p := range pos {
			for i := range d / 2 {
				ang := float64(p) * math.Pow(theta, -2*float64(i)/float64(d))
				v := math.Cos(ang)
				if in.Fn == "rope_sin" {
					v = math.Sin(ang)
				}
				out.Set(p*d+i, v)
				out.Set(p*d+i+d/2, v)
			}
		}
	}
	return out, nil
}
