package onnx

import (
	"fmt"

	"github.com/flashgraph/flashgraph/graph"
	"github.com/flashgraph/flashgraph/onnx/onnxpb"
)

// ReadTensorProto decodes one serialized TensorProto (an input_N.pb or
// output_N.pb of an ONNX test data set) into a host tensor, with the name it
// carries ("" when it has none). Integer types widen to int64, our one
// integer type; the element count must agree with the dims (the data is not
// allocated from the dims alone).
func ReadTensorProto(b []byte) (string, *graph.Tensor, error) {
	pt, err := onnxpb.DecodeTensor(b)
	if err != nil {
		return "", nil, err
	}
	c, err := cvalFromTensor(pt)
	if err != nil {
		return pt.Name, nil, err
	}
	dt, ok := dtypeOf(pt.DataType)
	if !ok {
		if !isIntType(pt.DataType) {
			return pt.Name, nil, fmt.Errorf("tensor %q: element type %v is not supported", pt.Name, pt.DataType)
		}
		dt = graph.Int64
	}
	t := graph.NewTensor(dt, c.shape)
	for k := range t.Len() {
		switch {
		case c.f != nil:
			t.Set(k, c.f[k])
		case dt == graph.Int64:
			t.I64[k] = c.i[k]
		default:
			t.B[k] = c.i[k] != 0
		}
	}
	return pt.Name, t, nil
}

// EncodeTensorProto serializes t as a TensorProto called name, the way
// ReadTensorProto and ONNX's test runners read it.
func EncodeTensorProto(name string, t *graph.Tensor) ([]byte, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	pt, err := tensorProto(name, t)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	return onnxpb.EncodeTensor(pt), nil
}

// tensorProto is t as a TensorProto called name: the one conversion that
// EncodeTensorProto and the exporter's initializers share.
func tensorProto(name string, t *graph.Tensor) (*onnxpb.Tensor, error) {
	dims := dims64(t.Shape)
	var pt *onnxpb.Tensor
	switch t.DType {
	case graph.Float32:
		pt = onnxpb.NewFloat32(name, dims, t.F32)
	case graph.Float16:
		pt = onnxpb.NewFloat16(name, dims, t.F32)
	case graph.BFloat16:
		pt = onnxpb.NewBFloat16(name, dims, t.F32)
	case graph.Float64:
		pt = onnxpb.NewFloat64(name, dims, t.F64)
	case graph.Int64:
		pt = onnxpb.NewInt64(name, dims, t.I64)
	case graph.Bool:
		pt = onnxpb.NewBool(name, dims, t.B)
	default:
		return nil, fmt.Errorf("dtype %v cannot be written as a TensorProto", t.DType)
	}
	return pt, nil
}
