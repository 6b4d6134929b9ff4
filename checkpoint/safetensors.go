package checkpoint

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/flashgraph/flashgraph/graph"
)

// The safetensors format (the Hugging Face one, which PyTorch tooling and
// tools/reference/st_io.py read): an 8-byte little-endian header length N,
// N bytes of JSON
//
//	{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//	 "__metadata__": {string: string}}
//
// then the tensors' little-endian bytes, offsets relative to the end of the
// header. We write tensors sorted by name, contiguously, with the header
// space-padded so the data starts 8-byte aligned.

// MaxHeaderBytes bounds the JSON header we are willing to parse: a corrupt
// length field must be an error, not a multi-gigabyte allocation.
const MaxHeaderBytes = 100 << 20

var stDTypes = map[graph.DType]string{
	graph.Float32: "F32", graph.Float64: "F64", graph.BFloat16: "BF16",
	graph.Float16: "F16", graph.Int64: "I64", graph.Bool: "BOOL",
}

func parseSTDType(s string) (graph.DType, bool) {
	for dt, n := range stDTypes {
		if n == s {
			return dt, true
		}
	}
	return graph.InvalidDType, false
}

// Tensors is a named set of tensors with string metadata: the content of one
// safetensors file.
type Tensors struct {
	Tensors  map[string]*graph.Tensor
	Metadata map[string]string
}

type stEntry struct {
	DType   string  `json:"dtype"`
	Shape   []int   `json:"shape"`
	Offsets []int64 `json:"data_offsets"`
}

// WriteSafetensors writes ts to w.
func WriteSafetensors(w io.Writer, ts *Tensors) error {
	names := make([]string, 0, len(ts.Tensors))
	for n := range ts.Tensors {
		if n == "__metadata__" || n == "" {
			return fmt.Errorf("safetensors: invalid tensor name %q", n)
		}
		names = append(names, n)
	}
	sort.Strings(names)
	header := map[string]any{}
	var off int64
	for _, n := range names {
		t := ts.Tensors[n]
		if t == nil {
			return fmt.Errorf("safetensors: tensor %s is nil", n)
		}
		if err := t.Check(); err != nil {
			return fmt.Errorf("safetensors: tensor %s: %w", n, err)
		}
		code, ok := stDTypes[t.DType]
		if !ok {
			return fmt.Errorf("safetensors: tensor %s: dtype %v has no safetensors code", n, t.DType)
		}
		size := int64(t.Len()) * int64(t.DType.Size())
		shape := append([]int{}, t.Shape...) // [] rather than null for a scalar
		header[n] = stEntry{DType: code, Shape: shape, Offsets: []int64{off, off + size}}
		off += size
	}
	if len(ts.Metadata) > 0 {
		header["__metadata__"] = ts.Metadata
	}
	hj, err := json.Marshal(header) // map keys come out sorted: deterministic bytes
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if pad := (8 - len(hj)%8) % 8; pad > 0 {
		hj = append(hj, strings.Repeat(" ", pad)...)
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hj)))
	bw.Write(lenBuf[:])
	bw.Write(hj)
	var buf []byte
	for _, n := range names {
		buf = graph.AppendLE(buf[:0], ts.Tensors[n])
		if _, err := bw.Write(buf); err != nil {
			return fmt.Errorf("safetensors: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// ReadSafetensors parses a whole safetensors file held in data. Every
// structural problem (short file, header length past the end, bad JSON,
// unknown dtype, offsets that do not match the shape, overlap, gaps, trailing
// bytes) is an error naming what is wrong; nothing panics.
func ReadSafetensors(data []byte) (*Tensors, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("safetensors: file is %d bytes, too short for the 8-byte header length", len(data))
	}
	n := binary.LittleEndian.Uint64(data[:8])
	if n > MaxHeaderBytes || n > uint64(len(data)-8) {
		return nil, fmt.Errorf("safetensors: header length %d does not fit the %d-byte file (truncated or not safetensors)", n, len(data))
	}
	hj := data[8 : 8+n]
	body := data[8+n:]
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hj, &raw); err != nil {
		return nil, fmt.Errorf("safetensors: header is not a JSON object: %w", err)
	}
	ts := &Tensors{Tensors: map[string]*graph.Tensor{}, Metadata: map[string]string{}}
	if m, ok := raw["__metadata__"]; ok {
		if err := json.Unmarshal(m, &ts.Metadata); err != nil {
			return nil, fmt.Errorf("safetensors: __metadata__ must map strings to strings: %w", err)
		}
		delete(raw, "__metadata__")
	}
	type span struct {
		name       string
		begin, end int64
	}
	var spans []span
	for name, msg := range raw {
		var e stEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("safetensors: tensor %s: bad entry: %w", name, err)
		}
		dt, ok := parseSTDType(e.DType)
		if !ok {
			return nil, fmt.Errorf("safetensors: tensor %s: unsupported dtype %q", name, e.DType)
		}
		if len(e.Offsets) != 2 {
			return nil, fmt.Errorf("safetensors: tensor %s: data_offsets must be [begin, end], got %v", name, e.Offsets)
		}
		numel := int64(1)
		for _, d := range e.Shape {
			if d < 0 || d > math.MaxInt32 {
				return nil, fmt.Errorf("safetensors: tensor %s: bad shape %v", name, e.Shape)
			}
			numel *= int64(d)
			if numel > int64(len(body)) {
				return nil, fmt.Errorf("safetensors: tensor %s: shape %v is larger than the file", name, e.Shape)
			}
		}
		b, en := e.Offsets[0], e.Offsets[1]
		if b < 0 || en < b || en > int64(len(body)) {
			return nil, fmt.Errorf("safetensors: tensor %s: data_offsets [%d, %d] outside the %d data bytes (truncated file?)", name, b, en, len(body))
		}
		if want := numel * int64(dt.Size()); en-b != want {
			return nil, fmt.Errorf("safetensors: tensor %s: %s%v needs %d bytes, data_offsets give %d", name, e.DType, e.Shape, want, en-b)
		}
		spans = append(spans, span{name, b, en})
		t := graph.NewTensor(dt, graph.Shape(e.Shape))
		if err := graph.DecodeLE(t, body[b:en]); err != nil {
			return nil, fmt.Errorf("safetensors: tensor %s: %w", name, err)
		}
		ts.Tensors[name] = t
	}
	// The data must be exactly the tensors, back to back: a gap or an
	// overlap means a damaged header, trailing bytes a damaged file.
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	var at int64
	for _, s := range spans {
		if s.begin != at {
			return nil, fmt.Errorf("safetensors: tensor %s starts at %d, previous data ends at %d (overlap or gap)", s.name, s.begin, at)
		}
		at = s.end
	}
	if at != int64(len(body)) {
		return nil, fmt.Errorf("safetensors: %d bytes after the last tensor (the header covers %d of %d data bytes)", int64(len(body))-at, at, len(body))
	}
	return ts, nil
}

// ReadSafetensorsFile reads and parses one file.
func ReadSafetensorsFile(path string) (*Tensors, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ts, err := ReadSafetensors(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ts, nil
}

// ReadSafetensorsMetadata reads the __metadata__ of a safetensors file from
// its header alone, not its tensors: what a checkpoint records of its run
// (its model config, the graph it was trained from) without reading its
// weights. The header length is bounded as in ReadSafetensors.
func ReadSafetensorsMetadata(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		return nil, fmt.Errorf("header length: %w", err)
	}
	if n > MaxHeaderBytes {
		return nil, fmt.Errorf("header of %d bytes is over the %d-byte limit", n, MaxHeaderBytes)
	}
	// The length is bounded above; a short file ends the read, not memory.
	head, err := io.ReadAll(io.LimitReader(f, int64(n)))
	if err != nil {
		return nil, err
	}
	if uint64(len(head)) != n {
		return nil, fmt.Errorf("header says %d bytes, the file has %d", n, len(head))
	}
	var h struct {
		Meta map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(head, &h); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	return h.Meta, nil
}

// atomicWrites is held while WriteFileAtomic creates its temporary file, and
// for good once StopAtomicWrites is called.
var atomicWrites sync.Mutex

// StopAtomicWrites makes every WriteFileAtomic from now on wait before it
// creates its temporary file, for as long as the process lives: for a process
// about to exit without finishing its writes (a second signal's abort), so
// that the temporaries it then removes are all there will be. A write that
// had its temporary already loses it (its rename fails): the file it would
// have replaced stays as it was.
func StopAtomicWrites() { atomicWrites.Lock() }

// WriteFileAtomic writes a file so that path holds either its old content or
// the complete new one, whatever happens: the data goes to a temporary file
// in the same folder (rename is atomic only within one file system), which is
// synced, closed and renamed over path; then the folder is synced so that the
// rename itself survives a power cut. A failed write removes the temporary.
func WriteFileAtomic(path string, write func(w io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	atomicWrites.Lock()
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	atomicWrites.Unlock()
	if err != nil {
		// Name the folder, not the temp file the user never asked for.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return fmt.Errorf("folder %s: %w", dir, pe.Err)
		}
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp makes the file private (0600); a checkpoint or a plot is
	// as readable as any file the user writes.
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = write(f); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir fsyncs a folder so a rename in it is durable. Some file systems
// refuse fsync on a directory; that is not a write error.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) && !isUnsupported(err) {
		return err
	}
	return nil
}

func isUnsupported(err error) bool {
	var pe *os.PathError
	if errors.As(err, &pe) {
		s := pe.Err.Error()
		return strings.Contains(s, "not supported") || strings.Contains(s, "invalid argument")
	}
	return false
}
