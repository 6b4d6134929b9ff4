package train

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// untilDone runs f and returns its result, or, as soon as ctx is done, an
// error wrapping ctx's cause (saying what was given up): work that cannot be
// stopped midway (compiling a graph) then finishes in the background and
// its result is released. A run interrupted while compiling thus returns at
// once instead of after the compilation.
func untilDone[T any](ctx context.Context, what string, f func() (T, error), release func(T) error) (T, error) {
	var zero T
	if ctx.Err() != nil {
		return zero, fmt.Errorf("%w while %s", context.Cause(ctx), what)
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.err == nil && release != nil {
				release(r.v)
			}
		}()
		return zero, fmt.Errorf("%w while %s", context.Cause(ctx), what)
	}
}

// runState is where a run is, so that an interrupt is acknowledged at once
// with what will happen next.
type runState struct {
	mu     sync.Mutex
	phase  string // phaseCompiling, phaseStep, phaseValidating, phaseBetween, phaseDiagnosing
	step   int64  // completed steps
	ckpt   bool   // an interrupt saves a checkpoint
	unsave bool   // steps since the last checkpoint
	say    func(string)
}

const (
	phaseCompiling  = "compiling"
	phaseStep       = "step"
	phaseValidating = "validating"
	phaseBetween    = "between"
	phaseDiagnosing = "diagnosing" // re-running a diverged step with every node checked
)

func (s *runState) set(phase string, step int64) {
	s.mu.Lock()
	s.phase, s.step = phase, step
	s.mu.Unlock()
}

// setSay routes the acknowledgement (to the progress display once there is one).
func (s *runState) setSay(f func(string)) {
	s.mu.Lock()
	s.say = f
	s.mu.Unlock()
}

func (s *runState) unsaved(u bool) {
	s.mu.Lock()
	s.unsave = u
	s.mu.Unlock()
}

// ack is the line an interrupt is acknowledged with.
func (s *runState) ack(cause error) string {
	what := "interrupted"
	if cause != nil && !errors.Is(cause, context.Canceled) {
		what = cause.Error()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	save := ""
	if s.ckpt && (s.unsave || s.phase == phaseStep) {
		save = ", then saving a checkpoint"
	}
	switch s.phase {
	case phaseCompiling:
		return fmt.Sprintf("%s: stopping now (the training step was compiling; nothing trained in this run)…", what)
	case phaseStep:
		return fmt.Sprintf("%s: stopping after step %d (the step in flight)%s…", what, s.step+1, save)
	case phaseValidating:
		return fmt.Sprintf("%s: stopping the validation at step %d%s…", what, s.step, save)
	case phaseDiagnosing:
		return fmt.Sprintf("%s: stopping the re-run of diverged step %d (the last good checkpoint is kept)…", what, s.step+1)
	}
	return fmt.Sprintf("%s: stopping after step %d%s…", what, s.step, save)
}

// watch prints the acknowledgement as soon as ctx is done; the returned
// function stops watching, after the acknowledgement of a ctx already done
// (so that it comes before what the run prints next). It may be called more
// than once.
func (s *runState) watch(ctx context.Context) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case <-ctx.Done():
		case <-done:
			if ctx.Err() == nil {
				return
			}
		}
		msg := s.ack(context.Cause(ctx))
		s.mu.Lock()
		say := s.say
		s.mu.Unlock()
		if say != nil {
			say(msg)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-finished
	}
}
