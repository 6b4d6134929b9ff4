package onnxpb

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to the decoder. Decoding must never panic, and
// whatever decodes must re-encode to a fixed point: encode(decode(encode(m))) is
// encode(m). The tensor readers run on every decoded tensor, since they index
// into raw_data with lengths that came from the input.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(sampleModel()))
	f.Add(handModel())
	f.Add([]byte{})
	seeds, _ := filepath.Glob(filepath.Join("..", "testdata", "*.onnx"))
	for _, p := range seeds {
		if b, err := os.ReadFile(p); err == nil && len(b) < 1<<20 {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		if m.Graph != nil {
			_ = visitTensors(m.Graph, func(tt *Tensor) error {
				_, _ = tt.Float32s()
				_, _ = tt.Float64s()
				_, _ = tt.Int64s()
				_, _ = tt.Int32s()
				_, _ = tt.Bools()
				return nil
			})
		}
		enc := Encode(m)
		m2, err := Decode(enc)
		if err != nil {
			t.Fatalf("re-decoding our own encoding failed: %v", err)
		}
		if enc2 := Encode(m2); !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not a fixed point:\n%x\n%x", enc, enc2)
		}
	})
}

// FuzzDecodeValues feeds arbitrary bytes to the SequenceProto and
// OptionalProto decoders (test data files): never a panic, and what decodes
// re-encodes to a fixed point.
func FuzzDecodeValues(f *testing.F) {
	a := NewFloat32("", []int64{2}, []float32{1, 2})
	f.Add(EncodeSequence(&Sequence{Name: "s", ElemType: KindTensor, Tensors: []*Tensor{a, a}}))
	f.Add(EncodeOptional(&Optional{Name: "o", ElemType: KindSequence, Sequence: &Sequence{ElemType: KindTensor, Tensors: []*Tensor{a}}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if s, err := DecodeSequence(b); err == nil {
			enc := EncodeSequence(s)
			s2, err := DecodeSequence(enc)
			if err != nil || !bytes.Equal(EncodeSequence(s2), enc) {
				t.Fatalf("sequence: not a fixed point (%v)", err)
			}
		}
		if o, err := DecodeOptional(b); err == nil {
			enc := EncodeOptional(o)
			o2, err := DecodeOptional(enc)
			if err != nil || !bytes.Equal(EncodeOptional(o2), enc) {
				t.Fatalf("optional: not a fixed point (%v)", err)
			}
		}
	})
}
