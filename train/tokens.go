package train

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Pre-tokenized training data: a file of token ids instead of bytes of
// text, as nanoGPT and llm.c write them.
//
//   - raw little-endian uint16 tokens, nothing else: nanoGPT's prepare.py
//     writes train.bin and val.bin so;
//   - llm.c's .bin: a header of 256 little-endian int32 (magic 20240520,
//     version 1, the token count, the rest zero), then that many uint16
//     tokens.
//
// The format is chosen by content where the content says it: the llm.c magic
// number, or text (UTF-8 without NUL bytes) for bytes. Raw uint16 tokens have
// no header, so any content could be them; a file is read so when its name
// ends in .bin (nanoGPT's name), or when -data-format uint16 says so.

// DataFormat is how a -data file is read.
type DataFormat string

const (
	FormatAuto   DataFormat = "auto"   // chosen by content, then by extension (see above)
	FormatText   DataFormat = "text"   // bytes: every byte is a token (vocabulary 256)
	FormatUint16 DataFormat = "uint16" // raw little-endian uint16 tokens (nanoGPT train.bin)
	FormatLLMC   DataFormat = "llm.c"  // llm.c's 1024-byte header, then uint16 tokens
)

// DataFormats lists the formats -data-format takes.
var DataFormats = []DataFormat{FormatAuto, FormatText, FormatUint16, FormatLLMC}

// ParseDataFormat reads a -data-format value ("" is auto).
func ParseDataFormat(s string) (DataFormat, error) {
	if s == "" {
		return FormatAuto, nil
	}
	for _, f := range DataFormats {
		if strings.EqualFold(s, string(f)) {
			return f, nil
		}
	}
	if strings.EqualFold(s, "llmc") {
		return FormatLLMC, nil
	}
	return "", fmt.Errorf("data format %q: want auto, text, uint16 or llm.c", s)
}

// DataOrder is how batches are drawn from the training stream.
type DataOrder string

const (
	// OrderRandom draws every row's window at a random token offset from a
	// PCG stream seeded by (seed, step) (the default).
	OrderRandom DataOrder = "random"
	// OrderSequential reads the stream in order: step k's row r is window
	// w = (k·B + r) mod W of S+1 tokens, tokens [w·(S+1), (w+1)·(S+1)), W
	// being the number of whole windows in the stream. Step k thus starts
	// at token k·B·(S+1) until the stream is used up, and then wraps to
	// token 0 (the tokens after the last whole window are never read), so a
	// run can be compared batch for batch with another framework reading
	// the same file the same way.
	OrderSequential DataOrder = "sequential"
)

// ParseDataOrder reads a -data-order value ("" is random).
func ParseDataOrder(s string) (DataOrder, error) {
	switch DataOrder(strings.ToLower(s)) {
	case "", OrderRandom:
		return OrderRandom, nil
	case OrderSequential:
		return OrderSequential, nil
	}
	return "", fmt.Errorf("data order %q: want random or sequential", s)
}

// llm.c's token file header.
const (
	llmcMagic       = 20240520 // GPT-2 tokens, uint16
	llmcVersion     = 1
	llmcMagicLlama3 = 20240801 // LLaMA 3 tokens, uint32: not read here
	llmcHeaderInts  = 256
	llmcHeaderBytes = llmcHeaderInts * 4
)

// MaxTokenFileBytes bounds how much of a token file is read into memory;
// a longer file is read up to it (the Corpus's Note says so).
var MaxTokenFileBytes int64 = 1 << 30

// tokenStream is a training stream: bytes, or uint16 tokens.
type tokenStream struct {
	b    []byte
	u    []uint16
	wide bool // u, not b
}

func (s tokenStream) len() int {
	if s.wide {
		return len(s.u)
	}
	return len(s.b)
}

func (s tokenStream) unit() string {
	if s.wide {
		return "tokens"
	}
	return "bytes"
}

// window writes tokens start.. into tokens and the next ones into targets.
func (s tokenStream) window(start int, tokens, targets []int64) {
	n := len(tokens)
	if s.wide {
		w := s.u[start : start+n+1]
		for j := range n {
			tokens[j], targets[j] = int64(w[j]), int64(w[j+1])
		}
		return
	}
	w := s.b[start : start+n+1]
	for j := range n {
		tokens[j], targets[j] = int64(w[j]), int64(w[j+1])
	}
}

// tokenOrigin is where a stream starts in its file: token i of the stream
// is token first+i of file, at byte header + width·(first+i).
type tokenOrigin struct {
	file   string // "" for the text of a folder: offsets count in the stream
	header int64
	first  int64
}

func (c *Corpus) isTokens() bool { return c.Format == FormatUint16 || c.Format == FormatLLMC }

func (c *Corpus) trainStream() tokenStream {
	if c.isTokens() {
		return tokenStream{u: c.TrainTokens, wide: true}
	}
	return tokenStream{b: c.Train}
}

func (c *Corpus) valStream() tokenStream {
	if c.isTokens() {
		return tokenStream{u: c.ValTokens, wide: true}
	}
	return tokenStream{b: c.Val}
}

// TrainLen and ValLen are the number of tokens (bytes, for text) of each part.
func (c *Corpus) TrainLen() int { return c.trainStream().len() }
func (c *Corpus) ValLen() int   { return c.valStream().len() }

// Unit is what the corpus counts: "bytes" or "tokens".
func (c *Corpus) Unit() string { return c.trainStream().unit() }

func (c *Corpus) tokenFingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "uint16 tokens train %d val %d\n", len(c.TrainTokens), len(c.ValTokens))
	var buf [1 << 12]byte
	for _, part := range [][]uint16{c.TrainTokens, c.ValTokens} {
		for len(part) > 0 {
			n := min(len(part), len(buf)/2)
			for i, t := range part[:n] {
				binary.LittleEndian.PutUint16(buf[2*i:], t)
			}
			h.Write(buf[:2*n])
			part = part[n:]
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Batchers returns the training and validation batchers of the corpus for
// batch×seq windows; val is nil when the validation part is shorter than a
// window. The validation batcher draws in the same order as the training one.
func (c *Corpus) Batchers(batch, seq int, seed uint64, order DataOrder) (train, val *Batcher, err error) {
	train, err = newStreamBatcher(c.trainStream(), batch, seq, seed, trainStream, order)
	if err != nil {
		return nil, nil, err
	}
	val, _ = newStreamBatcher(c.valStream(), batch, seq, seed, valStream, order)
	return train, val, nil
}

// CheckVocab returns an error naming the first token that a model with a
// vocabulary of vocab ids cannot embed (one at or above vocab), with its
// place in its file.
func (c *Corpus) CheckVocab(vocab int) error {
	if c.isTokens() {
		for _, part := range []struct {
			toks   []uint16
			origin tokenOrigin
		}{{c.TrainTokens, c.trainAt}, {c.ValTokens, c.valAt}} {
			if vocab > 0xffff {
				break
			}
			for i, t := range part.toks {
				if int(t) >= vocab {
					at := part.origin.first + int64(i)
					return fmt.Errorf("data: token %d at token offset %d of %s (byte %d) is not below the model's vocabulary size %d: give -vocab %d or more, or the token file of this model's tokenizer",
						t, at, part.origin.file, part.origin.header+2*at, vocab, maxToken(c)+1)
				}
			}
		}
		return nil
	}
	if vocab > 0xff {
		return nil
	}
	for _, part := range []struct {
		data   []byte
		origin tokenOrigin
	}{{c.Train, c.trainAt}, {c.Val, c.valAt}} {
		for i, b := range part.data {
			if int(b) >= vocab {
				at := part.origin.first + int64(i)
				where := fmt.Sprintf("byte offset %d of %s", at, part.origin.file)
				if part.origin.file == "" {
					where = fmt.Sprintf("byte %d of the text read from %s", at, c.Source)
				}
				return fmt.Errorf("data: byte %d at %s is not below the model's vocabulary size %d (text is read as bytes: a byte-level model needs -vocab 256)", b, where, vocab)
			}
		}
	}
	return nil
}

func maxToken(c *Corpus) int {
	m := 0
	for _, part := range [][]uint16{c.TrainTokens, c.ValTokens} {
		for _, t := range part {
			m = max(m, int(t))
		}
	}
	return m
}

// LoadData reads path like LoadCorpus, with the format of a single file
// given (FormatAuto: chosen as the comment at the top of this file says). A
// folder is always text. A token file is split into train and validation by
// its last valFrac of tokens, unless the file's name has "train" in it and
// the same name with "val" in its place is beside it (nanoGPT's train.bin
// and val.bin, llm.c's *_train.bin and *_val.bin): that file is then the
// validation set, whole.
func LoadData(path string, valFrac float64, format DataFormat) (*Corpus, error) {
	format, err := ParseDataFormat(string(format))
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if valFrac <= 0 || valFrac >= 1 {
		return nil, fmt.Errorf("data: validation fraction must be in (0, 1), got %v", valFrac)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if st.IsDir() {
		if format != FormatAuto && format != FormatText {
			return nil, fmt.Errorf("data: %s is a folder: a folder is read as text files; give the %s token file itself", path, format)
		}
		return loadFolder(&Corpus{Source: path}, path, valFrac)
	}
	return loadFile(path, valFrac, format)
}

// loadFile reads one file in format (auto: detected).
func loadFile(path string, valFrac float64, format DataFormat) (*Corpus, error) {
	format, err := detectFormat(path, format)
	if err != nil {
		return nil, err
	}
	if format == FormatText {
		return loadText(path, valFrac)
	}
	toks, note, err := readTokenFile(path, format, MaxTokenFileBytes)
	if err != nil {
		return nil, err
	}
	c := &Corpus{Source: path, Files: 1, Format: format, Note: note}
	header := func(f DataFormat) int64 {
		if f == FormatLLMC {
			return llmcHeaderBytes
		}
		return 0
	}
	if vp := siblingVal(path); vp != "" {
		vf, err := detectFormat(vp, format)
		if err != nil {
			return nil, fmt.Errorf("data: the validation file beside %s: %w", path, err)
		}
		if vf == FormatText {
			return nil, fmt.Errorf("data: %s, the validation file beside %s, is not a token file", vp, path)
		}
		vt, vnote, err := readTokenFile(vp, vf, MaxTokenFileBytes)
		if err != nil {
			return nil, fmt.Errorf("data: the validation file beside %s: %w", path, err)
		}
		if vnote != "" {
			c.Note = strings.TrimPrefix(c.Note+"; "+vnote, "; ")
		}
		c.Files = 2
		c.TrainTokens, c.ValTokens, c.ValSource = toks, vt, vp
		c.trainAt = tokenOrigin{path, header(format), 0}
		c.valAt = tokenOrigin{vp, header(vf), 0}
	} else {
		n := len(toks) - int(float64(len(toks))*valFrac)
		c.TrainTokens, c.ValTokens = toks[:n:n], toks[n:]
		c.trainAt = tokenOrigin{path, header(format), 0}
		c.valAt = tokenOrigin{path, header(format), int64(n)}
	}
	if len(c.TrainTokens) == 0 {
		return nil, fmt.Errorf("data: %s holds no tokens", path)
	}
	return c, nil
}

// siblingVal returns the validation file beside a training token file
// (the last "train" of its name replaced by "val"), or "".
func siblingVal(path string) string {
	dir, base := filepath.Split(path)
	i := strings.LastIndex(base, "train")
	if i < 0 {
		return ""
	}
	p := filepath.Join(dir, base[:i]+"val"+base[i+len("train"):])
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
		return p
	}
	return ""
}

// detectFormat resolves FormatAuto for the file at path: the llm.c magic,
// then a .bin name (raw uint16), then text. A given format is checked
// against the llm.c magic only (reading an llm.c file as raw tokens would
// train on its header).
func detectFormat(path string, format DataFormat) (DataFormat, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	var head [4]byte
	n, _ := io.ReadFull(f, head[:])
	magic := uint32(0)
	if n == 4 {
		magic = binary.LittleEndian.Uint32(head[:])
	}
	switch {
	case magic == llmcMagicLlama3:
		return "", fmt.Errorf("data: %s is an llm.c token file of LLaMA 3 tokens (magic %d, uint32 tokens); only GPT-2-style uint16 token files (magic %d) are read", path, llmcMagicLlama3, llmcMagic)
	case magic == llmcMagic && (format == FormatAuto || format == FormatLLMC):
		return FormatLLMC, nil
	case magic == llmcMagic && format == FormatUint16:
		return "", fmt.Errorf("data: %s starts with llm.c's magic number %d: it is an llm.c token file, not raw uint16 tokens (drop -data-format uint16)", path, llmcMagic)
	case format == FormatLLMC:
		return "", fmt.Errorf("data: %s is not an llm.c token file: it does not start with the magic number %d", path, llmcMagic)
	case format != FormatAuto:
		return format, nil
	case strings.EqualFold(filepath.Ext(path), ".bin"):
		return FormatUint16, nil
	}
	return FormatText, nil
}

// readTokenFile reads the tokens of a uint16 or llm.c file, at most limit
// bytes of them (note then says how many of how many were read).
func readTokenFile(path string, format DataFormat, limit int64) (toks []uint16, note string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, "", fmt.Errorf("data: %w", err)
	}
	if format == FormatUint16 && st.Size()%2 != 0 {
		head := make([]byte, min(st.Size(), 4096))
		n, _ := io.ReadFull(f, head)
		if isText(head[:n]) {
			return nil, "", fmt.Errorf("data: %s looks like text but is read as raw uint16 tokens (its .bin name or -data-format uint16), and its size is odd (%d bytes); give -data-format text to read it as bytes", path, st.Size())
		}
		return nil, "", fmt.Errorf("data: %s is not text, and not raw uint16 tokens either (they need an even size; it has %d bytes)", path, st.Size())
	}
	toks, note, err = readTokens(f, st.Size(), format, limit)
	if err != nil {
		return nil, "", fmt.Errorf("data: %s: %w", path, err)
	}
	if note != "" {
		note = path + ": " + note
	}
	return toks, note, nil
}

// readTokens decodes a token file of size bytes from r. Nothing is
// allocated from what the file says: the token count of an llm.c header must
// agree with the file's size, and the tokens read are bounded by limit.
func readTokens(r io.ReaderAt, size int64, format DataFormat, limit int64) ([]uint16, string, error) {
	start := int64(0)
	switch format {
	case FormatLLMC:
		if size < llmcHeaderBytes {
			return nil, "", fmt.Errorf("an llm.c token file needs its %d-byte header; the file has %d bytes", llmcHeaderBytes, size)
		}
		var h [llmcHeaderBytes]byte
		if _, err := r.ReadAt(h[:], 0); err != nil {
			return nil, "", fmt.Errorf("reading the llm.c header: %w", err)
		}
		field := func(i int) int32 { return int32(binary.LittleEndian.Uint32(h[4*i:])) }
		if m := field(0); m != llmcMagic {
			return nil, "", fmt.Errorf("llm.c header: magic %d, want %d", m, llmcMagic)
		}
		if v := field(1); v != llmcVersion {
			return nil, "", fmt.Errorf("llm.c header: version %d; this reader knows version %d (uint16 tokens)", v, llmcVersion)
		}
		count := int64(field(2))
		if count < 0 {
			return nil, "", fmt.Errorf("llm.c header: negative token count %d", count)
		}
		if have := size - llmcHeaderBytes; have != 2*count {
			return nil, "", fmt.Errorf("llm.c header says %d tokens (%d bytes), the file has %d bytes after the header (truncated or not an llm.c file)", count, 2*count, have)
		}
		start = llmcHeaderBytes
	case FormatUint16:
		if size%2 != 0 {
			return nil, "", fmt.Errorf("raw uint16 tokens need an even size; the file has %d bytes", size)
		}
	default:
		return nil, "", fmt.Errorf("format %q is not a token format", format)
	}
	n := (size - start) / 2
	note := ""
	if limit >= 0 && 2*n > limit {
		note = fmt.Sprintf("read the first %d of its %d tokens (%d MiB, the most a run reads)", limit/2, n, limit>>20)
		n = limit / 2
	}
	if n == 0 {
		return nil, "", errors.New("holds no tokens")
	}
	toks := make([]uint16, n)
	buf := make([]byte, min(2*n, 1<<20))
	for done := int64(0); done < n; {
		k := min(n-done, int64(len(buf)/2))
		if _, err := r.ReadAt(buf[:2*k], start+2*done); err != nil {
			return nil, "", fmt.Errorf("reading tokens: %w", err)
		}
		for i := range k {
			toks[done+i] = binary.LittleEndian.Uint16(buf[2*i:])
		}
		done += k
	}
	return toks, note, nil
}

// DescribeOrder says in one line how a run of steps draws its batch×seq
// windows from the corpus, for the log; with sequential order, how many
// steps one pass over the training tokens takes and whether the run wraps.
func (c *Corpus) DescribeOrder(order DataOrder, batch, seq int, steps int64) string {
	if order != OrderSequential {
		return fmt.Sprintf("data order: random windows of %d tokens (seeded by -seed and the step)", seq+1)
	}
	w := int64(c.TrainLen() / (seq + 1))
	if w == 0 {
		return "data order: sequential"
	}
	rows := steps * int64(batch)
	s := fmt.Sprintf("data order: sequential: step i reads windows i·%d … i·%d+%d of %d tokens (of %d whole windows; %d steps a pass)",
		batch, batch, batch-1, seq+1, w, (w+int64(batch)-1)/int64(batch))
	if rows > w {
		s += fmt.Sprintf("; the %d steps wrap to token 0 after window %d, %.2f passes in all", steps, w-1, float64(rows)/float64(w))
	}
	return s
}
