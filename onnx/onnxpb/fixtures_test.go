package onnxpb

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestFixtures decodes every exported model in onnx/testdata and checks the op
// counts against the exporter's own record (fixtures.json), and that every
// initializer's data reads back with the length its dims promise.
func TestFixtures(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "fixtures.json"))
	if err != nil {
		t.Skipf("no fixtures: %v", err)
	}
	var index struct {
		Fixtures []struct {
			File     string           `json:"file"`
			Exporter string           `json:"exporter"`
			OK       bool             `json:"ok"`
			Opset    int64            `json:"opset"`
			Ops      map[string]int   `json:"ops"`
			Opsets   map[string]int64 `json:"opsets"`
		} `json:"fixtures"`
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		t.Fatal(err)
	}
	for _, fx := range index.Fixtures {
		if !fx.OK {
			continue
		}
		t.Run(fx.File, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("..", "testdata", fx.File))
			if err != nil {
				t.Fatal(err)
			}
			m, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := m.Opset(""); !ok || v != fx.Opset {
				t.Errorf("default opset %d (%v), want %d", v, ok, fx.Opset)
			}
			ops := map[string]int{}
			for _, n := range m.Graph.Node {
				ops[n.OpType]++
			}
			if len(ops) != len(fx.Ops) {
				t.Errorf("ops %v, want %v", ops, fx.Ops)
			}
			for op, c := range fx.Ops {
				if ops[op] != c {
					t.Errorf("%s ×%d, want ×%d", op, ops[op], c)
				}
			}
			for _, in := range m.Graph.Initializer {
				n, err := in.NumElements()
				if err != nil {
					t.Fatal(err)
				}
				var got int
				switch in.DataType {
				case Float, Float16, BFloat16:
					v, err := in.Float32s()
					if err != nil {
						t.Fatal(err)
					}
					got = len(v)
				default:
					v, err := in.Int64s()
					if err != nil {
						t.Fatal(err)
					}
					got = len(v)
				}
				if got != n {
					t.Fatalf("%s: %d elements, want %d", in.Name, got, n)
				}
			}
			enc := Encode(m)
			m2, err := Decode(enc)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(Encode(m2), enc) {
				t.Fatal("re-encoding is not a fixed point")
			}
			// TorchScript exports use only fields we model, so our encoder must give
			// back the reference runtime's bytes exactly; dynamo exports also carry
			// per-node metadata that we skip.
			if fx.Exporter == "torchscript" && !bytes.Equal(enc, b) {
				t.Error("re-encoded bytes differ from the file")
			}
			t.Logf("%d nodes, %d initializers; re-encoded %d of %d bytes (identical: %v)",
				len(m.Graph.Node), len(m.Graph.Initializer), len(enc), len(b), bytes.Equal(enc, b))
		})
	}
}
