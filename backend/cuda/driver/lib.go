package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// library is one dlopened shared object and the addresses of the entry points we use.
type library struct {
	name   string // the soname or path that dlopen accepted
	handle uintptr
}

// openLibrary tries each candidate name in order (newest first) and then the same
// names under the CUDA toolkit's lib64 directories, so that a toolkit that is
// installed but not in the loader's path is still found. The error lists every
// name tried, which is what a user needs to fix the installation.
func openLibrary(what string, names ...string) (*library, error) {
	var tried []string
	var firstErr error
	candidates := append([]string(nil), names...)
	for _, dir := range toolkitDirs() {
		for _, n := range names {
			candidates = append(candidates, filepath.Join(dir, "lib64", n))
		}
	}
	for _, n := range candidates {
		if strings.ContainsRune(n, '/') {
			if _, err := os.Stat(n); err != nil {
				continue
			}
		}
		h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return &library{name: n, handle: h}, nil
		}
		tried = append(tried, n)
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, fmt.Errorf("%s not found (tried %s): %v", what, strings.Join(tried, ", "), firstErr)
}

// toolkitDirs lists CUDA toolkit roots: $CUDA_HOME, $CUDA_PATH, then /usr/local/cuda.
func toolkitDirs() []string {
	var dirs []string
	seen := map[string]bool{}
	for _, d := range []string{os.Getenv("CUDA_HOME"), os.Getenv("CUDA_PATH"), "/usr/local/cuda"} {
		if d != "" && !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// symbols resolves each name into the uintptr it points at. It stops at the first
// missing symbol and names it: an old driver that lacks a versioned entry point
// should say so rather than crash later.
func (l *library) symbols(table map[string]*uintptr) error {
	for name, dst := range table {
		p, err := purego.Dlsym(l.handle, name)
		if err != nil || p == 0 {
			return fmt.Errorf("%s: symbol %s not found (library too old?)", l.name, name)
		}
		*dst = p
	}
	return nil
}

// optionalSymbol returns 0 when the symbol is absent.
func (l *library) optionalSymbol(name string) uintptr {
	p, err := purego.Dlsym(l.handle, name)
	if err != nil {
		return 0
	}
	return p
}

// ccall calls a C function whose arguments are all integers or pointers and whose
// result is an int status (CUresult, nvrtcResult, cublasStatus_t).
//
// The go:uintptrescapes directive keeps any Go object whose address was converted
// to uintptr in the call expression alive and unmoved until ccall returns, which is
// what lets callers write ccall(fn, uintptr(unsafe.Pointer(&out))).
//
//go:uintptrescapes
func ccall(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// cString returns a NUL-terminated copy of s. The caller keeps the slice alive
// (or pinned) while C reads it.
func cString(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

// goString copies a NUL-terminated C string. C memory is never moved by the Go
// runtime, so holding it as *byte is safe; nil gives "".
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// loadOnce runs a loader exactly once and remembers its result, so that a missing
// library is reported the same way on every call without retrying dlopen.
type loadOnce[T any] struct {
	once sync.Once
	val  T
	err  error
}

func (l *loadOnce[T]) get(load func() (T, error)) (T, error) {
	l.once.Do(func() { l.val, l.err = load() })
	return l.val, l.err
}

// errClosed is returned by every method of a Device after Close.
var errClosed = errors.New("cuda: device is closed")

// ToolkitDirs lists CUDA toolkit roots: $CUDA_HOME, $CUDA_PATH, then /usr/local/cuda.
func ToolkitDirs() []string { return toolkitDirs() }
