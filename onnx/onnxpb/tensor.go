package onnxpb

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/flashgraph/flashgraph/graph"
)

// NumElements is the product of the tensor's dims (1 for a scalar). Negative dims
// and products that overflow int are errors.
func (t *Tensor) NumElements() (int, error) {
	n := uint64(1)
	for _, d := range t.Dims {
		if d < 0 {
			return 0, fmt.Errorf("tensor %q: negative dimension %d in %v", t.Name, d, t.Dims)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt {
			return 0, fmt.Errorf("tensor %q: %v has too many elements", t.Name, t.Dims)
		}
		n = lo
	}
	return int(n), nil
}

// payload says where a tensor's elements are: little-endian raw bytes, or one of
// the typed fields; it checks the element count against the dims.
type payload struct {
	n   int
	raw []byte // non-nil when the data is in raw_data
}

func (t *Tensor) payload(typedLen int) (payload, error) {
	n, err := t.NumElements()
	if err != nil {
		return payload{}, err
	}
	if t.DataLocation == LocationExternal {
		return payload{}, fmt.Errorf("tensor %q: data is in an external file; load it first (LoadExternalData)", t.Name)
	}
	if t.Segment != nil {
		return payload{}, fmt.Errorf("tensor %q: segmented tensors are not supported", t.Name)
	}
	if len(t.RawData) > 0 {
		size := t.DataType.ElemSize()
		if size == 0 {
			return payload{}, fmt.Errorf("tensor %q: raw_data for %v elements is not supported", t.Name, t.DataType)
		}
		if len(t.RawData)/size != n || len(t.RawData)%size != 0 {
			return payload{}, fmt.Errorf("tensor %q: raw_data has %d bytes, want %d (%d × %v)", t.Name, len(t.RawData), n*size, n, t.DataType)
		}
		return payload{n: n, raw: t.RawData}, nil
	}
	if typedLen != n {
		return payload{}, fmt.Errorf("tensor %q: %v data has %d elements, want %d for dims %v", t.Name, t.DataType, typedLen, n, t.Dims)
	}
	return payload{n: n}, nil
}

func (t *Tensor) wrongType(want string) error {
	return fmt.Errorf("tensor %q: data type %v cannot be read as %s", t.Name, t.DataType, want)
}

// Float32s returns the elements of a FLOAT, FLOAT16 or BFLOAT16 tensor as float32
// (the 16-bit formats widen exactly).
func (t *Tensor) Float32s() ([]float32, error) {
	switch t.DataType {
	case Float:
		p, err := t.payload(len(t.FloatData))
		if err != nil {
			return nil, err
		}
		if p.raw == nil {
			return append([]float32{}, t.FloatData...), nil
		}
		out := make([]float32, p.n)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(p.raw[4*i:]))
		}
		return out, nil
	case Float16, BFloat16:
		conv := graph.F16ToFloat32
		if t.DataType == BFloat16 {
			conv = graph.BF16ToFloat32
		}
		p, err := t.payload(len(t.Int32Data))
		if err != nil {
			return nil, err
		}
		out := make([]float32, p.n)
		for i := range out {
			if p.raw != nil {
				out[i] = conv(binary.LittleEndian.Uint16(p.raw[2*i:]))
			} else {
				// The 16 bits are stored in the low half of each int32_data element.
				out[i] = conv(uint16(t.Int32Data[i]))
			}
		}
		return out, nil
	}
	return nil, t.wrongType("float32")
}

// Float64s returns the elements of a DOUBLE tensor, or of any of the float types
// that Float32s reads, widened exactly.
func (t *Tensor) Float64s() ([]float64, error) {
	if t.DataType != Double {
		f, err := t.Float32s()
		if err != nil {
			return nil, t.wrongType("float64")
		}
		out := make([]float64, len(f))
		for i, v := range f {
			out[i] = float64(v)
		}
		return out, nil
	}
	p, err := t.payload(len(t.DoubleData))
	if err != nil {
		return nil, err
	}
	if p.raw == nil {
		return append([]float64{}, t.DoubleData...), nil
	}
	out := make([]float64, p.n)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(p.raw[8*i:]))
	}
	return out, nil
}

// Int64s returns the elements of any integer or BOOL tensor widened to int64;
// UINT64 values above MaxInt64 are an error rather than wrapping.
func (t *Tensor) Int64s() ([]int64, error) {
	switch t.DataType {
	case Int64:
		p, err := t.payload(len(t.Int64Data))
		if err != nil {
			return nil, err
		}
		if p.raw == nil {
			return append([]int64{}, t.Int64Data...), nil
		}
		out := make([]int64, p.n)
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(p.raw[8*i:]))
		}
		return out, nil
	case Uint32, Uint64:
		p, err := t.payload(len(t.Uint64Data))
		if err != nil {
			return nil, err
		}
		out := make([]int64, p.n)
		for i := range out {
			var v uint64
			switch {
			case p.raw == nil:
				v = t.Uint64Data[i]
			case t.DataType == Uint32:
				v = uint64(binary.LittleEndian.Uint32(p.raw[4*i:]))
			default:
				v = binary.LittleEndian.Uint64(p.raw[8*i:])
			}
			if v > math.MaxInt64 {
				return nil, fmt.Errorf("tensor %q: element %d = %d does not fit int64", t.Name, i, v)
			}
			out[i] = int64(v)
		}
		return out, nil
	case Int32, Int16, Int8, Uint16, Uint8, Bool:
		p, err := t.payload(len(t.Int32Data))
		if err != nil {
			return nil, err
		}
		out := make([]int64, p.n)
		for i := range out {
			if p.raw == nil {
				out[i] = narrowInt(t.DataType, uint32(t.Int32Data[i]))
				continue
			}
			var v uint32
			switch t.DataType.ElemSize() {
			case 1:
				v = uint32(p.raw[i])
			case 2:
				v = uint32(binary.LittleEndian.Uint16(p.raw[2*i:]))
			default:
				v = binary.LittleEndian.Uint32(p.raw[4*i:])
			}
			out[i] = narrowInt(t.DataType, v)
		}
		return out, nil
	}
	return nil, t.wrongType("int64")
}

// narrowInt interprets the low bits of v as a value of the narrow integer type dt.
func narrowInt(dt DataType, v uint32) int64 {
	switch dt {
	case Int8:
		return int64(int8(v))
	case Uint8:
		return int64(uint8(v))
	case Int16:
		return int64(int16(v))
	case Uint16:
		return int64(uint16(v))
	case Bool:
		if v != 0 {
			return 1
		}
		return 0
	}
	return int64(int32(v))
}

// Int32s returns the elements of an INT32 tensor, or of a narrower integer tensor
// widened.
func (t *Tensor) Int32s() ([]int32, error) {
	switch t.DataType {
	case Int32, Int16, Int8, Uint16, Uint8:
	default:
		return nil, t.wrongType("int32")
	}
	v, err := t.Int64s()
	if err != nil {
		return nil, err
	}
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out, nil
}

// Bools returns the elements of a BOOL tensor (any non-zero byte is true).
func (t *Tensor) Bools() ([]bool, error) {
	if t.DataType != Bool {
		return nil, t.wrongType("bool")
	}
	v, err := t.Int64s()
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(v))
	for i, x := range v {
		out[i] = x != 0
	}
	return out, nil
}

// Constructors for tensors in the layout ONNX tools write: raw_data, little endian.

func rawTensor(name string, dt DataType, dims []int64, raw []byte) *Tensor {
	return &Tensor{Name: name, DataType: dt, Dims: append([]int64(nil), dims...), RawData: raw}
}

// rawLE is the data of a host vector in graph's little-endian layout
// (graph.AppendLE), which is ONNX's raw_data layout for these types.
func rawLE(t graph.Tensor) []byte {
	t.Shape = graph.Shape{max(len(t.F32), len(t.F64), len(t.I64), len(t.B))}
	return graph.AppendLE(make([]byte, 0, t.Len()*t.DType.Size()), &t)
}

// NewFloat32 makes a FLOAT tensor.
func NewFloat32(name string, dims []int64, v []float32) *Tensor {
	return rawTensor(name, Float, dims, rawLE(graph.Tensor{DType: graph.Float32, F32: v}))
}

// NewFloat64 makes a DOUBLE tensor.
func NewFloat64(name string, dims []int64, v []float64) *Tensor {
	return rawTensor(name, Double, dims, rawLE(graph.Tensor{DType: graph.Float64, F64: v}))
}

// NewFloat16 makes a FLOAT16 tensor, rounding each value.
func NewFloat16(name string, dims []int64, v []float32) *Tensor {
	return rawTensor(name, Float16, dims, rawLE(graph.Tensor{DType: graph.Float16, F32: v}))
}

// NewBFloat16 makes a BFLOAT16 tensor, rounding each value.
func NewBFloat16(name string, dims []int64, v []float32) *Tensor {
	return rawTensor(name, BFloat16, dims, rawLE(graph.Tensor{DType: graph.BFloat16, F32: v}))
}

// NewInt64 makes an INT64 tensor.
func NewInt64(name string, dims []int64, v []int64) *Tensor {
	return rawTensor(name, Int64, dims, rawLE(graph.Tensor{DType: graph.Int64, I64: v}))
}

// NewInt32 makes an INT32 tensor.
func NewInt32(name string, dims []int64, v []int32) *Tensor {
	raw := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(x))
	}
	return rawTensor(name, Int32, dims, raw)
}

// NewBool makes a BOOL tensor, one byte per element.
func NewBool(name string, dims []int64, v []bool) *Tensor {
	return rawTensor(name, Bool, dims, rawLE(graph.Tensor{DType: graph.Bool, B: v}))
}
