package train

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgraph/flashgraph/model"
)

// ckptMetaFile writes a safetensors file with no tensors and the given metadata,
// and returns its path; a negative hdrLen writes the real header length.
func ckptMetaFile(t *testing.T, meta map[string]string, hdrLen int64) string {
	t.Helper()
	h, _ := json.Marshal(map[string]any{"__metadata__": meta})
	n := uint64(len(h))
	if hdrLen >= 0 {
		n = uint64(hdrLen)
	}
	b := binary.LittleEndian.AppendUint64(nil, n)
	p := filepath.Join(t.TempDir(), "c.safetensors")
	if err := os.WriteFile(p, append(b, h...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheckpointConfig(t *testing.T) {
	cfg, _ := model.Lookup("tiny")
	cfg.KVHeads, cfg.Vocab = 2, 50257
	js, _ := json.Marshal(cfg)
	got, err := CheckpointConfig(ckptMetaFile(t, map[string]string{"format": "flashgraph-train/1", "config": string(js)}, -1))
	if err != nil || got != cfg {
		t.Fatalf("config %+v, %v; want %+v", got, err, cfg)
	}
	for _, c := range []struct {
		path string
		want string
	}{
		{ckptMetaFile(t, map[string]string{"format": "other"}, -1), "not a flashgraph training checkpoint"},
		{ckptMetaFile(t, map[string]string{"format": "flashgraph-train/1", "config": "{"}, -1), "config"},
		{ckptMetaFile(t, map[string]string{"format": "flashgraph-train/1", "config": `{"Name":"x"}`}, -1), "must be positive"},
		{ckptMetaFile(t, nil, 1<<62), "over the"},
		{ckptMetaFile(t, nil, 1000), "header says 1000 bytes"},
		{filepath.Join(t.TempDir(), "missing"), "no such file"},
	} {
		if _, err := CheckpointConfig(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err %v, want %q", err, c.want)
		}
	}
}
