package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/flashgraph/flashgraph/kernels"
)

// nvrtcAPI holds the NVRTC entry points. NVRTC needs no GPU and no context, so
// compiles run on the caller's goroutine and do not hold up the device goroutine.
type nvrtcAPI struct {
	lib                                            *library
	nvrtcCreateProgram, nvrtcDestroyProgram        uintptr
	nvrtcCompileProgram                            uintptr
	nvrtcGetProgramLogSize, nvrtcGetProgramLog     uintptr
	nvrtcGetCUBINSize, nvrtcGetCUBIN, nvrtcVersion uintptr
	errorString                                    func(int32) string
	version                                        string // "13.0"
}

var nvrtcLoad loadOnce[*nvrtcAPI]

// nvrtcNames lists the sonames newest first. The CUDA 11 names come last so that a
// machine without a GPU but with an old toolkit can still run the compile tests; on
// a GPU they would only be picked when no 12 or 13 toolkit exists.
var nvrtcNames = []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"}

func loadNVRTC() (*nvrtcAPI, error) {
	return nvrtcLoad.get(func() (*nvrtcAPI, error) {
		lib, err := openLibrary("NVRTC", nvrtcNames...)
		if err != nil {
			return nil, fmt.Errorf("cuda: %w (install the CUDA toolkit's NVRTC or set CUDA_HOME)", err)
		}
		api := &nvrtcAPI{lib: lib}
		var errStr uintptr
		err = lib.symbols(map[string]*uintptr{
			"nvrtcCreateProgram":     &api.nvrtcCreateProgram,
			"nvrtcDestroyProgram":    &api.nvrtcDestroyProgram,
			"nvrtcCompileProgram":    &api.nvrtcCompileProgram,
			"nvrtcGetProgramLogSize": &api.nvrtcGetProgramLogSize,
			"nvrtcGetProgramLog":     &api.nvrtcGetProgramLog,
			"nvrtcGetCUBINSize":      &api.nvrtcGetCUBINSize,
			"nvrtcGetCUBIN":          &api.nvrtcGetCUBIN,
			"nvrtcVersion":           &api.nvrtcVersion,
			"nvrtcGetErrorString":    &errStr,
		})
		if err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		// purego copies the returned const char* into a Go string for us.
		purego.RegisterFunc(&api.errorString, errStr)
		var major, minor int32
		if err := api.check("nvrtcVersion", ccall(api.nvrtcVersion, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor)))); err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		api.version = fmt.Sprintf("%d.%d", major, minor)
		return api, nil
	})
}

func (api *nvrtcAPI) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: api.errorString(r)}
}

// compile turns CUDA C++ source into a cubin. A failed compile returns an *Error
// whose Log holds NVRTC's diagnostics; a successful one may still return a log of
// warnings.
func (api *nvrtcAPI) compile(name, source string, opts []string) (cubin []byte, log string, err error) {
	src, cname := cString(source), cString(name)
	var prog uintptr
	if err := api.check("nvrtcCreateProgram", ccall(api.nvrtcCreateProgram,
		uintptr(unsafe.Pointer(&prog)), uintptr(unsafe.Pointer(&src[0])), uintptr(unsafe.Pointer(&cname[0])), 0, 0, 0)); err != nil {
		return nil, "", err
	}
	defer func() { ccall(api.nvrtcDestroyProgram, uintptr(unsafe.Pointer(&prog))) }()

	// The option array holds addresses of Go byte slices; both it and the strings
	// must stay put and alive while NVRTC reads them, hence the pinner.
	var pin runtime.Pinner
	defer pin.Unpin()
	copts := make([]uintptr, len(opts)+1) // +1 keeps &copts[0] valid with no options
	for i, o := range opts {
		b := cString(o)
		pin.Pin(&b[0])
		copts[i] = uintptr(unsafe.Pointer(&b[0]))
	}
	pin.Pin(&copts[0])
	compileErr := api.check("nvrtcCompileProgram", ccall(api.nvrtcCompileProgram, prog, uintptr(len(opts)), uintptr(unsafe.Pointer(&copts[0]))))

	var logSize uintptr
	if err := api.check("nvrtcGetProgramLogSize", ccall(api.nvrtcGetProgramLogSize, prog, uintptr(unsafe.Pointer(&logSize)))); err == nil && logSize > 1 {
		buf := make([]byte, logSize)
		if api.check("nvrtcGetProgramLog", ccall(api.nvrtcGetProgramLog, prog, uintptr(unsafe.Pointer(&buf[0])))) == nil {
			log = strings.TrimRight(string(buf), "\x00")
		}
	}
	if compileErr != nil {
		e := compileErr.(*Error)
		e.Log = fmt.Sprintf("%s (options %s):\n%s", name, strings.Join(opts, " "), log)
		return nil, log, e
	}
	var size uintptr
	if err := api.check("nvrtcGetCUBINSize", ccall(api.nvrtcGetCUBINSize, prog, uintptr(unsafe.Pointer(&size)))); err != nil {
		return nil, log, err
	}
	if size == 0 {
		return nil, log, fmt.Errorf("cuda: nvrtcGetCUBINSize: empty cubin for %s (was a virtual arch compute_XX given?)", name)
	}
	cubin = make([]byte, size)
	if err := api.check("nvrtcGetCUBIN", ccall(api.nvrtcGetCUBIN, prog, uintptr(unsafe.Pointer(&cubin[0])))); err != nil {
		return nil, log, err
	}
	return cubin, log, nil
}

// includeDir returns the first toolkit include directory that exists, so that
// #include <cuda_bf16.h> and friends resolve; "" when there is none.
func includeDir() string {
	for _, d := range toolkitDirs() {
		inc := filepath.Join(d, "include")
		if st, err := os.Stat(inc); err == nil && st.IsDir() {
			return inc
		}
	}
	return ""
}

// compileOptions is the full NVRTC option list for arch: the target, the include
// path, then the caller's extra options (which may override earlier ones).
func compileOptions(arch string, extra []string) []string {
	opts := []string{"--gpu-architecture=" + arch}
	if inc := includeDir(); inc != "" {
		opts = append(opts, "-I"+inc)
	}
	return append(opts, extra...)
}

// cacheKey identifies a cubin: the source, every option (the target included), the
// architecture and the NVRTC version, since a newer compiler may emit different
// code. Headers included from the toolkit are covered by the version; the
// kernels' own headers (kernels/*.cuh) by the source, since CompileFile hands
// NVRTC the compile unit with them inlined (kernels.Unit): editing a header
// changes the key of every unit that includes it.
func cacheKey(source string, opts []string, arch, nvrtcVersion string) string {
	h := sha256.New()
	for _, part := range append([]string{"flashgraph-cubin-v1", nvrtcVersion, arch, source}, opts...) {
		fmt.Fprintf(h, "%d:%s;", len(part), part) // length-prefixed: no two lists collide
	}
	return hex.EncodeToString(h.Sum(nil))
}

// defaultCacheDir is where cubins are kept unless FLASHGRAPH_CUBIN_CACHE says
// otherwise ("off" disables the cache, any other value is the directory).
func defaultCacheDir() string {
	switch v := os.Getenv("FLASHGRAPH_CUBIN_CACHE"); v {
	case "off", "0", "none", "false":
		return ""
	case "":
	default:
		return v
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(base, "flashgraph", "cubin")
}

// SetCubinCacheDir sets the directory of the on-disk cubin cache; "" turns the
// cache off. The default is os.UserCacheDir()/flashgraph/cubin.
func (d *Device) SetCubinCacheDir(dir string) {
	d.cacheMu.Lock()
	d.cacheDir, d.cacheDirSet = dir, true
	d.cacheMu.Unlock()
}

// CubinCacheDir returns the cache directory in use ("" when the cache is off).
func (d *Device) CubinCacheDir() string {
	d.cacheMu.Lock()
	defer d.cacheMu.Unlock()
	if !d.cacheDirSet {
		d.cacheDir, d.cacheDirSet = defaultCacheDir(), true
	}
	return d.cacheDir
}

// readCache returns the cached cubin for key, or nil.
func readCache(dir, key string) []byte {
	if dir == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(dir, key+".cubin"))
	if err != nil || len(b) == 0 {
		return nil
	}
	return b
}

// writeCache stores a cubin atomically (write a temporary file, then rename) so a
// concurrent reader never sees half a file. Failures are ignored: the cache is an
// optimisation, and a read-only home directory must not stop compilation.
func writeCache(dir, key string, cubin []byte) {
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	f, err := os.CreateTemp(dir, key+".*.tmp")
	if err != nil {
		return
	}
	_, werr := f.Write(cubin)
	cerr := f.Close()
	if werr != nil || cerr != nil || os.Rename(f.Name(), filepath.Join(dir, key+".cubin")) != nil {
		os.Remove(f.Name())
	}
}

// Compile compiles CUDA C++ source with NVRTC for this device's architecture and
// loads it as a module. name labels the program in diagnostics (e.g. "util.cu").
// extraOpts are passed to NVRTC after the defaults (--gpu-architecture=<Arch()>,
// -I<toolkit>/include), e.g. "-lineinfo", "--use_fast_math", "-DTILE=64".
//
// Cubins are cached on disk (see SetCubinCacheDir); a cached cubin that the driver
// refuses to load is recompiled and replaced. A compile error is an *Error whose
// message carries the NVRTC log.
func (d *Device) Compile(name, source string, extraOpts ...string) (*Module, error) {
	nv, err := loadNVRTC()
	if err != nil {
		return nil, err
	}
	arch := d.Arch()
	opts := compileOptions(arch, extraOpts)
	key := cacheKey(source, opts, arch, nv.version)
	dir := d.CubinCacheDir()
	if cubin := readCache(dir, key); cubin != nil {
		if m, err := d.loadModule(name, cubin); err == nil {
			m.fromCache = true
			return m, nil
		}
	}
	cubin, _, err := nv.compile(name, source, opts)
	if err != nil {
		return nil, fmt.Errorf("cuda: compiling %s for %s: %w", name, arch, err)
	}
	writeCache(dir, key, cubin)
	return d.loadModule(name, cubin)
}

// CompileFile compiles one of the embedded compile units (see package kernels),
// e.g. d.CompileFile("util.cu"), with the package's own headers inlined.
func (d *Device) CompileFile(file string, extraOpts ...string) (*Module, error) {
	src, err := kernels.Unit(file)
	if err != nil {
		return nil, err
	}
	return d.Compile(file, src, extraOpts...)
}

// NVRTCVersion is the loaded NVRTC's version ("13.0"); it needs no GPU.
func NVRTCVersion() (string, error) {
	api, err := loadNVRTC()
	if err != nil {
		return "", err
	}
	return api.version, nil
}

// NVRTCCompile compiles source with NVRTC and opts (CompileOptions), with
// no cubin cache and no GPU: for checks of the generated machine code.
func NVRTCCompile(name, source string, opts []string) (cubin []byte, log string, err error) {
	api, err := loadNVRTC()
	if err != nil {
		return nil, "", err
	}
	return api.compile(name, source, opts)
}

// CompileOptions are the NVRTC options Compile uses for arch, then extra.
func CompileOptions(arch string, extra []string) []string { return compileOptions(arch, extra) }
