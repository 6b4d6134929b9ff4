package kernels

import (
	"strings"
	"testing"
)

func TestSource(t *testing.T) {
	for _, name := range []string{"util.cu", "util"} {
		src, err := Source(name)
		if err != nil {
			t.Fatalf("Source(%q): %v", name, err)
		}
		if !strings.Contains(src, `extern "C" __global__ void fill_f32`) {
			t.Fatalf("Source(%q) does not hold fill_f32", name)
		}
	}
	if _, err := Source("nope.cu"); err == nil || !strings.Contains(err.Error(), "util.cu") {
		t.Fatalf("missing file: got %v, want an error listing the files", err)
	}
}
