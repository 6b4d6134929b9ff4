package train

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math/bits"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"unicode/utf8"

	"github.com/flashgraph/flashgraph/graph"
)

// Vocab is the byte-level vocabulary size: a token is a byte.
const Vocab = 256

// Limits of the corpus walker. Files above MaxFileBytes are skipped as data
// dumps rather than text someone wrote (the Go tree has a few megabyte-sized
// generated tables and compressed test vectors); MaxCorpusBytes keeps a folder
// walk from reading an unbounded tree into memory.
const (
	MaxFileBytes   = 1 << 20
	MaxCorpusBytes = 256 << 20
)

// Corpus is a training set with its held-out validation part: bytes of
// text, or the tokens of a token file (see tokens.go).
type Corpus struct {
	Source string // the file or folder it was read from
	Files  int    // text files read
	Skip   int    // files skipped (binary, huge, unreadable)
	Train  []byte
	Val    []byte

	// A token file (Format FormatUint16 or FormatLLMC) is held as tokens
	// instead of bytes: TrainTokens and ValTokens, with Train and Val empty.
	Format      DataFormat // FormatText for bytes (also the zero value)
	TrainTokens []uint16
	ValTokens   []uint16
	// ValSource is the file the validation tokens came from when it is not
	// Source (nanoGPT's val.bin beside train.bin); Note says what else the
	// reader decided (a prefix of a file over the size limit).
	ValSource string
	Note      string
	// where the token streams start in their files, for error messages
	trainAt, valAt tokenOrigin
}

// Fingerprint identifies the corpus content (sha256 of the train and
// validation bytes, and their sizes): a checkpoint records it so that resuming
// on different data is caught instead of silently changing the batches.
func (c *Corpus) Fingerprint() string {
	if c.isTokens() {
		return c.tokenFingerprint()
	}
	h := sha256.New()
	fmt.Fprintf(h, "train %d val %d\n", len(c.Train), len(c.Val))
	h.Write(c.Train)
	h.Write(c.Val)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// DefaultCorpusDir is the Go standard library's source tree: every machine
// that builds flashgraph has it, so training needs no download.
func DefaultCorpusDir() (string, error) {
	root := runtime.GOROOT()
	if root == "" || !isDir(filepath.Join(root, "src")) {
		// runtime.GOROOT is empty for binaries built with -trimpath; ask the
		// go command, which knows even then.
		out, err := exec.Command("go", "env", "GOROOT").Output()
		if err == nil {
			root = strings.TrimSpace(string(out))
		}
	}
	if root == "" || !isDir(filepath.Join(root, "src")) {
		return "", errors.New("no default corpus: the Go source tree (go env GOROOT)/src was not found; pass -data FILE_OR_DIR with text to train on")
	}
	return filepath.Join(root, "src"), nil
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// LoadCorpus reads path (a file, or every text file under a folder, in
// lexical path order so the byte stream is the same on every machine) and
// holds out about valFrac of it for validation.
//
// The split is by file for a folder: a file goes to validation when an FNV
// hash of its relative path falls in the valFrac bucket, so the held-out set
// is a sample of the whole tree rather than its alphabetically last package,
// and it does not move when unrelated files are added. A single file (or a
// folder whose hash split leaves one side empty) is split by bytes instead:
// the last valFrac of the stream. It is LoadData with FormatAuto: a single
// file may be a token file.
func LoadCorpus(path string, valFrac float64) (*Corpus, error) {
	return LoadData(path, valFrac, FormatAuto)
}

// loadText reads a single text file as bytes.
func loadText(path string, valFrac float64) (*Corpus, error) {
	c := &Corpus{Source: path, Format: FormatText}
	data, err := readPrefix(path, MaxCorpusBytes)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	// A folder walk skips binary files; a single one is a mistake.
	if len(data) > 0 && !isText(data) {
		return nil, fmt.Errorf("data: %s is not text (it has NUL bytes or is not UTF-8): give a text file or a folder of them, or a token file (an llm.c .bin with its header; raw uint16 tokens named *.bin or read with -data-format uint16)", path)
	}
	c.Files = 1
	c.Train, c.Val = splitBytes(data, valFrac)
	c.trainAt = tokenOrigin{file: path}
	c.valAt = tokenOrigin{file: path, first: int64(len(c.Train))}
	return c.check()
}

// loadFolder reads every text file under path (see LoadCorpus).
func loadFolder(c *Corpus, path string, valFrac float64) (*Corpus, error) {
	c.Format = FormatText
	var train, val bytes.Buffer
	// One bucket in `buckets` goes to validation.
	const buckets = 1 << 16
	cut := uint32(valFrac * buckets)
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			// An unreadable subfolder costs its files, not the run.
			c.Skip++
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		name := d.Name()
		if d.IsDir() {
			if p != path && strings.HasPrefix(name, ".") {
				return fs.SkipDir // .git and friends
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if train.Len()+val.Len() >= MaxCorpusBytes {
			return fs.SkipAll
		}
		info, err := d.Info()
		if err != nil || info.Size() == 0 || info.Size() > MaxFileBytes {
			c.Skip++
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil || !isText(data) {
			c.Skip++
			return nil
		}
		rel, _ := filepath.Rel(path, p)
		h := fnv.New32a()
		h.Write([]byte(filepath.ToSlash(rel)))
		dst := &train
		if h.Sum32()%buckets < cut {
			dst = &val
		}
		dst.Write(data)
		if data[len(data)-1] != '\n' {
			dst.WriteByte('\n')
		}
		c.Files++
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	c.Train, c.Val = train.Bytes(), val.Bytes()
	if len(c.Train) == 0 || len(c.Val) == 0 {
		all := append(c.Train, c.Val...)
		c.Train, c.Val = splitBytes(all, valFrac)
	}
	// Offsets name the byte in the stream read (train part, then validation).
	c.valAt.first = int64(len(c.Train))
	return c.check()
}

// NewCorpus splits data held in memory like LoadCorpus splits a single file.
func NewCorpus(source string, data []byte, valFrac float64) (*Corpus, error) {
	if valFrac <= 0 || valFrac >= 1 {
		return nil, fmt.Errorf("data: validation fraction must be in (0, 1), got %v", valFrac)
	}
	c := &Corpus{Source: source, Files: 1, Format: FormatText}
	c.Train, c.Val = splitBytes(data, valFrac)
	return c.check()
}

func splitBytes(data []byte, valFrac float64) (train, val []byte) {
	n := len(data) - int(float64(len(data))*valFrac)
	return data[:n:n], data[n:]
}

func (c *Corpus) check() (*Corpus, error) {
	if len(c.Train) == 0 {
		return nil, fmt.Errorf("data: no text found in %s (%d files skipped as binary, empty or over %d bytes)", c.Source, c.Skip, MaxFileBytes)
	}
	return c, nil
}

// readPrefix reads at most n bytes of a file, cut back to the last newline
// when the file is longer (so a cut never splits a UTF-8 sequence).
func readPrefix(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(n)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > n {
		data = data[:n]
		if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
			data = data[:i+1]
		}
	}
	return data, nil
}

// isText says whether data looks like something a person wrote: valid UTF-8
// without NUL bytes (which no text format uses and every binary has).
func isText(data []byte) bool {
	return bytes.IndexByte(data, 0) < 0 && utf8.Valid(data)
}

// Batcher draws [B, S] windows of a byte stream: tokens are bytes t..t+S-1
// and targets the next bytes t+1..t+S.
//
// Batch k's windows come from a PCG stream seeded by (seed, k) alone, so a
// batch depends on nothing but the seed and the step: a resumed run needs no
// saved RNG state to see exactly the batches the uninterrupted run would have.
type Batcher struct {
	data      tokenStream
	batch     int
	seq       int
	seed      uint64
	stream    uint64
	numStarts int
	// sequential: batch k's row r is window (k·batch + r) mod windows of
	// seq+1 tokens, back to back from token 0 (see DataOrder).
	sequential bool
	windows    int
}

// Streams keep the train and validation draws independent for one seed.
const (
	trainStream = 0x7472_6169_6e00_0001
	valStream   = 0x7661_6c00_0000_0002
)

// NewBatcher returns a batcher over data; data must hold at least seq+1 bytes.
func NewBatcher(data []byte, batch, seq int, seed uint64) (*Batcher, error) {
	return newBatcher(data, batch, seq, seed, trainStream)
}

func newBatcher(data []byte, batch, seq int, seed, stream uint64) (*Batcher, error) {
	return newStreamBatcher(tokenStream{b: data}, batch, seq, seed, stream, OrderRandom)
}

func newStreamBatcher(data tokenStream, batch, seq int, seed, stream uint64, order DataOrder) (*Batcher, error) {
	if batch <= 0 || seq <= 0 {
		return nil, fmt.Errorf("data: batch and seq must be positive, got %d and %d", batch, seq)
	}
	if data.len() < seq+1 {
		return nil, fmt.Errorf("data: %d %s cannot fill one window of %d tokens plus its target", data.len(), data.unit(), seq)
	}
	b := &Batcher{data: data, batch: batch, seq: seq, seed: seed, stream: stream, numStarts: data.len() - seq}
	switch order {
	case OrderRandom, "":
	case OrderSequential:
		b.sequential, b.windows = true, data.len()/(seq+1)
	default:
		return nil, fmt.Errorf("data: unknown order %q (want %s or %s)", order, OrderRandom, OrderSequential)
	}
	return b, nil
}

// Batch returns the tokens and targets of batch k (int64 [B, S]).
func (b *Batcher) Batch(k int64) (tokens, targets *graph.Tensor) {
	tokens = graph.NewTensor(graph.Int64, graph.Shape{b.batch, b.seq})
	targets = graph.NewTensor(graph.Int64, graph.Shape{b.batch, b.seq})
	b.Fill(k, tokens.I64, targets.I64)
	return tokens, targets
}

// Fill writes batch k into tokens and targets (each B·S long, row-major).
func (b *Batcher) Fill(k int64, tokens, targets []int64) {
	// The step is mixed into the seed word, not the stream word, so that
	// the stream constants keep train and validation apart. Only the PCG
	// generator itself is used (its output is specified), and the bounded
	// draw is written here (multiply-high), so that batches never change
	// with the Go release: resuming a checkpoint depends on them.
	if b.sequential {
		// Window indices (k·B + r) mod W, computed without overflow: W and
		// B are below 2^31, so (k mod W)·B + r fits in 64 bits.
		w := uint64(b.windows)
		first := (uint64(k) % w) * uint64(b.batch)
		for r := range b.batch {
			start := int((first+uint64(r))%w) * (b.seq + 1)
			b.data.window(start, tokens[r*b.seq:(r+1)*b.seq], targets[r*b.seq:(r+1)*b.seq])
		}
		return
	}
	rng := rand.NewPCG(b.seed^(uint64(k)*0x9e3779b97f4a7c15), b.stream)
	for r := range b.batch {
		hi, _ := bits.Mul64(rng.Uint64(), uint64(b.numStarts))
		b.data.window(int(hi), tokens[r*b.seq:(r+1)*b.seq], targets[r*b.seq:(r+1)*b.seq])
	}
}
