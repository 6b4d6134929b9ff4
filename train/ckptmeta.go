package train

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/model"
)

// CheckpointConfig returns the model config a checkpoint was trained with,
// reading only the file's safetensors header (not its tensors), so that
// `train -resume` and `generate` know the model without flags.
func CheckpointConfig(path string) (model.Config, error) {
	var cfg model.Config
	f, err := os.Open(path)
	if err != nil {
		return cfg, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: header length: %w", path, err)
	}
	if n > checkpoint.MaxHeaderBytes {
		return cfg, fmt.Errorf("checkpoint %s: header of %d bytes is over the %d-byte limit", path, n, checkpoint.MaxHeaderBytes)
	}
	// The length is bounded above; a short file ends the read, not memory.
	head, err := io.ReadAll(io.LimitReader(f, int64(n)))
	if err != nil {
		return cfg, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if uint64(len(head)) != n {
		return cfg, fmt.Errorf("checkpoint %s: header says %d bytes, the file has %d", path, n, len(head))
	}
	var h struct {
		Meta map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(head, &h); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: header: %w", path, err)
	}
	if f := h.Meta[checkpoint.MetaFormat]; f != checkpoint.CheckpointFormat {
		return cfg, fmt.Errorf("checkpoint %s: format %q, want %q (not a flashgraph training checkpoint)", path, f, checkpoint.CheckpointFormat)
	}
	if err := json.Unmarshal([]byte(h.Meta[checkpoint.MetaConfig]), &cfg); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: config: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return cfg, nil
}
