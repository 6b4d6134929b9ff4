// Package cudatest is what the test binaries of the CUDA packages (driver,
// attention, cuda) share: one device for all of a binary's GPU tests, opened
// before they run and closed after, and the skip of a GPU test on a machine
// without one. It imports no CUDA package, so that package driver's own
// tests can use it; each package passes its Available and Open.
package cudatest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"testing"
)

// Device is the device a test binary's GPU tests share. Declare one per
// package and call its Main from TestMain.
type Device[D io.Closer] struct {
	dev    D
	err    error // why there is no device
	opened bool
}

// Main opens device 0 when available reports a GPU, runs the tests, closes
// the device and exits with the tests' status; a failed Close fails the run.
// Without a GPU the tests still run, and Get skips each that needs one.
func (s *Device[D]) Main(m *testing.M, available func() error, open func(ordinal int) (D, error)) {
	if s.err = available(); s.err == nil {
		s.dev, s.err = open(0)
		s.opened = s.err == nil
	}
	code := m.Run()
	if s.opened {
		if err := s.dev.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "Close:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Get returns the shared device, or skips the test with the reason there
// is none.
func (s *Device[D]) Get(t testing.TB) D {
	t.Helper()
	if !s.opened {
		t.Skip(s.err)
	}
	return s.dev
}

// Device returns the shared device, the zero D (nil) when there is none:
// for code that runs outside a test function, such as a child process.
func (s *Device[D]) Device() D { return s.dev }

// HostCXX returns the host's g++, which the tests that parse or emulate
// kernel sources on the CPU use, or skips the test where there is none.
func HostCXX(t testing.TB) string {
	t.Helper()
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++ on PATH")
	}
	return gxx
}

// HostCXX86 is HostCXX on an x86-64 host only: the sources' inline asm
// carries NVPTX register constraints, and the emulations' stand-ins for
// CUDA's vector types assume its layout, which only x86-64 was checked with.
func HostCXX86(t testing.TB) string {
	t.Helper()
	if runtime.GOARCH != "amd64" {
		t.Skipf("checked with an x86-64 g++ only (GOARCH %s)", runtime.GOARCH)
	}
	return HostCXX(t)
}
