package onnx

import (
	"fmt"
	"math"
	"strings"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// cval is a tensor whose value is known while importing: an initializer, a
// Constant node, a Shape of a statically shaped value, or anything computed from
// those. It keeps the ONNX element type, which may be one our IR lacks (INT32 in
// shape arithmetic); such values may be folded through but never become graph
// values.
type cval struct {
	dt    onnxpb.DataType
	shape graph.Shape
	f     []float64 // float types, each element already rounded to dt
	i     []int64   // integer types (wrapped to dt's width) and BOOL (0 or 1)
}

func isFloatType(dt onnxpb.DataType) bool {
	switch dt {
	case onnxpb.Float, onnxpb.Double, onnxpb.Float16, onnxpb.BFloat16:
		return true
	}
	return false
}

func isIntType(dt onnxpb.DataType) bool {
	switch dt {
	case onnxpb.Int8, onnxpb.Int16, onnxpb.Int32, onnxpb.Int64,
		onnxpb.Uint8, onnxpb.Uint16, onnxpb.Uint32, onnxpb.Uint64:
		return true
	}
	return false
}

// numericType is every element type cval can hold.
func numericType(dt onnxpb.DataType) bool {
	return isFloatType(dt) || isIntType(dt) || dt == onnxpb.Bool
}

func newCval(dt onnxpb.DataType, shape graph.Shape) *cval {
	c := &cval{dt: dt, shape: shape.Clone()}
	if isFloatType(dt) {
		c.f = make([]float64, shape.Numel())
	} else {
		c.i = make([]int64, shape.Numel())
	}
	return c
}

func (c *cval) n() int { return c.shape.Numel() }

func (c *cval) isFloat() bool { return isFloatType(c.dt) }

// at returns element k as a float64.
func (c *cval) at(k int) float64 {
	if c.f != nil {
		return c.f[k]
	}
	return float64(c.i[k])
}

// set stores v at k, rounding or wrapping to the element type.
func (c *cval) set(k int, v float64) {
	if c.f != nil {
		c.f[k] = roundTo(c.dt, v)
		return
	}
	c.i[k] = wrapInt(c.dt, truncInt(v))
}

// truncInt converts like a C cast (toward zero), saturating instead of the
// undefined behaviour of out-of-range conversions; NaN gives 0.
func truncInt(v float64) int64 { return graph.SaturateInt64(v) }

func roundTo(dt onnxpb.DataType, v float64) float64 {
	switch dt {
	case onnxpb.Float:
		return float64(float32(v))
	case onnxpb.Float16:
		return float64(graph.RoundF16(float32(v)))
	case onnxpb.BFloat16:
		return float64(graph.RoundBF16(float32(v)))
	}
	return v
}

// wrapInt reduces v to the range of the integer type, as a two's complement
// store of that width would.
func wrapInt(dt onnxpb.DataType, v int64) int64 {
	switch dt {
	case onnxpb.Int8:
		return int64(int8(v))
	case onnxpb.Int16:
		return int64(int16(v))
	case onnxpb.Int32:
		return int64(int32(v))
	case onnxpb.Uint8:
		return int64(uint8(v))
	case onnxpb.Uint16:
		return int64(uint16(v))
	case onnxpb.Uint32:
		return int64(uint32(v))
	case onnxpb.Bool:
		if v != 0 {
			return 1
		}
		return 0
	}
	return v
}

// ints returns the elements of an integer constant.
func (c *cval) ints() ([]int64, error) {
	if !isIntType(c.dt) {
		return nil, fmt.Errorf("want an integer tensor, got %v", c.dt)
	}
	return c.i, nil
}

func (c *cval) String() string { return fmt.Sprintf("%v%v", c.dt, c.shape) }

// cvalFromTensor reads a TensorProto's data.
func cvalFromTensor(t *onnxpb.Tensor) (*cval, error) {
	shape, err := tensorShape(t)
	if err != nil {
		return nil, err
	}
	c := &cval{dt: t.DataType, shape: shape}
	switch {
	case isFloatType(t.DataType):
		f, err := t.Float64s()
		if err != nil {
			return nil, err
		}
		c.f = f
	case isIntType(t.DataType) || t.DataType == onnxpb.Bool:
		i, err := t.Int64s()
		if err != nil {
			return nil, err
		}
		c.i = i
	default:
		return nil, fmt.Errorf("tensor %q: element type %v is not supported", t.Name, t.DataType)
	}
	return c, nil
}

// tensorShape reads a TensorProto's dims.
func tensorShape(t *onnxpb.Tensor) (graph.Shape, error) {
	shape := make(graph.Shape, len(t.Dims))
	for i, d := range t.Dims {
		if d < 0 || d > math.MaxInt32 {
			return nil, fmt.Errorf("tensor %q: bad dimension %d", t.Name, d)
		}
		shape[i] = int(d)
	}
	if err := shape.Check(); err != nil {
		return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return shape, nil
}

// dtypeOf maps an ONNX element type to ours.
func dtypeOf(dt onnxpb.DataType) (graph.DType, bool) {
	switch dt {
	case onnxpb.Float:
		return graph.Float32, true
	case onnxpb.Double:
		return graph.Float64, true
	case onnxpb.Float16:
		return graph.Float16, true
	case onnxpb.BFloat16:
		return graph.BFloat16, true
	case onnxpb.Int64:
		return graph.Int64, true
	case onnxpb.Bool:
		return graph.Bool, true
	case onnxpb.String:
		return graph.String, true
	}
	return graph.InvalidDType, false
}

// onnxType maps our element type to ONNX's.
func onnxType(dt graph.DType) onnxpb.DataType {
	switch dt {
	case graph.Float32:
		return onnxpb.Float
	case graph.Float64:
		return onnxpb.Double
	case graph.Float16:
		return onnxpb.Float16
	case graph.BFloat16:
		return onnxpb.BFloat16
	case graph.Int64:
		return onnxpb.Int64
	case graph.Bool:
		return onnxpb.Bool
	case graph.String:
		return onnxpb.String
	}
	return onnxpb.Undefined
}

// maxExactInt is the largest integer magnitude a float64 (and so an Init literal)
// holds exactly.
const maxExactInt = 1 << 53

// Narrow integers: INT8, INT16, INT32, UINT8, UINT16 and UINT32 have no
// dtype of their own; a graph holds them as Int64, exactly (every value of
// theirs is an int64), and an entry remembers the ONNX type (entry.odt) so
// that an op whose integer semantics would differ at the narrow width
// (wrap-around, saturation) is refused (narrow.go). UINT64 is held the same
// way for its values below 2^63, the ones int64 holds: a larger one is
// refused where it is read (a tensor's data, onnxpb's Int64s), folded
// (uint64Result) or written (an output, graph.CheckNarrow), never
// reinterpreted as a negative int64.

// isNarrowInt reports whether dt is an integer type held as Int64.
func isNarrowInt(dt onnxpb.DataType) bool {
	_, _, ok := graph.NarrowIntRange(narrowName(dt))
	return ok
}

// narrowName is the graph's name of a narrow integer type (Graph.ElemTypes).
func narrowName(dt onnxpb.DataType) string { return strings.ToLower(dt.String()) }

// narrowOf maps a graph's ElemTypes name back to the ONNX type.
func narrowOf(name string) (onnxpb.DataType, bool) {
	for _, dt := range []onnxpb.DataType{onnxpb.Int8, onnxpb.Int16, onnxpb.Int32, onnxpb.Uint8, onnxpb.Uint16, onnxpb.Uint32, onnxpb.Uint64} {
		if narrowName(dt) == name {
			return dt, true
		}
	}
	return onnxpb.Undefined, false
}

// intRange is the range of an integer or bool type held as Int64 (ok false
// for others); UINT64's is the part below 2^63.
func intRange(dt onnxpb.DataType) (lo, hi int64, ok bool) {
	switch dt {
	case onnxpb.Int64:
		return math.MinInt64, math.MaxInt64, true
	case onnxpb.Bool:
		return 0, 1, true
	}
	return graph.NarrowIntRange(narrowName(dt))
}

// graphDType is the dtype a graph holds values of ONNX type dt in: ours,
// or Int64 for a narrow integer.
func graphDType(dt onnxpb.DataType) (graph.DType, bool) {
	if d, ok := dtypeOf(dt); ok {
		return d, true
	}
	if isNarrowInt(dt) {
		return graph.Int64, true
	}
	return graph.InvalidDType, false
}

// literal returns the data as an Init literal for a value of our type (a
// narrow integer type's is Int64).
func (c *cval) literal() (graph.DType, []float64, error) {
	dt, ok := graphDType(c.dt)
	if !ok {
		return 0, nil, fmt.Errorf("element type %v has no flashgraph dtype", c.dt)
	}
	data := make([]float64, c.n())
	if c.f != nil {
		copy(data, c.f)
		return dt, data, nil
	}
	for k, v := range c.i {
		if err := uint64Result(c.dt, v); err != nil {
			return 0, nil, err
		}
		if v > maxExactInt || v < -maxExactInt {
			return 0, nil, fmt.Errorf("int64 value %d is too large to hold exactly", v)
		}
		data[k] = float64(v)
	}
	return dt, data, nil
}

// uint64Result refuses a UINT64 value that int64 does not hold: int64
// arithmetic wraps modulo 2^64 as UINT64's does, so such a value comes out
// as its bit pattern, a negative int64, which must not pass for a number.
func uint64Result(dt onnxpb.DataType, v int64) error {
	if dt == onnxpb.Uint64 && v < 0 {
		return fmt.Errorf("UINT64 value %d is at or above 2^63, beyond what int64 holds", uint64(v))
	}
	return nil
}

// reshaped shares c's data under a new shape of the same size.
func (c *cval) reshaped(shape graph.Shape) *cval {
	return &cval{dt: c.dt, shape: shape.Clone(), f: c.f, i: c.i}
}

// broadcastIndex returns, for each element of out, the index of the element of
// in (a shape that broadcasts to out) that it reads.
func broadcastIndex(in, out graph.Shape) []int {
	n := out.Numel()
	idx := make([]int, n)
	off := len(out) - len(in)
	inStrides := in.Strides()
	coord := make([]int, len(out))
	for k := range n {
		j := 0
		for a := range in {
			if in[a] != 1 {
				j += coord[off+a] * inStrides[a]
			}
		}
		idx[k] = j
		for a := len(out) - 1; a >= 0; a-- {
			coord[a]++
			if coord[a] < out[a] {
				break
			}
			coord[a] = 0
		}
	}
	return idx
}
