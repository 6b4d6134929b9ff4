package driver

import (
	"strings"
	"sync"
	"testing"

	"github.com/flashgraph/flashgraph/graph"
)

// Without NCCL every entry point fails with an error that names the library
// and says what it is for; with it, the version is reported.
func TestNCCLMissingSaysWhy(t *testing.T) {
	v, err := NCCLVersion()
	if err == nil {
		t.Skipf("NCCL %s is installed: nothing missing to report", ncclVersionString(v))
	}
	for _, want := range []string{"libnccl.so.2", "multi-GPU training"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if _, err2 := NewNCCLUniqueID(); err2 == nil || err2.Error() != err.Error() {
		t.Errorf("NewNCCLUniqueID without NCCL: got %v, want %v", err2, err)
	}
}

func TestNCCLVersionString(t *testing.T) {
	for code, want := range map[int]string{22703: "2.27.3", 21805: "2.18.5", 2804: "2.8.4"} {
		if got := ncclVersionString(code); got != want {
			t.Errorf("ncclVersionString(%d) = %q, want %q", code, got, want)
		}
	}
}

func TestNewCommRejectsBadRank(t *testing.T) {
	var id NCCLUniqueID
	// The arguments are checked before the device is touched.
	for _, rw := range [][2]int{{2, 2}, {-1, 2}, {0, 0}} {
		if _, err := (*Device)(nil).NewComm(id, rw[1], rw[0]); err == nil || !strings.Contains(err.Error(), "outside") {
			t.Errorf("rank %d of %d: got %v", rw[0], rw[1], err)
		}
	}
}

// Two GPUs of this process, one communicator: each device's rank all-reduces
// its own numbers and both must end with the exact sums. This is what the
// training loop's gradient all-reduce does, one process per GPU aside. It
// needs two GPUs and NCCL 2.23+, and runs on the two-GPU machine.
func TestNCCLAllReduceTwoGPUs(t *testing.T) {
	d0 := gpu(t)
	if n, err := DeviceCount(); err != nil || n < 2 {
		t.Skipf("needs 2 GPUs: %d, %v", n, err)
	}
	if _, err := NCCLVersion(); err != nil {
		t.Skip(err)
	}
	d1, err := Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer d1.Close()
	devs := []*Device{d0, d1}
	id, err := NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*Comm, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, d := range devs {
		wg.Go(func() { comms[r], errs[r] = d.NewComm(id, 2, r) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer func() {
		for _, c := range comms {
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		}
	}()

	// Small integers: the sums are exact in float32 and in bfloat16, so any
	// difference is a wrong reduction, not rounding.
	const n = 1<<20 + 3 // several NCCL chunks, and not a multiple of them
	value := func(r, i int) float32 { return float32((i*7+r*3)%61 - 30) }
	for _, typ := range []GemmType{GemmF32, GemmBF16} {
		bufs := make([]DevicePtr, 2)
		for r, d := range devs {
			if typ == GemmF32 {
				h := make([]float32, n)
				for i := range h {
					h[i] = value(r, i)
				}
				bufs[r], err = Upload(d, h)
			} else {
				h := make([]uint16, n)
				for i := range h {
					h[i] = graph.BF16FromFloat32(value(r, i))
				}
				bufs[r], err = Upload(d, h)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer d.Free(bufs[r])
		}
		for r := range devs {
			wg.Go(func() { errs[r] = comms[r].AllReduceSum(typ, bufs[r], bufs[r], n) })
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%s rank %d: %v", typ, r, err)
			}
		}
		for r, d := range devs {
			got := make([]float32, n)
			if typ == GemmF32 {
				err = Download(d, bufs[r], got)
			} else {
				h := make([]uint16, n)
				err = Download(d, bufs[r], h)
				for i, b := range h {
					got[i] = graph.BF16ToFloat32(b)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, g := range got {
				if want := value(0, i) + value(1, i); g != want {
					t.Fatalf("%s rank %d element %d: got %v, want %v", typ, r, i, g, want)
				}
			}
		}
	}
}
