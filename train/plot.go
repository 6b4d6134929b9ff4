package train

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/flashgraph/flashgraph/checkpoint"
)

// PlotLosses draws the loss curve as a PNG: every step's training loss (a
// thin line, plus its running mean, since single batches are noisy) and the
// validation points; unit is what the loss is per ("byte", "token").
func PlotLosses(path, title, unit string, losses []float64, val []ValPoint) error {
	if len(losses) == 0 && len(val) == 0 {
		return fmt.Errorf("loss plot: no losses to draw")
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = fmt.Sprintf("loss (nats/%s)", unit)
	p.Add(plotter.NewGrid())

	if len(losses) > 0 {
		raw := make(plotter.XYs, len(losses))
		smooth := make(plotter.XYs, len(losses))
		// An exponential moving average with a window of about 2% of the
		// run (at least 5 steps) shows the trend without hiding the start.
		alpha := 1 / max(5, float64(len(losses))/50)
		var ema float64
		for i, l := range losses {
			raw[i] = plotter.XY{X: float64(i + 1), Y: l}
			if i == 0 {
				ema = l
			} else {
				ema += alpha * (l - ema)
			}
			smooth[i] = plotter.XY{X: float64(i + 1), Y: ema}
		}
		lr, err := plotter.NewLine(raw)
		if err != nil {
			return fmt.Errorf("loss plot: %w", err)
		}
		lr.Color = color.RGBA{R: 150, G: 180, B: 230, A: 255}
		lr.Width = vg.Points(0.5)
		ls, err := plotter.NewLine(smooth)
		if err != nil {
			return fmt.Errorf("loss plot: %w", err)
		}
		ls.Color = color.RGBA{R: 20, G: 70, B: 180, A: 255}
		ls.Width = vg.Points(1.5)
		p.Add(lr, ls)
		p.Legend.Add("train (batch)", lr)
		p.Legend.Add("train (moving average)", ls)
	}
	if len(val) > 0 {
		xy := make(plotter.XYs, len(val))
		for i, v := range val {
			xy[i] = plotter.XY{X: float64(v.Step), Y: v.Loss}
		}
		l, s, err := plotter.NewLinePoints(xy)
		if err != nil {
			return fmt.Errorf("loss plot: %w", err)
		}
		red := color.RGBA{R: 200, G: 40, B: 30, A: 255}
		l.Color, l.Width = red, vg.Points(1.5)
		s.Color, s.Shape = red, draw.CircleGlyph{}
		p.Add(l, s)
		p.Legend.Add("validation", l, s)
	}
	p.Legend.Top = true
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "png")
	if err != nil {
		return fmt.Errorf("loss plot: %w", err)
	}
	return checkpoint.WriteFileAtomic(path, func(w io.Writer) error {
		_, err := wt.WriteTo(w)
		return err
	})
}
