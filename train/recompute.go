package train

import (
	"fmt"

	"github.com/flashgraph/flashgraph/passes"
)

// RecomputeMode says what a training step recomputes in the backward
// instead of keeping from the forward (passes.Recompute). None of the modes
// changes what the step computes: the recomputed values are the same ops on
// the same inputs.
type RecomputeMode string

const (
	// RecomputeNone keeps every activation the backward reads.
	RecomputeNone RecomputeMode = ""
	// RecomputeCheap recomputes norms and elementwise ops and keeps the
	// GEMM and attention outputs (passes.RecomputeCheap): most of the
	// memory saving for little arithmetic.
	RecomputeCheap RecomputeMode = "cheap"
	// RecomputeFull recomputes each layer's whole forward (passes.RecomputeFull).
	RecomputeFull RecomputeMode = "full"
)

// ParseRecomputeMode reads a -recompute value: none, cheap or full; true
// and false (the flag given alone, or =false) mean full and none, as when
// -recompute was a switch.
func ParseRecomputeMode(s string) (RecomputeMode, error) {
	switch s {
	case "none", "false", "":
		return RecomputeNone, nil
	case "cheap":
		return RecomputeCheap, nil
	case "full", "true":
		return RecomputeFull, nil
	}
	return RecomputeNone, fmt.Errorf("recompute mode %q: want none, cheap or full", s)
}

// String is the mode's flag value.
func (m RecomputeMode) String() string {
	if m == RecomputeNone {
		return "none"
	}
	return string(m)
}

// On reports whether the step recomputes anything.
func (m RecomputeMode) On() bool { return m != RecomputeNone }

// pass is the recomputation that m runs on a training step.
func (m RecomputeMode) pass() passes.Recompute {
	if m == RecomputeCheap {
		return passes.Recompute{Mode: passes.RecomputeCheap}
	}
	return passes.Recompute{Mode: passes.RecomputeFull}
}

// RecomputeMode is what h recomputes.
func (h Hyper) RecomputeMode() RecomputeMode {
	switch {
	case !h.Recompute:
		return RecomputeNone
	case h.RecomputeCheap:
		return RecomputeCheap
	}
	return RecomputeFull
}

// WithRecompute returns h set to recompute as m says.
func (h Hyper) WithRecompute(m RecomputeMode) Hyper {
	h.Recompute, h.RecomputeCheap = m.On(), m == RecomputeCheap
	return h
}
