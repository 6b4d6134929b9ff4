// Package kernels holds flashgraph's CUDA C++ kernel sources. They are embedded in
// the binary and compiled at run time by NVRTC for the GPU in hand (see
// backend/cuda.Device.Compile), so a Go build needs no CUDA toolkit.
//
// Every kernel entry point is declared extern "C" so that it can be looked up by its
// plain name. A compile unit (a *.cu file) may include CUDA toolkit headers such as
// <cuda_bf16.h> and this package's own *.cuh headers with #include "name.cuh"
// (relative to the including file, as a C compiler would resolve it). Unit inlines
// the package's own headers before NVRTC sees the text, so the cubin cache key,
// which covers the text, covers them too; dev/ holds the variants kept only to time
// against, compiled only when asked for.
package kernels

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"
)

// FS holds every *.cu and *.cuh file of this directory and dev/'s NVRTC
// unit (dev/harness.cu, built with nvcc for development, is not embedded).
//
//go:embed *.cu *.cuh dev/flash_sm90_dev.cu
var FS embed.FS

// Source returns the text of an embedded kernel file as written (its own
// #include lines left in); the ".cu" suffix may be left out ("util" and
// "util.cu" are the same file). Unit is the text to compile.
func Source(name string) (string, error) {
	if !strings.HasSuffix(name, ".cu") && !strings.HasSuffix(name, ".cuh") {
		name += ".cu"
	}
	b, err := FS.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("kernels: no embedded source %q (have %s)", name, strings.Join(Names(), ", "))
	}
	return string(b), nil
}

// Unit returns the compile unit name (a *.cu file, the suffix may be left
// out) with this package's headers inlined: the text NVRTC compiles.
func Unit(name string) (string, error) {
	if !strings.HasSuffix(name, ".cu") {
		name += ".cu"
	}
	if _, err := fs.Stat(FS, name); err != nil {
		return "", fmt.Errorf("kernels: no embedded source %q (have %s)", name, strings.Join(Names(), ", "))
	}
	src, _, err := Expand(FS, name)
	return src, err
}

// Includes lists the package headers the compile unit name includes,
// directly or not, in the order they are inlined.
func Includes(name string) ([]string, error) {
	if !strings.HasSuffix(name, ".cu") {
		name += ".cu"
	}
	_, inc, err := Expand(FS, name)
	return inc, err
}

// localInclude matches an #include of a file of our own: a quoted name
// (toolkit headers are included with <...>).
var localInclude = regexp.MustCompile(`^\s*#\s*include\s+"([^"]+)"\s*$`)

// Expand returns the file name of fsys with every #include "file" replaced
// by that file's text (resolved relative to the including file, recursively),
// each file inlined once at most, as the headers' include guards would have
// it (so a cycle ends); and the files it inlined, in order. #include <...>
// lines are left for the compiler. A missing file is an error.
func Expand(fsys fs.FS, name string) (string, []string, error) {
	var b strings.Builder
	var included []string
	seen := map[string]bool{}
	var expand func(file string, stack []string) error
	expand = func(file string, stack []string) error {
		text, err := fs.ReadFile(fsys, file)
		if err != nil {
			if len(stack) > 0 {
				return fmt.Errorf("kernels: %s includes %q: %w", stack[len(stack)-1], file, err)
			}
			return fmt.Errorf("kernels: %w", err)
		}
		stack = append(stack, file)
		for _, line := range strings.SplitAfter(string(text), "\n") {
			m := localInclude.FindStringSubmatch(strings.TrimRight(line, "\r\n"))
			if m == nil {
				b.WriteString(line)
				continue
			}
			inc := path.Join(path.Dir(file), m[1])
			if seen[inc] {
				continue
			}
			seen[inc] = true
			included = append(included, inc)
			if err := expand(inc, stack); err != nil {
				return err
			}
			if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
				b.WriteString("\n")
			}
		}
		return nil
	}
	if err := expand(name, nil); err != nil {
		return "", nil, err
	}
	return b.String(), included, nil
}

// Names lists the embedded compile units (*.cu, dev/ included), sorted.
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
