package checkpoint

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// stFile builds a safetensors file from a header and a body of zeros.
func stFile(header string, body int) []byte {
	b := make([]byte, 8, 8+len(header)+body)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	return append(append(b, header...), make([]byte, body)...)
}

// TestSafetensorsCostBoundedByFile: what the reader allocates is bounded by
// the file's size, whatever the header claims: the header must fit in the
// file, every shape must fit in the data bytes, the offsets must tile the data
// exactly, and so a tensor count or a rank is paid for in header bytes. The
// inputs are the cheapest ways to ask for a lot: many empty tensors, one
// shape of enormous rank, half-precision data that widens to float32.
func TestSafetensorsCostBoundedByFile(t *testing.T) {
	var many strings.Builder
	many.WriteString("{")
	for i := range 20000 {
		if i > 0 {
			many.WriteString(",")
		}
		fmt.Fprintf(&many, `"t%d":{"dtype":"BOOL","shape":[0],"data_offsets":[0,0]}`, i)
	}
	many.WriteString("}")
	rank := `{"r":{"dtype":"F32","shape":[0` + strings.Repeat(",2147483647", 100000) + `],"data_offsets":[0,0]}}`
	const halfs = 1 << 20
	half := fmt.Sprintf(`{"h":{"dtype":"BF16","shape":[%d],"data_offsets":[0,%d]}}`, halfs, 2*halfs)
	for _, c := range []struct {
		name string
		file []byte
	}{
		{"20000 empty tensors", stFile(many.String(), 0)},
		{"rank 100001", stFile(rank, 0)},
		{"bf16 widening", stFile(half, 2*halfs)},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if _, err := ReadSafetensors(c.file); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		runtime.ReadMemStats(&after)
		alloc := after.TotalAlloc - before.TotalAlloc
		ratio := float64(alloc) / float64(len(c.file))
		t.Logf("%s: %d-byte file, %d bytes allocated (%.1f per byte)", c.name, len(c.file), alloc, ratio)
		// 64 bytes per input byte: JSON decoding of many small objects
		// costs tens of bytes per byte; a reader that materialised what a
		// header claims would be off by orders of magnitude.
		if ratio > 64 {
			t.Errorf("%s: %.1f bytes allocated per file byte, over 64", c.name, ratio)
		}
	}
}
