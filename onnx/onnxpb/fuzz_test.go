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
