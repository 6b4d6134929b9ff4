package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// run refuses, from the memory plan and before allocating anything, forward
// passes that cannot fit: a long sequence (unfused attention grows with its
// square), a huge batch, and a graph file with a huge input. Each refusal is
// quick (nothing was allocated) and says what to change.
func TestRunRefusesWhatCannotFit(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skip("no /proc/meminfo: the available memory is not known here")
	}
	huge := filepath.Join(t.TempDir(), "huge.txt")
	if err := os.WriteFile(huge, []byte("flashgraph 1\ngraph huge\ninput x: float32[100000,100000]\nnode y = Relu(x) -> y: float32[100000,100000]\noutput y\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		hint string
	}{
		{[]string{"run", "-seq", "65536"}, "-seq"},
		{[]string{"run", "-batch", "16777216"}, "-batch"},
		{[]string{"run", huge}, "make its shapes smaller"},
	} {
		t0 := time.Now()
		code, _, stderr := runCode(c.args...)
		if code != 1 || !strings.Contains(stderr, "not enough memory") || !strings.Contains(stderr, c.hint) {
			t.Errorf("%v: exit %d, stderr:\n%s", c.args, code, stderr)
		}
		if strings.Contains(stderr, "forward in") || strings.Contains(stderr, "goroutine") {
			t.Errorf("%v ran or crashed:\n%s", c.args, stderr)
		}
		if took := time.Since(t0); took > 10*time.Second {
			t.Errorf("%v: refused after %v (allocated first?)", c.args, took)
		}
	}
}
