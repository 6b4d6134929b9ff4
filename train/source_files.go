package train

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/graph"
)

// A graph-trained model's checkpoint folder keeps what rebuilds its graph:
// source/<sha>.onnx (or .txt), the model file as trained, and
// source/<sha>.bind.safetensors, the bound inputs. Files are named by the
// model file's sha256, so a fresh run of another model in the same folder
// never overwrites the files an earlier run's checkpoints need.

// SourceDir is the folder of a checkpoint folder that holds the model files.
func SourceDir(ckptDir string) string { return filepath.Join(ckptDir, "source") }

// SourceFile is where a checkpoint folder keeps the model file of spec.
func SourceFile(ckptDir string, spec GraphSpec) string {
	ext := ".txt"
	if spec.Format == "onnx" {
		ext = ".onnx"
	}
	return filepath.Join(SourceDir(ckptDir), spec.SHA256[:min(16, len(spec.SHA256))]+ext)
}

// SourceBindFile is where a checkpoint folder keeps spec's bound inputs.
func SourceBindFile(ckptDir string, spec GraphSpec) string {
	return filepath.Join(SourceDir(ckptDir), spec.SHA256[:min(16, len(spec.SHA256))]+".bind.safetensors")
}

// SaveSourceFiles writes the model file (data) and the bound inputs of spec
// into ckptDir's source folder, each atomically; a file already there with
// the same content is left alone.
func SaveSourceFiles(ckptDir string, spec GraphSpec, data []byte, binds map[string]*graph.Tensor) error {
	if len(spec.SHA256) < 16 || FileSHA256(data) != spec.SHA256 {
		return fmt.Errorf("train: the model file's content does not match its recorded sha256")
	}
	if err := os.MkdirAll(SourceDir(ckptDir), 0o755); err != nil {
		return fmt.Errorf("checkpoint folder: %w", err)
	}
	p := SourceFile(ckptDir, spec)
	if old, err := os.ReadFile(p); err != nil || !bytes.Equal(old, data) {
		if err := checkpoint.WriteFileAtomic(p, func(w io.Writer) error { _, err := w.Write(data); return err }); err != nil {
			return fmt.Errorf("checkpoint folder: copy of the model file: %w", err)
		}
	}
	if len(binds) == 0 {
		return nil
	}
	ts := &checkpoint.Tensors{Tensors: binds, Metadata: map[string]string{"model_sha256": spec.SHA256}}
	if err := checkpoint.WriteFileAtomic(SourceBindFile(ckptDir, spec), func(w io.Writer) error { return checkpoint.WriteSafetensors(w, ts) }); err != nil {
		return fmt.Errorf("checkpoint folder: bound inputs: %w", err)
	}
	return nil
}

// LoadSourceFiles reads back what SaveSourceFiles wrote for spec, checking
// the model file and every bound tensor against the spec's hashes.
func LoadSourceFiles(ckptDir string, spec GraphSpec) (data []byte, binds map[string]*graph.Tensor, err error) {
	p := SourceFile(ckptDir, spec)
	data, err = os.ReadFile(p)
	if err != nil {
		return nil, nil, fmt.Errorf("the checkpoint's model file: %w (give the model FILE: it was %s)", err, spec.File)
	}
	if FileSHA256(data) != spec.SHA256 {
		return nil, nil, fmt.Errorf("%s is not the model the checkpoint was trained from (sha256 differs; give the model FILE: it was %s)", p, spec.File)
	}
	if len(spec.Bind) == 0 {
		return data, nil, nil
	}
	ts, err := checkpoint.ReadSafetensorsFile(SourceBindFile(ckptDir, spec))
	if err != nil {
		return nil, nil, fmt.Errorf("the checkpoint's bound inputs: %w", err)
	}
	for name, sum := range spec.Bind {
		t := ts.Tensors[name]
		if t == nil || TensorSHA256(t) != sum {
			return nil, nil, fmt.Errorf("the checkpoint's bound input %s is missing or differs from the one trained with", name)
		}
	}
	return data, ts.Tensors, nil
}

// CheckpointSpec returns the GraphSpec of the newest checkpoint in dir: nil
// when there is no checkpoint or it is of the built-in model. Only the
// header is read.
func CheckpointSpec(dir string) (*GraphSpec, string, error) {
	p, _, err := checkpoint.LatestCheckpoint(dir)
	if err != nil || p == "" {
		return nil, p, err
	}
	spec, err := CheckpointFileSpec(p)
	return spec, p, err
}

// CheckpointFileSpec is CheckpointSpec of one checkpoint file.
func CheckpointFileSpec(p string) (*GraphSpec, error) {
	meta, err := checkpoint.ReadSafetensorsMetadata(p)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", p, err)
	}
	spec, err := sourceSpec(meta)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", p, err)
	}
	return spec, nil
}

// sourceSpec is the GraphSpec a checkpoint's metadata records (MetaSource):
// nil for the built-in model, an error for a record that is not one.
func sourceSpec(meta map[string]string) (*GraphSpec, error) {
	raw, ok := meta[MetaSource]
	if !ok {
		return nil, nil
	}
	var spec GraphSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil || spec.SHA256 == "" {
		return nil, fmt.Errorf("damaged source record %q", raw)
	}
	return &spec, nil
}
