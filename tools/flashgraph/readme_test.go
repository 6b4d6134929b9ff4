package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// readmeBlock returns the command lines of README.md's "## Using it" block:
// comments stripped, comment-only lines dropped.
func readmeBlock(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "## Using it\n")
	if i < 0 {
		t.Fatal(`README.md has no "## Using it" section`)
	}
	s = s[i:]
	start := strings.Index(s, "```sh\n")
	if start < 0 {
		t.Fatal("no ```sh block under ## Using it")
	}
	s = s[start+len("```sh\n"):]
	s = s[:strings.Index(s, "```")]
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		in := false // inside "double quotes", where # is text
		for k, r := range l {
			if r == '"' {
				in = !in
			}
			if r == '#' && !in && (k == 0 || l[k-1] == ' ') {
				l = l[:k]
				break
			}
		}
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// shellWords splits a command line as sh does for the README's lines: words
// separated by blanks, "double quotes" keeping blanks.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	in, have := false, false
	for _, r := range line {
		switch {
		case r == '"':
			in, have = !in, true
		case (r == ' ' || r == '\t') && !in:
			if have {
				words = append(words, w.String())
				w.Reset()
				have = false
			}
		default:
			w.WriteRune(r)
			have = true
		}
	}
	if in {
		t.Fatalf("unbalanced quotes in README line %q", line)
	}
	if have {
		words = append(words, w.String())
	}
	return words
}

// needsGPU says whether a README line runs on a GPU (or compares with
// PyTorch there): such lines are checked for their flags only.
func needsGPU(args []string) bool {
	if args[0] == "bench" || args[0] == "parity" {
		return true
	}
	for i, a := range args {
		if (a == "-device" && i+1 < len(args) && args[i+1] == "cuda") || (a == "-dtype" && i+1 < len(args) && args[i+1] == "bf16") {
			return true
		}
	}
	return false
}

// yourFiles are the files README lines name that the reader brings (a model,
// its test data, a token file): those lines are checked for their flags only.
var yourFiles = []string{"model.onnx", "train.bin", "mask.pb", "test_data_set_0"}

// needsYourFiles says whether a README line reads one of yourFiles.
func needsYourFiles(args []string) bool {
	for _, a := range args {
		for _, f := range yourFiles {
			if a == f || strings.HasSuffix(a, "="+f) {
				return true
			}
		}
	}
	return false
}

// withHelp is args with -h among the flags: before a graph FILE operand
// (flags come before positional arguments), else at the end.
func withHelp(args []string) []string {
	n := len(args)
	if last := args[n-1]; strings.HasSuffix(last, ".onnx") || strings.HasSuffix(last, ".txt") {
		return append(append(append([]string(nil), args[:n-1]...), "-h"), last)
	}
	return append(append([]string(nil), args...), "-h")
}

// TestReadmeCommandsRun runs the README's "Using it" block in a fresh
// folder, in order, so that the sequence cannot rot: every CPU line runs as
// written, with one change: train's -steps are divided by 10 (the README's
// 300 and 400 tiny steps take about 15 s; the test trains 30 and resumes to
// 40, the same sequence). The line that trains small for ~20 minutes and the
// GPU lines and those on the reader's own files (yourFiles) run with -h
// after their flags: every flag must exist and parse.
func TestReadmeCommandsRun(t *testing.T) {
	lines := readmeBlock(t)
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	// train -ranks N starts its ranks as helper processes of this binary.
	old := rankCommand
	rankCommand = helperRankCommand
	t.Cleanup(func() { rankCommand = old })
	t.Setenv("FLASHGRAPH_TRAIN_HELPER", "1")
	data := filepath.Join(t.TempDir(), "data.txt")
	if err := os.WriteFile(data, []byte(strings.Repeat("func main() { fmt.Println(\"hello, world\") }\n", 400)), 0o644); err != nil {
		t.Fatal(err)
	}
	ran, checked := 0, 0
	for _, line := range lines {
		words := shellWords(t, line)
		switch {
		case words[0] == "go" && len(words) >= 4 && words[1] == "build":
			// The test binary is the CLI; the package the line builds must exist.
			if st, err := os.Stat(filepath.Join(repo, words[len(words)-1])); err != nil || !st.IsDir() {
				t.Errorf("README builds %s, which is not a package folder of the repository", words[len(words)-1])
			}
			continue
		case words[0] == "export":
			continue
		case words[0] != "flashgraph":
			t.Errorf("README line %q: not a flashgraph command; teach this test what it means", line)
			continue
		}
		args := words[1:]
		long := args[0] == "train" && strings.Contains(line, "-config small")
		if needsGPU(args) || long || needsYourFiles(args) {
			code, _, stderr := runCode(withHelp(args)...)
			if code != 0 {
				t.Errorf("README line %q: its flags do not parse (exit %d):\n%s", line, code, stderr)
			}
			checked++
			continue
		}
		if args[0] == "train" {
			for i := range args {
				if args[i] == "-steps" && i+1 < len(args) {
					n, err := strconv.Atoi(args[i+1])
					if err != nil {
						t.Fatalf("README line %q: -steps %q", line, args[i+1])
					}
					args[i+1] = strconv.Itoa(max(1, n/10))
				}
			}
			// The Go sources are the default corpus; a small file keeps the
			// test's reading short (the steps are the same).
			args = append([]string{args[0], "-data", data}, args[1:]...)
		}
		code, stdout, stderr := runCode(args...)
		if code != 0 {
			t.Fatalf("README line %q: exit %d\nstdout:\n%s\nstderr:\n%s", line, code, stdout, stderr)
		}
		ran++
	}
	if ran < 10 || checked < 5 {
		t.Errorf("ran %d lines and checked %d: the block changed shape; look at this test", ran, checked)
	}
	// What the lines promised is there.
	for _, f := range []string{"small.txt", "g.txt", "small.onnx", "tiny.dot", "tiny.svg", "tiny.onnx", "out/loss.png", "out/ckpt/step-00000040.safetensors", "ranks/ckpt/step-00000010.safetensors"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("after the README's lines: %v", err)
		}
	}
}

var planFigure = `([0-9.]+ [KMG]iB)`

// TestDocsQuotePlanFigures checks the memory figures the README and
// docs/GPU.md quote for gpt2's training step against what `compile -plan`
// prints for the command they name.
func TestDocsQuotePlanFigures(t *testing.T) {
	stdout, _ := runCLI(t, "compile", "-config", "gpt2", "-fuse", "-plan", "-dtype", "bf16")
	full := regexp.MustCompile(`memory plan of gpt2 \(training step[^\n]*\nactivation arena ` + planFigure).FindStringSubmatch(stdout)
	rec := regexp.MustCompile(`with train -recompute: activation arena ` + planFigure).FindStringSubmatch(stdout)
	if full == nil || rec == nil {
		t.Fatalf("compile -plan no longer prints the training step's arena and the -recompute one:\n%s", stdout)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := os.ReadFile(filepath.Join("..", "..", "docs", "GPU.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		doc, text string
		re        *regexp.Regexp
	}{
		{"README.md", string(readme), regexp.MustCompile(`gpt2's step plans ` + planFigure + ` of activations, not ` + planFigure + `\s*\n\s*# \(compile -config gpt2 -fuse -plan -dtype bf16\)`)},
		{"docs/GPU.md", string(gpu), regexp.MustCompile(`gpt2, bf16: ` + planFigure + ` of activations\s+instead of ` + planFigure + `[^(]*` + "`compile -config gpt2 -fuse\\s+-plan -dtype bf16`")},
	} {
		m := c.re.FindStringSubmatch(c.text)
		if m == nil {
			t.Errorf("%s no longer quotes gpt2's -recompute figures with the command (update this test with the text)", c.doc)
			continue
		}
		if m[1] != rec[1] || m[2] != full[1] {
			t.Errorf("%s says %s with -recompute instead of %s; compile -plan prints %s and %s", c.doc, m[1], m[2], rec[1], full[1])
		}
	}
}
