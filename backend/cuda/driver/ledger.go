package driver

import "sync"

// allocLedger counts the device memory one Device has allocated and not yet
// freed, and the most that was ever live at once since the last resetPeak.
// It is what a benchmark reports as the memory a step took: unlike
// cuMemGetInfo's free memory, it sees only this Device's own allocations,
// so another process on the GPU (or one still releasing its memory) cannot
// move it. Like torch.cuda.max_memory_allocated it counts the bytes asked
// for, not what the driver rounds them up to, nor memory the libraries
// take on their own (module code, NCCL buffers, cuBLAS's internal workspace
// when it has none of ours).
//
// Allocations and frees happen on the device goroutine and reads on any
// goroutine; a mutex orders them. The zero value is an empty ledger.
type allocLedger struct {
	mu    sync.Mutex
	sizes map[DevicePtr]int64 // every live allocation and its size in bytes
	live  int64               // the sum of sizes
	peak  int64               // the largest live since the last resetPeak
}

// add records an allocation of bytes at p. An address the ledger already
// holds (which the driver hands out only after it was freed, so a free this
// ledger missed) is replaced rather than counted twice.
func (l *allocLedger) add(p DevicePtr, bytes int64) {
	if p == 0 || bytes <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sizes == nil {
		l.sizes = map[DevicePtr]int64{}
	}
	l.live += bytes - l.sizes[p]
	l.sizes[p] = bytes
	l.peak = max(l.peak, l.live)
}

// remove records that p was freed and returns its size; an address the
// ledger does not hold (memory allocated before the ledger saw it, or by
// someone else) returns false and changes nothing.
func (l *allocLedger) remove(p DevicePtr) (bytes int64, known bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	bytes, known = l.sizes[p]
	if known {
		delete(l.sizes, p)
		l.live -= bytes
	}
	return bytes, known
}

// stats returns the live bytes and their peak since the last resetPeak.
func (l *allocLedger) stats() (live, peak int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.live, l.peak
}

// resetPeak starts a new peak from the bytes live now, and returns them.
func (l *allocLedger) resetPeak() (live int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peak = l.live
	return l.live
}
