package train

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows the run: a redrawn bar on a terminal, otherwise a plain
// line every few percent (a log file or CI output must not fill with
// carriage-return redraws).
type progress struct {
	w       io.Writer
	bar     *progressbar.ProgressBar
	total   int64
	every   int64
	start   time.Time
	startAt int64
	lastOut time.Time
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
	p := &progress{w: w, total: total, start: time.Now(), startAt: from, every: max(1, (total-from)/20)}
	if w == nil {
		return p
	}
	if bar {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("train"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(24),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
		p.bar.Set64(from)
	}
	return p
}

// step reports a finished step.
func (p *progress) step(step int64, loss, lr, tokPerSec float64) {
	if p.w == nil {
		return
	}
	eta := time.Duration(0)
	if done := step - p.startAt; done > 0 {
		eta = time.Duration(float64(time.Since(p.start)) / float64(done) * float64(p.total-step))
	}
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("loss %.4f  lr %.2e  %s tok/s", loss, lr, humanRate(tokPerSec)))
		p.bar.Set64(step)
		return
	}
	// Lines: every few percent, but at least every 10 seconds so a slow
	// run still shows it is alive, and always the last step.
	if step%p.every != 0 && step != p.total && time.Since(p.lastOut) < 10*time.Second {
		return
	}
	p.lastOut = time.Now()
	fmt.Fprintf(p.w, "step %*d/%d  loss %.4f  lr %.2e  %s tok/s  eta %s\n",
		len(fmt.Sprint(p.total)), step, p.total, loss, lr, humanRate(tokPerSec), eta.Round(time.Second))
}

// note prints a line without breaking the bar.
func (p *progress) note(format string, args ...any) {
	if p.w == nil {
		return
	}
	if p.bar != nil {
		p.bar.Clear()
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

func (p *progress) finish() {
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
