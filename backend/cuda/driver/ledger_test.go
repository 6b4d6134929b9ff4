package driver

// Tests of the allocation ledger: they need no GPU.

import (
	"sync"
	"testing"
)

// checkLedger fails unless l holds live bytes with the given peak.
func checkLedger(t *testing.T, l *allocLedger, what string, live, peak int64) {
	t.Helper()
	gotLive, gotPeak := l.stats()
	if gotLive != live || gotPeak != peak {
		t.Errorf("%s: live %d peak %d, want live %d peak %d", what, gotLive, gotPeak, live, peak)
	}
}

func TestAllocLedgerCountsLiveAndPeak(t *testing.T) {
	var l allocLedger // the zero value is ready
	checkLedger(t, &l, "empty", 0, 0)
	l.add(0x1000, 100)
	l.add(0x2000, 300)
	checkLedger(t, &l, "two allocations", 400, 400)
	if n, ok := l.remove(0x1000); !ok || n != 100 {
		t.Errorf("remove(0x1000) = %d, %v; want 100, true", n, ok)
	}
	checkLedger(t, &l, "after freeing the first", 300, 400)
	l.add(0x3000, 50)
	checkLedger(t, &l, "a smaller allocation stays under the peak", 350, 400)
	l.add(0x4000, 200)
	checkLedger(t, &l, "a larger one raises it", 550, 550)
	for _, p := range []DevicePtr{0x2000, 0x3000, 0x4000} {
		if _, ok := l.remove(p); !ok {
			t.Errorf("remove(%#x): not known", p)
		}
	}
	checkLedger(t, &l, "everything freed", 0, 550)
}

func TestAllocLedgerResetPeak(t *testing.T) {
	var l allocLedger
	l.add(0x1000, 1000)
	l.add(0x2000, 24)
	l.remove(0x1000)
	if live := l.resetPeak(); live != 24 {
		t.Errorf("resetPeak returned %d, want the 24 bytes live", live)
	}
	checkLedger(t, &l, "after reset", 24, 24)
	// What a step takes after the reset: up to 24+500+76, then back down.
	l.add(0x3000, 500)
	l.add(0x4000, 76)
	l.remove(0x3000)
	l.remove(0x4000)
	checkLedger(t, &l, "a step after the reset", 24, 600)
	if got := l.resetPeak(); got != 24 {
		t.Errorf("second resetPeak returned %d, want 24", got)
	}
	checkLedger(t, &l, "after the second reset", 24, 24)
}

func TestAllocLedgerUnknownPointer(t *testing.T) {
	var l allocLedger
	if n, ok := l.remove(0x1234); ok || n != 0 {
		t.Errorf("remove of a pointer never added on an empty ledger = %d, %v; want 0, false", n, ok)
	}
	l.add(0x1000, 64)
	if n, ok := l.remove(0x1234); ok || n != 0 {
		t.Errorf("remove of an unknown pointer = %d, %v; want 0, false", n, ok)
	}
	checkLedger(t, &l, "an unknown free changes nothing", 64, 64)
	l.remove(0x1000)
	if _, ok := l.remove(0x1000); ok {
		t.Error("a second free of the same pointer was known")
	}
	checkLedger(t, &l, "double free", 0, 64)
}

func TestAllocLedgerIgnoresEmptyAndReplacesReusedAddress(t *testing.T) {
	var l allocLedger
	l.add(0, 100)      // the null pointer (a zero-byte Alloc) holds nothing
	l.add(0x1000, 0)   // nor does an empty allocation
	l.add(0x2000, -10) // nor a nonsense size
	checkLedger(t, &l, "empty allocations", 0, 0)
	// The driver hands an address out again only after it was freed; a free
	// the ledger missed must not make the new allocation count twice.
	l.add(0x1000, 100)
	l.add(0x1000, 40)
	checkLedger(t, &l, "reused address", 40, 100)
	if n, _ := l.remove(0x1000); n != 40 {
		t.Errorf("remove returned %d bytes, want the 40 of the latest allocation", n)
	}
	checkLedger(t, &l, "after freeing it", 0, 100)
}

// Allocations on one goroutine (as on the device goroutine) while others
// read and reset the peak: run with -race. The peak read at any moment is at
// least the live bytes read with it, and the end state is exact.
func TestAllocLedgerConcurrent(t *testing.T) {
	var d Device // the ledger as the Device's public methods see it
	const rounds, size = 2000, 256
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				live, peak := d.allocs.stats()
				if peak < live || live < 0 || live > 3*size {
					t.Errorf("read live %d peak %d", live, peak)
					return
				}
				_ = d.AllocatedBytes() + d.PeakAllocatedBytes()
				d.ResetPeakAllocated()
			}
		}()
	}
	for i := range rounds {
		p := DevicePtr(0x10000 + 0x1000*(i%3))
		d.allocs.add(p, size)
		if i%3 == 2 {
			for j := range 3 {
				d.allocs.remove(DevicePtr(0x10000 + 0x1000*j))
			}
		}
	}
	close(stop)
	wg.Wait()
	live := int64(rounds%3) * size
	if got := d.AllocatedBytes(); got != live {
		t.Errorf("AllocatedBytes = %d, want %d", got, live)
	}
	if got := d.ResetPeakAllocated(); got != live {
		t.Errorf("ResetPeakAllocated = %d, want %d", got, live)
	}
	if got := d.PeakAllocatedBytes(); got != live {
		t.Errorf("PeakAllocatedBytes after reset = %d, want %d", got, live)
	}
}
