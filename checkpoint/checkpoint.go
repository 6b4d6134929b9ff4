// Package checkpoint reads and writes safetensors files and keeps the
// checkpoints of a training run: one file per step, written atomically,
// pruned, listed and loaded. Package train fills and restores them; package
// generate reads them without depending on train.
package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/flashgraph/flashgraph/graph"
)

// Checkpoints are safetensors files named step-NNNNNNNN.safetensors in one
// folder, NNNNNNNN being the number of completed steps. Each holds every
// initializer the training step updates (params, AdamW moments opt.m.* and
// opt.v.*) and, in __metadata__, what is needed to continue exactly: the
// step, the model config, the training options, the data seed and the
// corpus fingerprint (see Metadata keys below).

const (
	ckptPrefix = "step-"
	ckptSuffix = ".safetensors"
)

// Metadata keys of a checkpoint.
const (
	MetaFormat      = "format"       // CheckpointFormat
	MetaStep        = "step"         // completed steps
	MetaConfig      = "config"       // model.Config as JSON
	MetaOptions     = "train"        // the run's schedule and optimizer settings as JSON
	MetaDataSeed    = "data_seed"    // seed of the batch sampler
	MetaDataNext    = "data_next"    // index of the next batch (batch k is a function of data_seed and k)
	MetaCorpus      = "corpus"       // Corpus.Fingerprint of the data trained on
	MetaTrainTokens = "train_tokens" // tokens consumed so far
	MetaLosses      = "losses"       // per-step train losses so far, for the curve
	MetaValLosses   = "val_losses"   // (step, loss) validation points so far
	MetaElapsed     = "elapsed_s"    // wall time spent training so far
)

// CheckpointFormat names this layout; a reader refuses any other.
const CheckpointFormat = "flashgraph-train/1"

// CheckpointPath is the file of step in dir.
func CheckpointPath(dir string, step int64) string {
	return filepath.Join(dir, fmt.Sprintf("%s%08d%s", ckptPrefix, step, ckptSuffix))
}

// parseCheckpointName returns the step of a checkpoint file name.
func parseCheckpointName(name string) (int64, bool) {
	if !strings.HasPrefix(name, ckptPrefix) || !strings.HasSuffix(name, ckptSuffix) {
		return 0, false
	}
	s, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(name, ckptPrefix), ckptSuffix), 10, 64)
	if err != nil || s < 0 {
		return 0, false
	}
	return s, true
}

// ListCheckpoints returns the steps of the checkpoints in dir, ascending. A
// missing folder has none. Temporary files of an interrupted write never
// match: they start with a dot and end in .tmp-*.
func ListCheckpoints(dir string) ([]int64, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var steps []int64
	for _, e := range ents {
		if s, ok := parseCheckpointName(e.Name()); ok && e.Type().IsRegular() {
			steps = append(steps, s)
		}
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i] < steps[j] })
	return steps, nil
}

// LatestCheckpoint returns the path and step of the newest checkpoint in dir,
// or "" when there is none.
func LatestCheckpoint(dir string) (string, int64, error) {
	steps, err := ListCheckpoints(dir)
	if err != nil || len(steps) == 0 {
		return "", 0, err
	}
	s := steps[len(steps)-1]
	return CheckpointPath(dir, s), s, nil
}

// SaveHook lets tests (here, and train's kill stress) stand between the
// encoder and the file, to fail or stall a write part way through; nil in
// normal use.
var SaveHook func(w io.Writer) io.Writer

// SaveCheckpoint writes ts as the checkpoint of step in dir, atomically, and
// then prunes older checkpoints: the newest is always kept, and with
// keepEvery > 0 so is every step that is a multiple of it. Stale temporaries
// of earlier crashed writes are removed too.
func SaveCheckpoint(dir string, step int64, ts *Tensors, keepEvery int64) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	path := CheckpointPath(dir, step)
	err := WriteFileAtomic(path, func(w io.Writer) error {
		if SaveHook != nil {
			w = SaveHook(w)
		}
		return WriteSafetensors(w, ts)
	})
	if err != nil {
		return "", fmt.Errorf("checkpoint %s: %w; %s", path, err, previousCheckpoint(dir, step, err))
	}
	steps, err := ListCheckpoints(dir)
	if err != nil {
		return path, nil // saved; pruning is best effort
	}
	for _, s := range steps {
		if s < step && !(keepEvery > 0 && s%keepEvery == 0) {
			os.Remove(CheckpointPath(dir, s))
		}
	}
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if n := e.Name(); strings.HasPrefix(n, "."+ckptPrefix) && strings.Contains(n, ckptSuffix+".tmp-") {
				os.Remove(filepath.Join(dir, n))
			}
		}
	}
	return path, nil
}

// previousCheckpoint says, after a failed save of step, what a resumed run
// would start from. A save writes a temporary file and renames it only once
// complete, so a failure (a full disk above all) never touches the checkpoint
// before it.
func previousCheckpoint(dir string, step int64, failure error) string {
	var msg string
	if errors.Is(failure, syscall.ENOSPC) || errors.Is(failure, syscall.EFBIG) {
		msg = fmt.Sprintf("no room for the checkpoint in %s (free space there); ", dir)
	}
	p, s, err := LatestCheckpoint(dir)
	switch {
	case err != nil:
		return msg + fmt.Sprintf("could not list earlier checkpoints: %v", err)
	case p == "" || s >= step:
		return msg + fmt.Sprintf("there is no earlier checkpoint in %s", dir)
	}
	return msg + fmt.Sprintf("the previous checkpoint %s (step %d) is untouched and -resume continues from it", p, s)
}

// LoadCheckpoint reads a checkpoint and checks it is one of ours.
func LoadCheckpoint(path string) (*Tensors, int64, error) {
	ts, err := ReadSafetensorsFile(path)
	if err != nil {
		return nil, 0, fmt.Errorf("checkpoint: %w", err)
	}
	if f := ts.Metadata[MetaFormat]; f != CheckpointFormat {
		return nil, 0, fmt.Errorf("checkpoint %s: format %q, want %q (not a flashgraph training checkpoint)", path, f, CheckpointFormat)
	}
	step, err := strconv.ParseInt(ts.Metadata[MetaStep], 10, 64)
	if err != nil || step < 0 {
		return nil, 0, fmt.Errorf("checkpoint %s: bad step %q in metadata", path, ts.Metadata[MetaStep])
	}
	return ts, step, nil
}

// CheckState compares a checkpoint's tensors with the state a graph expects
// (name → type): every expected tensor present with its dtype and shape, and
// nothing else. The error lists every mismatch, so a wrong -config shows at
// once what differs.
func CheckState(ts *Tensors, want map[string]graph.TensorType) error {
	var problems []string
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t, ok := ts.Tensors[n]
		if !ok {
			problems = append(problems, fmt.Sprintf("missing %s (%v)", n, want[n]))
			continue
		}
		if !t.Type().Equal(want[n]) {
			problems = append(problems, fmt.Sprintf("%s is %v, the graph wants %v", n, t.Type(), want[n]))
		}
	}
	var extra []string
	for n := range ts.Tensors {
		if _, ok := want[n]; !ok {
			extra = append(extra, n)
		}
	}
	sort.Strings(extra)
	for _, n := range extra {
		problems = append(problems, fmt.Sprintf("unexpected tensor %s", n))
	}
	if len(problems) == 0 {
		return nil
	}
	const show = 8
	msg := strings.Join(problems[:min(show, len(problems))], "; ")
	if len(problems) > show {
		msg += fmt.Sprintf("; and %d more", len(problems)-show)
	}
	return fmt.Errorf("checkpoint does not match the training graph: %s", msg)
}
