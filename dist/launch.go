package dist

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Launch describes a job of World ranks on this host, one process each, as
// train -gpus N starts it: every process runs Path with Args and Env plus the
// torchrun variables of its rank, so that a rank is the same program on one
// host as on many.
type Launch struct {
	Path       string
	Args       []string
	Env        []string // the environment every rank starts with
	World      int
	MasterAddr string
	MasterPort int
	// Stdout and Stderr receive rank 0's output; the other ranks' output is
	// kept (its last TailBytes) to explain a failure.
	Stdout, Stderr io.Writer
	// Started, if set, is told each rank's process id (tests check that none
	// outlives the job).
	Started func(rank, pid int)
	// Signals, if set, are passed on to every rank that is still running.
	// The ranks run in a process group of their own (on Linux), so that a
	// terminal's Ctrl-C reaches them once, through the launcher, and not
	// twice (a rank takes a second signal as "abort now").
	Signals <-chan os.Signal
	// Graceful, if set, says that a rank's unsuccessful exit is one the
	// others are about to make too (stopped by a signal that every rank
	// got): the launcher then waits for them instead of killing them, and
	// still returns the first such exit as a *RankError.
	Graceful func(rank int, err error) bool
}

// TailBytes is how much of a failing rank's output its error repeats.
const TailBytes = 4096

// tail keeps the last TailBytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > TailBytes {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-TailBytes:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// RankError is a launched job's failure: the first rank to exit unsuccessfully
// and what it said.
type RankError struct {
	Rank   int
	Err    error  // how it ended (exit status or signal)
	Output string // the end of its output
}

func (e *RankError) Error() string {
	msg := fmt.Sprintf("rank %d failed: %v", e.Rank, e.Err)
	if e.Output != "" {
		msg += "\n" + e.Output
	}
	return msg
}

// Run starts the ranks and waits for them. When one exits unsuccessfully the
// others are killed (so none outlives the job, and none waits on a peer that
// is gone) and Run returns a *RankError naming it, or, if within a second a
// rank dies by a signal, naming that one (the likely cause); when ctx is done
// every rank is killed and Run returns ctx's error. On Linux a rank is also
// killed if the launcher itself dies.
func (l *Launch) Run(ctx context.Context) error {
	if l.World < 1 {
		return fmt.Errorf("dist: launch: world size must be at least 1, got %d", l.World)
	}
	cmds := make([]*exec.Cmd, l.World)
	tails := make([]*tail, l.World)
	for r := range l.World {
		cmd := exec.Command(l.Path, l.Args...)
		cmd.Env = append(append([]string(nil), l.Env...),
			EnvRank+"="+strconv.Itoa(r),
			EnvWorldSize+"="+strconv.Itoa(l.World),
			EnvLocalRank+"="+strconv.Itoa(r),
			EnvMasterAddr+"="+l.MasterAddr,
			EnvMasterPort+"="+strconv.Itoa(l.MasterPort),
		)
		tails[r] = &tail{}
		if r == 0 {
			cmd.Stdout = io.MultiWriter(orDiscard(l.Stdout), tails[r])
			cmd.Stderr = io.MultiWriter(orDiscard(l.Stderr), tails[r])
		} else {
			cmd.Stdout, cmd.Stderr = tails[r], tails[r]
		}
		dieWithParent(cmd)
		cmds[r] = cmd
	}
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, l.World)
	started := 0
	killAll := func() {
		for _, c := range cmds[:started] {
			c.Process.Kill()
		}
	}
	for r, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			killAll()
			for range started {
				<-exits
			}
			return fmt.Errorf("dist: launch: starting rank %d: %w", r, err)
		}
		started++
		if l.Started != nil {
			l.Started(r, cmd.Process.Pid)
		}
		go func() { exits <- exit{r, cmd.Wait()} }()
	}
	var first *RankError
	var ctxErr error
	done := ctx.Done()
	running := make([]bool, l.World)
	for r := range running {
		running[r] = true
	}
	// A rank that fails because a peer died usually exits before the
	// peer's own death is reaped here: which exit comes first is a race.
	// So a failure that is an ordinary exit waits up to rootCauseWait for a
	// rank killed by a signal (not by this launcher) to name instead; a
	// rank killed by a signal is named at once.
	var grace <-chan time.Time
	killed := false
	stop := func() {
		grace = nil
		if !killed {
			killed = true
			killAll()
		}
	}
	for left := l.World; left > 0; {
		select {
		case sig := <-l.Signals:
			for r, c := range cmds {
				if running[r] {
					c.Process.Signal(sig)
				}
			}
		case e := <-exits:
			left--
			running[e.rank] = false
			if e.err == nil || ctxErr != nil || killed {
				continue
			}
			switch {
			case first == nil:
				first = &RankError{Rank: e.rank, Err: e.err}
				switch {
				case l.Graceful != nil && l.Graceful(e.rank, e.err):
				case killedBySignal(e.err):
					stop()
				default:
					grace = time.After(rootCauseWait)
				}
			case grace != nil && killedBySignal(e.err):
				first = &RankError{Rank: e.rank, Err: e.err}
				stop()
			}
		case <-grace:
			stop()
		case <-done:
			ctxErr = ctx.Err()
			done = nil
			stop()
		}
	}
	if first != nil {
		// Read the tail only after the process is reaped: its output is complete.
		first.Output = tails[first.Rank].String()
		return first
	}
	if ctxErr != nil {
		return errors.Join(errors.New("dist: launch: stopped"), ctxErr)
	}
	return nil
}

// rootCauseWait is how long a rank's ordinary failure waits for a peer's
// death by a signal to name instead (see Run).
const rootCauseWait = time.Second

// killedBySignal reports whether a rank's exit was a death by a signal.
func killedBySignal(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
