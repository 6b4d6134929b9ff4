package driver

import (
	"testing"

	"github.com/flashgraph/flashgraph/kernels"
)

// The sm90 attention compile units, as package attention names them
// (flashSM90FwdFile, flashSM90BwdFile, flashSM90DevFile there): the NVRTC
// tests of this package compile and key them, and attention imports this
// package, so its names cannot be imported here.
const (
	flashSM90FwdFile = "flash_sm90_fwd.cu"
	flashSM90BwdFile = "flash_sm90_bwd.cu"
	flashSM90DevFile = "dev/flash_sm90_dev.cu"
)

var flashSM90Files = []string{flashSM90FwdFile, flashSM90BwdFile, flashSM90DevFile}

// flashSM90Sources is each sm90 unit's text as CompileFile hands it to NVRTC.
func flashSM90Sources(tb testing.TB) map[string]string {
	tb.Helper()
	srcs := map[string]string{}
	for _, f := range flashSM90Files {
		src, err := kernels.Unit(f)
		if err != nil {
			tb.Fatal(err)
		}
		srcs[f] = src
	}
	return srcs
}
