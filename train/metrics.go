package train

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
)

// metricsLine is one line of Options.Metrics (JSON lines): a step's loss,
// learning rate, gradient norm (with -clip), steady-state tokens/s and MFU
// (when known), or a validation loss. Fields that are not known are left
// out, never written as 0.
type metricsLine struct {
	Step     int64    `json:"step"`
	Loss     *float64 `json:"loss,omitempty"`
	LR       *float64 `json:"lr,omitempty"`
	GradNorm *float64 `json:"grad_norm,omitempty"`
	TokS     *float64 `json:"tok_s,omitempty"`
	MFU      *float64 `json:"mfu,omitempty"`
	StepMs   *float64 `json:"step_ms,omitempty"`
	ValLoss  *float64 `json:"val_loss,omitempty"`
}

func some(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil // JSON has no NaN; a non-finite value stops the run anyway
	}
	return &v
}

func positive(v float64) *float64 {
	if v > 0 {
		return some(v)
	}
	return nil
}

// metrics writes the JSON lines of a run (nil writer: nothing).
type metrics struct {
	w   io.Writer
	err error // the first write error, reported at the end of the run
}

func (m *metrics) write(l metricsLine) {
	if m.w == nil || m.err != nil {
		return
	}
	b, err := json.Marshal(l)
	if err == nil {
		_, err = m.w.Write(append(b, '\n'))
	}
	if err != nil {
		m.err = fmt.Errorf("train: writing the metrics: %w", err)
	}
}

// divergedError adds to a step's divergence error where the run can go on
// from: the last complete checkpoint, which the run keeps.
func divergedError(err error, ckpt string, step int64) error {
	if ckpt == "" {
		return fmt.Errorf("%w; no checkpoint of this run to go back to", err)
	}
	return fmt.Errorf("%w; the last good checkpoint, %s (step %d), is kept: -resume continues from it (with a lower -lr, or -clip)", err, ckpt, step)
}
