package train

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rawTokens is toks as raw little-endian uint16 (nanoGPT's train.bin).
func rawTokens(toks []uint16) []byte {
	out := make([]byte, 2*len(toks))
	for i, t := range toks {
		binary.LittleEndian.PutUint16(out[2*i:], t)
	}
	return out
}

// llmcTokens is toks as an llm.c token file; count is the header's count.
func llmcTokens(toks []uint16, count int32) []byte {
	h := make([]byte, llmcHeaderBytes)
	binary.LittleEndian.PutUint32(h[0:], llmcMagic)
	binary.LittleEndian.PutUint32(h[4:], llmcVersion)
	binary.LittleEndian.PutUint32(h[8:], uint32(count))
	return append(h, rawTokens(toks)...)
}

func seqTokens(n int, mod uint16) []uint16 {
	toks := make([]uint16, n)
	for i := range toks {
		toks[i] = uint16(i) % mod
	}
	return toks
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTokensFormats(t *testing.T) {
	dir := t.TempDir()
	toks := seqTokens(1000, 50000)
	toks[3] = 50256 // GPT-2's <|endoftext|>
	for _, c := range []struct {
		name   string
		data   []byte
		format DataFormat
		want   DataFormat
	}{
		{"corpus.bin", rawTokens(toks), FormatAuto, FormatUint16},
		{"tokens.u16", rawTokens(toks), FormatUint16, FormatUint16},
		{"shakespeare.bin", llmcTokens(toks, int32(len(toks))), FormatAuto, FormatLLMC},
		{"llmc.dat", llmcTokens(toks, int32(len(toks))), FormatAuto, FormatLLMC},
		{"llmc2.bin", llmcTokens(toks, int32(len(toks))), FormatLLMC, FormatLLMC},
		{"llmc3.bin", llmcTokens(toks, int32(len(toks))), DataFormat("LLM.C"), FormatLLMC},
		{"raw2.dat", rawTokens(toks), DataFormat("UINT16"), FormatUint16},
	} {
		p := writeFile(t, dir, c.name, c.data)
		corp, err := LoadData(p, 0.1, c.format)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if corp.Format != c.want || corp.Unit() != "tokens" {
			t.Errorf("%s: read as %s (%s), want %s", c.name, corp.Format, corp.Unit(), c.want)
		}
		got := append(append([]uint16(nil), corp.TrainTokens...), corp.ValTokens...)
		if len(got) != len(toks) || corp.TrainLen() != 900 || corp.ValLen() != 100 {
			t.Fatalf("%s: %d+%d tokens, want 900+100", c.name, corp.TrainLen(), corp.ValLen())
		}
		for i := range toks {
			if got[i] != toks[i] {
				t.Fatalf("%s: token %d is %d, want %d", c.name, i, got[i], toks[i])
			}
		}
		if err := corp.CheckVocab(50257); err != nil {
			t.Errorf("%s: vocab 50257: %v", c.name, err)
		}
	}
	// Text stays bytes, also by content when the name says nothing.
	p := writeFile(t, dir, "notes.dat", []byte(strings.Repeat("plain text\n", 20)))
	if c, err := LoadData(p, 0.1, FormatAuto); err != nil || c.Format != FormatText || c.Unit() != "bytes" || c.TrainLen() != len(c.Train) {
		t.Errorf("text file: %+v, %v", c, err)
	}
}

func TestTokensFingerprint(t *testing.T) {
	dir := t.TempDir()
	a, _ := LoadData(writeFile(t, dir, "a.bin", rawTokens(seqTokens(100, 300))), 0.1, FormatAuto)
	toks := seqTokens(100, 300)
	toks[50]++
	b, _ := LoadData(writeFile(t, dir, "b.bin", rawTokens(toks)), 0.1, FormatAuto)
	// The same tokens as bytes would read differently: a byte corpus of the
	// file's bytes must not collide with the token corpus either.
	c, _ := NewCorpus("c", rawTokens(seqTokens(100, 300)), 0.1)
	if a.Fingerprint() == b.Fingerprint() || a.Fingerprint() == c.Fingerprint() {
		t.Errorf("fingerprints %s %s %s", a.Fingerprint(), b.Fingerprint(), c.Fingerprint())
	}
	a2, _ := LoadData(filepath.Join(dir, "a.bin"), 0.1, FormatAuto)
	if a.Fingerprint() != a2.Fingerprint() {
		t.Error("two reads of one file fingerprint differently")
	}
}

func TestTokensVocabCheck(t *testing.T) {
	dir := t.TempDir()
	toks := seqTokens(200, 100)
	toks[150] = 777
	p := writeFile(t, dir, "t.bin", rawTokens(toks))
	c, err := LoadData(p, 0.1, FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckVocab(778); err != nil {
		t.Errorf("vocab 778: %v", err)
	}
	err = c.CheckVocab(777)
	if err == nil || !strings.Contains(err.Error(), "token 777 at token offset 150 of "+p+" (byte 300)") || !strings.Contains(err.Error(), "-vocab 778") {
		t.Errorf("vocab 777: %v", err)
	}
	// In the validation part of an llm.c file, past the header.
	toks[150], toks[195] = 1, 999
	p = writeFile(t, dir, "l.bin", llmcTokens(toks, int32(len(toks))))
	c, _ = LoadData(p, 0.1, FormatAuto)
	if err := c.CheckVocab(500); err == nil || !strings.Contains(err.Error(), "token 999 at token offset 195 of "+p+" (byte 1414)") {
		t.Errorf("llm.c, vocab 500: %v", err)
	}
	// Bytes: any byte is below 256; a smaller vocabulary is checked too.
	tc, _ := NewCorpus("mem", []byte("abc\xc3\xa9"), 0.5)
	if err := tc.CheckVocab(256); err != nil {
		t.Error(err)
	}
	if err := tc.CheckVocab(128); err == nil || !strings.Contains(err.Error(), "byte 195 at byte") {
		t.Errorf("bytes, vocab 128: %v", err)
	}
}

func TestTokensSiblingVal(t *testing.T) {
	dir := t.TempDir()
	train := writeFile(t, dir, "train.bin", rawTokens(seqTokens(300, 256)))
	writeFile(t, dir, "val.bin", rawTokens(seqTokens(40, 7)))
	c, err := LoadData(train, 0.1, FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if c.TrainLen() != 300 || c.ValLen() != 40 || c.ValSource != filepath.Join(dir, "val.bin") || c.Files != 2 {
		t.Errorf("train.bin + val.bin: %d train, %d val from %q", c.TrainLen(), c.ValLen(), c.ValSource)
	}
	// llm.c's names; the validation file is llm.c too.
	lt := writeFile(t, dir, "tiny_train.bin", llmcTokens(seqTokens(300, 256), 300))
	writeFile(t, dir, "tiny_val.bin", llmcTokens(seqTokens(50, 9), 50))
	if c, err := LoadData(lt, 0.1, FormatAuto); err != nil || c.ValLen() != 50 || c.ValTokens[10] != 1 {
		t.Errorf("llm.c train and val: %v", err)
	}
	// A damaged validation file is an error naming it.
	bt := writeFile(t, dir, "b_train.bin", rawTokens(seqTokens(300, 256)))
	writeFile(t, dir, "b_val.bin", []byte{1, 2, 3})
	if _, err := LoadData(bt, 0.1, FormatAuto); err == nil || !strings.Contains(err.Error(), "b_val.bin") {
		t.Errorf("odd val file: %v", err)
	}
}

func TestTokensErrors(t *testing.T) {
	dir := t.TempDir()
	toks := seqTokens(100, 256)
	for _, c := range []struct {
		name   string
		data   []byte
		format DataFormat
		want   string
	}{
		{"short.bin", llmcTokens(toks, 101), FormatAuto, "header says 101 tokens (202 bytes), the file has 200 bytes"},
		{"long.bin", llmcTokens(toks, 99), FormatAuto, "header says 99 tokens"},
		{"huge.bin", llmcTokens(toks, 1<<31-1), FormatAuto, "header says 2147483647 tokens"},
		{"neg.bin", llmcTokens(toks, -5), FormatAuto, "negative token count -5"},
		{"v2.bin", func() []byte { d := llmcTokens(toks, 100); d[4] = 2; return d }(), FormatAuto, "version 2"},
		{"llama3.bin", func() []byte { d := llmcTokens(toks, 100); binary.LittleEndian.PutUint32(d, llmcMagicLlama3); return d }(), FormatAuto, "LLaMA 3"},
		{"odd.bin", []byte{0, 1, 2}, FormatAuto, "odd.bin is not text"},
		{"oddtext.bin", []byte("abc"), FormatAuto, "give -data-format text"},
		{"empty.bin", nil, FormatAuto, "no tokens"},
		{"headeronly.bin", llmcTokens(nil, 0), FormatAuto, "no tokens"},
		{"raw.bin", rawTokens(toks), FormatLLMC, "not an llm.c token file"},
		{"llmc_as_raw.bin", llmcTokens(toks, 100), FormatUint16, "it is an llm.c token file"},
		{"blob.exe", []byte("MZ\x00\x00binary"), FormatAuto, "blob.exe is not text"},
	} {
		p := writeFile(t, dir, c.name, c.data)
		if _, err := LoadData(p, 0.1, c.format); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.want)
		}
	}
	if _, err := LoadData(dir, 0.1, FormatUint16); err == nil || !strings.Contains(err.Error(), "is a folder") {
		t.Errorf("folder as uint16: %v", err)
	}
	if _, err := ParseDataFormat("utf-16"); err == nil {
		t.Error("ParseDataFormat accepted utf-16")
	}
	if _, err := ParseDataOrder("shuffled"); err == nil {
		t.Error("ParseDataOrder accepted shuffled")
	}
}

// TestTokensPrefixLimit: a file over the size limit is read up to it, and
// the note says so.
func TestTokensPrefixLimit(t *testing.T) {
	old := MaxTokenFileBytes
	MaxTokenFileBytes = 100
	defer func() { MaxTokenFileBytes = old }()
	p := writeFile(t, t.TempDir(), "big.bin", rawTokens(seqTokens(80, 256)))
	c, err := LoadData(p, 0.1, FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if c.TrainLen()+c.ValLen() != 50 || !strings.Contains(c.Note, "the first 50 of its 80 tokens") {
		t.Errorf("%d tokens read, note %q", c.TrainLen()+c.ValLen(), c.Note)
	}
}

// TestTokensSequentialOrder: step i reads B consecutive non-overlapping
// windows of S+1 tokens from token i·B·(S+1), and wraps to token 0 after
// the last whole window.
func TestTokensSequentialOrder(t *testing.T) {
	const B, S, n = 3, 4, 52 // 10 whole windows of 5; tokens 50, 51 never read
	p := writeFile(t, t.TempDir(), "s.bin", rawTokens(seqTokens(n, 1000)))
	c, err := LoadData(p, 0.5, FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	c.TrainTokens, c.ValTokens = seqTokens(n, 1000), seqTokens(12, 1000)
	tb, vb, err := c.Batchers(B, S, 1, OrderSequential)
	if err != nil {
		t.Fatal(err)
	}
	for step := range int64(8) {
		tok, tgt := tb.Batch(step)
		for r := range B {
			w := (int(step)*B + r) % 10
			for j := range S {
				if got, want := tok.I64[r*S+j], int64(w*(S+1)+j); got != want {
					t.Fatalf("step %d row %d: token %d is %d, want %d", step, r, j, got, want)
				}
				if got, want := tgt.I64[r*S+j], int64(w*(S+1)+j+1); got != want {
					t.Fatalf("step %d row %d: target %d is %d, want %d", step, r, j, got, want)
				}
			}
		}
	}
	if first, _ := tb.Batch(1); first.I64[0] != B*(S+1) {
		t.Errorf("step 1 starts at token %d, want %d", first.I64[0], B*(S+1))
	}
	// Validation reads its own stream in the same order: 2 windows there.
	if vb == nil {
		t.Fatal("no validation batcher over 12 tokens")
	}
	if tok, _ := vb.Batch(0); tok.I64[0] != 0 || tok.I64[S] != S+1 || tok.I64[2*S] != 0 {
		t.Errorf("validation batch 0 rows start at %d %d %d, want 0 5 0", tok.I64[0], tok.I64[S], tok.I64[2*S])
	}
	if d := c.DescribeOrder(OrderSequential, B, S, 8); !strings.Contains(d, "10 whole windows") || !strings.Contains(d, "wrap to token 0") {
		t.Errorf("description %q", d)
	}
	// Random order over tokens still draws valid windows, and the random
	// sampler is the one of bytes (same draws for the same seed).
	rb, _, _ := c.Batchers(B, S, 7, OrderRandom)
	tok, _ := rb.Batch(3)
	probe := make([]byte, n) // the same values as the tokens, as bytes
	for i := range probe {
		probe[i] = byte(i)
	}
	pb, _ := NewBatcher(probe, B, S, 7)
	pt, _ := pb.Batch(3)
	if !equalI64(tok.I64, pt.I64) {
		t.Errorf("random batch 3 over tokens %v, over the same bytes %v", tok.I64, pt.I64)
	}
}

func FuzzReadTokens(f *testing.F) {
	f.Add(rawTokens(seqTokens(10, 300)), false)
	f.Add(llmcTokens(seqTokens(10, 300), 10), true)
	f.Add(llmcTokens(seqTokens(3, 300), 1<<30), true)
	f.Fuzz(func(t *testing.T, data []byte, llmc bool) {
		format := FormatUint16
		if llmc {
			format = FormatLLMC
		}
		toks, _, err := readTokens(bytes.NewReader(data), int64(len(data)), format, 1<<20)
		if err != nil {
			return
		}
		start := 0
		if llmc {
			start = llmcHeaderBytes
		}
		if 2*len(toks) != len(data)-start {
			t.Fatalf("%d tokens from %d bytes after a %d-byte header", len(toks), len(data), start)
		}
		for i, tk := range toks {
			if want := binary.LittleEndian.Uint16(data[start+2*i:]); tk != want {
				t.Fatalf("token %d is %d, the bytes say %d", i, tk, want)
			}
		}
	})
}
