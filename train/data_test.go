package train

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeTree makes a corpus folder: text files in a few subfolders, plus
// things the loader must skip.
func writeTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write := func(rel string, data []byte) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		write(fmt.Sprintf("pkg%d/file%02d.go", i%4, i), []byte(fmt.Sprintf("package pkg%d\n\n// File %d says hello.\nfunc F%d() int { return %d }", i%4, i, i, i*i)))
	}
	write("bin/blob.bin", []byte("ELF\x00\x01\x02binary"))
	write("bin/latin1.txt", []byte("caf\xe9")) // not UTF-8
	write("big/huge.txt", bytes.Repeat([]byte("a"), MaxFileBytes+1))
	write(".git/config", []byte("[core]\n"))
	write("empty.txt", nil)
	return dir
}

func TestDataLoadFolder(t *testing.T) {
	dir := writeTree(t)
	c, err := LoadCorpus(dir, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	if c.Files != 40 {
		t.Errorf("read %d files, want the 40 text files", c.Files)
	}
	if c.Skip != 4 { // binary, latin-1, huge, empty; .git is not even walked
		t.Errorf("skipped %d files, want 4", c.Skip)
	}
	all := string(c.Train) + string(c.Val)
	for _, bad := range []string{"ELF", "caf", "aaaa", "[core]"} {
		if strings.Contains(all, bad) {
			t.Errorf("corpus contains %q from a file that should be skipped", bad)
		}
	}
	// Split by file: every file is wholly on one side, both sides non-empty.
	if len(c.Val) == 0 || len(c.Train) == 0 {
		t.Fatalf("split train %d / val %d bytes", len(c.Train), len(c.Val))
	}
	for i := range 40 {
		marker := fmt.Sprintf("// File %d says", i)
		inT, inV := bytes.Contains(c.Train, []byte(marker)), bytes.Contains(c.Val, []byte(marker))
		if inT == inV {
			t.Errorf("file %d: in train %v, in val %v; want exactly one", i, inT, inV)
		}
	}
	// Deterministic: a second load gives the same bytes.
	c2, err := LoadCorpus(dir, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.Train, c2.Train) || !bytes.Equal(c.Val, c2.Val) || c.Fingerprint() != c2.Fingerprint() {
		t.Error("two loads of one folder differ")
	}
}

func TestDataLoadFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "text.txt")
	data := []byte(strings.Repeat("0123456789", 100))
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadCorpus(p, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Val) != 100 || !bytes.Equal(c.Val, data[900:]) || !bytes.Equal(c.Train, data[:900]) {
		t.Errorf("file split: train %d, val %d bytes; want the last 10%% held out", len(c.Train), len(c.Val))
	}
	// Appending to Train must not overwrite Val (they share one array).
	_ = append(c.Train, 'x')
	if c.Val[0] != '0' {
		t.Error("Train aliases Val's storage")
	}
}

func TestDataErrors(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "x.bin"), []byte{0, 1, 2}, 0o644)
	if _, err := LoadCorpus(dir, 0.1); err == nil || !strings.Contains(err.Error(), "no text") {
		t.Errorf("binary-only folder: err %v", err)
	}
	// A folder skips binary files; a single binary file is refused by name.
	bin := filepath.Join(dir, "x.bin")
	if _, err := LoadCorpus(bin, 0.1); err == nil || !strings.Contains(err.Error(), bin+" is not text") {
		t.Errorf("binary file: err %v", err)
	}
	if _, err := LoadCorpus(filepath.Join(dir, "missing"), 0.1); err == nil {
		t.Error("missing path: no error")
	}
	if _, err := LoadCorpus(dir, 0); err == nil {
		t.Error("valFrac 0: no error")
	}
	if _, err := NewBatcher([]byte("short"), 2, 8, 1); err == nil {
		t.Error("data shorter than a window: no error")
	}
}

func TestDataDefaultCorpus(t *testing.T) {
	dir, err := DefaultCorpusDir()
	if err != nil {
		t.Skipf("no Go source tree here: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "fmt", "print.go")); err != nil {
		t.Errorf("default corpus %s is not the Go source tree: %v", dir, err)
	}
}

func TestDataBatches(t *testing.T) {
	data := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 50))
	const B, S = 3, 16
	b, err := NewBatcher(data, B, S, 42)
	if err != nil {
		t.Fatal(err)
	}
	tok, tgt := b.Batch(7)
	if !tok.Shape.Equal([]int{B, S}) || !tgt.Shape.Equal([]int{B, S}) {
		t.Fatalf("shapes %v %v", tok.Shape, tgt.Shape)
	}
	for r := range B {
		row := make([]byte, S+1)
		for j := range S {
			row[j] = byte(tok.I64[r*S+j])
			if j > 0 && tgt.I64[r*S+j-1] != tok.I64[r*S+j] {
				t.Fatalf("row %d: target %d is not the next token", r, j-1)
			}
		}
		row[S] = byte(tgt.I64[r*S+S-1])
		if !bytes.Contains(data, row) {
			t.Errorf("row %d %q is not a window of the data", r, row)
		}
	}
	// A batch is a function of (seed, step) only: a fresh batcher, asked
	// out of order, gives the same batch.
	b2, _ := NewBatcher(data, B, S, 42)
	b2.Batch(100)
	tok2, tgt2 := b2.Batch(7)
	if !equalI64(tok.I64, tok2.I64) || !equalI64(tgt.I64, tgt2.I64) {
		t.Error("batch 7 differs between two batchers of one seed")
	}
	other, _ := b.Batch(8)
	if equalI64(tok.I64, other.I64) {
		t.Error("batches 7 and 8 are equal")
	}
	b3, _ := NewBatcher(data, B, S, 43)
	if t3, _ := b3.Batch(7); equalI64(tok.I64, t3.I64) {
		t.Error("seeds 42 and 43 give the same batch")
	}
	v, _ := newBatcher(data, B, S, 42, valStream)
	if tv, _ := v.Batch(7); equalI64(tok.I64, tv.I64) {
		t.Error("train and validation streams give the same batch")
	}
	// Every start position is reachable, including the last one.
	small := []byte("abcdefghij")
	bs, _ := NewBatcher(small, 1, 4, 1)
	seen := map[int64]bool{}
	for k := range int64(400) {
		tk, _ := bs.Batch(k)
		seen[tk.I64[0]] = true
	}
	if len(seen) != len(small)-4 {
		t.Errorf("%d distinct start positions of %d", len(seen), len(small)-4)
	}
}

// TestDataBatchGolden pins the sampler's output: checkpoints resume by step
// number, so a change of the batches would silently break every resume.
func TestDataBatchGolden(t *testing.T) {
	data := make([]byte, 1000)
	for i := range data {
		data[i] = byte(i % 251)
	}
	b, _ := NewBatcher(data, 4, 1, 7)
	tok, _ := b.Batch(3)
	want := []int64{181, 231, 62, 202}
	if !equalI64(tok.I64, want) {
		t.Errorf("batch 3 of seed 7 starts at %v, want %v", tok.I64, want)
	}
}

func equalI64(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
