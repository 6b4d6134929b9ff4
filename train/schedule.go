package train

import (
	"fmt"
	"math"
)

// Schedule is the learning rate as a pure function of the step: linear
// warmup from Peak/Warmup to Peak over the first Warmup steps, then a cosine
// from Peak down to Min at step Total. Being a function of the step alone is
// what lets a resumed run use exactly the rates the uninterrupted run would.
type Schedule struct {
	Peak, Min     float64
	Warmup, Total int64
}

// LR is the rate of step i (0-based: i completed steps before it).
func (s Schedule) LR(i int64) float64 {
	if i < s.Warmup {
		return s.Peak * float64(i+1) / float64(s.Warmup)
	}
	span := s.Total - s.Warmup
	if span <= 0 || i >= s.Total {
		return s.Min
	}
	progress := float64(i-s.Warmup) / float64(span)
	return s.Min + 0.5*(s.Peak-s.Min)*(1+math.Cos(math.Pi*progress))
}

// Validate reports a schedule that cannot train.
func (s Schedule) Validate() error {
	switch {
	case !(s.Peak > 0) || math.IsInf(s.Peak, 0):
		return fmt.Errorf("learning rate must be positive, got %v", s.Peak)
	case s.Min < 0 || s.Min > s.Peak || math.IsNaN(s.Min):
		return fmt.Errorf("minimum learning rate must be in [0, %v], got %v", s.Peak, s.Min)
	case s.Warmup < 0:
		return fmt.Errorf("warmup must not be negative, got %d", s.Warmup)
	case s.Total <= 0:
		return fmt.Errorf("steps must be positive, got %d", s.Total)
	}
	return nil
}
