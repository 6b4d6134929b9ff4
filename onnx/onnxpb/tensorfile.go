package onnxpb

// EncodeTensor serializes one TensorProto on its own, as ONNX's test data
// sets store each input and expected output (test_data_set_N/input_0.pb).
func EncodeTensor(t *Tensor) []byte { return appendTensor(nil, t) }
