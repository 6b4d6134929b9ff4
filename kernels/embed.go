// Package kernels holds flashgraph's CUDA C++ kernel sources. They are embedded in
// the binary and compiled at run time by NVRTC for the GPU in hand (see
// backend/cuda.Device.Compile), so a Go build needs no CUDA toolkit.
//
// Every kernel entry point is declared extern "C" so that it can be looked up by its
// plain name, and each file is self-contained (it may include CUDA toolkit headers
// such as <cuda_bf16.h>, but no other file here), because the cubin cache key covers
// only the file's own text.
package kernels

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

// FS holds every *.cu file of this directory.
//
//go:embed *.cu
var FS embed.FS

// Source returns the text of an embedded kernel file; the ".cu" suffix may be left
// out ("util" and "util.cu" are the same file).
func Source(name string) (string, error) {
	if !strings.HasSuffix(name, ".cu") {
		name += ".cu"
	}
	b, err := FS.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("kernels: no embedded source %q (have %s)", name, strings.Join(Names(), ", "))
	}
	return string(b), nil
}

// Names lists the embedded kernel files, sorted.
func Names() []string {
	var names []string
	fs.WalkDir(FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".cu") {
			names = append(names, path)
		}
		return nil
	})
	sort.Strings(names)
	return names
}
