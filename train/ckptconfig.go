package train

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/flashgraph/flashgraph/model"
)

// CheckpointConfig reads the model config a checkpoint was trained with
// from its header alone (the tensors are not read): what -resume builds.
func CheckpointConfig(path string) (model.Config, error) {
	var cfg model.Config
	f, err := os.Open(path)
	if err != nil {
		return cfg, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: too short for a safetensors header: %w", path, err)
	}
	size := binary.LittleEndian.Uint64(n[:])
	if size > maxHeaderBytes {
		return cfg, fmt.Errorf("checkpoint %s: header length %d is not plausible (not safetensors)", path, size)
	}
	hj := make([]byte, size)
	if _, err := io.ReadFull(f, hj); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: header: %w (truncated?)", path, err)
	}
	var h struct {
		Meta map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(hj, &h); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: header is not JSON: %w", path, err)
	}
	if f := h.Meta[MetaFormat]; f != CheckpointFormat {
		return cfg, fmt.Errorf("checkpoint %s: format %q, want %q (not a flashgraph training checkpoint)", path, f, CheckpointFormat)
	}
	if err := json.Unmarshal([]byte(h.Meta[MetaConfig]), &cfg); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: config: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return cfg, nil
}
