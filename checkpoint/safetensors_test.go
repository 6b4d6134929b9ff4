package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// sampleTensors has one tensor of every dtype, a scalar and an empty one.
func sampleTensors() *Tensors {
	f32 := graph.NewTensor(graph.Float32, graph.Shape{2, 3})
	copy(f32.F32, []float32{1.5, -2, float32(math.Inf(1)), 3.25e-30, 0, float32(math.Copysign(0, -1))})
	f64 := graph.NewTensor(graph.Float64, graph.Shape{3})
	copy(f64.F64, []float64{math.Pi, -1e300, 5e-324})
	bf := graph.NewTensor(graph.BFloat16, graph.Shape{3})
	for i, v := range []float32{1.0078125, -3.5, 1e20} {
		bf.F32[i] = graph.RoundBF16(v)
	}
	f16 := graph.NewTensor(graph.Float16, graph.Shape{5})
	for i, v := range []float32{1.0009765625, -65504, 6e-8, 0.1, float32(math.Inf(-1))} {
		f16.F32[i] = graph.RoundF16(v)
	}
	i64 := graph.NewTensor(graph.Int64, graph.Shape{2, 2})
	copy(i64.I64, []int64{math.MinInt64, -1, 0, math.MaxInt64})
	b := graph.NewTensor(graph.Bool, graph.Shape{3})
	copy(b.B, []bool{true, false, true})
	sc := graph.NewTensor(graph.Float32, graph.Shape{})
	sc.F32[0] = 42
	empty := graph.NewTensor(graph.Float32, graph.Shape{0, 4})
	return &Tensors{
		Tensors: map[string]*graph.Tensor{
			"w.f32": f32, "w.f64": f64, "w.bf16": bf, "w.f16": f16, "idx": i64, "mask": b, "scalar": sc, "empty": empty,
		},
		Metadata: map[string]string{"step": "12", "note": "ünïcode \"quoted\""},
	}
}

func encode(t *testing.T, ts *Tensors) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, ts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sameBits(a, b *graph.Tensor) bool {
	if !a.Type().Equal(b.Type()) || a.Len() != b.Len() {
		return false
	}
	for i := range a.Len() {
		switch {
		case a.F32 != nil:
			if math.Float32bits(a.F32[i]) != math.Float32bits(b.F32[i]) {
				return false
			}
		case a.F64 != nil:
			if math.Float64bits(a.F64[i]) != math.Float64bits(b.F64[i]) {
				return false
			}
		case a.I64 != nil:
			if a.I64[i] != b.I64[i] {
				return false
			}
		case a.B != nil:
			if a.B[i] != b.B[i] {
				return false
			}
		}
	}
	return true
}

func TestSafetensorsRoundTrip(t *testing.T) {
	in := sampleTensors()
	data := encode(t, in)
	n := binary.LittleEndian.Uint64(data)
	if (8+n)%8 != 0 {
		t.Errorf("data starts at %d, not 8-byte aligned", 8+n)
	}
	out, err := ReadSafetensors(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Tensors) != len(in.Tensors) {
		t.Fatalf("%d tensors back, wrote %d", len(out.Tensors), len(in.Tensors))
	}
	for name, want := range in.Tensors {
		if got := out.Tensors[name]; got == nil || !sameBits(got, want) {
			t.Errorf("%s: got %+v, want %+v", name, got, want)
		}
	}
	for k, v := range in.Metadata {
		if out.Metadata[k] != v {
			t.Errorf("metadata %s = %q, want %q", k, out.Metadata[k], v)
		}
	}
	// Writing is deterministic: the same tensors give the same bytes.
	if !bytes.Equal(data, encode(t, sampleTensors())) {
		t.Error("two encodings of the same tensors differ")
	}
	// The header is standard: dtype codes and sizes other tools read.
	var hdr map[string]json.RawMessage
	json.Unmarshal(data[8:8+n], &hdr)
	var e stEntry
	json.Unmarshal(hdr["w.bf16"], &e)
	if e.DType != "BF16" || e.Offsets[1]-e.Offsets[0] != 6 {
		t.Errorf("bf16 entry %+v, want BF16 with 2 bytes per element", e)
	}
	json.Unmarshal(hdr["scalar"], &e)
	if e.Shape == nil || len(e.Shape) != 0 {
		t.Errorf("scalar shape %v, want []", e.Shape)
	}
}

func TestSafetensorsCorrupt(t *testing.T) {
	good := encode(t, sampleTensors())
	// Every truncation is an error, never a panic.
	for n := range len(good) {
		if _, err := ReadSafetensors(good[:n]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", n, len(good))
		}
	}
	// Trailing garbage is an error too.
	if _, err := ReadSafetensors(append(append([]byte{}, good...), 0)); err == nil || !strings.Contains(err.Error(), "after the last tensor") {
		t.Errorf("trailing byte: err %v", err)
	}
	// Flipping any header byte gives an error or a valid reading, never a
	// panic.
	n := int(binary.LittleEndian.Uint64(good))
	for i := range 8 + n {
		bad := append([]byte{}, good...)
		bad[i] ^= 0x5a
		ReadSafetensors(bad)
	}

	header := func(h string, body int) []byte {
		b := make([]byte, 8, 8+len(h)+body)
		binary.LittleEndian.PutUint64(b, uint64(len(h)))
		return append(append(b, h...), make([]byte, body)...)
	}
	for _, c := range []struct {
		name, header string
		body         int
		want         string
	}{
		{"not json", `{"a": nope}`, 0, "not a JSON object"},
		{"bad dtype", `{"a":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}}`, 1, "unsupported dtype"},
		{"size mismatch", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4, "needs 8 bytes"},
		{"past end", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4, "outside"},
		{"gap", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8, "overlap or gap"},
		{"overlap", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4, "overlap or gap"},
		{"negative dim", `{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4, "bad shape"},
		{"huge shape", `{"a":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,4]}}`, 4, "larger than the file"},
		{"bad offsets", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}`, 4, "data_offsets"},
		{"bad metadata", `{"__metadata__":{"a":1}}`, 0, "__metadata__"},
	} {
		_, err := ReadSafetensors(header(c.header, c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one mentioning %q", c.name, err, c.want)
		}
	}
	huge := make([]byte, 16)
	binary.LittleEndian.PutUint64(huge, math.MaxUint64)
	if _, err := ReadSafetensors(huge); err == nil {
		t.Error("header length 2^64-1: no error")
	}
}

// FuzzReadSafetensors: no input makes the reader panic, and whatever it
// accepts writes back to something it reads the same.
func FuzzReadSafetensors(f *testing.F) {
	var buf bytes.Buffer
	WriteSafetensors(&buf, sampleTensors())
	f.Add(buf.Bytes())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, err := ReadSafetensors(data)
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := WriteSafetensors(&out, ts); err != nil {
			return // e.g. a tensor named "" that the reader accepted
		}
		back, err := ReadSafetensors(out.Bytes())
		if err != nil {
			t.Fatalf("rewrite does not read back: %v", err)
		}
		for n, x := range ts.Tensors {
			if y := back.Tensors[n]; y == nil || !sameBits(x, y) {
				// f16 NaN payloads are canonicalised; anything else must be exact.
				if x.DType != graph.Float16 {
					t.Fatalf("tensor %s changed on rewrite", n)
				}
			}
		}
	})
}

// TestSafetensorsMetadata reads a file's metadata from its header alone:
// the metadata written, and errors for a header the file does not hold.
func TestSafetensorsMetadata(t *testing.T) {
	in := sampleTensors()
	dir := t.TempDir()
	p := filepath.Join(dir, "x.safetensors")
	if err := os.WriteFile(p, encode(t, in), 0o644); err != nil {
		t.Fatal(err)
	}
	meta, err := ReadSafetensorsMetadata(p)
	if err != nil || !maps.Equal(meta, in.Metadata) {
		t.Fatalf("metadata %v, %v; want %v", meta, err, in.Metadata)
	}
	for _, c := range []struct {
		data []byte
		want string
	}{
		{[]byte{1, 2}, "header length"},
		{binary.LittleEndian.AppendUint64(nil, 1<<62), "over the"},
		{append(binary.LittleEndian.AppendUint64(nil, 100), "{}"...), "header says 100 bytes, the file has 2"},
		{append(binary.LittleEndian.AppendUint64(nil, 2), "{["...), "header:"},
	} {
		bad := filepath.Join(dir, "bad.safetensors")
		if err := os.WriteFile(bad, c.data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadSafetensorsMetadata(bad); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err %v, want %q", c.data, err, c.want)
		}
	}
}
