package train

import (
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// countColour counts the pixels of the PNG at path that are exactly c.
func countColour(t *testing.T, path string, c color.RGBA) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if color.RGBAModel.Convert(img.At(x, y)).(color.RGBA) == c {
				n++
			}
		}
	}
	return n
}

// TestPlotLossesShowsValidation: the loss plot draws the validation points
// (in their red) when there are some, and nothing red without them.
func TestPlotLossesShowsValidation(t *testing.T) {
	dir := t.TempDir()
	losses := make([]float64, 100)
	for i := range losses {
		losses[i] = 5.5 - float64(i)*0.03
	}
	val := []ValPoint{{Step: 25, Loss: 5.0}, {Step: 50, Loss: 4.3}, {Step: 100, Loss: 3.0}}
	red := color.RGBA{R: 200, G: 40, B: 30, A: 255}
	with, without := filepath.Join(dir, "with.png"), filepath.Join(dir, "without.png")
	if err := PlotLosses(with, "t", "byte", losses, val); err != nil {
		t.Fatal(err)
	}
	if err := PlotLosses(without, "t", "byte", losses, nil); err != nil {
		t.Fatal(err)
	}
	if n := countColour(t, with, red); n < 50 {
		t.Errorf("with validation points: %d pixels of the validation red", n)
	}
	if n := countColour(t, without, red); n != 0 {
		t.Errorf("without validation points: %d pixels of the validation red", n)
	}
}
