//go:build linux || darwin

package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// enospcAfter passes n bytes through and then fails with the errno a full
// disk gives.
type enospcAfter struct {
	w io.Writer
	n int
}

func (f *enospcAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k, _ := f.w.Write(p[:f.n])
		f.n = 0
		return k, &os.PathError{Op: "write", Path: "checkpoint", Err: syscall.ENOSPC}
	}
	f.n -= len(p)
	return f.w.Write(p)
}

// checkDiskFullOutcome: after a save of step 2 failed for lack of space, the
// error says so and names the previous checkpoint, the folder holds only that
// checkpoint (no partial file), and it loads with the data it was saved with.
func checkDiskFullOutcome(t *testing.T, dir, msg string, size int) {
	t.Helper()
	t.Logf("the failed save says: %s", msg)
	prev := CheckpointPath(dir, 1)
	for _, want := range []string{"no room for the checkpoint", "previous checkpoint " + prev + " (step 1) is untouched", "-resume continues from it"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != filepath.Base(prev) {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("folder holds %v after the failed save, want only %s", names, filepath.Base(prev))
	}
	p, s, err := LatestCheckpoint(dir)
	if err != nil || s != 1 {
		t.Fatalf("latest after the failed save: step %d, err %v; want step 1", s, err)
	}
	checkLoads(t, p, 1, size)
}

// TestCheckpointDiskFull: a write that fails with ENOSPC part way leaves the
// previous checkpoint loadable, and the error says so.
func TestCheckpointDiskFull(t *testing.T) {
	dir := t.TempDir()
	const size = 1000
	if _, err := SaveCheckpoint(dir, 1, ckptTensors(1, size), 0); err != nil {
		t.Fatal(err)
	}
	SaveHook = func(w io.Writer) io.Writer { return &enospcAfter{w: w, n: 5000} }
	defer func() { SaveHook = nil }()
	_, err := SaveCheckpoint(dir, 2, ckptTensors(2, size), 0)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("save on a full disk: err %v, want ENOSPC", err)
	}
	checkDiskFullOutcome(t, dir, err.Error(), size)
}

// TestCheckpointFileSizeLimit is the same with the kernel refusing the write:
// a child process limits the size of the files it may write
// (RLIMIT_FSIZE, so write(2) fails with EFBIG the way it fails with ENOSPC on
// a full disk), saves a small checkpoint, then a larger one that cannot fit.
func TestCheckpointFileSizeLimit(t *testing.T) {
	const small, large = 1000, 1 << 16 // 12 KB and 786 KB of tensors
	if dir := os.Getenv("FLASHGRAPH_FSIZE_HELPER"); dir != "" {
		lim := syscall.Rlimit{Cur: 256 << 10, Max: 256 << 10}
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
			fmt.Println("setrlimit:", err)
			return
		}
		if _, err := SaveCheckpoint(dir, 1, ckptTensors(1, small), 0); err != nil {
			fmt.Println("first save:", err)
			return
		}
		_, err := SaveCheckpoint(dir, 2, ckptTensors(2, large), 0)
		fmt.Printf("second save: %v\n", err)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckpointFileSizeLimit$")
	cmd.Env = append(os.Environ(), "FLASHGRAPH_FSIZE_HELPER="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var msg string
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "second save: "); ok {
			msg = rest
		}
	}
	if msg == "" || msg == "<nil>" || !strings.Contains(msg, syscall.EFBIG.Error()) {
		t.Fatalf("the helper's second save should fail with %q; it printed:\n%s", syscall.EFBIG.Error(), out)
	}
	checkDiskFullOutcome(t, dir, msg, small)
}
