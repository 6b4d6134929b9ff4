package kernels

import (
	"slices"
	"strings"
	"testing"
	"testing/fstest"
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

func TestExpand(t *testing.T) {
	fsys := fstest.MapFS{
		"a.cu":        {Data: []byte("#include <cuda_bf16.h>\n#include \"b.cuh\"\n#include \"dev/c.cuh\"\nA\n")},
		"b.cuh":       {Data: []byte("B\n")},
		"dev/c.cuh":   {Data: []byte("#include \"../b.cuh\"\nC")},
		"dev/d.cu":    {Data: []byte("#include \"../b.cuh\"\nD\n")},
		"loop.cu":     {Data: []byte("#include \"loop.cuh\"\n")},
		"loop.cuh":    {Data: []byte("#include \"loop.cuh\"\n")},
		"missing.cu":  {Data: []byte("#include \"nope.cuh\"\n")},
		"indented.cu": {Data: []byte("  #  include \"b.cuh\"\n")},
	}
	for _, c := range []struct {
		name, want string
		inc        []string
	}{
		// Toolkit headers stay; ours are inlined once, relative to the includer.
		{"a.cu", "#include <cuda_bf16.h>\nB\nC\nA\n", []string{"b.cuh", "dev/c.cuh"}},
		{"dev/d.cu", "B\nD\n", []string{"b.cuh"}},
		{"indented.cu", "B\n", []string{"b.cuh"}},
		{"loop.cu", "", []string{"loop.cuh"}}, // inlined once: the cycle ends
	} {
		got, inc, err := Expand(fsys, c.name)
		if err != nil || got != c.want || !slices.Equal(inc, c.inc) {
			t.Errorf("Expand(%s) = %q, %v, %v; want %q, %v", c.name, got, inc, err, c.want, c.inc)
		}
	}
	for name, want := range map[string]string{"missing.cu": "nope.cuh", "none.cu": "none.cu"} {
		if _, _, err := Expand(fsys, name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Expand(%s): got %v, want an error mentioning %q", name, err, want)
		}
	}
}

func TestUnitsHaveNoLocalIncludes(t *testing.T) {
	for _, name := range Names() {
		src, err := Unit(name)
		if err != nil {
			t.Fatalf("Unit(%s): %v", name, err)
		}
		if strings.Contains(src, "#include \"") {
			t.Errorf("Unit(%s) still holds a local #include", name)
		}
	}
	if _, err := Unit("nope"); err == nil || !strings.Contains(err.Error(), "util.cu") {
		t.Errorf("Unit of a missing file: got %v, want an error listing the files", err)
	}
}
