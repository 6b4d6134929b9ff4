package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
)

// signalError is the error of a command stopped by a signal: realMain exits
// with 128 + the signal's number, as a shell reports a process killed by it
// (130 for SIGINT, 143 for SIGTERM), so that scripts see that the run did not
// finish.
type signalError struct{ sig syscall.Signal }

func (e *signalError) Error() string { return "interrupted (" + signalName(e.sig) + ")" }

// exitCode is the status of a process stopped by the signal.
func (e *signalError) exitCode() int { return 128 + int(e.sig) }

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

// runSignals turns SIGINT and SIGTERM into a cancelled context for a long
// command. The first signal is acknowledged on stderr at once and cancels
// ctx (with a *signalError as its cause); the command then stops at its next
// safe point (train: after the step in flight, with a checkpoint). A second
// signal aborts at once: the cleanup registered with onAbort runs and the
// process exits.
type runSignals struct {
	ctx      context.Context
	cancel   context.CancelCauseFunc
	ch       chan os.Signal
	done     chan struct{} // closed by stop
	finished chan struct{} // closed when loop returns
	stderr   io.Writer

	mu    sync.Mutex
	first *signalError
	phase string // what the command is doing; "" when the work acknowledges the signal itself
	abort func()
	exit  func(int) // os.Exit
}

func watchSignals(stderr io.Writer) *runSignals {
	s := &runSignals{ch: make(chan os.Signal, 2), done: make(chan struct{}), finished: make(chan struct{}), stderr: stderr, exit: os.Exit}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	signal.Notify(s.ch, syscall.SIGINT, syscall.SIGTERM)
	go s.loop()
	return s
}

func (s *runSignals) loop() {
	defer close(s.finished)
	for {
		var sig os.Signal
		select {
		case sig = <-s.ch:
		case <-s.done:
			// A signal that came before stop still counts: a second one
			// aborts even if the command was about to return.
			select {
			case sig = <-s.ch:
			default:
				return
			}
		}
		ss, _ := sig.(syscall.Signal)
		s.mu.Lock()
		if s.first == nil {
			s.first = &signalError{ss}
			phase := s.phase
			s.mu.Unlock()
			if phase != "" {
				fmt.Fprintf(s.stderr, "\n%s: stopping now (during %s)…\n", signalName(ss), phase)
			}
			s.cancel(s.first)
			continue
		}
		abort := s.abort
		s.mu.Unlock()
		fmt.Fprintf(s.stderr, "\n%s: a second signal: aborting now; the last complete checkpoint is kept\n", signalName(ss))
		if abort != nil {
			abort()
		}
		s.exit(128 + int(ss))
		return
	}
}

// stop stops watching: signals get their default action again. It waits
// for the watcher, so that a second signal that came in the meantime aborts
// (and ends the process) before the command returns with another status.
func (s *runSignals) stop() {
	signal.Stop(s.ch)
	close(s.done)
	<-s.finished
	s.cancel(nil)
}

// setPhase names what the command does now (for the acknowledgement); ""
// says the work in progress acknowledges the signal itself.
func (s *runSignals) setPhase(p string) {
	s.mu.Lock()
	s.phase = p
	s.mu.Unlock()
}

// onAbort sets the cleanup of a second signal.
func (s *runSignals) onAbort(f func()) {
	s.mu.Lock()
	s.abort = f
	s.mu.Unlock()
}

// err is the *signalError of the first signal, nil before one.
func (s *runSignals) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.first == nil {
		return nil
	}
	return s.first
}

// do runs f as phase and returns its error, or the signal's as soon as one
// comes: work that cannot be stopped midway (reading the data, building the
// graphs) is left to finish in the background while the command returns,
// and the process exits.
func (s *runSignals) do(phase string, f func() error) error {
	if err := s.err(); err != nil {
		return err
	}
	s.setPhase(phase)
	res := make(chan error, 1)
	go func() { res <- f() }()
	select {
	case err := <-res:
		return err
	case <-s.ctx.Done():
		return s.err()
	}
}

// createdFiles records what a run creates, so that an aborted run removes it:
// folders that did not exist and files that were not there before the run,
// and the half-written temporary files of atomic writes. Checkpoints are
// never removed: the last complete one is what the run leaves behind.
type createdFiles struct {
	mu    sync.Mutex
	dirs  []string // created folders, parents first
	files []string // files that did not exist before the run
}

// dir notes that d will be created (if it does not exist yet).
func (c *createdFiles) dir(d string) {
	if d == "" {
		return
	}
	if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
		c.mu.Lock()
		c.dirs = append(c.dirs, d)
		c.mu.Unlock()
	}
}

// file notes that p will be written (if it does not exist yet).
func (c *createdFiles) file(p string) {
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		c.mu.Lock()
		c.files = append(c.files, p)
		c.mu.Unlock()
	}
}

// remove removes the created files, temporary files of atomic writes in the
// created or watched folders, and the created folders left empty.
func (c *createdFiles) remove(watched ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.files {
		os.Remove(f)
	}
	for _, d := range append(append([]string(nil), c.dirs...), watched...) {
		if d == "" {
			continue
		}
		tmps, _ := filepath.Glob(filepath.Join(d, ".*.tmp-*"))
		for _, t := range tmps {
			os.Remove(t)
		}
	}
	for i := len(c.dirs) - 1; i >= 0; i-- {
		os.Remove(c.dirs[i]) // only an empty folder goes
	}
}
