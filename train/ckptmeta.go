package train

import (
	"encoding/json"
	"fmt"

	"github.com/flashgraph/flashgraph/checkpoint"
	"github.com/flashgraph/flashgraph/model"
)

// CheckpointConfig returns the model config a checkpoint was trained with,
// reading only the file's safetensors header (not its tensors), so that
// `train -resume` and `generate` know the model without flags.
func CheckpointConfig(path string) (model.Config, error) {
	var cfg model.Config
	meta, err := checkpoint.ReadSafetensorsMetadata(path)
	if err != nil {
		return cfg, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if f := meta[checkpoint.MetaFormat]; f != checkpoint.CheckpointFormat {
		return cfg, fmt.Errorf("checkpoint %s: format %q, want %q (not a flashgraph training checkpoint)", path, f, checkpoint.CheckpointFormat)
	}
	if err := json.Unmarshal([]byte(meta[checkpoint.MetaConfig]), &cfg); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: config: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return cfg, nil
}
