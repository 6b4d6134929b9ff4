package bench

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseTorchDecodeRows(t *testing.T) {
	in := `{"backend": "flash", "B": 2, "H": 16, "Sq": 1, "S": 16384, "D": 128, "causal": false, "dtype": "bfloat16", "fwd_ms": 0.05, "bwd_ms": null, "peak_mem_bytes": 100, "iters": 20, "gpu": "H200", "torch": "2.5", "error": null}

{"backend": "cudnn", "B": 2, "H": 16, "Sq": 1, "S": 16384, "D": 128, "causal": false, "dtype": "bfloat16", "fwd_ms": null, "bwd_ms": null, "peak_mem_bytes": null, "iters": 20, "gpu": "H200", "torch": "2.5", "error": "refused"}
`
	rows, err := parseTorchDecodeRows(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Impl != "torch-flash" || rows[0].Sq != 1 || rows[0].S != 16384 || rows[0].FwdMs == nil || *rows[0].FwdMs != 0.05 {
		t.Fatalf("rows %+v", rows)
	}
	// 4·B·H·Sq·S·D flops in 0.05 ms
	if want := 4.0 * 32 * 16384 * 128 / 0.05e-3 / 1e12; rows[0].FwdTFLOPs == nil || *rows[0].FwdTFLOPs != want {
		t.Errorf("TFLOP/s %v, want %v", rows[0].FwdTFLOPs, want)
	}
	if rows[1].Error == nil || *rows[1].Error != "refused" || rows[1].FwdMs != nil {
		t.Errorf("refused row %+v", rows[1])
	}
	if _, err := parseTorchDecodeRows(strings.NewReader(`{"backend": "flash", "B": 2, "H": 16, "S": 16384, "D": 128}`)); err == nil {
		t.Error("a record without Sq accepted")
	}
	var buf bytes.Buffer
	sh := []DecodeShape{{B: 2, H: 16, Sq: 1, Sk: 16384, D: 128}}
	printDecodeTable(&buf, sh, append([]benchRow{decodeRow(sh[0], "fused-decode", 0.025, 20, "H200")}, rows...))
	if !strings.Contains(buf.String(), "2.00x") || !strings.Contains(buf.String(), "flash") {
		t.Errorf("table:\n%s\nwant the decode forward at 2.00x the best SDPA backend (flash)", buf.String())
	}
}
