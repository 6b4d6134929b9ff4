package main

// Tests of what a new user meets in the first hour: each one is a rough edge
// that was found by trying the commands, fixed, and kept fixed here.

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/backend/cpu"
)

// A training run whose memory plan cannot fit is refused before anything is
// compiled or written, naming the estimate and the way out.
func TestTrainRefusesARunThatCannotFit(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skip("no /proc/meminfo: the available memory is not known here")
	}
	out := filepath.Join(t.TempDir(), "out")
	// 2^24 sequences of 32 bytes: the logits alone are 512 GiB.
	code, _, stderr := runCode("train", "-batch", "16777216", "-steps", "1", "-data", trainData(t), "-out", out)
	if code != 1 || !strings.Contains(stderr, "not enough memory") || !strings.Contains(stderr, "-force") || !strings.Contains(stderr, "needs about") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("the refused run created %s (%v)", out, err)
	}
}

func TestCheckMemoryForce(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		t.Skip("no /proc/meminfo")
	}
	huge := memoryNeed{Total: 1 << 60, Activations: 1 << 60}
	var w bytes.Buffer
	if err := checkMemory(&w, cpu.New(), huge, "x", false); err == nil {
		t.Fatal("1 EiB fits?")
	}
	if err := checkMemory(&w, cpu.New(), huge, "x", true); err != nil || !strings.Contains(w.String(), "because of -force") {
		t.Fatalf("-force: err %v, output %q", err, w.String())
	}
	w.Reset()
	if err := checkMemory(&w, cpu.New(), memoryNeed{Total: 1 << 10}, "x", false); err != nil || !strings.Contains(w.String(), "available") {
		t.Fatalf("1 KiB: err %v, output %q", err, w.String())
	}
}

// Runs that fail to start leave -out as it was: no empty folders, no
// overwritten graphs of the run they refused to continue.
func TestFailedTrainRunsLeaveOutputAlone(t *testing.T) {
	data := trainData(t)
	dir := t.TempDir()
	fresh := filepath.Join(dir, "fresh")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-dtype", "bf16", "-device", "cpu"}, "-dtype bf16 is mixed precision on CUDA"},
		{[]string{"-resume"}, "no checkpoint in"},
		{[]string{"-lr", "-1"}, "learning rate must be positive"},
	} {
		code, _, stderr := runCode(tinyTrainArgs(data, fresh, "2", c.args...)...)
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("train %v: exit %d, stderr lacks %q:\n%s", c.args, code, c.want, stderr)
		}
		if _, err := os.Stat(fresh); !os.IsNotExist(err) {
			t.Fatalf("train %v failed but created %s", c.args, fresh)
		}
		if strings.Contains(stderr, "train: train:") {
			t.Errorf("doubled prefix: %s", stderr)
		}
	}

	out := filepath.Join(dir, "out")
	runCLI(t, tinyTrainArgs(data, out, "2")...)
	before := readAll(t, out)
	// Another model: refused, and the first run's graphs stay.
	code, _, stderr := runCode(tinyTrainArgs(data, out, "4", "-resume", "-layers", "1")...)
	if code != 1 || !strings.Contains(stderr, "another model") {
		t.Fatalf("mismatched -resume: exit %d:\n%s", code, stderr)
	}
	// The checkpoint already reached -steps: an error saying how to go on.
	code, _, stderr = runCode(tinyTrainArgs(data, out, "2", "-resume")...)
	if code != 1 || !strings.Contains(stderr, "nothing to train") || !strings.Contains(stderr, "raise -steps") {
		t.Fatalf("-resume at -steps: exit %d:\n%s", code, stderr)
	}
	if after := readAll(t, out); !equalFiles(before, after) {
		t.Errorf("failed runs changed %s: %v before, %v after", out, keys(before), keys(after))
	}
	// Raising -steps continues.
	stdout, _ := runCLI(t, tinyTrainArgs(data, out, "3", "-resume")...)
	if !strings.Contains(stdout, "this run: 2 to 3") {
		t.Errorf("-resume -steps 3 did not continue from 2:\n%s", stdout)
	}
	// An -out that is a file is refused before anything else.
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	if code, _, stderr := runCode(tinyTrainArgs(data, file, "1")...); code != 1 || !strings.Contains(stderr, "-out "+file+": is a file") {
		t.Errorf("-out FILE: exit %d: %s", code, stderr)
	}
}

func readAll(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	m := map[string][]byte{}
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			b, _ := os.ReadFile(p)
			m[p] = b
		}
		return nil
	})
	return m
}

func equalFiles(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, filepath.Base(k))
	}
	sort.Strings(out)
	return out
}

// -explain and -plan are reports: printed on stdout without the graph text
// after them, unless the graph is asked for with -o -.
func TestCompileReportsAreNotBuried(t *testing.T) {
	const header = "flashgraph 1\n"
	stdout, _ := runCLI(t, "compile", "-fuse", "-explain")
	if !strings.Contains(stdout, ": fused into ") || strings.Contains(stdout, header) {
		t.Errorf("compile -fuse -explain stdout:\n%.600s", stdout)
	}
	stdout, _ = runCLI(t, "compile", "-fuse", "-plan")
	if !strings.Contains(stdout, "memory plan of tiny (training step") || strings.Contains(stdout, header) {
		t.Errorf("compile -fuse -plan stdout:\n%.600s", stdout)
	}
	stdout, stderr := runCLI(t, "compile", "-fuse", "-explain", "-o", "-")
	if !strings.HasPrefix(stdout, header) || !strings.Contains(stderr, ": fused into ") {
		t.Errorf("compile -explain -o -: stdout %.100q, stderr %.300q", stdout, stderr)
	}
	stdout, _ = runCLI(t, "compile")
	if !strings.HasPrefix(stdout, header) {
		t.Errorf("compile with no report: stdout %.100q", stdout)
	}
}

// An output path that is a folder is a clear error naming it.
func TestOutputThatIsAFolder(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"compile", "-o", dir},
		{"compile", "-dot", dir},
		{"dot", "-o", dir},
	} {
		code, _, stderr := runCode(args...)
		if code != 1 || !strings.Contains(stderr, dir+": is a folder") || strings.Contains(stderr, ".tmp") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
}

// `<cmd> -h` is help that was asked for: on stdout, exit 0. A bad flag's
// usage stays on stderr.
func TestHelpGoesToStdout(t *testing.T) {
	for name := range commands {
		code, stdout, stderr := runCode(name, "-h")
		if code != 0 || !strings.Contains(stdout, "Usage: flashgraph "+name) || stderr != "" {
			t.Errorf("%s -h: exit %d, stdout %.80q, stderr %.80q", name, code, stdout, stderr)
		}
	}
	if code, stdout, stderr := runCode("run", "-nope"); code != 2 || stdout != "" || !strings.Contains(stderr, "Usage:") {
		t.Errorf("run -nope: exit %d, stdout %q", code, stdout)
	}
}

// The commands share their defaults (-config tiny, -device cpu), except the
// GPU comparisons, whose help says why.
func TestDefaultsAgree(t *testing.T) {
	def := regexp.MustCompile(`(?m)^  -(config|device) string\n.*\(default "([a-z0-9]+)"\)`)
	want := map[string]string{"config": defaultConfig, "device": defaultDevice}
	except := map[string]map[string]string{
		"parity": {"config": "small", "device": "cuda"},
		"bench":  {"device": "cuda"},
	}
	seen := 0
	for name := range commands {
		_, stdout, _ := runCode(name, "-h")
		for _, m := range def.FindAllStringSubmatch(stdout, -1) {
			seen++
			w := want[m[1]]
			if e, ok := except[name][m[1]]; ok {
				w = e
				if !strings.Contains(stdout, "Unlike the other commands") && !strings.Contains(stdout, "only cuda") {
					t.Errorf("%s: -%s defaults to %s without saying why", name, m[1], e)
				}
			}
			if m[2] != w {
				t.Errorf("%s -%s defaults to %q, want %q", name, m[1], m[2], w)
			}
		}
	}
	if seen < 6 {
		t.Fatalf("found only %d -config/-device defaults in the help texts", seen)
	}
}

// Long work says what it is doing and roughly how long it takes before it
// goes quiet.
func TestLongWorkIsSignposted(t *testing.T) {
	_, stderr := runCLI(t, "run")
	if !regexp.MustCompile(`run: forward pass of tiny \([0-9.]+ MFLOP of matrix products\) on cpu, roughly .* on this CPU`).MatchString(stderr) {
		t.Errorf("run does not say what it does:\n%s", stderr)
	}
	_, stderr = runCLI(t, tinyTrainArgs(trainData(t), filepath.Join(t.TempDir(), "o"), "2")...)
	for _, want := range []string{"memory: training tiny", "time: ", "steps take roughly", "compiling the training step on cpu"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("train stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// The project's docs stand alone: no paths of the machine they were written
// on, and every .md file they name exists in the repository.
func TestDocsStandAlone(t *testing.T) {
	root := "../.."
	files := []string{"README.md", "BENCHMARKS.md", "Makefile", "tools/reference/README.md"}
	more, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, m := range more {
		rel, _ := filepath.Rel(root, m)
		files = append(files, rel)
	}
	bad := regexp.MustCompile(`/work/|\.\./shared|shared/GPU|\.library|/home/|/tmp/|lent ` + "`" + `nvidia`)
	mdRef := regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_]\.md\b`)
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if m := bad.Find(b); m != nil {
			t.Errorf("%s points outside the repository: %q", f, m)
		}
		for _, ref := range mdRef.FindAllString(string(b), -1) {
			ok := false
			for _, base := range []string{root, filepath.Join(root, filepath.Dir(f))} {
				if _, err := os.Stat(filepath.Join(base, ref)); err == nil {
					ok = true
				}
			}
			if !ok {
				t.Errorf("%s names %s, which is not in the repository", f, ref)
			}
		}
	}
}
