package train

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows the run: a redrawn bar on a terminal, otherwise a plain
// line every few percent (a log file or CI output must not fill with
// carriage-return redraws). Its rate and ETA come from a window of recent
// steps (window), never from the first step, which includes one-time work
// (on CUDA: kernel compilation, graph capture).
type progress struct {
	mu      sync.Mutex // the signal watcher notes from another goroutine
	w       io.Writer
	bar     *progressbar.ProgressBar
	total   int64
	every   int64
	lastOut time.Time
}

// window is the recent steps' timing: the steady state that throughput,
// MFU and the ETA are measured on.
type window struct {
	step []time.Duration // time inside each step, oldest first
	wall []time.Duration // wall time from the previous step's end (evaluations and checkpoints included)
}

// windowSteps is how many recent steps the rate is measured over: enough to
// average out one slow step, few enough to follow a change of pace.
const windowSteps = 32

func (w *window) add(step, wall time.Duration) {
	if len(w.step) == windowSteps {
		w.step, w.wall = w.step[1:], w.wall[1:]
	}
	w.step = append(w.step, step)
	w.wall = append(w.wall, wall)
}

// steps is how many steps the window holds.
func (w *window) steps() int { return len(w.step) }

// stepTime is the mean time inside a step over the window.
func (w *window) stepTime() time.Duration { return meanDuration(w.step) }

// wallTime is the mean wall time a step takes over the window, the basis of
// the ETA.
func (w *window) wallTime() time.Duration { return meanDuration(w.wall) }

func meanDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s / time.Duration(len(ds))
}

// IsTerminal reports whether w is a character device (a terminal), the only
// place a redrawn progress bar reads well.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newProgress(w io.Writer, bar bool, from, total int64) *progress {
	p := &progress{w: w, total: total, every: max(1, (total-from)/20)}
	if w == nil {
		return p
	}
	if bar {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("train"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(24),
			// The bar's own time estimate averages from the start, first
			// step and validations included; the description has the
			// window's.
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
		p.bar.Set64(from)
	}
	return p
}

// stepStatus is what a progress line says about a finished step.
type stepStatus struct {
	step      int64
	loss, lr  float64
	tokPerSec float64 // steady state (0: only the first step so far)
	first     time.Duration
	mfu       float64 // 0: unknown
	eta       time.Duration
}

func (s stepStatus) rate() string {
	r := "first step " + roundDuration(s.first)
	if s.tokPerSec > 0 {
		r = humanRate(s.tokPerSec) + " tok/s"
	}
	if s.mfu > 0 {
		r += fmt.Sprintf("  MFU %.1f%%", 100*s.mfu)
	}
	return r
}

// step reports a finished step.
func (p *progress) step(s stepStatus) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	eta := "-"
	if s.tokPerSec > 0 {
		eta = roundDuration(s.eta)
	}
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("loss %.4f  lr %.2e  %s  eta %s", s.loss, s.lr, s.rate(), eta))
		p.bar.Set64(s.step)
		return
	}
	// Lines: every few percent, but at least every 10 seconds so a slow
	// run still shows it is alive, and always the last step.
	if s.step%p.every != 0 && s.step != p.total && time.Since(p.lastOut) < 10*time.Second {
		return
	}
	p.lastOut = time.Now()
	fmt.Fprintf(p.w, "step %*d/%d  loss %.4f  lr %.2e  %s  eta %s\n",
		len(fmt.Sprint(p.total)), s.step, p.total, s.loss, s.lr, s.rate(), eta)
}

// roundDuration writes d to a precision that reads well: milliseconds below
// a second, tenths below a minute, seconds above.
func roundDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// note prints a line without breaking the bar.
func (p *progress) note(format string, args ...any) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		p.bar.Clear()
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		p.bar.Finish()
	}
}

func humanRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.1fk", r/1e3)
	}
	return fmt.Sprintf("%.0f", r)
}
